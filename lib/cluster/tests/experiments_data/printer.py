"""One step on the cluster client that prints progress lines, for the streaming tests."""

from dataclasses import dataclass

from schooner.cluster import ResourceConfig, StepRunner, step


@dataclass(frozen=True)
class Cfg:
    lines: int = 3


def talk(config: Cfg, out: str) -> int:
    for i in range(config.lines):
        print(f"progress line {i}", flush=True)
    return config.lines


talker = step("talker", talk, Cfg(), resources=ResourceConfig.with_cpu())

if __name__ == "__main__":
    StepRunner().main([talker])
