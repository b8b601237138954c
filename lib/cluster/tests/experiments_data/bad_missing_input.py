"""A bad experiment: an input path names a sub folder its step never writes (a typo)."""

import os
from dataclasses import dataclass
from typing import Any

from schooner.cluster import StepRunner, step


@dataclass(frozen=True)
class Cfg:
    data: Any = None


def make_train(config, out):
    os.makedirs(os.path.join(out, "train"), exist_ok=True)


def use(config, out):
    os.listdir(config.data)


source = step("source", make_train, Cfg())
user = step("user", use, Cfg(data=source / "trian"))

if __name__ == "__main__":
    StepRunner().run([user])
