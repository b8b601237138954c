"""Step keys note code: the body of a helper a step's function calls, and of a transform in its config.

The experiment and its helpers are real files in a temporary folder, run as scripts in fresh interpreters
(with different hash seeds), as a user reruns an experiment after editing a helper: the edited step runs
again under a new key, every step downstream of it too, and an unchanged (or merely reformatted) file keeps
every key, so the cache holds across processes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schooner.cluster import code_fingerprint, step
from schooner.cluster.runner._version import canonicalize

HELPERS = textwrap.dedent("""
    import os

    SCALE = 2
    VERBOSE = os.environ.get("HELPERS_VERBOSE", "")


    def scale(x):
        if VERBOSE:
            print("scaling", x)
        return x * SCALE


    def double(x):
        return x * 2
""")

UTILS = textwrap.dedent("""
    def offset(x):
        return x + 1
""")

EXPERIMENT = textwrap.dedent("""
    import json
    import os
    import sys
    from dataclasses import dataclass

    import utils
    from helpers import double, scale
    from schooner.cluster import StepRunner, step


    @dataclass(frozen=True)
    class Cfg:
        n: int
        transform: object = None
        upstream: object = None


    def compute(config, out):
        value = utils.offset(scale(config.n))
        if config.transform is not None:
            value = config.transform(value)
        with open(os.path.join(out, "value.txt"), "w") as f:
            f.write(str(value))
        return value


    def plain(config, out):
        return config.n


    def plus(config, out):
        with open(os.path.join(config.upstream, "value.txt")) as f:
            return config.n + int(f.read())


    first = step("first", compute, Cfg(3, transform=double))
    second = step("second", plus, Cfg(4, upstream=first))
    alone = step("alone", plain, Cfg(5))
    result = StepRunner(prefix=sys.argv[1]).run([second, alone])
    print(json.dumps({o.name: [o.key, o.state, o.result] for o in result.steps}))
""")


def _run(folder: Path, prefix: Path, seed: str, **extra: str) -> dict[str, list[Any]]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONDONTWRITEBYTECODE": "1", **extra}
    proc = subprocess.run(
        [sys.executable, "exp.py", str(prefix)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_editing_a_helper_or_a_transform_reruns_the_step_and_everything_downstream(tmp_path: Path) -> None:
    folder, prefix = tmp_path / "exp", tmp_path / "out"
    folder.mkdir()
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "utils.py").write_text(UTILS)
    (folder / "exp.py").write_text(EXPERIMENT)

    first = _run(folder, prefix, "1")
    assert {k: v[1:] for k, v in first.items()} == {
        "first": ["succeeded", 14],  # double(offset(scale(3))) = (3*2 + 1) * 2
        "second": ["succeeded", 18],
        "alone": ["succeeded", 5],
    }
    keys = {k: v[0] for k, v in first.items()}

    # Unchanged files, another interpreter and hash seed, a knob read from the environment into a module
    # constant (how, not what, the code computes): every key holds, everything is reused.
    again = _run(folder, prefix, "2", HELPERS_VERBOSE="1")
    assert {k: v[0] for k, v in again.items()} == keys
    assert {v[1] for v in again.values()} == {"cached"}

    # Reformatting and comments are not code: still reused.
    _edit(folder / "helpers.py", "def scale(x):\n", "\n\n# a comment\ndef scale(x):  # scales\n\n")
    assert {v[1] for v in _run(folder, prefix, "3").values()} == {"cached"}

    # The body of a helper the step's function calls directly.
    _edit(folder / "helpers.py", "return x * SCALE", "return x * SCALE + 0 * 1 - 1")
    edited = _run(folder, prefix, "4")
    assert edited["first"][1:] == ["succeeded", 12] and edited["first"][0] != keys["first"]
    assert edited["second"][1:] == ["succeeded", 16] and edited["second"][0] != keys["second"]  # downstream
    assert edited["alone"] == [keys["alone"], "cached", 5]  # its code did not change
    keys = {k: v[0] for k, v in edited.items()}

    # A module-level constant the helper reads.
    _edit(folder / "helpers.py", "SCALE = 2", "SCALE = 3")
    assert _run(folder, prefix, "5")["first"][1:] == ["succeeded", 18]  # (3*3 - 1 + 1) * 2

    # A function reached through a module attribute (`utils.offset`).
    _edit(folder / "utils.py", "return x + 1", "return x + 2")
    assert _run(folder, prefix, "6")["first"][1:] == ["succeeded", 20]

    # The body of a transform callable held in the step's config.
    _edit(folder / "helpers.py", "return x * 2\n", "return x * 4\n")
    last = _run(folder, prefix, "7")
    assert last["first"][1:] == ["succeeded", 40] and last["second"][1] == "succeeded"
    assert last["alone"] == [keys["alone"], "cached", 5]
    assert _run(folder, prefix, "8") == {k: [v[0], "cached", v[2]] for k, v in last.items()}


# -- in-process properties of code fingerprints ----------------------------------------------------------

CALLS: list[str] = []
_lock = threading.Lock()
_log = logging.getLogger(__name__)
LIMITS = (1, 2)


def counting(config: Any, out: str) -> None:
    with _lock:
        CALLS.append(out)
    _log.info("ran %s", out)
    return None


def test_mutable_module_state_does_not_change_a_key() -> None:
    """Caches, counters and locks a step function touches change while a program runs; keys must not."""
    before = step("c", counting, {"n": 1})
    CALLS.extend(["a", "b"])
    assert step("c", counting, {"n": 1}).key == before.key


def reads_limits(config: Any, out: str) -> int:
    return LIMITS[0]


def test_module_values_count_by_their_assignment_not_their_runtime_value(monkeypatch) -> None:
    """`LIMITS = (1, 2)` is keyed by that statement: a value patched at run time (like one read from the
    environment) is not code; the subprocess test above edits such a statement and sees the key change."""
    before = code_fingerprint(reads_limits)
    monkeypatch.setattr(sys.modules[__name__], "LIMITS", (5, 2))
    assert code_fingerprint(reads_limits) == before
    monkeypatch.setattr(sys.modules[__name__], "UNASSIGNED", (5, 2), raising=False)

    def reads_unassigned(config: Any, out: str) -> int:
        return UNASSIGNED[0]  # type: ignore[name-defined]  # noqa: F821

    one = code_fingerprint(reads_unassigned)
    monkeypatch.setattr(sys.modules[__name__], "UNASSIGNED", (6, 2))
    assert code_fingerprint(reads_unassigned) != one  # no statement assigns it: its (immutable) value counts


def reads_an_attribute(config: Any, out: str) -> int:
    return config.parts + len(out.split("/"))


def test_an_attribute_name_is_not_a_global_the_function_reads(monkeypatch) -> None:
    """`config.parts` reads an attribute: a module-level `parts` (here a global no statement assigns, so its
    value would count) is not something the function uses, and changing it (or a secret on the statement
    that assigns it) must not move the key. Names come from the bytecode's global loads, not `co_names`."""
    monkeypatch.setattr(sys.modules[__name__], "parts", 1, raising=False)
    monkeypatch.setattr(sys.modules[__name__], "split", "a", raising=False)
    before = code_fingerprint(reads_an_attribute)
    monkeypatch.setattr(sys.modules[__name__], "parts", 2)
    monkeypatch.setattr(sys.modules[__name__], "split", "b")
    assert code_fingerprint(reads_an_attribute) == before


@dataclass(frozen=True)
class Scaler:
    factor: int

    def __call__(self, x: int) -> int:
        return x * self.factor


def test_callable_config_objects_carry_their_class_code_and_library_callables_only_their_name() -> None:
    canon = canonicalize({"t": Scaler(2), "lib": json.dumps})
    assert canon["t"]["__code__"] == code_fingerprint(Scaler) and canon["t"]["factor"] == 2
    assert canon["lib"] == {"__callable__": "json:dumps"}
    assert code_fingerprint(json.dumps) is None and code_fingerprint(pytest.raises) is None


def recursive(n: int) -> int:
    return 1 if n <= 1 else n * recursive(n - 1)


def test_recursion_and_unfingerprintable_values_still_give_a_stable_key(caplog) -> None:
    assert code_fingerprint(recursive) == code_fingerprint(recursive)
    holder = _Opaque()

    def uses(config: Any, out: str) -> Any:
        return holder.value

    with caplog.at_level(logging.WARNING, logger="schooner.cluster"):
        a, b = code_fingerprint(uses), code_fingerprint(uses)
    assert a == b


class _Opaque:
    __slots__ = ()

    @property
    def value(self) -> int:
        return 1


def writes_one(config: Any, out: str) -> int:
    return 1


def writes_two(config: Any, out: str) -> int:
    return 2


def test_explain_names_a_code_change_as_the_reason_for_a_new_key(tmp_path: Path) -> None:
    from schooner.cluster import StepRunner, lower
    from schooner.cluster.views._explain import explain_step

    prefix = str(tmp_path / "out")
    first = step("w", writes_one, {"n": 1})
    assert StepRunner(prefix=prefix).run([first]).ok
    edited = step("w", writes_two, {"n": 1})  # the same step after its function's body was edited
    (low,) = lower(edited)
    why = explain_step(low, prefix)
    assert why.verdict == "will run" and [c.path for c in why.changes] == ["code"]
    assert why.changes[0].old == first.code and why.changes[0].new == edited.code != first.code
