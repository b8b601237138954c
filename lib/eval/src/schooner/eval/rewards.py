"""Verifiable rewards: functions of a prompt, a completion and the task row's fields, and a batch scorer.

A reward function is any callable `(prompt, completion, fields) -> float` (`RewardFn`): `fields` is the task
row (e.g. `{"answer": 42}` or `{"tests": "assert f(2) == 4"}`). Two are built in:

* `exact_answer()`: 1.0 when the completion's final number equals the row's answer, else 0.0
  (`extract_answer` states the parsing rules).
* `code_tests()`: 1.0 when the completion's code passes the row's tests, run by `run_python` in a fresh
  interpreter with time, memory and output limits, no network where the kernel allows it, its own temporary
  folder (removed afterwards) and its whole process group killed when it overruns.

`score_batch` scores a batch with any reward function and never lets one row crash the run: a row whose
function raises (or returns something that is not a finite number) gets `on_error` and is counted by name
(exception type, message and row id) in the result.

    >>> reward = exact_answer()
    >>> reward("Tom has 3 apples...", "3 + 4 = 7. The answer is 7.", {"answer": 7})
    1.0
    >>> extract_answer("so x = 1,234.50 dollars")
    '1,234.50'
    >>> parse_number("-1,234.50")
    Fraction(-2469, 2)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol


class RewardFn(Protocol):
    """A verifiable reward: the score of `completion` as an answer to `prompt`, given the task row's `fields`."""

    def __call__(self, prompt: str, completion: str, fields: Mapping[str, Any], /) -> float: ...


# ---------------------------------------------------------------------------------------------- numbers

_NUMBER = re.compile(
    r"(?<![\w.])"  # not inside a word or after a decimal point: "x2", "v1.2" and "10-2"'s "-2" are not numbers
    r"[-+\u2212]?"  # sign: ASCII minus/plus or the Unicode minus sign
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"  # 1,234,567 (groups of exactly three) or 1234567, then .5
    r"|(?<![\w.])[-+\u2212]?\.\d+"  # .5
)
_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE)


def _boxed_contents(text: str) -> list[str]:
    """The contents of each `\\boxed{...}` in `text` (nested braces balanced), in order."""
    out = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start:i])
                break
    return out


def _first_number(text: str) -> str | None:
    match = _NUMBER.search(text.replace("$", ""))
    return match.group(0) if match else None


def extract_answer(text: str) -> str | None:
    """The final numeric answer of a completion, as written (None when it holds no number).

    The rules, first that applies wins:

    1. the last `\\boxed{...}` holding a number: the first number inside it (`\\boxed{42}`, `\\boxed{-3.5}`);
    2. the last `#### ...` line holding a number (GSM8K's marker): the first number after the marks;
    3. the last "answer is ...", "answer: ..." or "answer = ..." (any case) followed by a number on the same
       line: the first number after it ("The answer is 42 apples." -> "42");
    4. otherwise the last number anywhere in the text.

    A number is an optional sign (`-`, `+` or the Unicode minus `\u2212`), digits that may be grouped by
    commas in threes (`1,234,567`; "1,2" is two numbers), and an optional decimal part (`3.25`, `.5`). A `$`
    is ignored. A number never starts inside a word or right after a digit or a point, so "x2" holds none,
    "v1.2" none and "10-2" the numbers 10 and 2 (a hyphen between digits is not a sign). Fractions (`3/4`),
    scientific notation and words ("seven") are not parsed: "3/4" reads as 3 and 4.
    """
    for contents in reversed(_boxed_contents(text)):
        if (number := _first_number(contents)) is not None:
            return number
    for pattern in (_HASHES, _ANSWER_IS):
        for match in reversed(list(pattern.finditer(text))):
            if (number := _first_number(match.group(1))) is not None:
                return number
    found = _NUMBER.findall(text.replace("$", ""))
    return found[-1] if found else None


def parse_number(text: str) -> Fraction:
    """The exact value of one number written as `extract_answer` reads them (`"1,234.50"` -> 2469/2).

    Raises:
        ValueError: `text` (stripped, `$` removed) is not exactly one such number.
    """
    cleaned = text.strip().replace("$", "")
    match = _NUMBER.fullmatch(cleaned)
    if match is None:
        raise ValueError(
            f"not a number: {text!r}; write digits with an optional sign, thousands commas and decimal part "
            "(e.g. '-1,234.5')"
        )
    return Fraction(cleaned.replace(",", "").replace("\u2212", "-"))


def _gold_value(answer: Any) -> Fraction:
    if isinstance(answer, bool):
        raise TypeError(f"the answer field must be a number or a numeric string, got the bool {answer!r}")
    if isinstance(answer, int):
        return Fraction(answer)
    if isinstance(answer, float):
        if not math.isfinite(answer):
            raise ValueError(f"the answer field must be finite, got {answer!r}")
        return Fraction(repr(answer))  # 0.1 means the decimal 0.1, not the nearest double
    if isinstance(answer, str):
        return parse_number(answer)
    raise TypeError(f"the answer field must be a number or a numeric string, got {type(answer).__name__}")


def exact_answer(field: str = "answer") -> RewardFn:
    """A reward of 1.0 when the completion's final number (`extract_answer`) equals `fields[field]`, else 0.0.

    Values are compared exactly as decimals: "42", "42.0", "+42" and "$42" all equal the answer 42, and
    "1,000" equals 1000. A completion with no number scores 0.0. A row without the field, or whose answer is
    not a number, raises (`score_batch` counts it and names the row). The function's `fields` attribute,
    `(field,)`, names what each row must hold: an RL run checks its prompts file for it before it starts.
    """

    def reward(prompt: str, completion: str, fields: Mapping[str, Any], /) -> float:
        if field not in fields:
            raise KeyError(f"the row has no {field!r} field (it has {sorted(fields)})")
        gold = _gold_value(fields[field])
        found = extract_answer(completion)
        return 1.0 if found is not None and parse_number(found) == gold else 0.0

    reward.__name__ = reward.__qualname__ = f"exact_answer[{field}]"
    reward.fields = (field,)  # type: ignore[attr-defined]  # what each row must hold (an RL run checks it)
    return reward


_STEP_LINE = re.compile(r"(?:[^=:]*:)?\s*([-+]?\d+)\s*([-+*/x\u00d7])\s*([-+]?\d+)\s*=\s*([-+]?\d+)\s*\.?\s*")
_ANSWER_LINE = re.compile(r"\s*####\s*([-+]?\d+)\s*\.?\s*")


def _step_true(a: str, op: str, b: str, c: str) -> bool:
    x, y, z = Fraction(int(a)), Fraction(int(b)), Fraction(int(c))
    if op == "+":
        return x + y == z
    if op == "-":
        return x - y == z
    if op in ("*", "x", "\u00d7"):
        return x * y == z
    return y != 0 and x / y == z


_KEY = re.compile(r"(\d+)((?:[-+*/]\d+)*)")
_KEY_OP = re.compile(r"([-+*/])(\d+)")
_OP_NAME = {"+": "+", "-": "-", "*": "*", "x": "*", "\u00d7": "*", "/": "/"}


def _key_steps(key: Any, field: str) -> tuple[int, list[tuple[str, int]]]:
    """The start and `(op, operand)`s of an arithmetic key (`schooner.eval.arithmetic.problem_key`)."""
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise ValueError(
            f"{field}={key!r} is not an arithmetic key: write the start and each operation (one of + - * /, "
            "no spaces), e.g. '3+4-2' (`schooner.eval.arithmetic.problem_key`)"
        )
    if not match.group(2):
        raise ValueError(
            f"{field}={key!r} has no operation, so no worked step could follow it: write the start and each "
            "operation, e.g. '3+4-2' (`schooner.eval.arithmetic.problem_key`)"
        )
    return int(match.group(1)), [(op, int(n)) for op, n in _KEY_OP.findall(match.group(2))]


def _follows_key(steps: Sequence[tuple[str, ...]], start: int, ops: list[tuple[str, int]]) -> bool:
    """Whether the steps are the key's operations in its order, each on the previous step's result (the
    first on the start); `+` and `*` either way round."""
    if len(steps) != len(ops):
        return False
    value = start
    for (a, op, b, c), (want, operand) in zip(steps, ops, strict=True):
        x, y = int(a), int(b)
        if _OP_NAME[op] != want:
            return False
        if (x, y) != (value, operand) and not (want in "+*" and (y, x) == (value, operand)):
            return False
        value = int(c)
    return True


def worked_answer(field: str = "answer", *, key: str | None = None) -> RewardFn:
    r"""A reward of 1.0 for a completion that shows true integer arithmetic leading to the right answer.

    A completion earns 1.0 only when all of these hold, else 0.0:

    * it has exactly one answer line, `#### n` (nothing else on it but an optional period), and `n` equals
      `fields[field]`;
    * at least one worked step before it, each a line `a op b = c` (integers; `op` one of `+ - * / x` or
      `\u00d7`; an optional period), optionally after prose ending in a colon (`Noah gets 18 more: 12 + 18 =
      30.`, the form of `schooner.eval.arithmetic`'s reference solutions), whose arithmetic is true (`/`
      exactly: `7 / 2 = 3` is false);
    * every line before the answer that holds `=` is such a true step (a line like `10 = 2 = 9` fails), and
      nothing but blank lines follows the answer;
    * the last step's result is the answer (the steps lead to it).

    Lines without `=` before the answer (prose) are allowed. So the answer alone (`#### 4`), several answers
    (`#### 4 = 8` / `#### 8`), a false step (`12 - 4 = 9` / `#### 8`), or a true step unrelated to the
    answer all score 0: the answer-only parse of `exact_answer` rewards those when the number is right. A row
    without the field raises (`score_batch` counts it); `fields` names it, as for `exact_answer`.

    Without `key`, true steps that lead to the answer are enough, whatever amounts they use: `8 - 3 = 5` /
    `5 / 5 = 1` / `#### 1` is paid for a problem whose arithmetic is `8 - 4 = 4` / `4 / 4 = 1` (an RL run
    found this, 2 of 1,600 completions: docs/rl.md). With `key` (the name of a field holding the problem's
    arithmetic as `schooner.eval.arithmetic` writes it, `"8-4/4"`), the steps must also be exactly the key's
    operations in its order, the first on the start and each on the previous step's result (`+` and `*`
    either way round); a row whose key field is missing raises `KeyError`, one that is not such a key (or has
    no operation) `ValueError`.

        >>> strict = worked_answer(key="key")
        >>> row = {"answer": 1, "key": "8-4/4"}
        >>> strict("", "8 - 4 = 4\n4 / 4 = 1\n#### 1", row), strict("", "8 - 3 = 5\n5 / 5 = 1\n#### 1", row)
        (1.0, 0.0)

        >>> reward = worked_answer()
        >>> reward("", "9 - 4 = 5\n5 * 2 = 10\n#### 10", {"answer": 10})
        1.0
        >>> reward("", "9 - 4 = 6\n6 * 2 = 12\n#### 10", {"answer": 10}), reward("", "#### 10", {"answer": 10})
        (0.0, 0.0)
    """

    def reward(prompt: str, completion: str, fields: Mapping[str, Any], /) -> float:
        if field not in fields:
            raise KeyError(f"the row has no {field!r} field (it has {sorted(fields)})")
        gold = _gold_value(fields[field])
        if key is not None and key not in fields:
            raise KeyError(f"the row has no {key!r} field (it has {sorted(fields)})")
        plan = _key_steps(fields[key], key) if key is not None else None
        lines = completion.split("\n")
        answers = [i for i, line in enumerate(lines) if "####" in line]
        if len(answers) != 1:
            return 0.0
        end = answers[0]
        final = _ANSWER_LINE.fullmatch(lines[end])
        if final is None or Fraction(int(final.group(1))) != gold or any(x.strip() for x in lines[end + 1 :]):
            return 0.0
        steps = []
        for line in lines[:end]:
            if "=" not in line:
                continue
            step = _STEP_LINE.fullmatch(line)
            if step is None or not _step_true(*step.groups()):
                return 0.0
            steps.append(step.groups())
        if not steps or Fraction(int(steps[-1][3])) != gold:
            return 0.0
        return 1.0 if plan is None or _follows_key(steps, *plan) else 0.0

    fields = (field,) if key is None else (field, key)
    reward.__name__ = reward.__qualname__ = f"worked_answer[{','.join(fields)}]"
    reward.fields = fields  # type: ignore[attr-defined]  # what each row must hold (an RL run checks it)
    return reward


# ----------------------------------------------------------------------------------------------- code


@dataclasses.dataclass(frozen=True)
class CodeLimits:
    """What a program run by `run_python` may use.

    Attributes:
        timeout_s: wall-clock seconds before its whole process group is killed (SIGKILL).
        cpu_s: CPU seconds (RLIMIT_CPU; the kernel sends SIGXCPU, then SIGKILL).
        memory_bytes: address space (RLIMIT_AS): an allocation beyond it fails with MemoryError.
        output_bytes: largest file it may write, its captured stdout and stderr included (RLIMIT_FSIZE).
        network: "auto" (a private network namespace when the kernel allows an unprivileged one, else
            `socket` disabled in the interpreter, recorded in the result), "namespace" (required: an error
            when unavailable) or "allow".
    """

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    output_bytes: int = 1 << 20
    network: str = "auto"

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"CodeLimits: timeout_s must be > 0, got timeout_s={self.timeout_s!r}")
        for name in ("cpu_s", "memory_bytes", "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CodeLimits: {name} must be a positive int, got {name}={value!r}")
        if self.network not in ("auto", "namespace", "allow"):
            raise ValueError(
                f"CodeLimits: network must be 'auto', 'namespace' or 'allow', got network={self.network!r}"
            )


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """How a program run by `run_python` ended.

    Attributes:
        passed: it exited with status 0 within its limits.
        returncode: its exit status (negative: killed by that signal; None: killed at the timeout).
        timed_out: it ran past `timeout_s` and its process group was killed.
        stdout: what it printed (at most `output_bytes`).
        stderr: its error output (the traceback of a failing test, "MemoryError", ...).
        network: how network access was cut: "namespace", "socket-guard" or "allowed".
        seconds: wall-clock time it ran.
    """

    passed: bool
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    network: str
    seconds: float


# The limits are set by the child itself before the program runs (not in a `preexec_fn`, which is unsafe in a
# process with threads, as a JAX trainer is): soft and hard limits both, so the program cannot raise them.
_BOOTSTRAP = """\
import resource, sys
for name, value in ((resource.RLIMIT_AS, {memory}), (resource.RLIMIT_CPU, {cpu}), (resource.RLIMIT_FSIZE, {fsize})):
    resource.setrlimit(name, (value, value))
if {guard}:
    import socket
    def _no_network(*args, **kwargs):
        raise OSError("network access is disabled for this program")
    socket.socket = socket.create_connection = socket.socketpair = socket.getaddrinfo = _no_network
    del socket, _no_network
del resource
sys.argv = ["main.py"]
__file__ = "main.py"
with open("main.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code)
"""

# BLAS and OpenMP runtimes reserve address space per thread (RLIMIT_AS counts it) and would oversubscribe the
# cores when many programs run at once: one thread each.
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}

_UNSHARE: list[bool] = []  # cached answer of _network_namespace_available


def _network_namespace_available() -> bool:
    """Whether `unshare --net --map-root-user` works here (unprivileged user namespaces enabled)."""
    if not _UNSHARE:
        unshare = shutil.which("unshare")
        ok = False
        if unshare and sys.platform.startswith("linux"):
            try:
                ok = (
                    subprocess.run(
                        [unshare, "--net", "--map-root-user", "true"], capture_output=True, timeout=10
                    ).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _UNSHARE.append(ok)
    return _UNSHARE[0]


def run_python(code: str, limits: CodeLimits = CodeLimits()) -> CodeResult:
    """Run `code` as `main.py` in a fresh, isolated Python interpreter under `limits`.

    The program runs in a new temporary folder (its working directory and `HOME`, removed afterwards, whatever
    happens) with `python -I` (no user site-packages, no `PYTHON*` variables, not the caller's folder on
    `sys.path`) and an environment holding only `PATH`, `HOME`, `TMPDIR`, `LANG` and one thread for BLAS and
    OpenMP (`OMP_NUM_THREADS=1`, ...). Memory (RLIMIT_AS: address space, which counts more than resident
    memory; a program importing numpy needs a few hundred MB of it), CPU time (RLIMIT_CPU) and file size
    (RLIMIT_FSIZE, which also caps the captured output) are limited by the kernel. It starts a session of its own, so it and every process it forks share one process group, which is
    killed with SIGKILL at the timeout and again when the program ends (a forked child left running dies with
    it). A process that starts a new session of its own (`os.setsid`) leaves the group: a sandbox (a container,
    bubblewrap, nsjail) is the answer for untrusted code meant to escape, which these limits do not stop.

    Network: on Linux with unprivileged user namespaces (the usual default; `kernel.unprivileged_userns_clone`
    on Debian, `user.max_user_namespaces` > 0), the program runs under `unshare --net --map-root-user` in a
    network namespace holding only a down loopback device: no connection can leave it, whatever the program
    does. Without them (`network="auto"`), Python's `socket` constructors are replaced by a function that
    raises, which stops ordinary library code but not a program that works around it (e.g. via `ctypes`);
    the result's `network` field says which applied.

    Args:
        code: the program (e.g. a solution followed by its tests, which fail by raising).
        limits: time, memory, CPU and output limits and the network policy.
    """
    namespace = limits.network != "allow" and _network_namespace_available()
    if limits.network == "namespace" and not namespace:
        raise RuntimeError(
            "CodeLimits(network='namespace'): this machine does not allow an unprivileged network namespace "
            "(`unshare --net --map-root-user true` fails); enable user namespaces or use network='auto'"
        )
    network = "namespace" if namespace else ("allowed" if limits.network == "allow" else "socket-guard")
    bootstrap = _BOOTSTRAP.format(
        memory=limits.memory_bytes,
        cpu=limits.cpu_s,
        fsize=limits.output_bytes,
        guard=network == "socket-guard",
    )
    folder = tempfile.mkdtemp(prefix="schooner-reward-")
    try:
        with open(os.path.join(folder, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        argv = [sys.executable, "-I", "-c", bootstrap]
        if namespace:
            argv = ["unshare", "--net", "--map-root-user", *argv]
        env = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8", **_ONE_THREAD}
        out_path, err_path = os.path.join(folder, ".stdout"), os.path.join(folder, ".stderr")
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            timed_out = False
            try:
                returncode: int | None = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, returncode = True, None
            finally:
                _kill_group(proc)
        seconds = time.perf_counter() - start
        stdout, stderr = (_read_capped(p, limits.output_bytes) for p in (out_path, err_path))
        return CodeResult(
            passed=returncode == 0 and not timed_out,
            returncode=returncode,
            timed_out=timed_out,
            stdout=stdout,
            stderr=stderr,
            network=network,
            seconds=seconds,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the program's whole process group (the program and everything it forked) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_capped(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The code of a completion: its last fenced block (```python ... ```, or an unlabeled fence), else all of it."""
    blocks = _FENCE.findall(completion)
    return textwrap.dedent(blocks[-1] if blocks else completion)


def code_tests(field: str = "tests", limits: CodeLimits = CodeLimits()) -> RewardFn:
    """A reward of 1.0 when the completion's code (`extract_code`) followed by `fields[field]` runs cleanly.

    The tests are Python statements that raise on failure (`assert add(2, 2) == 4`); the program is the code,
    a blank line, then the tests, run by `run_python` under `limits`. Any failure (a raising test, a syntax
    error, the time or memory limit) scores 0.0: these are the policy's mistakes, not reward errors. A row
    without the field raises (`score_batch` counts it and names the row). The function's `fields` attribute,
    `(field,)`, names what each row must hold (an RL run checks its prompts file for it).
    """

    def reward(prompt: str, completion: str, fields: Mapping[str, Any], /) -> float:
        if field not in fields:
            raise KeyError(f"the row has no {field!r} field (it has {sorted(fields)})")
        tests = fields[field]
        if not isinstance(tests, str):
            raise TypeError(
                f"the {field!r} field must be a string of Python statements, got {type(tests).__name__}"
            )
        return 1.0 if run_python(f"{extract_code(completion)}\n\n{tests}\n", limits).passed else 0.0

    reward.__name__ = reward.__qualname__ = f"code_tests[{field}]"
    reward.fields = (field,)  # type: ignore[attr-defined]  # what each row must hold (an RL run checks it)
    return reward


# ---------------------------------------------------------------------------------------------- batches


@dataclasses.dataclass(frozen=True)
class RewardError:
    """A row whose reward function failed.

    Attributes:
        row: the row's id (as given to `score_batch`, else its index in the batch).
        kind: the exception's type name ("KeyError"), or "ValueError" for a non-finite or non-number result.
        message: the exception's message.
    """

    row: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.kind}: {self.message}"


@dataclasses.dataclass(frozen=True)
class BatchRewards:
    """The rewards of a batch and the rows whose reward failed.

    Attributes:
        rewards: one reward per row, in order (`on_error` for a failed row).
        errors: the failed rows, in order.
    """

    rewards: list[float]
    errors: list[RewardError]

    def error_counts(self) -> dict[str, int]:
        """How many rows failed with each `"Kind: message"`, most frequent first."""
        return dict(Counter(f"{e.kind}: {e.message}" for e in self.errors).most_common())


def score_batch(
    reward_fn: RewardFn | Callable[[str, str, Mapping[str, Any]], float],
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Sequence[Mapping[str, Any]],
    *,
    row_ids: Sequence[str] | None = None,
    on_error: float = 0.0,
    max_workers: int = 1,
) -> BatchRewards:
    """Score each (prompt, completion, fields) row with `reward_fn`; a failing row never stops the batch.

    A row whose function raises an `Exception`, or returns something other than a finite real number, gets
    `on_error` and a `RewardError` naming its id, the exception's type and its message. (KeyboardInterrupt
    and SystemExit are not caught: stopping the run is the user's call.)

    Args:
        reward_fn: the reward function.
        prompts, completions, fields: the rows, one entry each (the same length).
        row_ids: each row's id in error reports (default: its index in the batch).
        on_error: the reward of a failed row.
        max_workers: rows scored at once, in threads (the results keep the rows' order). Worth it for
            rewards that wait on a subprocess, as `code_tests` does; the function must then be thread-safe.

    Raises:
        ValueError: the sequences differ in length, or `max_workers < 1`.
    """
    n = len(prompts)
    lengths = {"prompts": n, "completions": len(completions), "fields": len(fields)}
    if row_ids is not None:
        lengths["row_ids"] = len(row_ids)
    if len(set(lengths.values())) != 1:
        raise ValueError(f"score_batch: one entry per row in each sequence, got lengths {lengths}")
    ids = [str(i) for i in range(n)] if row_ids is None else [str(r) for r in row_ids]
    if max_workers < 1:
        raise ValueError(f"score_batch: max_workers must be >= 1, got max_workers={max_workers!r}")

    def one(i: int) -> float | RewardError:
        try:
            value = reward_fn(prompts[i], completions[i], fields[i])
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"a reward must be a finite real number, got {value!r}")
            return float(value)
        except Exception as e:  # noqa: BLE001 - any failure of a user's reward is counted, never fatal
            return RewardError(ids[i], type(e).__name__, str(e))

    if max_workers == 1 or n < 2:
        outcomes = [one(i) for i in range(n)]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(max_workers, n)) as pool:
            outcomes = list(pool.map(one, range(n)))
    rewards = [on_error if isinstance(o, RewardError) else o for o in outcomes]
    return BatchRewards(rewards, [o for o in outcomes if isinstance(o, RewardError)])
