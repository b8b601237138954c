"""A small experiment for the CLI and fault tests: numbers -> squares, cubes -> report/total.

Knobs (environment): EXP_LOG (file every step appends "start|end NAME PID" to), EXP_SLEEP
("name=seconds,..." sleeps mid-step, after half the output is written), EXP_FAIL (comma-separated step
names that raise), EXP_SCALE (a config field of `numbers`; changing it changes every key downstream),
EXP_GATE (a file path: `numbers` waits until it exists).
"""

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from schooner.cluster import StepRunner, lower, step

SLEEP = {k: float(v) for k, v in (kv.split("=") for kv in os.environ.get("EXP_SLEEP", "").split(",") if kv)}
FAIL = set(filter(None, os.environ.get("EXP_FAIL", "").split(",")))
SCALE = int(os.environ.get("EXP_SCALE", "3"))


def _log(what: str, name: str) -> None:
    path = os.environ.get("EXP_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{what} {name} {os.getpid()}\n".encode())
        os.close(fd)


def _write_parts(name: str, out: str, values: list[int]) -> None:
    """Two part files, appended to value by value (one JSON line each); the sleep sits between them, so a
    kill leaves partial output behind that a rerun appending to it would corrupt."""
    _log("start", name)
    gate = os.environ.get("EXP_GATE")
    while name == "numbers" and gate and not os.path.exists(gate):
        time.sleep(0.02)  # held until the test opens the gate
    if name in FAIL:
        raise RuntimeError(f"{name} failed on purpose (EXP_FAIL)")
    half = len(values) // 2
    _append(os.path.join(out, "part-0.json"), values[:half])
    time.sleep(SLEEP.get(name, 0.0))
    _append(os.path.join(out, "part-1.json"), values[half:])
    _log("end", name)


def _append(path: str, values: list[int]) -> None:
    open(path, "a").close()  # the part exists even when it holds no value
    for v in values:
        with open(path, "a") as f:
            f.write(json.dumps(v) + "\n")


def _read_parts(folder: str) -> list[int]:
    out = []
    for i in (0, 1):
        with open(os.path.join(folder, f"part-{i}.json")) as f:
            out += [json.loads(line) for line in f]
    return out


@dataclass(frozen=True)
class NumbersConfig:
    count: int
    scale: int


@dataclass(frozen=True)
class PowerConfig:
    numbers: Any
    power: int


@dataclass(frozen=True)
class TotalConfig:
    parts: Any
    """{handle: weight}"""


def write_numbers(config: NumbersConfig, out: str) -> dict:
    _write_parts("numbers", out, [i * config.scale for i in range(config.count)])
    return {"count": config.count}


def write_power(config: PowerConfig, out: str) -> dict:
    name = "squares" if config.power == 2 else "cubes"
    _write_parts(name, out, [v**config.power for v in _read_parts(config.numbers)])
    return {"power": config.power}


def write_total(config: TotalConfig, out: str) -> dict:
    total = sum(w * sum(_read_parts(path)) for path, w in config.parts.items())
    _write_parts("report/total", out, [int(total)])
    return {"total": total}


numbers = step("numbers", write_numbers, NumbersConfig(count=6, scale=SCALE), version="v1")
squares = step("squares", write_power, PowerConfig(numbers=numbers, power=2))
cubes = step("cubes", write_power, PowerConfig(numbers=numbers, power=3))
report = step("report/total", write_total, TotalConfig(parts={squares: 1.0, cubes: 2.0}))

if __name__ == "__main__":
    StepRunner().main([lower(report)])
