"""An experiment whose second step runs through the cluster client (`--cluster local` in the tests)."""

import os
from dataclasses import dataclass
from typing import Any

from schooner.cluster import ResourceConfig, StepRunner, step


@dataclass(frozen=True)
class Cfg:
    source: Any = None
    words: tuple = ("a", "b")


@step(version="v1")
def write_words(config: Cfg, output_path: str) -> int:
    with open(os.path.join(output_path, "words.txt"), "w") as f:
        f.write("\n".join(config.words))
    return os.getpid()


@step(version="v1", resources=ResourceConfig.with_cpu(1))
def count_words(config: Cfg, output_path: str) -> dict:
    with open(os.path.join(config.source, "words.txt")) as f:
        n = len(f.read().split())
    with open(os.path.join(output_path, "count.txt"), "w") as f:
        f.write(str(n))
    return {"count": n, "pid": os.getpid()}


words = write_words("words", Cfg())
counted = count_words("counted", Cfg(source=words))

if __name__ == "__main__":
    result = StepRunner().run([counted])
    print("RESULT", result[counted].result, result[words].result)
