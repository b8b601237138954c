"""Per-record operations, fused into one generator chain per shard, each counting records in and out.

One small frozen type per operation (`MapOp`, `FilterOp`, `FlatMapOp`, `MapShardOp`, `SelectOp`, `LimitOp`):
each knows how to run over a stream (`apply`), how to show itself in `Dataset.explain` (`describe`) and
what identifies it in a plan fingerprint (`token`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._fingerprint import token


def fn_name(fn: Any) -> str:
    """A readable name of a function or callable object (`lambda` for lambdas), never a memory address."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


class _Count:
    __slots__ = ("extra", "n")

    def __init__(self) -> None:
        self.n = 0
        self.extra: dict[str, int] = {}


def _describe_record(rec: Any) -> str:
    rid = rec.get("id") if isinstance(rec, dict) else None
    return f"record id={rid!r}" if rid is not None else f"record {str(rec)[:80]!r}"


@dataclass(frozen=True)
class Op(ABC):
    """One per-record operation of a pipeline. `label` names it in the counters (`"{label}.in"`,
    `"{label}.out"`)."""

    label: str

    @abstractmethod
    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        """Run over `it`, counting records in and out."""

    @abstractmethod
    def describe(self) -> str:
        """One line for `Dataset.explain()`."""

    def token(self) -> Any:
        """What identifies this operation in a plan fingerprint."""
        return [type(self).__name__, self.label, token(self._identity())]

    @abstractmethod
    def _identity(self) -> Any:
        """What, besides the type and label, makes this operation what it is (for `token`)."""

    def extra_counters(self, c_in: _Count, c_out: _Count) -> dict[str, int]:
        return {}


@dataclass(frozen=True)
class MapOp(Op):
    fn: Callable[[dict], dict]

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        fn, label = self.fn, self.label
        for r in it:
            c_in.n += 1
            out = fn(r)
            if out is None:
                raise ValueError(
                    f"map {label!r} returned None for {_describe_record(r)}; use filter() to drop"
                )
            c_out.n += 1
            yield out

    def describe(self) -> str:
        return f"map {fn_name(self.fn)} (as {self.label!r})"

    def _identity(self) -> Any:
        return self.fn


@dataclass(frozen=True)
class FilterOp(Op):
    fn: Callable[[dict], bool]
    reason: str

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        fn = self.fn
        for r in it:
            c_in.n += 1
            if fn(r):
                c_out.n += 1
                yield r

    def describe(self) -> str:
        return f"filter {fn_name(self.fn)} (as {self.label!r}; drops count as dropped.{self.reason})"

    def _identity(self) -> Any:
        return [self.fn, self.reason]

    def extra_counters(self, c_in: _Count, c_out: _Count) -> dict[str, int]:
        return {f"dropped.{self.reason}": c_in.n - c_out.n}


@dataclass(frozen=True)
class FlatMapOp(Op):
    fn: Callable[[dict], Iterable[dict]]

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        fn, label = self.fn, self.label
        for r in it:
            c_in.n += 1
            outs = fn(r)
            if outs is None:
                raise ValueError(
                    f"flat_map {label!r} returned None for {_describe_record(r)}; return [] to drop a record"
                )
            for o in outs:
                c_out.n += 1
                yield o

    def describe(self) -> str:
        return f"flat_map {fn_name(self.fn)} (as {self.label!r})"

    def _identity(self) -> Any:
        return self.fn


@dataclass(frozen=True)
class MapShardOp(Op):
    fn: Callable[..., Iterable[dict]]
    with_counters: bool = False

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        stream = _counting(it, c_in)
        out = self.fn(stream, c_out.extra) if self.with_counters else self.fn(stream)
        for r in out:
            c_out.n += 1
            yield r

    def describe(self) -> str:
        return f"map_shard {fn_name(self.fn)} (as {self.label!r})"

    def _identity(self) -> Any:
        return [self.fn, self.with_counters]

    def extra_counters(self, c_in: _Count, c_out: _Count) -> dict[str, int]:
        return dict(c_out.extra)


@dataclass(frozen=True)
class SelectOp(Op):
    fields: tuple[str, ...]

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        fields = self.fields
        for r in it:
            c_in.n += 1
            c_out.n += 1
            yield {k: r[k] for k in fields if k in r}

    def describe(self) -> str:
        return f"select {list(self.fields)}"

    def _identity(self) -> Any:
        return list(self.fields)


@dataclass(frozen=True)
class LimitOp(Op):
    n: int

    def apply(self, it: Iterator[dict], c_in: _Count, c_out: _Count) -> Iterator[dict]:
        if self.n <= 0:
            return
        for r in it:
            c_in.n += 1
            c_out.n += 1
            yield r
            if c_in.n >= self.n:
                return

    def describe(self) -> str:
        return f"limit {self.n}"

    def _identity(self) -> Any:
        return self.n


def _counting(it: Iterable[dict], c: _Count) -> Iterator[dict]:
    for r in it:
        c.n += 1
        yield r


def apply_ops(
    records: Iterable[dict], ops: Sequence[Op]
) -> tuple[Iterator[dict], Callable[[], dict[str, int]]]:
    """Chain `ops` over `records` lazily; returns (iterator, counters()) where `counters()` reads the
    in/out counts so far (call it after the iterator is exhausted)."""
    it: Iterator[dict] = iter(records)
    tallies: list[tuple[Op, _Count, _Count]] = []
    for op in ops:
        c_in, c_out = _Count(), _Count()
        it = op.apply(it, c_in, c_out)
        tallies.append((op, c_in, c_out))

    def counters() -> dict[str, int]:
        out: dict[str, int] = {}
        for op, c_in, c_out in tallies:
            out[f"{op.label}.in"] = c_in.n
            out[f"{op.label}.out"] = c_out.n
            for k, v in op.extra_counters(c_in, c_out).items():
                out[k] = out.get(k, 0) + v
        return out

    return it, counters
