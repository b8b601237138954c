"""`schooner explain STEP [EXPERIMENT.py]`: the steps a name or regex picks, each explained."""

from __future__ import annotations

import contextlib
import re

from schooner.cluster.runner._lower import Step
from schooner.cluster.runner._version import ConfigError

from ._explain import Explanation, explain_records, explain_step
from ._versions import known_names

MAX_EXPLAINED = 10
"""At most this many steps are explained for one pattern."""


def explain_recorded(prefix: str, pattern: str) -> list[Explanation]:
    """Why the recorded step named `pattern` changed between its two latest versions (without the experiment
    file); when no step has that name, every recorded step whose name matches it as a regex.

    Raises:
        LookupError: nothing under `prefix` matches; the message lists the steps there.
    """
    expl = explain_records(prefix, pattern)
    found = [expl] if expl is not None else []
    known: list[str] = []
    if not found:
        known = known_names(prefix)
        with contextlib.suppress(re.error):
            found = [e for n in known if re.search(pattern, n) for e in [explain_records(prefix, n)] if e]
    if not found:
        listed = ", ".join(known[:30]) or "none"
        raise LookupError(
            f"no recorded step named {pattern!r} under {prefix} (steps there: {listed}); pass the "
            "experiment file to explain a step that has not run yet"
        )
    return found[:MAX_EXPLAINED]


def explain_planned(steps: list[Step], prefix: str, pattern: str, experiment: str) -> list[Explanation]:
    """Why each of the experiment's steps named `pattern` (else matching it as a regex) would run or be
    reused under `prefix`.

    Raises:
        ConfigError: `pattern` names no step of the experiment (or is neither a name nor a valid regex);
            the message lists its steps.
    """
    by_key = {s.key: s for s in steps}
    names = ", ".join(sorted({s.name for s in steps})[:30])
    try:
        matches = [s for s in steps if s.name == pattern] or [s for s in steps if re.search(pattern, s.name)]
    except re.error as e:
        raise ConfigError(
            f"{pattern!r} is no step name of {experiment} and not a valid regular expression ({e}); "
            f"its steps: {names}"
        ) from None
    if not matches:
        raise ConfigError(f"no step named {pattern!r} in {experiment}; its steps: {names}")
    return [explain_step(s, prefix, by_key) for s in matches[:MAX_EXPLAINED]]
