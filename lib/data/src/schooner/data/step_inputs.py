"""What data steps take as inputs and how a running step reads them: step handles, paths, globs and URLs
as step inputs, and pipeline functions stored by name.

The step builders of every package that reads record folders (`schooner.data.steps`,
`schooner.data.curation.steps`, `schooner.tokenize.steps`) turn what a user passes into step inputs here.

Example:
    >>> as_step_inputs([])
    Traceback (most recent call last):
    ...
    ValueError: inputs is empty; give record folders, files, globs, URLs or step handles
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from schooner.cluster import InputFiles, InputPath, StepHandle


def as_step_inputs(items: Any, *, what: str = "inputs") -> list[Any]:
    """Step inputs from what a user passes: handles (and `handle / "sub"`) stay, paths, globs and URLs become
    `InputFiles`, keyed by their content (relative names, sizes, hashes), never by where they sit: moving a
    folder reruns nothing, editing a file reruns the steps that read it.

    Example:
        >>> as_step_inputs([], what="transform inputs")
        Traceback (most recent call last):
        ...
        ValueError: transform inputs is empty; give record folders, files, globs, URLs or step handles
    """
    if isinstance(items, str | StepHandle | InputPath | InputFiles) or not isinstance(items, Sequence):
        items = [items]
    if not items:
        raise ValueError(f"{what} is empty; give record folders, files, globs, URLs or step handles")
    return [InputFiles(os.fspath(x)) if isinstance(x, str | os.PathLike) else x for x in items]


def input_locations(inputs: Sequence[Any]) -> list[str]:
    """The paths a running step reads: its inputs as resolved by the runner, `InputFiles` as the patterns
    they were given (absolute), so a record folder is read as a folder."""
    out: list[str] = []
    for x in inputs:
        out.extend(x.patterns if isinstance(x, InputFiles) else [x])
    return out


def function_path(fn: Callable[..., Any] | str) -> str:
    """`"package.module:function"` for a module-level function (what a step config stores).

    Example:
        >>> from schooner.data.pipelines import length_filter
        >>> function_path(length_filter)
        'schooner.data.pipelines:length_filter'
    """
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"pipeline={fn!r} must look like 'package.module:function'")
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise ValueError(
            f"pipeline={fn!r} must be a module-level function of an importable module (not a lambda, a nested "
            "function or a __main__ function): steps store it by name so workers can import it"
        )
    return f"{module}:{qualname}"


def resolve_function(path: str) -> Callable[..., Any]:
    """The function named by `function_path`."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
