"""A bad experiment: a config field holds an object with no canonical JSON form."""

import threading
from dataclasses import dataclass
from typing import Any

from schooner.cluster import StepRunner, step


@dataclass(frozen=True)
class Cfg:
    lock: Any


def noop(config, out):
    return None


held = step("holds-a-lock", noop, Cfg(lock=threading.Lock()))

if __name__ == "__main__":
    StepRunner().run([held])
