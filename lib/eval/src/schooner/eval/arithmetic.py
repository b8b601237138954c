"""A verifiable task generated offline: multi-step integer arithmetic in words, with worked solutions.

Each problem is a short story ("Tom has 3 apples. He buys 4 more. He gives 2 away. How many apples does Tom
have now?") whose answer is one integer, with a worked solution in GSM8K's form (one line per step, then
`#### 5`) for supervised fine-tuning, and the answer checked by `schooner.eval.rewards.exact_answer` for
reinforcement learning and pass@k (`schooner.eval.passk`).

Steps add ("buys 4 more"), subtract ("gives 2 away", never below zero), multiply ("doubles"/"triples") or
divide exactly ("splits them into 3 equal groups and keeps one group"); every intermediate amount stays
within `0..max_value`. Everything is a pure function of the seed: the same settings write the same rows.

Train and held-out problems never share their arithmetic: a problem's *key* is its starting amount and its
sequence of operations and operands (names, items and wording aside), and its split is fixed by a hash of that
key alone, one key in `heldout_every` going to the held-out split, whatever the seed or sizes. So held-out
problems are new computations, not train problems with another name, and the train rows of one seed never
meet the held-out rows of another.

Which keys may be held out is `heldout_by`: `"key"` (the default) hashes every key, so a one-step problem
("9 - 1") can be held out and its fact is then never a one-step train problem; `"composition"` keeps every
one-step problem in train and hashes only keys of two or more steps, so the held-out problems are new
combinations of facts the train split teaches one at a time (as GSM8K's test problems are new problems built
from the arithmetic its train problems use).

Problems longer than any a model was fine-tuned on come from a second task of the same amounts with
`min_steps=max_steps=3` (and `heldout_by="composition"`): its train split (e.g. RL prompts) and held-out split
share no computation with each other or with a 1- to 2-step task (a key's length is its number of steps),
and each of their steps is a one-step problem of that task's train split when it is large enough to hold
them all (the RL tutorial's `SCHOONER_RL_HELDOUT_STEPS=3`).

    >>> rows = arithmetic_problems("train", 2, seed=0)
    >>> sorted(rows[0])
    ['answer', 'id', 'key', 'prompt', 'solution', 'steps']
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from typing import Any

ARITHMETIC_VERSION = 1
"""Bumped whenever the construction changes (the folder's task.json records it)."""

SPLITS = ("train", "heldout")
HELDOUT_BY = ("key", "composition")
_MAX_MISSES = 20_000
"""Draws in a row that give no new problem of the split before `arithmetic_problems` gives up."""

_NAMES = ("Tom", "Ana", "Lena", "Omar", "Priya", "Kenji", "Maya", "Sam", "Ivan", "Zoe", "Noah", "Aisha")
_ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "coins",
    "books",
    "pencils",
    "shells",
    "cards",
    "cookies",
    "stamps",
)
_ADD = ("buys {n} more", "finds {n} more", "is given {n} more", "wins {n} more")
_SUB = ("gives {n} away", "loses {n}", "eats {n}", "sells {n}")
_MUL = {2: "doubles the pile", 3: "triples the pile"}
_DIV = "splits them into {n} equal groups and keeps one group"


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """The settings of a generated arithmetic task (`arithmetic_task` writes its files).

    Attributes:
        train_size: rows of the train split.
        heldout_size: rows of the held-out split.
        min_steps: fewest operations after the starting amount.
        max_steps: most operations after the starting amount.
        max_value: largest starting, intermediate and final amount (and bound of the operands).
        seed: the generator's seed.
        heldout_every: one arithmetic key in this many goes to the held-out split (by hash, seed-independent).
        heldout_by: which keys may be held out: `"key"` (any) or `"composition"` (those of 2 or more steps;
            every one-step problem is train).
    """

    train_size: int = 2000
    heldout_size: int = 200
    min_steps: int = 2
    max_steps: int = 4
    max_value: int = 50
    seed: int = 0
    heldout_every: int = 5
    heldout_by: str = "key"

    def __post_init__(self) -> None:
        for name in ("train_size", "heldout_size", "min_steps", "max_steps", "max_value", "heldout_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ArithmeticTask: {name} must be a positive int, got {name}={value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"ArithmeticTask: seed must be an int, got seed={self.seed!r}")
        if self.min_steps > self.max_steps:
            raise ValueError(
                f"ArithmeticTask: min_steps must be <= max_steps, got {self.min_steps=} {self.max_steps=}"
            )
        if self.max_value < 6:
            raise ValueError(
                f"ArithmeticTask: max_value must be >= 6 (room for every operation), got {self.max_value}"
            )
        if self.heldout_every < 2:
            raise ValueError(f"ArithmeticTask: heldout_every must be >= 2, got {self.heldout_every}")
        if self.heldout_by not in HELDOUT_BY:
            raise ValueError(
                f"ArithmeticTask: heldout_by must be 'key' or 'composition', got heldout_by={self.heldout_by!r}"
            )
        if self.heldout_by == "composition" and self.max_steps < 2:
            raise ValueError(
                "ArithmeticTask: heldout_by='composition' holds out problems of 2 or more steps, but "
                f"max_steps={self.max_steps}: raise max_steps or use heldout_by='key'"
            )

    def problems(self, split: str, size: int | None = None) -> list[dict[str, Any]]:
        """`size` problems of `split` ("train" or "heldout") with these settings: `arithmetic_problems` called
        with every one of them, so a row of this task is the same wherever it is drawn. `size` defaults to the
        split's own (`train_size` or `heldout_size`); a larger `size` draws further rows of the same split
        after those (the first `train_size` rows are `train.jsonl`'s), which no other row of the split shares
        a key with.

        Example:
            >>> task = ArithmeticTask(train_size=3, heldout_size=2, max_value=10)
            >>> [r["id"] for r in task.problems("heldout")]
            ['arith-heldout-0-000000', 'arith-heldout-0-000001']
            >>> task.problems("train", 5)[:3] == task.problems("train")
            True
        """
        if split not in SPLITS:
            raise ValueError(f"ArithmeticTask.problems: split must be one of {SPLITS}, got {split!r}")
        if size is None:
            size = self.train_size if split == "train" else self.heldout_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"ArithmeticTask.problems: size must be an int >= 0, got size={size!r}")
        return arithmetic_problems(
            split,
            size,
            seed=self.seed,
            min_steps=self.min_steps,
            max_steps=self.max_steps,
            max_value=self.max_value,
            heldout_every=self.heldout_every,
            heldout_by=self.heldout_by,
        )


def _operation(rng: random.Random, value: int, max_value: int) -> tuple[str, int] | None:
    """A random operation applicable to `value` within 0..max_value, as (op, operand); None if none drawn."""
    op = rng.choice("+-*/")
    if op == "+" and value < max_value:
        return op, rng.randint(1, min(max_value - value, max_value // 2))
    if op == "-" and value > 0:
        return op, rng.randint(1, value)
    if op == "*" and 0 < value <= max_value // 2:
        return op, rng.choice([k for k in (2, 3) if value * k <= max_value])
    if op == "/":
        divisors = [d for d in range(2, 6) if value >= d and value % d == 0]
        if divisors:
            return op, rng.choice(divisors)
    return None


def _apply(value: int, op: str, operand: int) -> int:
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    return value // operand


def _story(rng: random.Random, start: int, ops: list[tuple[str, int]]) -> dict[str, Any]:
    """The prompt, worked solution and answer of one computation, in words chosen by `rng`."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    sentences = [f"{name} has {start} {item}."]
    lines = [f"{name} starts with {start} {item}."]
    value = start
    for op, operand in ops:
        new = _apply(value, op, operand)
        if op == "+":
            action = rng.choice(_ADD).format(n=operand)
            lines.append(f"{name} gets {operand} more: {value} + {operand} = {new}.")
        elif op == "-":
            action = rng.choice(_SUB).format(n=operand)
            lines.append(f"{name} has {operand} fewer: {value} - {operand} = {new}.")
        elif op == "*":
            action = _MUL[operand]
            lines.append(f"{name} has {operand} times as many: {value} * {operand} = {new}.")
        else:
            action = _DIV.format(n=operand)
            lines.append(f"{name} keeps one of {operand} equal groups: {value} / {operand} = {new}.")
        sentences.append(f"Then {name} {action}.")
        value = new
    sentences.append(f"How many {item} does {name} have now?")
    lines.append(f"{name} has {value} {item} now.")
    lines.append(f"#### {value}")
    return {"prompt": " ".join(sentences), "solution": "\n".join(lines), "answer": value}


def problem_key(start: int, ops: list[tuple[str, int]]) -> str:
    """The arithmetic of a problem, names and wording aside (`"3+4-2"`): what the splits never share."""
    return str(start) + "".join(f"{op}{operand}" for op, operand in ops)


def split_of(key: str, heldout_every: int = 5, heldout_by: str = "key") -> str:
    """The split a problem's arithmetic belongs to ("train" or "heldout"), by a hash of its key alone; with
    `heldout_by="composition"` a key of one step (one operator: amounts are never negative) is always train."""
    if heldout_by == "composition" and sum(c in "+-*/" for c in key) < 2:
        return "train"
    digest = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    return "heldout" if digest % heldout_every == 0 else "train"


def arithmetic_problems(
    split: str,
    size: int,
    *,
    seed: int = 0,
    min_steps: int = 2,
    max_steps: int = 4,
    max_value: int = 50,
    heldout_every: int = 5,
    heldout_by: str = "key",
) -> list[dict[str, Any]]:
    """`size` distinct problems of `split` ("train" or "heldout"), a pure function of the arguments.

    Each row: `id` (`arith-{split}-{seed}-{i:06d}`), `prompt`, `solution` (the worked steps, ending `#### answer`),
    `answer` (an int), `steps` (operations after the start) and `key` (`problem_key`). Distinct keys within the
    list; problems whose key belongs to the other split are drawn and dropped, so `heldout` costs about
    `heldout_every` draws a row. `heldout_by` as in `ArithmeticTask`.

    Raises:
        ValueError: an unknown split, or fewer distinct problems exist than asked for.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ArithmeticTask(1, 1, min_steps, max_steps, max_value, seed, heldout_every, heldout_by)  # validates them
    rng = random.Random(f"schooner-arithmetic-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    misses = 0
    while len(rows) < size:
        if misses > _MAX_MISSES:
            raise ValueError(
                f"only {len(rows)} distinct {split} problems found ({_MAX_MISSES} draws in a row gave nothing "
                f"new; asked for {size}); raise max_value ({max_value}) or max_steps ({max_steps}), or ask for fewer"
            )
        steps = rng.randint(min_steps, max_steps)
        value = start = rng.randint(1, max_value)
        ops: list[tuple[str, int]] = []
        while len(ops) < steps:
            if (drawn := _operation(rng, value, max_value)) is not None:
                ops.append(drawn)
                value = _apply(value, *drawn)
        key = problem_key(start, ops)
        # the story's words are drawn for every problem, kept or not, so one draw never shifts the next's
        story = _story(rng, start, ops)
        if key in seen or split_of(key, heldout_every, heldout_by) != split:
            misses += 1
            continue
        misses = 0
        seen.add(key)
        rows.append({"id": f"arith-{split}-{seed}-{len(rows):06d}", **story, "steps": steps, "key": key})
    return rows


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    os.replace(tmp, path)


def arithmetic_task(folder: str, task: ArithmeticTask = ArithmeticTask()) -> dict[str, str]:
    """Write `train.jsonl` and `heldout.jsonl` into `folder` (once; reused when `task.json` matches).

    Returns:
        Each split's file path (`{"train": ..., "heldout": ...}`).
    """
    os.makedirs(folder, exist_ok=True)
    index = os.path.join(folder, "task.json")
    settings = {"version": ARITHMETIC_VERSION, **dataclasses.asdict(task)}
    paths = {split: os.path.join(folder, f"{split}.jsonl") for split in SPLITS}
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            if json.load(f).get("settings") == settings and all(os.path.exists(p) for p in paths.values()):
                return paths
    for split, path in paths.items():
        _write_jsonl(path, task.problems(split))
    tmp = f"{index}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(
            {"settings": settings, "files": {s: os.path.basename(p) for s, p in paths.items()}}, f, indent=2
        )
    os.replace(tmp, index)
    return paths
