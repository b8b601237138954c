"""Verifiable rewards: the numeric parser on hand-written cases, the code runner's limits enforced by the kernel
(a runaway loop and the child it forks are killed, a 2 GB allocation fails, no network), and a batch that
survives a raising reward function and names the row."""

from __future__ import annotations

import math
import os
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schooner.eval import rewards
from schooner.eval.rewards import (
    CodeLimits,
    code_tests,
    exact_answer,
    extract_answer,
    extract_code,
    parse_number,
    run_python,
    score_batch,
)

# (completion, the number extract_answer must find, as written)
ANSWERS = [
    ("42", "42"),
    ("Tom has 3 apples and buys 4 more, so he has 7.", "7"),
    ("3 + 4 = 7\n#### 7", "7"),
    ("#### 1,234", "1,234"),
    ("First 5, then #### -12 \n and 99 later", "-12"),  # the #### line wins over a later number
    ("We get \\boxed{42}. Check: 6 * 7 = 42 and 1 more is 43", "42"),
    ("\\boxed{-3.5}", "-3.5"),
    ("\\boxed{x = 12} so 13", "12"),
    ("\\boxed{1} then \\boxed{2}", "2"),  # the last boxed
    ("\\boxed{{nested} 17} 18", "17"),  # balanced braces
    ("\\boxed{no number} 8", "8"),  # a boxed without a number falls through to the last number
    ("The answer is 42 apples. Then 7 pears.", "42"),
    ("the ANSWER IS: 9.", "9"),
    ("Answer: $1,000,000.50", "1,000,000.50"),
    ("answer = -7", "-7"),
    ("The answer is unclear\n5", "5"),  # no number on the answer's line: the last number
    ("It costs $12.", "12"),
    ("12.5%", "12.5"),
    ("a loss of \u22124", "\u22124"),
    ("+3", "+3"),
    (".5 of it", ".5"),
    ("1,2", "2"),  # not a thousands group: two numbers
    ("1,2345", "2345"),  # a group of four digits is not a thousands group
    ("10-2", "2"),  # a hyphen between digits is not a sign
    ("x2 and v1.2", None),  # digits inside words are not numbers
    ("3/4", "4"),  # fractions are not parsed
    ("no digits here", None),
    ("", None),
]


@pytest.mark.parametrize(("completion", "expected"), ANSWERS)
def test_extract_answer_table(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


VALUES = [
    ("42", Fraction(42)),
    ("-1,234.50", Fraction(-2469, 2)),
    ("+3", Fraction(3)),
    ("\u22124", Fraction(-4)),
    (".5", Fraction(1, 2)),
    ("$7", Fraction(7)),
    (" 0.10 ", Fraction(1, 10)),
    ("1,000,000", Fraction(10**6)),
]


@pytest.mark.parametrize(("text", "value"), VALUES)
def test_parse_number_table(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "4 2", "1,2", "3/4", "seven", "1e5", "--3", "1.2.3"])
def test_parse_number_rejects_what_is_not_one_number(text: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        parse_number(text)


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("The answer is 42.", 42, 1.0),
        ("The answer is 42.0", 42, 1.0),
        ("#### 1,000", 1000, 1.0),
        ("#### 1,000", "1000", 1.0),
        ("so 0.1", 0.1, 1.0),  # the float 0.1 is the decimal 0.1
        ("so 0.1000", "0.1", 1.0),
        ("The answer is 41.", 42, 0.0),
        ("The answer is -42.", 42, 0.0),
        ("I don't know", 42, 0.0),
    ],
)
def test_exact_answer(completion: str, answer: object, reward: float) -> None:
    assert exact_answer()("prompt", completion, {"answer": answer}) == reward


_WRITTEN = st.sampled_from(["{n}", "{n:,}", "{n}.0", "{n:,}.00", "${n}", "{plus}{n}"])
_WRAPPED = st.sampled_from(
    ["{s}", "#### {s}", "\\boxed{{{s}}}", "The answer is {s}.", "Answer: {s}", "So we get {s}"]
)


@given(n=st.integers(-(10**12), 10**12), written=_WRITTEN, wrapped=_WRAPPED, noise=st.integers(0, 999))
def test_any_integer_written_any_supported_way_is_read_back(
    n: int, written: str, wrapped: str, noise: int
) -> None:
    text = written.format(n=n, plus="+" if n >= 0 else "")
    completion = f"First {noise} and then {noise + 1}. " + wrapped.format(s=text)
    assert parse_number(extract_answer(completion)) == n
    assert exact_answer()("p", completion, {"answer": n}) == 1.0
    assert exact_answer()("p", completion, {"answer": str(n + 1)}) == 0.0


@given(
    value=st.decimals(min_value=-(10**6), max_value=10**6, places=3, allow_nan=False, allow_infinity=False)
)
def test_decimals_are_read_exactly(value) -> None:
    assert parse_number(extract_answer(f"it comes to {value} in total")) == Fraction(value)


def test_exact_answer_reads_another_field() -> None:
    assert exact_answer("target")("p", "= 5", {"target": "5"}) == 1.0


# ----------------------------------------------------------------------------------------------- code


def _state(pid: int) -> str | None:
    """The process's state letter, None once it is gone (a zombie 'Z' is dead, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _dead(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_a_loop_and_the_child_it_forked(tmp_path) -> None:
    pids = tmp_path / "pids"
    program = f"""
import os
child = os.fork()
if child == 0:
    with open({str(pids)!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    while True:
        pass
with open({str(pids)!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
while True:
    pass
"""
    start = time.perf_counter()
    result = run_python(program, CodeLimits(timeout_s=4.0, cpu_s=60))  # time to start on a busy machine
    assert time.perf_counter() - start < 15
    assert result.timed_out and not result.passed and result.returncode is None
    written = [int(p) for p in pids.read_text().split()]
    assert len(written) == 2  # the program and its child both ran
    assert all(_dead(pid) for pid in written), [(pid, _state(pid)) for pid in written]


def test_a_child_left_running_dies_when_the_program_ends(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    program = f"""
import os, time
if os.fork() == 0:
    with open({str(pid_file)!r}, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
    os._exit(0)
while not os.path.exists({str(pid_file)!r}):
    time.sleep(0.01)
"""
    result = run_python(program, CodeLimits(timeout_s=30))
    assert result.passed and not result.timed_out
    assert _dead(int(pid_file.read_text()))


def test_cpu_limit_stops_a_loop_before_the_wall_clock_timeout() -> None:
    result = run_python("while True:\n    pass\n", CodeLimits(timeout_s=60, cpu_s=1))
    assert not result.passed and not result.timed_out
    assert result.returncode is not None and result.returncode < 0  # killed by SIGXCPU / SIGKILL
    assert result.seconds < 30


def test_memory_limit_stops_a_2gb_allocation() -> None:
    limits = CodeLimits(memory_bytes=512 << 20)
    small = run_python("x = bytearray(16 << 20)\nprint(len(x))\n", limits)
    assert small.passed and small.stdout == f"{16 << 20}\n"  # the limit leaves room for ordinary programs
    big = run_python("x = bytearray(2 << 30)\nx[-1] = 1\n", limits)
    assert not big.passed and big.returncode == 1
    assert big.stderr.rstrip().endswith("MemoryError")


def test_output_is_capped() -> None:
    result = run_python("import sys\nsys.stdout.write('x' * 5000)\n", CodeLimits(output_bytes=1000))
    assert not result.passed  # writing past RLIMIT_FSIZE fails (EFBIG / SIGXFSZ)
    assert len(result.stdout) <= 1000


def test_the_program_runs_isolated_in_a_temporary_folder_removed_afterwards(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-schooner-path")
    monkeypatch.setenv("SCHOONER_SECRET", "do-not-leak")
    result = run_python(
        "import os, sys\nprint(os.getcwd())\nprint(sorted(os.environ))\nprint(sys.flags.isolated)\n"
        "print('/nonexistent-schooner-path' in sys.path)\n"
    )
    assert result.passed, result.stderr
    cwd, env, isolated, on_path = result.stdout.splitlines()
    assert os.path.basename(cwd).startswith("schooner-reward-")
    assert not os.path.exists(cwd)
    assert "SCHOONER_SECRET" not in env and "PYTHONPATH" not in env
    assert "OMP_NUM_THREADS" in env
    assert isolated == "1" and on_path == "False"


def _connect_program() -> str:
    return "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n"


def test_no_network() -> None:
    result = run_python(_connect_program())
    assert not result.passed
    if result.network == "namespace":
        # the namespace's loopback is down: even localhost is unreachable
        assert "Network is unreachable" in result.stderr or "Cannot assign" in result.stderr, result.stderr
    else:
        assert result.network == "socket-guard"
        assert "network access is disabled" in result.stderr


def test_socket_guard_where_namespaces_are_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(rewards, "_UNSHARE", [False])
    result = run_python(_connect_program())
    assert result.network == "socket-guard" and not result.passed
    assert "OSError: network access is disabled for this program" in result.stderr
    with pytest.raises(RuntimeError, match="unprivileged network namespace"):
        run_python("pass", CodeLimits(network="namespace"))


def test_code_tests_reward() -> None:
    reward = code_tests()
    tests = {"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"}
    good = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    slow = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    assert reward("p", good, tests) == 1.0
    assert reward("p", wrong, tests) == 0.0
    assert code_tests(limits=CodeLimits(timeout_s=1.0))("p", slow, tests) == 0.0
    assert reward("p", "def add(a, b):\n    return a + b\n", tests) == 1.0  # unfenced: all of it


def test_extract_code_takes_the_last_fence() -> None:
    assert extract_code("```\nfirst\n```\ntext\n```py\n  second\n```") == "second\n"
    assert extract_code("plain") == "plain"


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="memory_bytes must be a positive int, got memory_bytes=0"):
        CodeLimits(memory_bytes=0)
    with pytest.raises(ValueError, match="network must be"):
        CodeLimits(network="off")


# ---------------------------------------------------------------------------------------------- batches


def test_score_batch_counts_and_names_errors_and_never_raises() -> None:
    def reward(prompt: str, completion: str, fields) -> float:
        if completion == "boom":
            raise ZeroDivisionError("division by zero")
        if completion == "nan":
            return math.nan
        if completion == "text":
            return "1.0"  # type: ignore[return-value]
        return exact_answer()(prompt, completion, fields)

    completions = ["7", "boom", "8", "boom", "nan", "text", "7", "np"]
    fields = [{"answer": 7}, {}, {}, {}, {}, {}, {"answer": 6}, {"answer": 1}]
    fields[7] = {"answer": 1}
    completions[7] = "1"
    result = score_batch(
        reward, ["p"] * 8, completions, fields, row_ids=[f"r{i}" for i in range(8)], on_error=-1.0
    )
    assert result.rewards == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 0.0, 1.0]
    assert [(e.row, e.kind) for e in result.errors] == [
        ("r1", "ZeroDivisionError"),
        ("r2", "KeyError"),
        ("r3", "ZeroDivisionError"),
        ("r4", "ValueError"),
        ("r5", "ValueError"),
    ]
    assert str(result.errors[1]) == "row r2: KeyError: \"the row has no 'answer' field (it has [])\""
    assert result.error_counts() == {
        "ZeroDivisionError: division by zero": 2,
        "KeyError: \"the row has no 'answer' field (it has [])\"": 1,
        "ValueError: a reward must be a finite real number, got nan": 1,
        "ValueError: a reward must be a finite real number, got '1.0'": 1,
    }


def test_score_batch_accepts_numpy_scalars_and_default_ids() -> None:
    result = score_batch(lambda p, c, f: np.float32(0.5), ["a", "b"], ["x", "y"], [{}, {}])
    assert result.rewards == [0.5, 0.5] and result.errors == []
    failing = score_batch(lambda p, c, f: 1 / 0, ["a"], ["x"], [{}])
    assert failing.errors[0].row == "0"


def test_score_batch_checks_lengths() -> None:
    with pytest.raises(ValueError, match="one entry per row"):
        score_batch(exact_answer(), ["a", "b"], ["x"], [{}, {}])


def test_score_batch_in_threads_keeps_the_order_and_runs_programs_at_once() -> None:
    reward = code_tests(limits=CodeLimits(timeout_s=30))
    completions = [f"import time\ntime.sleep(1)\nx = {i}" for i in range(8)]
    fields = [{"tests": "assert x % 2 == 0"}] * 7 + [{}]
    serial = score_batch(reward, ["p"] * 8, completions, fields)
    start = time.perf_counter()
    threaded = score_batch(reward, ["p"] * 8, completions, fields, max_workers=8)
    assert time.perf_counter() - start < 6  # 8 one-second programs at once, not one after another
    assert threaded == serial
    assert serial.rewards == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert [(e.row, e.kind) for e in serial.errors] == [("7", "KeyError")]
    with pytest.raises(ValueError, match="max_workers must be >= 1"):
        score_batch(reward, ["p"], ["x"], [{}], max_workers=0)


# -- worked_answer: the steps checked, not just the answer -------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("9 - 4 = 5\n5 * 2 = 10\n#### 10", 10, 1.0),  # the tutorial's worked form
        ("8 / 2 = 4\n4 + 5 = 9\n#### 9", 9, 1.0),
        ("7 + 5 = 12\n#### 12\n", 12, 1.0),  # a trailing newline is fine
        ("Tom starts with 3.\n3 x 4 = 12.\n#### 12.", 12, 1.0),  # prose lines, x, periods
        ("9 - 4 = 5\n5 * 2 = 10\n#### 11", 10, 0.0),  # true steps, wrong answer
        ("12 - 4 = 9\n#### 8", 8, 0.0),  # a false step, lucky answer (what exact_answer rewards)
        ("8 / 3 = 4\n4 + 5 = 9\n#### 9", 9, 0.0),  # a false step among true ones (division is exact)
        ("7 / 2 = 3\n#### 3", 3, 0.0),
        (" 4\n#### 4", 4, 0.0),  # the answer alone
        ("#### 4", 4, 0.0),
        ("10\n#### 4 = 8\n#### 8", 8, 0.0),  # several answers
        ("4 + 4 = 8\n#### 8\n#### 8", 8, 0.0),
        ("10 = 2 = 9\n#### 9", 9, 0.0),  # a malformed step
        ("3 + 4 = 7\n#### 7 apples", 7, 0.0),  # something else on the answer line
        ("3 + 4 = 7\n#### 7\n3 + 4 = 7", 7, 0.0),  # text after the answer
        ("1 + 1 = 2\n#### 9", 9, 0.0),  # a true step that does not lead to the answer
        ("4 + 5 = 9", 9, 0.0),  # no answer line
        ("", 9, 0.0),
    ],
)
def test_worked_answer_credits_only_true_steps_that_lead_to_the_right_answer(completion, answer, expected):
    assert rewards.worked_answer()("prompt", completion, {"answer": answer}) == expected


def test_worked_answer_agrees_with_exact_answer_on_the_answer_and_names_a_missing_field() -> None:
    worked, exact = rewards.worked_answer(), rewards.exact_answer()
    good = "9 - 4 = 5\n5 * 2 = 10\n#### 10"
    for answer in range(8, 13):  # never credited where exact_answer says the answer is wrong
        assert worked("", good, {"answer": answer}) <= exact("", good, {"answer": answer})
    assert worked.fields == ("answer",) and worked.__name__ == "worked_answer[answer]"
    with pytest.raises(KeyError, match="'answer'"):
        worked("", good, {"solution": good})
    result = rewards.score_batch(worked, ["p", "p"], [good, good], [{"answer": 10}, {}])
    assert result.rewards == [1.0, 0.0] and [e.kind for e in result.errors] == ["KeyError"]


def test_worked_answer_pays_the_arithmetic_tasks_own_reference_solutions() -> None:
    """The task's reference solutions put each step after prose ("Noah gets 18 more: 12 + 18 = 30."); the
    step-checking reward pays every one of them, and a false step in the same form still scores 0."""
    from schooner.eval.arithmetic import arithmetic_problems
    from schooner.eval.rewards import worked_answer

    reward = worked_answer()
    for split in ("train", "heldout"):
        rows = list(arithmetic_problems(split, size=40))
        assert [reward("", r["solution"], r) for r in rows] == [1.0] * len(rows)
    row = {"answer": 30}
    assert reward("", "Noah gets 18 more: 12 + 18 = 30.\n#### 30", row) == 1.0
    assert reward("", "Noah gets 18 more: 12 + 18 = 31.\n#### 30", row) == 0.0
    assert reward("", "Noah = 18 more: 12 + 18 = 30.\n#### 30", row) == 0.0


# -- worked_answer(key=...): the steps must be the problem's own arithmetic ------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("8 - 4 = 4\n4 / 4 = 1\n#### 1", 1.0),  # the problem's amounts, in its order
        ("Ann has 4 fewer: 8 - 4 = 4.\nAnn keeps one of 4 equal groups: 4 / 4 = 1.\n#### 1", 1.0),
        # the loophole the RL run found (docs/rl.md): true steps on amounts the problem does not have
        ("8 - 3 = 5\n5 / 5 = 1\n#### 1", 0.0),
        ("8 - 4 = 4\n#### 4", 0.0),  # a step short (and the wrong answer)
        ("8 - 4 = 4\n4 / 4 = 1\n1 * 1 = 1\n#### 1", 0.0),  # a step more than the problem has
        ("4 - 8 = -4\n-4 / -4 = 1\n#### 1", 0.0),  # subtraction and division keep their order
        ("8 / 4 = 2\n2 - 1 = 1\n#### 1", 0.0),  # the problem's operations in another order
    ],
)
def test_worked_answer_with_a_key_pays_only_the_problems_own_steps(completion: str, expected: float) -> None:
    row = {"answer": 1, "key": "8-4/4"}
    assert rewards.worked_answer(key="key")("", completion, row) == expected
    # without the key, true steps that lead to the answer are enough: the loophole is the documented default
    assert rewards.worked_answer()("", "8 - 3 = 5\n5 / 5 = 1\n#### 1", row) == 1.0


def test_worked_answer_with_a_key_takes_addition_and_multiplication_either_way_round() -> None:
    reward = rewards.worked_answer(key="key")
    row = {"answer": 30, "key": "12+18"}
    assert reward("", "18 + 12 = 30\n#### 30", row) == 1.0
    assert reward("", "6 x 5 = 30\n#### 30", {"answer": 30, "key": "6*5"}) == 1.0
    assert reward("", "5 \u00d7 6 = 30\n#### 30", {"answer": 30, "key": "6*5"}) == 1.0
    assert reward("", "6 * 5 = 30\n#### 30", {"answer": 30, "key": "6+24"}) == 0.0  # another operation


def test_worked_answer_with_a_key_pays_every_reference_solution_and_names_its_fields() -> None:
    from schooner.eval.arithmetic import arithmetic_problems

    reward = rewards.worked_answer(key="key")
    assert reward.fields == ("answer", "key") and reward.__name__ == "worked_answer[answer,key]"
    for split in ("train", "heldout"):
        rows = list(arithmetic_problems(split, size=40))
        assert [reward("", r["solution"], r) for r in rows] == [1.0] * len(rows)
    with pytest.raises(KeyError, match="'key'"):
        reward("", "8 - 4 = 4\n#### 4", {"answer": 4})
    with pytest.raises(ValueError, match=r"key='8-x'.*e\.g\. '3\+4-2'"):
        reward("", "8 - 4 = 4\n#### 4", {"answer": 4, "key": "8-x"})


@pytest.mark.parametrize("key", ["8", "12"])
def test_worked_answer_refuses_a_key_without_operations(key: str) -> None:
    # a key of the start alone has no step to show, so no completion could be paid: every row scored 0.0 silently
    reward = rewards.worked_answer(key="key")
    with pytest.raises(ValueError, match=rf"key='{key}'.*no operation"):
        reward("", f"{key} + 0 = {key}\n#### {key}", {"answer": int(key), "key": key})
