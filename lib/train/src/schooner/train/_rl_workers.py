"""Rollout workers: a rollout group sampled in chunks of prompts, in the trainer or by N workers of the cluster
layer (`Grpo(rollout_workers=N)`), with the same result bitwise.

**Chunks.** A group's `P` prompts are cut, in order, into chunks of `rollout_chunk` prompts (`chunk_slices`);
chunk `c` is one `schooner.model.sample` call with the key `fold_in(rollout_key(seed, group), c)` (one chunk:
`rollout_key(seed, group)` itself, the single call `_rl_rollout.rollout` makes). The rows are the chunks'
rows in chunk order, so the batch is prompt-major as before. What is sampled depends on the chunk size (a
chunk's padding width and its random draws are its own) and never on who samples it: the trainer (N = 0)
samples the chunks one after another with its live model; N workers sample them in parallel, each from the
weights the trainer published for the group. Same seed and chunk size: the same rollouts for every N, bitwise
(tested for N = 0 and 2, local processes and Ray).

**Weights, versioned.** Before a group's chunks go out the trainer writes its current weights once to
`<run>/rollout-weights/weights-<group>.npz` (the model's array leaves in `jax.tree.leaves` order, plus
`__version__` = the group), atomically through `schooner.cluster.storage` (a local folder, or the shared
bucket a cluster run writes its checkpoints to). Each chunk job carries a `WeightsRef`: the path, the version
and the SHA-256 of the bytes written. A worker reads the file, checks the digest and the version it holds
against the ones asked for, and refuses anything else (`StaleWeightsError`): it never samples with another
step's weights, nor with a file half-written or overwritten by another run. A worker keeps the last weights
it loaded (by digest) and its compiled sampler, so a warm worker reads each version once. The file is removed
once the group's chunks are back.

**Workers** are jobs of `schooner.cluster.current_client()`: on a `RayClient` (a run under
`SCHOONER_CLUSTER=ray`, or inside `using_client(ray_client)`) Ray tasks, otherwise `LocalClient` worker
processes on this machine; `client.map` with `max_workers=N` runs the chunks and returns them in order.
Scoring stays in the trainer (its errors are counted and named there, as without workers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

WEIGHTS_DIR = "rollout-weights"


class StaleWeightsError(RuntimeError):
    """A rollout worker was handed a weights file that is not the version the trainer published."""


def chunk_slices(num_prompts: int, chunk: int | None) -> list[slice]:
    """The prompts of each chunk, in order: `chunk` at a time (None: all in one).

    Example:
        >>> chunk_slices(5, 2)
        [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    size = num_prompts if chunk is None else max(1, min(chunk, num_prompts))
    return [slice(i, min(i + size, num_prompts)) for i in range(0, num_prompts, size)]


ROUND_TAG = 2**31 - 1
"""Folded into a group's key before a dynamic-sampling round's index (rounds >= 1): no chunk index reaches it,
so no round's key is a chunk's key of round 0."""


def chunk_key(seed: int, group: int, chunk: int, chunks: int, sampling_round: int = 0) -> Any:
    """Chunk `chunk`'s sampling key: `rollout_key(seed, group)` when the group is one chunk, else that key
    folded with the chunk's index. Round `r >= 1` of dynamic sampling (`Grpo(dynamic_sampling=True)`) starts
    from `fold_in(fold_in(rollout_key(seed, group), ROUND_TAG), r)` instead; round 0 is the group's own key."""
    import jax

    from ._rl_rollout import rollout_key

    key = rollout_key(seed, group)
    if sampling_round:
        key = jax.random.fold_in(jax.random.fold_in(key, ROUND_TAG), sampling_round)
    return key if chunks == 1 else jax.random.fold_in(key, chunk)


# -- weights ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WeightsRef:
    """Where a version of the policy's weights lies and what it must be: the file, the version (the rollout
    group it is for) and the SHA-256 of its bytes."""

    path: str
    version: int
    digest: str


def publish_weights(model: Any, root: str, version: int) -> WeightsRef:
    """Write the model's array leaves for rollout workers (module docstring) and return their reference."""
    import jax

    from schooner.cluster import storage

    leaves = {f"leaf_{i:05d}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(model))}
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, __version__=np.asarray(version, np.int64), **leaves)
    data = buf.getvalue()
    folder = storage.join(root.rstrip("/"), WEIGHTS_DIR)
    storage.makedirs(folder)
    path = storage.join(folder, f"weights-{version:06d}.npz")
    storage.atomic_write(path, data)
    return WeightsRef(path, int(version), hashlib.sha256(data).hexdigest())


def retire_weights(ref: WeightsRef) -> None:
    """Remove a published version once its chunks are back (a missing file is fine)."""
    from schooner.cluster import storage

    if storage.exists(ref.path):
        storage.remove(ref.path)


def load_weights(ref: WeightsRef, model_config: Any) -> Any:
    """The model of `ref`, after checking the file is that version, byte for byte.

    Raises:
        StaleWeightsError: the file's digest or version is not the one the trainer published.
    """
    import jax
    import jax.numpy as jnp

    from schooner.cluster import storage
    from schooner.model import model_shapes

    data = storage.read_bytes(ref.path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref.digest:
        raise StaleWeightsError(
            f"rollout worker: {ref.path} (version {ref.version}) has digest {digest[:12]}, not the "
            f"{ref.digest[:12]} the trainer published: the file was rewritten (another run writing the same "
            "folder?) or is torn; refusing to sample with weights of another step"
        )
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        held = int(z["__version__"])
        if held != ref.version:
            raise StaleWeightsError(
                f"rollout worker: asked for version {ref.version} but {ref.path} holds version {held}; "
                "refusing to sample with weights of another step"
            )
        arrays = [z[f"leaf_{i:05d}"] for i in range(len(z.files) - 1)]
    shapes = model_shapes(model_config)
    like, treedef = jax.tree.flatten(shapes)
    if len(like) != len(arrays) or any(a.shape != s.shape for a, s in zip(arrays, like, strict=True)):
        raise ValueError(
            f"rollout worker: {ref.path} holds {len(arrays)} arrays that are not the leaves of the model "
            f"config it was sent with ({len(like)} leaves)"
        )
    return jax.tree.unflatten(treedef, [jnp.asarray(a) for a in arrays])


# -- the worker's job ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ChunkJob:
    """One chunk of a rollout group, as a worker receives it."""

    weights: WeightsRef
    model_config: Any
    prompts: Sequence[Sequence[int]]
    sampling: Any
    seed: int
    group: int
    chunk: int
    chunks: int
    max_prompt_tokens: int
    pad_id: int
    row_ids: Sequence[str] | None = None
    sampling_round: int = 0
    """The dynamic-sampling round (0 without dynamic sampling)."""


_loaded: tuple[str, Any] | None = None
"""The last weights this worker process loaded: (digest, model)."""


def sample_chunk(job: ChunkJob) -> dict[str, Any]:
    """A worker's job: the chunk's rollouts from the weights version it names (never another)."""
    global _loaded
    from ._rl_rollout import rollout

    if _loaded is None or _loaded[0] != job.weights.digest:
        _loaded = None  # drop the old weights before reading the new ones
        _loaded = (job.weights.digest, load_weights(job.weights, job.model_config))
    rb = rollout(
        _loaded[1],
        job.prompts,
        job.sampling,
        seed=job.seed,
        step=job.group,
        max_prompt_tokens=job.max_prompt_tokens,
        row_ids=job.row_ids,
        pad_id=job.pad_id,
        key=chunk_key(job.seed, job.group, job.chunk, job.chunks, job.sampling_round),
    )
    out = {f.name: getattr(rb, f.name) for f in dataclasses.fields(rb)}
    return out | {"version": job.weights.version, "pid": os.getpid()}


# -- the trainer's side ----------------------------------------------------------------------------------
class RolloutPool:
    """Samples a rollout group in chunks: in this process (`workers=0`) or as jobs of the current cluster
    client on `workers` workers (module docstring).

    Args:
        workers: N; 0 samples here.
        root: the run folder (the weights go under `rollout-weights/`).
        model_config: the policy's config (a worker builds the model's structure from it).
        resources: each worker's `ResourceConfig` (default one CPU).
    """

    def __init__(self, workers: int, root: str, model_config: Any, resources: Any = None) -> None:
        self.workers, self.root, self.model_config, self.resources = workers, root, model_config, resources
        self.last_versions: list[int] = []
        """The weights version each chunk of the last group was sampled with (workers > 0)."""
        self.last_pids: list[int] = []
        """The process that sampled each chunk of the last group."""

    def chunk_size(self, num_prompts: int, chunk: int | None) -> int | None:
        """`chunk`, or with workers and no chunk size: the prompts split evenly over the workers."""
        if chunk is None and self.workers > 0:
            return math.ceil(num_prompts / self.workers)
        return chunk

    def rollout(
        self,
        model: Any,
        prompts: Sequence[Sequence[int]],
        *,
        sampling: Any,
        seed: int,
        group: int,
        max_prompt_tokens: int,
        pad_id: int,
        chunk: int | None,
        row_ids: Sequence[str] | None = None,
        sampling_round: int = 0,
    ) -> Any:
        """The group's `RolloutBatch` (of round `sampling_round` with dynamic sampling): its chunks' rows in
        chunk order."""
        from ._rl_rollout import rollout

        ids = [str(i) for i in range(len(prompts))] if row_ids is None else [str(r) for r in row_ids]
        slices = chunk_slices(len(prompts), self.chunk_size(len(prompts), chunk))
        if self.workers == 0:
            parts = [
                rollout(
                    model,
                    prompts[s],
                    sampling,
                    seed=seed,
                    step=group,
                    max_prompt_tokens=max_prompt_tokens,
                    row_ids=ids[s],
                    pad_id=pad_id,
                    key=chunk_key(seed, group, c, len(slices), sampling_round),
                )
                for c, s in enumerate(slices)
            ]
            self.last_versions, self.last_pids = [], [os.getpid()] * len(parts)
            return parts[0] if len(parts) == 1 else _concat(parts)
        return self._remote(
            model, prompts, ids, slices, sampling, seed, group, max_prompt_tokens, pad_id, sampling_round
        )

    def _remote(
        self,
        model: Any,
        prompts: Sequence[Sequence[int]],
        ids: Sequence[str],
        slices: Sequence[slice],
        sampling: Any,
        seed: int,
        group: int,
        cap: int,
        pad_id: int,
        sampling_round: int = 0,
    ) -> Any:
        from schooner.cluster import ResourceConfig, current_client

        from ._rl_rollout import RolloutBatch

        ref = publish_weights(model, self.root, group)
        jobs = [
            ChunkJob(
                weights=ref,
                model_config=self.model_config,
                prompts=[list(map(int, p)) for p in prompts[s]],
                sampling=sampling,
                seed=seed,
                group=group,
                chunk=c,
                chunks=len(slices),
                max_prompt_tokens=cap,
                pad_id=pad_id,
                row_ids=ids[s],
                sampling_round=sampling_round,
            )
            for c, s in enumerate(slices)
        ]
        client = current_client()
        try:
            results = list(
                client.map(
                    sample_chunk,
                    jobs,
                    resources=self.resources or ResourceConfig.with_cpu(),
                    max_workers=self.workers,
                    name=f"rollout-group-{group}",
                )
            )
        finally:
            retire_weights(ref)
        self.last_versions = [int(r.pop("version")) for r in results]
        self.last_pids = [int(r.pop("pid")) for r in results]
        if self.last_versions != [group] * len(results):  # sample_chunk refuses any other; say so if not
            raise StaleWeightsError(
                f"rollout group {group}: chunks came back from versions {self.last_versions}"
            )
        parts = [RolloutBatch(**r) for r in results]
        return parts[0] if len(parts) == 1 else _concat(parts)


def _concat(parts: Sequence[Any]) -> Any:
    """One `RolloutBatch` of the chunks' rows, in order."""
    from ._rl_rollout import RolloutBatch

    arrays = ("tokens", "mask", "old_logprobs", "prompt_lengths", "completion_lengths")
    return RolloutBatch(
        **{f: np.concatenate([getattr(p, f) for p in parts]) for f in arrays},
        stop_reasons=tuple(r for p in parts for r in p.stop_reasons),
        row_ids=tuple(r for p in parts for r in p.row_ids),
        group_size=parts[0].group_size,
        skipped=tuple(s for p in parts for s in p.skipped),
    )
