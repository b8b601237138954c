"""Per-record operations, fused into one generator chain per shard, each counting records in and out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

OP_KINDS = ("map", "filter", "flat_map", "map_shard", "select", "limit")


@dataclass(frozen=True)
class Op:
    """One per-record operation of a pipeline.

    `label` names it in the counters (`"{label}.in"`, `"{label}.out"`); a filter's drops also count under
    `"dropped.{reason}"`.
    """

    kind: str
    fn: Any
    label: str
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"Op.kind must be one of {OP_KINDS}, got {self.kind!r}")


def fn_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


class _Count:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def _describe(rec: Any) -> str:
    rid = rec.get("id") if isinstance(rec, dict) else None
    return f"record id={rid!r}" if rid is not None else f"record {str(rec)[:80]!r}"


def _map(it: Iterator[dict], fn: Callable, label: str, c_in: _Count) -> Iterator[dict]:
    for r in it:
        c_in.n += 1
        out = fn(r)
        if out is None:
            raise ValueError(f"map {label!r} returned None for {_describe(r)}; use filter() to drop records")
        yield out


def _filter(it: Iterator[dict], fn: Callable, c_in: _Count, c_out: _Count) -> Iterator[dict]:
    for r in it:
        c_in.n += 1
        if fn(r):
            c_out.n += 1
            yield r


def _flat_map(it: Iterator[dict], fn: Callable, label: str, c_in: _Count, c_out: _Count) -> Iterator[dict]:
    for r in it:
        c_in.n += 1
        outs = fn(r)
        if outs is None:
            raise ValueError(
                f"flat_map {label!r} returned None for {_describe(r)}; return [] to drop a record"
            )
        for o in outs:
            c_out.n += 1
            yield o


def _counting(it: Iterable[dict], c: _Count) -> Iterator[dict]:
    for r in it:
        c.n += 1
        yield r


def _select(it: Iterator[dict], fields: tuple[str, ...], c_in: _Count) -> Iterator[dict]:
    for r in it:
        c_in.n += 1
        yield {k: r[k] for k in fields if k in r}


def _limit(it: Iterator[dict], n: int, c_in: _Count) -> Iterator[dict]:
    if n <= 0:
        return
    for r in it:
        c_in.n += 1
        yield r
        if c_in.n >= n:
            return


def apply_ops(
    records: Iterable[dict], ops: Sequence[Op]
) -> tuple[Iterator[dict], Callable[[], dict[str, int]]]:
    """Chain `ops` over `records` lazily; returns (iterator, counters()) where `counters()` reads the
    in/out counts so far (call it after the iterator is exhausted)."""
    it: Iterator[dict] = iter(records)
    tallies: list[tuple[Op, _Count, _Count | None]] = []
    for op in ops:
        c_in, c_out = _Count(), None
        if op.kind == "map":
            it = _map(it, op.fn, op.label, c_in)
        elif op.kind == "filter":
            c_out = _Count()
            it = _filter(it, op.fn, c_in, c_out)
        elif op.kind == "flat_map":
            c_out = _Count()
            it = _flat_map(it, op.fn, op.label, c_in, c_out)
        elif op.kind == "map_shard":
            c_out = _Count()
            it = _counting(op.fn(_counting(it, c_in)), c_out)
        elif op.kind == "select":
            it = _select(it, op.fn, c_in)
        else:
            it = _limit(it, op.fn, c_in)
        tallies.append((op, c_in, c_out))

    def counters() -> dict[str, int]:
        out: dict[str, int] = {}
        for op, c_in, c_out in tallies:
            n_out = c_in.n if c_out is None else c_out.n
            out[f"{op.label}.in"] = c_in.n
            out[f"{op.label}.out"] = n_out
            if op.kind == "filter":
                key = f"dropped.{op.reason or op.label}"
                out[key] = out.get(key, 0) + c_in.n - n_out
        return out

    return it, counters
