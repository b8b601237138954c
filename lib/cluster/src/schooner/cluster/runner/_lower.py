"""Lowering: a graph of step handles into a deduplicated, topologically ordered list of runnable steps."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._step import InputPath, StepHandle
from ._version import ConfigError, canonicalize, dumps


@dataclass(frozen=True, eq=False)
class Step:
    """A lowered, runnable step: a handle plus the keys of the steps it depends on."""

    handle: StepHandle
    deps: tuple[str, ...]
    """Keys of the direct inputs, in field order, without duplicates."""
    input_fields: tuple[tuple[str, str], ...]
    """(field path, input key) for every input occurrence in the config."""

    name = property(lambda self: self.handle.name)
    key = property(lambda self: self.handle.key)

    def __repr__(self) -> str:
        return f"Step({self.name!r}, key={self.key[:8]}, deps={len(self.deps)})"


def lower(handles: StepHandle | Step | Iterable[StepHandle | Step | Iterable[Any]]) -> list[Step]:
    """The steps needed to produce `handles` (and all their inputs), in a topological order, deduplicated.

    Raises:
        ConfigError: a cycle (naming the steps and fields), a config mutated after `step()` was called,
            or two different steps claiming one output path.
        ValueError: two steps with the same key but different functions.
    """
    order: list[Step] = []
    state: dict[str, int] = {}  # key -> 1 on the DFS stack, 2 done
    seen: dict[str, StepHandle] = {}
    frames: list[list[Any]] = []  # [handle, inputs, next input index]; iterative: chains may be long

    def push(h: StepHandle) -> None:
        st = state.get(h.key)
        if st == 2:
            _check_same(seen[h.key], h)
            return
        if st == 1:
            i = next(i for i, fr in enumerate(frames) if fr[0].key == h.key)
            chain = " -> ".join(f"{fr[0].name!r} (field {fr[1][fr[2] - 1][0]})" for fr in frames[i:])
            raise ConfigError(f"cycle between steps: {chain} -> {h.name!r}; a step cannot depend on itself")
        state[h.key] = 1
        seen[h.key] = h
        frames.append([h, h.inputs(), 0])

    for root in _flatten(handles):
        push(root)
        while frames:
            fr = frames[-1]
            h, inputs, i = fr
            if i < len(inputs):
                fr[2] += 1
                push(inputs[i][1])
                continue
            frames.pop()
            if dumps(canonicalize(h.config, step_name=h.name)) != h._canonical_text:
                raise ConfigError(
                    f"step {h.name!r}: its config was changed after step() built it (key "
                    f"{h.key[:8]}); configs must not be mutated, build a new step instead"
                )
            deps = tuple(dict.fromkeys(d.key for _, d in inputs))
            order.append(Step(h, deps, tuple((f, d.key) for f, d in inputs)))
            state[h.key] = 2
    _check_overrides(order)
    return order


def _flatten(x: Any) -> Iterator[StepHandle]:
    if isinstance(x, StepHandle):
        yield x
    elif isinstance(x, Step):
        yield x.handle
    elif isinstance(x, InputPath):
        yield x.step
    elif isinstance(x, Iterable) and not isinstance(x, str | bytes | Mapping):
        for y in x:
            yield from _flatten(y)
    else:
        raise TypeError(f"lower()/run() take step handles, lowered steps or lists of them, got {x!r}")


def _check_same(a: StepHandle, b: StepHandle) -> None:
    """Two handles with one key are one step: their runtime arguments must agree too."""
    if a is b:
        return
    if a.fn is not b.fn and a.fn_name() != b.fn_name():
        raise ConfigError(
            f"two steps named {a.name!r} have the same key {a.key[:8]} but different functions "
            f"({a.fn_name()} and {b.fn_name()}); give them different names or versions"
        )
    for attr in ("override_output_path", "resources"):
        if getattr(a, attr) != getattr(b, attr):
            raise ConfigError(
                f"step {a.name!r} (key {a.key[:8]}) is built twice with different {attr}: "
                f"{getattr(a, attr)!r} and {getattr(b, attr)!r}; it is one step, so build it once and reuse "
                "the handle"
            )


def _check_overrides(steps: list[Step]) -> None:
    claimed: dict[str, StepHandle] = {}
    for s in steps:
        p = s.handle.override_output_path
        if p is None:
            continue
        other = claimed.setdefault(p.rstrip("/"), s.handle)
        if other is not s.handle:
            raise ConfigError(
                f"steps {other.name!r} and {s.name!r} both set override_output_path={p!r}; "
                "each step needs its own output folder"
            )
