"""cuDNN flash attention on NVIDIA GPUs: causal, grouped-query, and documents through cuDNN's packed layout.

``jax.nn.dot_product_attention(implementation="cudnn")`` takes a document mask only as a dense bias
(a [B, 1, T, T] array read in every layer, forward and backward, with its gradient computed too). cuDNN's
packed layout (Hopper and later) describes the documents of each row by their offsets and lengths instead,
and skips the blocks between documents. jax (0.10-0.11) exposes it only in its private
``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`` (``q_offsets``/``kv_offsets`` [B, M + 1] and
``q_seqlen``/``kv_seqlen`` [B, M], -1 past a row's last document); :func:`packed_segments` converts
segment ids to that form, and ``tests/test_cudnn.py`` checks that the mask it describes is the reference mask.

The packed form holds at most ``max_segments`` documents per row (:data:`MAX_SEGMENTS` by default) and takes
each run of equal ids as one document, so it equals the reference mask (same id = same document) when the ids
never decrease along a row, as every loader of ``schooner.tokenize`` writes them. A batch with more documents
in a row, or ids that decrease, takes the blocked path instead (a ``lax.cond`` on the batch: correct, slower).

Where cuDNN cannot take the shape (not a bf16/fp16 dtype, head dim past cuDNN's limit, an odd length with a
mask bias, no NVIDIA GPU), :func:`cudnn_attention` runs the caller's fallback (the blocked path, which never
holds the full [B, heads, T, T] float32 scores) and logs why, once per shape.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

logger = logging.getLogger(__name__)

MAX_SEGMENTS = 64
"""Documents per row the packed layout holds (rows of 2048 tokens with documents of 32 tokens on average)."""

_DETECT: Any = object()


class PackedSegments(NamedTuple):
    """Segment ids as cuDNN's packed layout.

    Attributes:
        offsets: int32[B, M + 1], the first position of each document of a row, then -1 (``M`` =
            ``max_segments``; the last column is always -1, as jax's packed-layout API takes it).
        lengths: int32[B, M], each document's length, -1 past the row's last document.
        fits: bool[], whether the layout describes the segment ids' mask exactly: every row has at most
            ``max_segments`` runs of equal ids, and the ids never decrease along a row.
    """

    offsets: jax.Array
    lengths: jax.Array
    fits: jax.Array


def packed_segments(segment_ids: jax.Array, max_segments: int = MAX_SEGMENTS) -> PackedSegments:
    """cuDNN's packed layout of int[B, T] segment ids: each run of equal ids is one document.

    Example:
        >>> import numpy as np
        >>> p = packed_segments(np.array([[0, 0, 0, 1, 1, 2]]), max_segments=4)
        >>> p.offsets.tolist(), p.lengths.tolist(), bool(p.fits)
        ([[0, 3, 5, -1, -1]], [[3, 2, 1, -1]], True)
    """
    if isinstance(max_segments, bool) or not isinstance(max_segments, int) or max_segments < 1:
        raise ValueError(f"max_segments must be a positive int; got {max_segments=!r}.")
    seg = jnp.asarray(segment_ids)
    if seg.ndim != 2:
        raise ValueError(f"segment_ids must be int[batch, seq_len]; got shape {tuple(seg.shape)}.")
    b = seg.shape[0]
    starts_run = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    run = jnp.cumsum(starts_run, axis=1, dtype=jnp.int32) - 1  # [B, T]: the run of each position
    runs = run[:, -1] + 1
    r = jnp.arange(max_segments, dtype=jnp.int32)
    lengths = jnp.sum(run[:, :, None] == r[None, None, :], axis=1, dtype=jnp.int32)  # [B, M]
    starts = jnp.cumsum(lengths, axis=1, dtype=jnp.int32) - lengths
    present = r[None, :] < runs[:, None]
    lengths = jnp.where(present, lengths, -1)
    offsets = jnp.concatenate([jnp.where(present, starts, -1), jnp.full((b, 1), -1, jnp.int32)], axis=1)
    fits = jnp.all(runs <= max_segments) & jnp.all(seg[:, 1:] >= seg[:, :-1])
    return PackedSegments(offsets, lengths, fits)


def unsupported_reason(
    q: jax.Array, k: jax.Array, *, bias: bool, capability: tuple[int, int] | None
) -> str | None:
    """Why cuDNN flash attention cannot take these [B, T, N, H] queries and keys (None when it can): jax's own
    checks (``check_is_flash_attention``), read ahead so the model can fall back instead of failing.
    ``bias``: documents go in as a mask bias; ``capability``: the GPU's compute capability (None: no GPU)."""
    if capability is None:
        return "cuDNN attention needs an NVIDIA GPU"
    if q.dtype not in (jnp.bfloat16, jnp.float16) or k.dtype != q.dtype:
        return f"cuDNN flash attention takes bf16/fp16 only; got {q.dtype}"
    h_max = 256 if capability >= (9, 0) else 128
    h = q.shape[-1]
    if h > h_max or h % 8:
        return f"cuDNN flash attention needs a head dim <= {h_max} and a multiple of 8; got {h}"
    if bias and q.shape[1] % 2:
        return f"cuDNN flash attention with a mask bias needs an even sequence length; got {q.shape[1]}"
    return None


@functools.cache
def _log_once(message: str) -> None:
    logger.warning(message)


def keep_residuals(fn: Callable[..., jax.Array], name: str, differentiable: int) -> Callable[..., jax.Array]:
    """``fn`` whose backward residuals (for cuDNN: the output and the softmax statistics) all carry the
    ``checkpoint_name`` ``name``, so a remat policy that saves ``name`` keeps them and never runs the forward
    kernel again in the backward. The first ``differentiable`` arguments get gradients, the rest (integer
    offsets and lengths) none."""

    @jax.custom_vjp
    def wrapped(*args: jax.Array) -> jax.Array:
        return fn(*args)

    def fwd(*args: jax.Array) -> tuple[jax.Array, Any]:
        out, vjp = jax.vjp(lambda *d: fn(*d, *args[differentiable:]), *args[:differentiable])
        named = jax.tree_util.tree_map(lambda r: checkpoint_name(r, name), vjp)
        return out, (named, (None,) * (len(args) - differentiable))  # the Nones: no gradient for the rest

    def bwd(res: Any, g: jax.Array) -> tuple[Any, ...]:
        vjp, rest = res
        return (*vjp(g), *rest)

    wrapped.defvjp(fwd, bwd)
    return wrapped


class CudnnKernels(NamedTuple):
    """The three cuDNN calls :func:`cudnn_attention` makes (tests pass emulations built from the reference)."""

    causal: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    masked: Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
    packed: Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


_Implementation = Literal["xla", "cudnn"]


def _causal(
    q: jax.Array, k: jax.Array, v: jax.Array, *, implementation: _Implementation = "cudnn"
) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def _masked(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array,
    *,
    implementation: _Implementation = "cudnn",
) -> jax.Array:
    """Documents as a mask (jax turns it into cuDNN's additive bias); ``implementation="xla"`` in tests."""
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None, :, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation=implementation)


def _packed(q: jax.Array, k: jax.Array, v: jax.Array, offsets: jax.Array, lengths: jax.Array) -> jax.Array:
    # jax's public dot_product_attention (0.10-0.11) takes one length per row; the packed layout is only in
    # this private module (jax's own tests use it). tests/test_cudnn.py pins its signature.
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_dpa

    return cudnn_dpa(
        q,
        k,
        v,
        None,
        None,
        lengths,
        lengths,
        offsets,
        offsets,
        scale=1.0 / q.shape[-1] ** 0.5,
        mask_type=MaskType.PADDING_CAUSAL,
        qkv_layout="BTNH",
    )


CUDNN = CudnnKernels(_causal, _masked, _packed)


def cudnn_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    fallback: Callable[[jax.Array, jax.Array, jax.Array, jax.Array | None], jax.Array],
    packed: bool = True,
    max_segments: int = MAX_SEGMENTS,
    residual_name: str = "attention_output",
    capability: Any = _DETECT,
    kernels: CudnnKernels = CUDNN,
) -> jax.Array:
    """Causal (and segment-masked) attention by cuDNN flash attention: q [B, T, N, H], k and v [B, T, K, H].

    Documents: with ``packed`` on Hopper or later, cuDNN's packed layout (:func:`packed_segments`), the batch
    taking ``fallback`` when it does not fit; otherwise (``packed=False``, or an older GPU, logged) a dense
    mask bias. Where cuDNN cannot take the shape (:func:`unsupported_reason`), ``fallback`` (logged). The
    kernels' residuals are named ``residual_name`` (:func:`keep_residuals`). ``capability``: the GPU's compute
    capability, detected by default (None: no GPU).
    """
    from ._kernels import gpu_compute_capability

    cap = gpu_compute_capability() if capability is _DETECT else capability
    use_packed = segment_ids is not None and packed and cap is not None and cap >= (9, 0)
    if segment_ids is not None and packed and cap is not None and not use_packed:
        _log_once(
            f"cuDNN's packed layout needs Hopper (compute capability 9.0); this GPU is {cap}: documents go "
            "in as a mask bias"
        )
    bias = segment_ids is not None and not use_packed
    reason = unsupported_reason(q, k, bias=bias, capability=cap)
    if reason is not None:
        _log_once(f"attention q{list(q.shape)} {q.dtype}: {reason}; using the blocked path")
        return fallback(q, k, v, segment_ids)
    if segment_ids is None:
        return keep_residuals(kernels.causal, residual_name, 3)(q, k, v)
    if not use_packed:
        return keep_residuals(kernels.masked, residual_name, 3)(q, k, v, segment_ids)
    layout = packed_segments(segment_ids, max_segments)
    run_packed = keep_residuals(kernels.packed, residual_name, 3)
    return jax.lax.cond(
        layout.fits,
        lambda q, k, v, seg, off, lens: run_packed(q, k, v, off, lens),
        lambda q, k, v, seg, off, lens: fallback(q, k, v, seg),
        q,
        k,
        v,
        segment_ids,
        layout.offsets,
        layout.lengths,
    )
