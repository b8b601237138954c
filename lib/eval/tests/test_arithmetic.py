"""The generated arithmetic task: answers checked by an independent evaluation of each story's numbers,
deterministic rows, and train and held-out splits that never share a computation (across seeds too)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from schooner.eval.arithmetic import ArithmeticTask, arithmetic_problems, arithmetic_task
from schooner.eval.rewards import exact_answer

_NUMBER_WORDS = {"doubles": ("*", 2), "triples": ("*", 3)}


def _evaluate_prompt(prompt: str) -> int:
    """The answer read from the story's words alone (not from the generator's key or solution)."""
    sentences = [s for s in re.split(r"(?<=[.?])\s+", prompt) if s]
    value = int(re.search(r" has (\d+) ", sentences[0]).group(1))
    for sentence in sentences[1:-1]:
        n = re.search(r"\d+", sentence)
        if "doubles" in sentence or "triples" in sentence:
            value *= 2 if "doubles" in sentence else 3
        elif "equal groups" in sentence:
            assert value % int(n.group(0)) == 0, sentence
            value //= int(n.group(0))
        elif any(w in sentence for w in ("buys", "finds", "is given", "wins")):
            value += int(n.group(0))
        elif any(w in sentence for w in ("gives", "loses", "eats", "sells")):
            value -= int(n.group(0))
        else:
            raise AssertionError(f"unknown step {sentence!r}")
    assert sentences[-1].startswith("How many")
    return value


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_answers_follow_from_the_words_and_the_worked_solution(split: str) -> None:
    rows = arithmetic_problems(split, 300, seed=3, max_value=30)
    reward = exact_answer()
    for row in rows:
        assert _evaluate_prompt(row["prompt"]) == row["answer"], row
        assert isinstance(row["answer"], int) and 0 <= row["answer"] <= 30
        # every worked line's arithmetic is right, every amount within bounds, and the solution scores 1.0
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["solution"]):
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[
                op
            ] == int(c)
            assert 0 <= int(c) <= 30 and (op != "/" or int(a) % int(b) == 0)
        assert row["solution"].count("=") == row["steps"]
        assert row["solution"].endswith(f"#### {row['answer']}")
        assert reward(row["prompt"], row["solution"], row) == 1.0
        assert 2 <= row["steps"] <= 4


def test_deterministic_from_the_seed() -> None:
    assert arithmetic_problems("train", 50, seed=7) == arithmetic_problems("train", 50, seed=7)
    assert arithmetic_problems("train", 50, seed=7) != arithmetic_problems("train", 50, seed=8)
    # a longer list starts with the shorter one
    assert arithmetic_problems("heldout", 80, seed=7)[:30] == arithmetic_problems("heldout", 30, seed=7)


def test_splits_never_share_a_computation_or_a_prompt() -> None:
    train = {seed: arithmetic_problems("train", 2000, seed=seed) for seed in (0, 1)}
    heldout = {seed: arithmetic_problems("heldout", 300, seed=seed) for seed in (0, 1)}
    for rows in (*train.values(), *heldout.values()):
        assert len({r["key"] for r in rows}) == len(rows)  # distinct computations within a split
    for a in (0, 1):
        for b in (0, 1):
            assert not {r["key"] for r in train[a]} & {r["key"] for r in heldout[b]}
            assert not {r["prompt"] for r in train[a]} & {r["prompt"] for r in heldout[b]}
    # the same held-out computations come up under another seed: the split is by computation, not by seed
    assert {r["key"] for r in heldout[0]} & {r["key"] for r in heldout[1]}


def test_every_operation_appears() -> None:
    keys = "".join(r["key"] for r in arithmetic_problems("train", 500))
    assert all(op in keys for op in "+-*/")


def test_arithmetic_task_writes_both_splits_once(tmp_path) -> None:
    task = ArithmeticTask(train_size=40, heldout_size=10, seed=2)
    paths = arithmetic_task(str(tmp_path), task)
    rows = {
        s: [json.loads(line) for line in Path(p).read_text(encoding="utf-8").splitlines()]
        for s, p in paths.items()
    }
    assert [len(rows["train"]), len(rows["heldout"])] == [40, 10]
    assert rows["train"] == arithmetic_problems("train", 40, seed=2)
    assert set(rows["train"][0]) >= {"id", "prompt", "answer", "solution"}
    stamp = (tmp_path / "train.jsonl").stat().st_mtime_ns
    assert arithmetic_task(str(tmp_path), task) == paths
    assert (tmp_path / "train.jsonl").stat().st_mtime_ns == stamp  # reused
    arithmetic_task(str(tmp_path), ArithmeticTask(train_size=41, heldout_size=10, seed=2))
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 41  # new settings: rewritten


def test_bad_settings_and_exhausted_spaces_are_named() -> None:
    with pytest.raises(ValueError, match="min_steps must be <= max_steps"):
        ArithmeticTask(min_steps=3, max_steps=2)
    with pytest.raises(ValueError, match="train_size must be a positive int, got train_size=0"):
        ArithmeticTask(train_size=0)
    with pytest.raises(ValueError, match="split must be one of"):
        arithmetic_problems("test", 1)
    with pytest.raises(ValueError, match=r"only \d+ distinct train problems found"):
        arithmetic_problems("train", 10_000, min_steps=1, max_steps=1, max_value=6)


def _facts(row: dict) -> list[str]:
    """Each step of a row as the key of a one-step problem (`"9-4"`), read from its worked solution."""
    return [f"{a}{op}{b}" for a, op, b in re.findall(r"(\d+) ([-+*/]) (\d+) = \d+", row["solution"])]


def test_heldout_by_composition_holds_out_new_combinations_of_facts_the_train_split_teaches() -> None:
    settings = dict(min_steps=1, max_steps=2, max_value=9)
    train = arithmetic_problems("train", 600, heldout_by="composition", **settings)
    heldout = arithmetic_problems("heldout", 100, heldout_by="composition", **settings)
    assert not {r["key"] for r in train} & {r["key"] for r in heldout}
    assert {r["steps"] for r in heldout} == {2}  # every held-out problem combines several steps
    taught = {r["key"] for r in train if r["steps"] == 1}
    for row in heldout:
        # each of its steps from a start of 1 or more is a one-step train problem (0 is no problem's start)
        assert {f for f in _facts(row) if not f.startswith("0")} <= taught, row
    # by key (the default, as before) a one-step problem can be held out: its fact is no one-step train problem
    by_key = [r for r in arithmetic_problems("heldout", 100, **settings) if r["steps"] == 1]
    assert by_key and arithmetic_problems(
        "heldout", 100, heldout_by="key", **settings
    ) == arithmetic_problems("heldout", 100, **settings)
    train_by_key = {r["key"] for r in arithmetic_problems("train", 600, **settings)}
    assert not {r["key"] for r in by_key} & train_by_key
    assert ArithmeticTask().heldout_by == "key"


def test_heldout_by_is_checked() -> None:
    with pytest.raises(
        ValueError, match=r"heldout_by must be 'key' or 'composition', got heldout_by='steps'"
    ):
        ArithmeticTask(heldout_by="steps")
    with pytest.raises(ValueError, match=r"heldout_by='composition' holds out problems of 2 or more steps"):
        ArithmeticTask(min_steps=1, max_steps=1, heldout_by="composition")


def _evaluate_key(key: str) -> int:
    """The answer of a key (`"9-4*2+1"`, applied left to right) by Python's own `eval` of the composed
    expression `((9-4)*2)+1`, not the generator's arithmetic; every division must come out whole."""
    start, rest = re.fullmatch(r"(\d+)((?:[-+*/]\d+)+)", key).groups()
    expression = start
    for op, operand in re.findall(r"([-+*/])(\d+)", rest):
        expression = f"({expression}){op}{operand}"
        value = eval(expression)  # noqa: S307 -- digits, operators and parentheses only (the fullmatch above)
        assert value == int(value), f"{expression} is not whole"
    return int(value)


def test_longer_compositions_than_sft_teaches_for_rl_prompts_and_heldout() -> None:
    """The RL tutorial's SCHOONER_RL_HELDOUT_STEPS=3 setting: SFT on the 1-2 step task's train split, RL on the
    train split of 3-step problems, scored on the held-out split of 3-step problems. The three never share a
    computation, every answer is Python's evaluation of the composed expression, and every fact of a 3-step
    problem is a one-step problem the SFT split teaches (at the tutorial's sizes)."""
    settings = dict(max_value=10, heldout_by="composition", seed=0)
    sft = arithmetic_problems("train", 800, min_steps=1, max_steps=2, **settings)
    rl = arithmetic_problems("train", 800, min_steps=3, max_steps=3, **settings)
    heldout = arithmetic_problems("heldout", 200, min_steps=3, max_steps=3, **settings)
    keys = [{r["key"] for r in rows} for rows in (sft, rl, heldout)]
    assert [len(k) for k in keys] == [800, 800, 200]  # distinct within each
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
    taught = {r["key"] for r in sft if r["steps"] == 1}
    for row in rl + heldout:
        assert row["steps"] == 3 and row["solution"].count(" = ") == 3, row
        assert _evaluate_key(row["key"]) == _evaluate_prompt(row["prompt"]) == row["answer"], row
        assert 0 <= row["answer"] <= 10 and row["solution"].endswith(f"#### {row['answer']}")
        assert {f for f in _facts(row) if not f.startswith("0")} <= taught, row
    assert {r["steps"] for r in sft} == {1, 2}
    # the held-out 3-step computations are held out whatever the size asked for, and by key alone
    assert [r["key"] for r in arithmetic_problems("heldout", 50, min_steps=3, max_steps=3, **settings)] == [
        r["key"] for r in heldout[:50]
    ]
    assert _evaluate_key("9-4*2+1") == 11 and _evaluate_key("8/4*3") == 6


def test_a_tasks_problems_are_arithmetic_problems_with_every_setting_of_the_task(tmp_path) -> None:
    """`ArithmeticTask.problems` (what `arithmetic_task` writes and the RL tutorial's extra SFT rows draw)
    passes every setting on: it equals `arithmetic_problems` called with each one by hand, and changing any one
    setting changes the rows."""
    import dataclasses

    settings = dict(seed=7, min_steps=1, max_steps=3, max_value=12, heldout_every=3, heldout_by="composition")
    task = ArithmeticTask(train_size=30, heldout_size=10, **settings)
    assert task.problems("train") == arithmetic_problems("train", 30, **settings)
    assert task.problems("heldout") == arithmetic_problems("heldout", 10, **settings)
    longer = task.problems("train", 36)
    assert longer[:30] == task.problems("train") and len({r["key"] for r in longer}) == 36
    assert task.problems("heldout", 0) == []
    for name, other in dict(
        seed=8, min_steps=2, max_steps=2, max_value=11, heldout_every=4, heldout_by="key"
    ).items():
        changed = dataclasses.replace(task, **{name: other})
        assert changed.problems("train") != task.problems("train"), name
    paths = arithmetic_task(str(tmp_path / "task"), task)
    for split in ("train", "heldout"):
        written = [json.loads(line) for line in Path(paths[split]).read_text().splitlines()]
        assert written == task.problems(split)
    with pytest.raises(ValueError, match="split must be one of .*got 'test'"):
        task.problems("test")
    with pytest.raises(ValueError, match="size must be an int >= 0, got size=-1"):
        task.problems("train", -1)
