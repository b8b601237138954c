"""`MixtureDataset`: a weighted, scheduled mixture of token caches with deterministic block sampling.

Global sequence `g` (batch `step` holds `g = offset(step) ... offset(step) + batch_size - 1`) lies in block
`k = g // block_size` at position `j = g % block_size`. Each block holds a fixed number of sequences per
component (largest-remainder rounding of the weights in force for that block); a seeded permutation of
the block's slots decides which component fills position `j`. Inside a component, its `i`-th drawn
sequence is `perm_{epoch}(i mod n)` with `epoch = i // n`: a seeded bijection per epoch, so every epoch
sees every sequence exactly once, in a new order. Everything is arithmetic on (seed, g): `batch(step)`
is pure, any process computes the same batch, and resuming at a step replays nothing.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._cache import CacheError, TokenCache
from ._packing import AllMaskedError, PackedSequences
from ._permute import Permutation, derive_key
from ._sequences import TokenSequences, held_bytes

BatchSize = int | Callable[[int], int]
logger = logging.getLogger("schooner.tokenize")

DEFAULT_MAX_EPOCHS = 4.0
"""Repetitions of a component beyond which `MixtureDataset.repetition` warns. Up to about 4 epochs,
repeated tokens are worth nearly as much as new ones; beyond that their value falls fast (Muennighoff et
al., "Scaling Data-Constrained Language Models", 2023)."""


class MixtureError(ValueError):
    """A mixture's components, weights or schedule cannot work."""


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to `total`, proportional to `weights` (ties go to the earlier component)."""
    share = weights / weights.sum() * total
    counts = np.floor(share).astype(np.int64)
    order = sorted(range(len(weights)), key=lambda i: (-(share[i] - counts[i]), i))
    for i in order[: total - int(counts.sum())]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class _Stage:
    first_block: int
    counts: np.ndarray  # sequences per component in each block of this stage
    starts: np.ndarray  # slot where each component's run begins inside the block


class _Offsets:
    """Step -> first global sequence index, for a constant or a per-step batch size."""

    def __init__(self, batch_size: BatchSize) -> None:
        self.batch_size = batch_size
        self._prefix = [0]
        self._lock = threading.Lock()  # loader threads ask concurrently; the prefix sums must grow once

    def size(self, step: int) -> int:
        bs = self.batch_size(step) if callable(self.batch_size) else self.batch_size
        if isinstance(bs, bool) or not isinstance(bs, int | np.integer) or bs < 1:
            raise ValueError(f"batch size at step {step} must be a positive int, got {bs!r}")
        return int(bs)

    def offset(self, step: int) -> int:
        if not callable(self.batch_size):
            return step * self.size(step)
        with self._lock:
            while len(self._prefix) <= step:
                self._prefix.append(self._prefix[-1] + self.size(len(self._prefix) - 1))
            return self._prefix[step]


class MixtureDataset:
    """Training batches drawn from several token caches by weight; a pure function of (seed, step).

    Args:
        components: cache path (or tokenized step folder, or `TokenCache`) -> weight (>= 0, finite).
        seq_len: tokens per sequence.
        seed: the shuffle seed.
        weight_schedule: `[(start_step, {component: weight}), ...]`, ascending; from `start_step` on,
            those weights hold (components not named get 0). Takes effect at the first block that starts
            at or after the step's first sequence.
        block_size: sequences per sampling block; per-block component counts are exact.
        tokenizer: a `Tokenizer` or fingerprint every cache must have been built with (a mismatch raises
            `TokenizerMismatchError` naming the cache and both fingerprints).
        vocab_size: the model's vocabulary; every cached token id must be below it.
        in_memory_bytes: read plain-text components whose token ids and offsets fit in this many bytes
            (counted in order, against one total) into memory here, once; their batches then read nothing
            from storage and are the same arrays (64 x 64 tokens from a 51M-token cache, 100 MB held:
            0.4-0.7 ms of CPU a batch, against about 4 reading). 0 (the default): every batch reads from
            the caches.

    Example:
        >>> ds = MixtureDataset({"out/docs/train": 0.7, "out/code/train": 0.3}, seq_len=256, seed=0)  # doctest: +SKIP
        >>> b = ds.batch(step=10, batch_size=8)                                                   # doctest: +SKIP
        >>> b["tokens"].shape, b["segment_ids"].dtype                                             # doctest: +SKIP
        ((8, 256), dtype('int32'))
    """

    def __init__(
        self,
        components: Mapping[Any, float],
        seq_len: int,
        seed: int = 0,
        weight_schedule: Sequence[tuple[int, Mapping[Any, float]]] | None = None,
        block_size: int = 1024,
        *,
        tokenizer: Any = None,
        vocab_size: int | None = None,
        in_memory_bytes: int = 0,
    ) -> None:
        if not components:
            raise MixtureError("MixtureDataset needs at least one component (cache path -> weight)")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise MixtureError(f"MixtureDataset: seq_len must be a positive int, got seq_len={seq_len!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise MixtureError(
                f"MixtureDataset: block_size must be a positive int, got block_size={block_size!r}"
            )
        if isinstance(in_memory_bytes, bool) or not isinstance(in_memory_bytes, int) or in_memory_bytes < 0:
            raise MixtureError(
                f"MixtureDataset: in_memory_bytes must be an int >= 0, got in_memory_bytes={in_memory_bytes!r}"
            )
        self.seq_len, self.seed, self.block_size = seq_len, int(seed), block_size
        self.names = [_name(k) for k in components]
        self.caches = [k if isinstance(k, TokenCache) else TokenCache.open(os.fspath(k)) for k in components]
        base = self._weights(components.values(), "weights")
        stages = [(0, base)]
        for i, entry in enumerate(weight_schedule or []):
            stages.append(self._schedule_entry(i, entry, stages[-1][0] if i else -1))
        self._schedule = stages
        self._check_caches(tokenizer, vocab_size)
        self.sequences: list[PackedSequences | TokenSequences] = []
        budget = in_memory_bytes
        self.not_held: list[tuple[str, int]] = []
        """With `in_memory_bytes`: `(cache path, bytes it needs)` of the plain-text caches that did not fit."""
        for c in self.caches:
            if c.has_loss_mask:
                self.sequences.append(PackedSequences(c, seq_len))
                continue
            size = held_bytes(c) if budget or in_memory_bytes else 0  # opens the token array: only if asked
            held = 0 < size <= budget
            self.sequences.append(TokenSequences(c, seq_len, in_memory=held))
            budget -= size if held else 0
            if in_memory_bytes and not held:
                self.not_held.append((c.path, size))
        self._plans: dict[Any, tuple[_Offsets, list[_Stage]]] = {}
        self._perms: dict[tuple, Permutation] = {}

    @property
    def held_bytes(self) -> int:
        """Bytes of token ids and offsets held in memory (`in_memory_bytes`); 0 when every batch is read."""
        return sum(getattr(s, "held_bytes", 0) for s in self.sequences)

    # -- validation ----------------------------------------------------------------------------------
    def _weights(self, values: Any, where: str) -> np.ndarray:
        w = []
        for name, v in zip(self.names, values):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise MixtureError(
                    f"MixtureDataset {where}: component {name!r} has weight {v!r}; weights must be finite "
                    "numbers >= 0"
                )
            w.append(float(v))
        arr = np.array(w, dtype=np.float64)
        if arr.sum() <= 0:
            raise MixtureError(
                f"MixtureDataset {where}: weights sum to zero ({dict(zip(self.names, w))}); give at least one "
                "component a positive weight"
            )
        return arr

    def _schedule_entry(self, i: int, entry: Any, prev_step: int) -> tuple[int, np.ndarray]:
        try:
            start, mapping = entry
        except (TypeError, ValueError):
            raise MixtureError(
                f"weight_schedule[{i}] must be (start_step, {{component: weight}}), got {entry!r}"
            ) from None
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start <= prev_step:
            raise MixtureError(
                f"weight_schedule[{i}]: start_step={start!r} must be an int >= 0 and above the previous "
                f"entry's ({prev_step}); list entries in ascending step order"
            )
        named = {_name(k): v for k, v in mapping.items()}
        unknown = sorted(set(named) - set(self.names))
        if unknown:
            raise MixtureError(
                f"weight_schedule[{i}] (step {start}) names unknown components {unknown}; known: {self.names}"
            )
        return start, self._weights(
            [named.get(n, 0.0) for n in self.names], f"weight_schedule[{i}] (step {start})"
        )

    def _check_caches(self, tokenizer: Any, vocab_size: int | None) -> None:
        first = self.caches[0]
        used = np.any([w for _, w in self._schedule], axis=0)
        for name, cache, in_use in zip(self.names, self.caches, used):
            if tokenizer is not None:
                cache.check_tokenizer(tokenizer)
            elif cache.tokenizer_fingerprint != first.tokenizer_fingerprint:
                raise MixtureError(
                    f"MixtureDataset: component {name!r} (cache {cache.path!r}) was built with tokenizer "
                    f"{cache.tokenizer_fingerprint[:12]} but component {self.names[0]!r} with "
                    f"{first.tokenizer_fingerprint[:12]}; rebuild one of them with the other's tokenizer"
                )
            else:  # the same tokenizer.json with other special tokens: documents end with another EOS
                for key in ("bos_id", "eos_id"):
                    if (
                        key in cache.manifest
                        and key in first.manifest
                        and cache.manifest[key] != first.manifest[key]
                    ):
                        raise MixtureError(
                            f"MixtureDataset: component {name!r} (cache {cache.path!r}) was built with "
                            f"{key}={cache.manifest[key]} but component {self.names[0]!r} with "
                            f"{key}={first.manifest[key]} (the same tokenizer.json, other special tokens); "
                            "rebuild one of them with the other's tokenizer_config.json"
                        )
            if vocab_size is not None:
                cache.check_vocab(vocab_size)
            if cache.kind == "preference":
                raise MixtureError(
                    f"MixtureDataset: component {name!r} (cache {cache.path!r}) is a preference cache; read it "
                    "with PreferenceDataset (pairs for DPO), or use a chat cache for SFT"
                )
            if cache.num_tokens == 0:
                raise MixtureError(
                    f"MixtureDataset: component {name!r} (cache {cache.path!r}) is empty: "
                    f"{cache.num_documents} documents, 0 tokens; drop it or rebuild it from non-empty records"
                )
            if in_use and not cache.has_loss_mask and cache.num_tokens < self.seq_len:
                raise MixtureError(
                    f"MixtureDataset: seq_len={self.seq_len} is longer than component {name!r} (cache "
                    f"{cache.path!r}), which holds only {cache.num_tokens} tokens; use seq_len <= "
                    f"{cache.num_tokens} or drop the component"
                )

    # -- the block plan ------------------------------------------------------------------------------
    def _plan(self, batch_size: BatchSize) -> tuple[_Offsets, list[_Stage]]:
        key = batch_size  # an int, or the function itself (kept alive here, so its id cannot be reused)
        if key not in self._plans:
            offsets = _Offsets(batch_size)
            stages: list[_Stage] = []
            for start_step, w in self._schedule:
                first = -(-offsets.offset(start_step) // self.block_size)
                counts = largest_remainder(w, self.block_size)
                starved = [n for n, wi, c in zip(self.names, w, counts) if wi > 0 and c == 0]
                if starved:
                    raise MixtureError(
                        f"MixtureDataset: components {starved} have weight > 0 but get 0 of block_size="
                        f"{self.block_size} sequences per block (step {start_step}); raise block_size or their weights"
                    )
                stage = _Stage(first, counts, np.concatenate([[0], np.cumsum(counts)[:-1]]))
                if stages and stages[-1].first_block == first:
                    stages[-1] = stage  # two changes before the same block: the later one wins
                else:
                    stages.append(stage)
            self._plans[key] = (offsets, stages)
        return self._plans[key]

    def _block_perm(self, block: int) -> Permutation:
        perm = self._perms.get(("block", block))
        if perm is None:
            if len(self._perms) > 1024:  # bounded: consecutive batches touch a handful of blocks/epochs
                self._perms.clear()
            perm = self._perms[("block", block)] = Permutation(
                self.block_size, derive_key(self.seed, "block", block)
            )
        return perm

    def _epoch_perm(self, component: int, epoch: int) -> Permutation:
        perm = self._perms.get(("epoch", component, epoch))
        if perm is None:
            if len(self._perms) > 1024:
                self._perms.clear()
            n = len(self.sequences[component])
            perm = Permutation(n, derive_key(self.seed, "component", component, epoch))
            self._perms[("epoch", component, epoch)] = perm
        return perm

    def _drawn_before(self, stages: list[_Stage], block: int) -> np.ndarray:
        """Sequences each component contributed in blocks `[0, block)`."""
        total = np.zeros(len(self.names), dtype=np.int64)
        for i, st in enumerate(stages):
            end = stages[i + 1].first_block if i + 1 < len(stages) else None
            n_blocks = max(0, min(block, end if end is not None else block) - st.first_block)
            total += n_blocks * st.counts
        return total

    def _locate(self, stages: list[_Stage], g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component, within-component draw index) of global sequence indices `g`."""
        comp = np.empty(g.shape, dtype=np.int64)
        draw = np.empty(g.shape, dtype=np.int64)
        blocks = g // self.block_size
        for block in np.unique(blocks):
            sel = blocks == block
            stage = next(st for st in reversed(stages) if st.first_block <= block)
            slots = self._block_perm(int(block))(g[sel] % self.block_size)
            c = np.searchsorted(stage.starts, slots, side="right") - 1
            comp[sel] = c
            draw[sel] = self._drawn_before(stages, int(block))[c] + slots - stage.starts[c]
        return comp, draw

    # -- public --------------------------------------------------------------------------------------
    def sequence_ids(
        self, step: int, batch_size: BatchSize, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(component, epoch, sequence index within the component) of each row (or of `rows`) of batch `step`."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be an int >= 0, got step={step!r}")
        offsets, stages = self._plan(batch_size)
        start, size = offsets.offset(int(step)), offsets.size(int(step))
        if rows is None:
            g = np.arange(start, start + size, dtype=np.int64)
        else:
            rows = np.asarray(rows, dtype=np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= size):
                raise IndexError(f"rows {rows.tolist()[:8]} are outside batch {step}'s [0, {size})")
            g = start + rows
        comp, draw = self._locate(stages, g)
        epoch = np.empty_like(draw)
        seq = np.empty_like(draw)
        for c in np.unique(comp):
            sel = comp == c
            n = len(self.sequences[c])
            epoch[sel] = draw[sel] // n
            for e in np.unique(epoch[sel]):
                es = sel & (epoch == e)
                seq[es] = self._epoch_perm(int(c), int(e))(draw[es] % n)
        return comp, epoch, seq

    def batch(
        self, step: int, batch_size: BatchSize, rows: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Batch `step`: `{"tokens", "loss_mask", "segment_ids"}`, int32 `[batch_size, seq_len]`, pure in
        (seed, step).

        `loss_mask[b, t] == 1` where token `tokens[b, t]` is a training target: everywhere for plain
        caches, the assistant tokens of chat caches (whose rows hold whole conversations, one segment
        each, then padding with mask 0). The model's per-prediction mask is
        `schooner.model.target_mask_to_loss_mask(loss_mask)` (`loss_mask[:, 1:]`). `batch_size` is an int,
        or a function step -> int (then batch `step` starts after the sequences of all earlier steps).
        `rows` (indices into the batch) computes only those rows, in that order: what one host of many
        needs for its own devices.

        Raises:
            AllMaskedError: a row holds no target token (naming its documents); never a silent zero loss.
        """
        comp, _, seq = self.sequence_ids(step, batch_size, rows)
        out = {
            k: np.empty((comp.size, self.seq_len), dtype=np.int32)
            for k in ("tokens", "loss_mask", "segment_ids")
        }
        for c in np.unique(comp):
            sel = comp == c
            part = self.sequences[c].batch(seq[sel])
            for k, v in out.items():
                v[sel] = part[k]
        trained = (out["loss_mask"][:, 1:] * (out["segment_ids"][:, 1:] == out["segment_ids"][:, :-1])).any(
            axis=1
        )
        if not trained.all():
            r = int(np.flatnonzero(~trained)[0])
            raise AllMaskedError(
                f"MixtureDataset batch {step}, row {r}: no target token ({self.sequences[comp[r]].describe(int(seq[r]))}); "
                "every row must have something to train on"
            )
        return out

    def epochs_at(self, step: int, batch_size: BatchSize) -> dict[str, float]:
        """Epochs of each component consumed by the end of batch `step` (e.g. 2.5: half into the third)."""
        offsets, stages = self._plan(batch_size)
        end = offsets.offset(int(step) + 1)
        block, pos = divmod(end, self.block_size)
        drawn = self._drawn_before(stages, block).astype(np.float64)
        if pos:
            stage = next(st for st in reversed(stages) if st.first_block <= block)
            slots = self._block_perm(block)(np.arange(pos))
            c = np.searchsorted(stage.starts, slots, side="right") - 1
            drawn += np.bincount(c, minlength=len(self.names))
        return {n: float(d / len(s)) if len(s) else 0.0 for n, d, s in zip(self.names, drawn, self.sequences)}

    def repetition(
        self, num_steps: int, batch_size: BatchSize, *, max_epochs: float = DEFAULT_MAX_EPOCHS
    ) -> dict[str, Any]:
        """How often each component is repeated by the end of `num_steps` steps, with a warning (logged on
        the `schooner.tokenize` logger, and returned for a step record) for every component repeated more
        than `max_epochs` times.

        Returns:
            `{"num_steps", "max_epochs", "epochs": {component: epochs}, "warnings": [message, ...]}`.

        Example:
            >>> report = ds.repetition(num_steps=10_000_000, batch_size=8)       # doctest: +SKIP
            >>> report["warnings"]                                                 # doctest: +SKIP
            ["mixture component 'out/docs' is repeated 228,695.2 times over 10,000,000 steps ..."]
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer) or num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got num_steps={num_steps!r}")
        if not (isinstance(max_epochs, int | float) and max_epochs > 0 and math.isfinite(max_epochs)):
            raise ValueError(f"max_epochs must be a finite number > 0, got max_epochs={max_epochs!r}")
        epochs = self.epochs_at(int(num_steps) - 1, batch_size)
        warnings = []
        for (name, e), seqs in zip(epochs.items(), self.sequences):
            if e > max_epochs:
                msg = (
                    f"mixture component {name!r} is repeated {e:,.1f} times over {num_steps:,} steps (more than "
                    f"max_epochs={max_epochs:g}): its cache holds {len(seqs):,} sequences of {self.seq_len} "
                    "tokens; add data to it, lower its weight, or train for fewer steps"
                )
                logger.warning("%s", msg)
                warnings.append(msg)
        return {
            "num_steps": int(num_steps),
            "max_epochs": float(max_epochs),
            "epochs": epochs,
            "warnings": warnings,
        }

    @property
    def tokenizer_fingerprint(self) -> str:
        """The fingerprint of the tokenizer every component's cache was built with (they all agree; a
        checkpoint records it so the model is never paired with another tokenizer)."""
        return self.caches[0].tokenizer_fingerprint

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise `TokenizerMismatchError` (naming the cache and both fingerprints) unless every component's
        cache was built with `tokenizer` (a `Tokenizer` or its fingerprint)."""
        for cache in self.caches:
            cache.check_tokenizer(tokenizer)

    def weights_at(self, step: int) -> dict[str, float]:
        """The normalised weights the schedule gives at `step`."""
        w = next(w for s, w in reversed(self._schedule) if s <= step)
        return dict(zip(self.names, (w / w.sum()).tolist()))

    @property
    def eos_id(self) -> int:
        return self.caches[0].eos_id

    def __repr__(self) -> str:
        comps = ", ".join(f"{n!r}: {len(s)} seqs" for n, s in zip(self.names, self.sequences))
        return f"MixtureDataset({{{comps}}}, seq_len={self.seq_len}, seed={self.seed}, block_size={self.block_size})"


def _name(key: Any) -> str:
    if isinstance(key, TokenCache):
        return key.path
    try:
        return os.fspath(key)
    except TypeError:
        raise CacheError(
            f"MixtureDataset component keys must be cache paths or TokenCache objects, got {key!r}"
        ) from None
