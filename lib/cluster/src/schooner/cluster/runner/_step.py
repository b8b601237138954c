"""Lazy step handles: what a step builder returns, and how a graph of them is lowered into runnable steps.

Nothing runs when a handle is built. Building one computes its version key at once (so a config that
cannot be serialised fails on the line of the experiment that builds it, naming the step and field).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, overload

from schooner.cluster._resources import ResourceConfig

from ._version import (
    RUNTIME_META,
    ConfigError,
    canonicalize,
    code_fingerprint,
    dumps,
    stable_module_name,
    version_key,
)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=@-]*(/[A-Za-z0-9_][A-Za-z0-9._+=@-]*)*$")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._+=@/-]")
MAX_NAME_PART = 200
"""The longest part of a step name between slashes: its folders (`{part}-{key8}`, and the attempt folder
`.{part}-{key8}.attempt-{run}-{8 hex}`, 38 characters more) must fit the file system's 255 bytes."""


def _bad_char(name: object) -> str:
    """' (it holds 'é' (position 7))' for a name with a character no step name may hold; else ''."""
    m = _NAME_CHARS.search(name) if isinstance(name, str) else None
    return f" (it holds {m.group()!r} (position {m.start()}))" if m else ""


def join_path(base: str, sub: str) -> str:
    """`base/sub` for local paths and URLs alike (no normalisation of `..`: inputs never contain it)."""
    sub = sub.strip("/")
    return base.rstrip("/") + "/" + sub if sub else base


class StepHandle:
    """A lazy step: name, config, inputs (handles inside the config), version and code; hashable by key.

    Build with `step(...)` or a step builder. `handle / "sub/path"` is an `InputPath` inside its output.
    Two handles with the same key are equal: they are the same step.
    """

    __slots__ = (
        "name",
        "fn",
        "config",
        "version",
        "resources",
        "override_output_path",
        "description",
        "resumable",
        "resume_hint",
        "key",
        "code",
        "canonical_config",
        "_canonical_text",
    )

    def __init__(
        self,
        name: str,
        fn: Callable[[Any, str], Any],
        config: Any,
        *,
        version: str | None = None,
        resources: ResourceConfig | None = None,
        override_output_path: str | None = None,
        description: str = "",
        resumable: bool = False,
        resume_hint: Callable[[str], str | None] | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name.split("/"):
            raise ConfigError(
                f"step name {name!r} is not valid{_bad_char(name)}: use ASCII letters, digits and . _ - + = @, "
                "with '/' between parts (e.g. 'tokenized/python-docs'); no leading '/', spaces or '..'"
            )
        long = [p for p in name.split("/") if len(p) > MAX_NAME_PART]
        if long:
            raise ConfigError(
                f"step name part of {len(long[0])} characters ({long[0][:40]}...) is too long: parts of a step "
                f"name (between '/') have at most {MAX_NAME_PART} characters, so that its output and attempt "
                "folders fit the file system's 255-byte names; shorten it or split it with '/'"
            )
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be a function of (config, output_path), got {fn!r}")
        if version is not None and not isinstance(version, str):
            raise TypeError(f"step {name!r}: version must be a string like 'v2' or None, got {version!r}")
        if resources is not None and not isinstance(resources, ResourceConfig):
            raise TypeError(f"step {name!r}: resources must be a ResourceConfig or None, got {resources!r}")
        if override_output_path is not None and (
            not isinstance(override_output_path, str) or not override_output_path.strip("/")
        ):
            raise ValueError(
                f"step {name!r}: override_output_path must be a non-empty path, got {override_output_path!r}"
            )
        self.name = name
        self.fn = fn
        self.config = config
        self.version = version
        self.resources = resources
        self.override_output_path = override_output_path
        self.description = description
        if not isinstance(resumable, bool):
            raise TypeError(f"step {name!r}: resumable must be True or False, got {resumable!r}")
        self.resumable = resumable
        if resume_hint is not None and not callable(resume_hint):
            raise TypeError(
                f"step {name!r}: resume_hint must be a function of the output path, got {resume_hint!r}"
            )
        self.resume_hint = resume_hint
        _check_runtime_fields(config, name, "config")
        self.canonical_config = canonicalize(config, step_name=name, field="config")
        self._canonical_text = dumps(self.canonical_config)
        self.code: str | None = code_fingerprint(fn)
        """Fingerprint of `fn`'s code and the helpers it calls (None for a library function)."""
        self.key: str = version_key(name, self.canonical_config, version, self.code)

    # -- identity ---------------------------------------------------------------------------------------
    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepHandle) and other.key == self.key

    def __repr__(self) -> str:
        return f"StepHandle({self.name!r}, key={self.key[:8]})"

    def __schooner_ref__(self) -> dict[str, str]:
        return {"__step__": self.key}

    def __truediv__(self, sub: str) -> InputPath:
        return InputPath(self, "") / sub

    def __deepcopy__(self, memo: dict) -> StepHandle:  # handles are immutable values
        return self

    @property
    def dir_name(self) -> str:
        """`{name}-{key[:8]}`: the output folder relative to the prefix."""
        return f"{self.name}-{self.key[:8]}"

    def output_path(self, prefix: str) -> str:
        """Where this step writes under `prefix` (or its override path)."""
        if self.override_output_path is not None:
            return self.override_output_path
        return join_path(prefix, self.dir_name)

    def fn_name(self) -> str:
        """`module:qualname` of the step's function (a function of the script run as `__main__` is named
        by the module that file is imported as)."""
        module = stable_module_name(getattr(self.fn, "__module__", None) or "?")
        return f"{module}:{getattr(self.fn, '__qualname__', repr(self.fn))}"

    def input_paths(self) -> list[tuple[str, InputPath]]:
        """The (field path, InputPath) of each `handle / "sub"` input in the config."""
        return [
            (f, r) for f, r in _walk_refs(self.config, "config", set(), self.name) if isinstance(r, InputPath)
        ]

    def inputs(self) -> list[tuple[str, StepHandle]]:
        """The (field path, handle) of each input found in the config now, in field order."""
        return list(_walk_inputs(self.config, "config", set(), self.name))


@dataclass(frozen=True)
class InputPath:
    """A path inside another step's output: `handle / "train"`. Resolves to `output_path/train`."""

    step: StepHandle
    path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or ".." in self.path.split("/"):
            raise ValueError(
                f"InputPath into step {self.step.name!r}: sub path must be a string without '..', "
                f"got {self.path!r}"
            )

    def __truediv__(self, sub: str) -> InputPath:
        if not isinstance(sub, str):
            raise TypeError(f"`handle / sub`: sub must be a str, got {sub!r}")
        joined = "/".join(p for p in (self.path.strip("/"), sub.strip("/")) if p)
        return InputPath(self.step, joined)

    def __schooner_ref__(self) -> dict[str, str]:
        if not self.path:
            return {"__step__": self.step.key}
        return {"__step__": self.step.key, "__path__": self.path}

    def __repr__(self) -> str:
        return f"InputPath({self.step.name!r} / {self.path!r})"


def _check_runtime_fields(value: Any, step: str, path: str) -> None:
    """Inputs must be part of the identity: refuse handles inside `runtime_field`s."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            sub = getattr(value, f.name, None)
            if f.metadata.get(RUNTIME_META) and any(True for _ in _walk_inputs(sub, path, set(), step)):
                raise ConfigError(
                    f"step {step!r}: runtime-only field {path}.{f.name!r} holds a step handle; inputs must be "
                    "part of the identity, so use a normal dataclass field"
                )


def _walk_refs(
    value: Any, path: str, active: set[int], step: str
) -> Iterator[tuple[str, StepHandle | InputPath]]:
    if value is None or isinstance(value, str | int | float | bool):
        return
    if isinstance(value, StepHandle | InputPath):
        yield path, value
        return
    if id(value) in active:
        raise ConfigError(f"step {step!r}: config field {path!r} contains itself (a reference cycle)")
    active.add(id(value))
    try:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                yield from _walk_refs(getattr(value, f.name, None), f"{path}.{f.name}", active, step)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                label = k if isinstance(k, str) else getattr(k, "name", None) or repr(k)
                yield from _walk_refs(k, f"{path}<key {label!r}>", active, step)
                yield from _walk_refs(v, f"{path}[{label!r}]", active, step)
        elif isinstance(value, list | tuple | set | frozenset):
            for i, v in enumerate(value):
                yield from _walk_refs(v, f"{path}[{i}]", active, step)
    finally:
        active.discard(id(value))


def _walk_inputs(value: Any, path: str, active: set[int], step: str) -> Iterator[tuple[str, StepHandle]]:
    for field_path, ref in _walk_refs(value, path, active, step):
        yield field_path, ref.step if isinstance(ref, InputPath) else ref


def resolve_config(config: Any, output_path_of: Callable[[StepHandle], str]) -> Any:
    """`config` with every handle / InputPath replaced by its output path string.

    Nested dataclasses are rebuilt with `dataclasses.replace` (only where something changed), containers
    keep their type (tuples stay tuples; dict keys that are handles become path strings).
    """

    def go(v: Any) -> Any:
        if v is None or isinstance(v, str | int | float | bool):
            return v
        if isinstance(v, StepHandle):
            return output_path_of(v)
        if isinstance(v, InputPath):
            return join_path(output_path_of(v.step), v.path)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            changes = {}
            for f in dataclasses.fields(v):
                if not f.init:
                    continue
                old = getattr(v, f.name)
                new = go(old)
                if new is not old:
                    changes[f.name] = new
            return dataclasses.replace(v, **changes) if changes else v
        if isinstance(v, Mapping):
            items = [(go(k), go(x)) for k, x in v.items()]
            if all(k2 is k and x2 is x for (k2, x2), (k, x) in zip(items, v.items())):
                return v
            return dict(items) if not isinstance(v, dict) or type(v) is dict else type(v)(items)
        if isinstance(v, list | tuple):
            new_items = [go(x) for x in v]
            if all(a is b for a, b in zip(new_items, v)):
                return v
            if isinstance(v, tuple) and hasattr(v, "_fields"):  # namedtuple
                return type(v)(*new_items)
            return type(v)(new_items)
        if isinstance(v, set | frozenset):
            return type(v)(go(x) for x in v)
        return v

    return go(config)


# -- the step() builder and decorator --------------------------------------------------------------------


class StepDef:
    """A function of (config, output_path) turned into a step builder by `@step`.

    Calling it, `builder(name, config, resources=..., ...)`, returns a `StepHandle`; the plain function
    stays available as `builder.fn`.
    """

    def __init__(
        self,
        fn: Callable[[Any, str], Any],
        *,
        version: str | None = None,
        resources: ResourceConfig | None = None,
        description: str = "",
        resumable: bool = False,
        resume_hint: Callable[[str], str | None] | None = None,
    ) -> None:
        if "<" not in getattr(fn, "__qualname__", "<"):
            # `module.name` is now this StepDef; `module.name.fn` finds the function again, so pickle
            # (and Ray / the LocalClient) can send it by reference instead of by value.
            fn.__qualname__ = f"{fn.__qualname__}.fn"
        self.fn = fn
        self.version = version
        self.resources = resources
        self.resumable = resumable
        self.resume_hint = resume_hint
        self.description = description or (fn.__doc__ or "").strip().split("\n")[0]
        self.__name__ = getattr(fn, "__name__", "step")
        self.__doc__ = fn.__doc__

    def __call__(
        self,
        name: str,
        config: Any,
        *,
        resources: ResourceConfig | None = None,
        override_output_path: str | None = None,
        description: str | None = None,
    ) -> StepHandle:
        return StepHandle(
            name,
            self.fn,
            config,
            version=self.version,
            resources=resources if resources is not None else self.resources,
            override_output_path=override_output_path,
            description=self.description if description is None else description,
            resumable=self.resumable,
            resume_hint=self.resume_hint,
        )

    def __repr__(self) -> str:
        return f"StepDef({self.fn.__qualname__}, version={self.version!r})"


_MISSING: Any = object()


@overload
def step(
    name: str,
    fn: Callable[[Any, str], Any],
    config: Any,
    *,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    override_output_path: str | None = None,
    description: str = "",
    resumable: bool = False,
    resume_hint: Callable[[str], str | None] | None = None,
) -> StepHandle: ...
@overload
def step(name: Callable[[Any, str], Any]) -> StepDef: ...
@overload
def step(
    *,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    description: str = "",
    resumable: bool = False,
    resume_hint: Callable[[str], str | None] | None = None,
) -> Callable[[Callable[[Any, str], Any]], StepDef]: ...


def step(
    name: Any = None,
    fn: Any = None,
    config: Any = _MISSING,
    *,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    override_output_path: str | None = None,
    description: str = "",
    resumable: bool = False,
    resume_hint: Callable[[str], str | None] | None = None,
) -> Any:
    """Make a lazy step: `fn(resolved_config, output_path)` will run once for this name+config+version.

    Three forms:

        h = step("counts/docs", count_words, CountConfig(input=docs), version="v1")   # a handle

        @step(version="v1")                     # a reusable builder (also bare `@step`)
        def count_words(config: CountConfig, output_path: str) -> dict: ...
        h = count_words("counts/docs", CountConfig(input=docs))

    Args:
        name: the step's name; also its output folder `{prefix}/{name}-{key[:8]}`.
        fn: a module-level function `fn(config, output_path) -> small JSON-able result`.
        config: a frozen dataclass (or dict) whose fields may hold handles / `handle / "sub"`: the inputs.
        version: a code version string; bump it when `fn` changes what it writes.
        resources: run through the current cluster client with these resources; None runs it in the
            runner process. Runtime-only: not part of the identity.
        override_output_path: write here instead of under the prefix (recorded; not part of the identity).
        description: one line for plans and records.
        resumable: the function finds and continues its own partial output (checkpoints, a manifest
            of finished shards), so a retry or rerun after a crash gets the folder back as it was left.
            False (the default): every attempt starts from an empty output folder (the runner clears
            it first), so a killed attempt can never leave rows that the next one appends to.
            `--force` empties the folder of resumable steps too. Runtime-only: not part of the identity.
        resume_hint: for a resumable step, a function of its output path saying where a rerun would
            resume (e.g. "from checkpoint step-000120"); shown when a run is interrupted.
    """
    if config is not _MISSING:
        return StepHandle(
            name,
            fn,
            config,
            version=version,
            resources=resources,
            override_output_path=override_output_path,
            description=description,
            resumable=resumable,
            resume_hint=resume_hint,
        )
    kw: dict[str, Any] = {
        "version": version,
        "resources": resources,
        "description": description,
        "resumable": resumable,
        "resume_hint": resume_hint,
    }
    if callable(name) and fn is None:
        return StepDef(name, **kw)
    if name is None and fn is None:
        return lambda f: StepDef(f, **kw)
    raise TypeError(
        "step() takes (name, fn, config, ...) to build a handle, or is used as a decorator "
        f"`@step` / `@step(version=...)`; got name={name!r}, fn={fn!r} and no config"
    )
