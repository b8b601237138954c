"""Grouped-query self-attention with RoPE, optional qk-norm and document (segment) masking.

Implementations (``LlamaConfig.attention_implementation``; by the kernel path when None, see ``_kernels.py``):
``"blocked"`` (CPU), ``"splash"`` (TPU), ``"cudnn"`` / ``"cudnn_bias"`` (NVIDIA GPU, ``_cudnn.py``) and
``"xla"`` (``jax.nn.dot_product_attention``'s XLA path, float32 scores [B, heads, T, T]).
"""

from __future__ import annotations

from typing import Any, Literal

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis, NamedArray
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from ._config import LlamaConfig
from ._cudnn import cudnn_attention
from ._kernels import pallas_interpret, resolve_attention
from ._layers import (
    BATCH,
    EMBED,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    POSITION,
    ParamFactory,
    apply_rope,
    axes_for,
    ones,
    rms_norm,
)
from ._matmul import named_dot
from ._sharding import active_specs
from ._splash import splash_attention


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """bool[B, 1, T, T]: query t may see key s only within the same segment (causality is added separately)."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None, :, :]


ATTENTION_BLOCK = 128
"""Query block of :func:`blocked_attention` (keys after a block's last query are never computed)."""
# ``attention``'s implementations that are jax's XLA attention (jax's None is its XLA path too, jax 0.10-0.11).
_JAX_ATTENTION: dict[str | None, Literal["xla"]] = {None: "xla", "xla": "xla"}


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    implementation: str | None = None,
) -> jax.Array:
    """Causal (and segment-masked) attention.

    Args:
        q: [B, T, N, H] queries (RoPE applied).
        k: [B, T, K, H] keys; K divides N (grouped-query attention is native to the kernel).
        v: [B, T, K, H] values.
        segment_ids: int[B, T] or None (one document per row).
        implementation: ``"blocked"`` (:func:`blocked_attention`), ``"splash"`` (jax's Pallas TPU kernel,
            ``_splash.py``; interpreted on the CPU), ``"cudnn"`` (cuDNN flash attention, documents through
            cuDNN's packed layout; ``_cudnn.py``), ``"cudnn_bias"`` (cuDNN with documents as a mask bias) or
            ``"xla"`` / ``None`` for ``jax.nn.dot_product_attention``'s XLA path (jax's None is XLA too: it
            holds float32 scores [B, N, T, T]). The model passes ``"blocked"`` on its CPU kernel path,
            ``"splash"`` on its TPU path and ``"cudnn"`` on its XLA path on a GPU (``LlamaConfig.kernels``).

    Returns:
        [B, T, N, H] attention outputs in q's dtype.
    """
    if implementation == "blocked":
        return blocked_attention(q, k, v, segment_ids)
    if implementation == "splash":
        return splash_attention(q, k, v, segment_ids, interpret=pallas_interpret())
    if implementation in ("cudnn", "cudnn_bias"):
        return cudnn_attention(
            q,
            k,
            v,
            segment_ids,
            fallback=remat_blocked_attention,
            packed=implementation == "cudnn",
            residual_name=ATTENTION_OUTPUT,
        )
    if implementation not in _JAX_ATTENTION:
        raise ValueError(
            "attention implementation must be None, 'blocked', 'splash', 'xla', 'cudnn' or 'cudnn_bias'; got "
            f"{implementation!r}."
        )
    mask = None if segment_ids is None else segment_mask(segment_ids)
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, is_causal=True, implementation=_JAX_ATTENTION[implementation]
    )


def blocked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    block: int = ATTENTION_BLOCK,
    remat: bool = False,
) -> jax.Array:
    """Causal attention computed one block of ``block`` queries at a time, against keys up to the block's end.

    The key blocks above the causal diagonal are skipped rather than masked (about half the score and value
    FLOPs at long sequence lengths), and each block's [B, K, G, block, keys] scores are smaller than a full
    [B, N, T, T] tensor. Scores, softmax and the value product run in float32 whatever the input dtype:
    on CPU this is faster than 16-bit attention (no native 16-bit softmax) and it is the precise choice.
    Pure JAX, differentiable by autodiff. ``remat``: each block is a ``jax.checkpoint``, so the backward keeps
    only q, k and v and recomputes one block's scores at a time (never the [B, N, T, T] float32 scores: the
    GPU's fallback where cuDNN cannot take the shape; the CPU path keeps the blocks' softmax, measured
    faster there). Same arguments and result as :func:`attention`.
    """
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    dtype = q.dtype
    qg = q.astype(jnp.float32).reshape(b, t, kv, g, h) * (1.0 / h**0.5)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)

    def one_block(
        qb: jax.Array, kb: jax.Array, vb: jax.Array, segs: jax.Array | None, start: int
    ) -> jax.Array:
        end = start + qb.shape[1]
        scores = jnp.einsum("bqkgh,bskh->bkgqs", qb, kb)
        allowed = (jnp.arange(start, end)[:, None] >= jnp.arange(end)[None, :])[None, None, None]
        if segs is not None:
            same = segs[:, start:end, None] == segs[:, None, :end]
            allowed = allowed & same[:, None, None]
        probs = jax.nn.softmax(jnp.where(allowed, scores, jnp.float32(-1e30)), axis=-1)
        return jnp.einsum("bkgqs,bskh->bqkgh", probs, vb)

    run = jax.checkpoint(one_block, static_argnums=(4,)) if remat else one_block
    outs = []
    for start in range(0, t, block):
        end = min(start + block, t)
        segs = None if segment_ids is None else segment_ids[:, :end]
        outs.append(run(qg[:, start:end], k32[:, :end], v32[:, :end], segs, start))
    return jnp.concatenate(outs, axis=1).reshape(b, t, n, h).astype(dtype)


def remat_blocked_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None
) -> jax.Array:
    """:func:`blocked_attention` with each block rematerialised (the GPU's fallback from cuDNN)."""
    return blocked_attention(q, k, v, segment_ids, remat=True)


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """A plain, explicit reference of :func:`attention` for tests: repeat kv heads, softmax(QK^T/sqrt(d)) V.

    Computed in float32 with an explicit causal and segment mask (no fused kernel, no grouping trick).
    """
    _b, t, n, h = q.shape
    groups = n // k.shape[2]
    k = jnp.repeat(k, groups, axis=2).astype(jnp.float32)
    v = jnp.repeat(v, groups, axis=2).astype(jnp.float32)
    scores = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), k) / jnp.sqrt(jnp.float32(h))
    allowed = jnp.tril(jnp.ones((t, t), dtype=bool))[None, None, :, :]
    if segment_ids is not None:
        allowed = allowed & segment_mask(segment_ids)
    scores = jnp.where(allowed, scores, jnp.float32(-1e30))
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", probs, v).astype(q.dtype)


ATTENTION_QKV = "attention_qkv"
"""``checkpoint_name`` of the queries, keys and values after RoPE (see the "dots" remat)."""
ATTENTION_OUTPUT = "attention_output"
"""``checkpoint_name`` of the attention's [B, T, N, H] output (before the output projection) and, with cuDNN,
of the kernel's residuals (its output and softmax statistics: ``_cudnn.keep_residuals``), so the "dots" remat
never runs the attention forward again in the backward."""


def _shard_specs(q_axes: tuple[Axis, ...], kv_axes: tuple[Axis, ...]) -> Any:
    """(mesh, q spec, kv spec) for running a kernel per shard under the active activation mapping (batch and
    heads split; heads only when query and key heads split alike), or None without one."""
    active = active_specs(q_axes, kv_axes)
    if active is None:
        return None
    mesh, (sq, skv) = active
    if sq[2] != skv[2]:  # e.g. 8 query heads split 4 ways but 2 key heads not: keep heads whole
        sq, skv = PartitionSpec(sq[0], None, None, None), PartitionSpec(skv[0], None, None, None)
    return mesh, PartitionSpec(sq[0], None, sq[2], None), PartitionSpec(skv[0], None, skv[2], None)


class Attention(eqx.Module):
    """Self-attention with HF-shaped projections: q (heads, head_dim, embed), k/v (kv_heads, head_dim, embed),
    o (embed, heads, head_dim); optional per-head RMSNorm on q and k before RoPE (``qk_norm``)."""

    q_proj: NamedArray
    k_proj: NamedArray
    v_proj: NamedArray
    o_proj: NamedArray
    q_norm: NamedArray | None
    k_norm: NamedArray | None
    norm_eps: float = eqx.field(static=True)
    implementation: str | None = eqx.field(static=True, default=None)

    @staticmethod
    def init(config: LlamaConfig, params: ParamFactory, *, lead: tuple[Axis, ...] = ()) -> Attention:
        ax = axes_for(config)
        std = config.initializer_range
        out_std = std / (2 * config.num_layers) ** 0.5  # GPT-2 style: residual branches start small
        return Attention(
            q_proj=params.normal((*lead, ax[HEADS], ax[HEAD_DIM], ax[EMBED]), std),
            k_proj=params.normal((*lead, ax[KV_HEADS], ax[HEAD_DIM], ax[EMBED]), std),
            v_proj=params.normal((*lead, ax[KV_HEADS], ax[HEAD_DIM], ax[EMBED]), std),
            o_proj=params.normal((*lead, ax[EMBED], ax[HEADS], ax[HEAD_DIM]), out_std),
            q_norm=ones((*lead, ax[HEAD_DIM])) if config.qk_norm else None,
            k_norm=ones((*lead, ax[HEAD_DIM])) if config.qk_norm else None,
            norm_eps=config.norm_eps,
            implementation=config.attention_implementation,
        )

    def __call__(
        self,
        x: NamedArray,
        cos: jax.Array,
        sin: jax.Array,
        segment_ids: jax.Array | None,
        *,
        kernels: str,
        reference: bool = False,
    ) -> NamedArray:
        dtype = x.dtype
        q = named_dot(x, self.q_proj.astype(dtype), EMBED, kernels=kernels)
        k = named_dot(x, self.k_proj.astype(dtype), EMBED, kernels=kernels)
        v = named_dot(x, self.v_proj.astype(dtype), EMBED, kernels=kernels)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, HEAD_DIM, self.norm_eps, recompute=kernels != "cpu")
            k = rms_norm(k, self.k_norm, HEAD_DIM, self.norm_eps, recompute=kernels != "cpu")
        q_raw = q.rearrange((BATCH, POSITION, HEADS, HEAD_DIM)).array
        k_raw = k.rearrange((BATCH, POSITION, KV_HEADS, HEAD_DIM)).array
        v_raw = v.rearrange((BATCH, POSITION, KV_HEADS, HEAD_DIM)).array
        by_matmul = kernels == "tpu"
        q_raw = checkpoint_name(apply_rope(q_raw, cos, sin, by_matmul=by_matmul), ATTENTION_QKV)
        k_raw = checkpoint_name(apply_rope(k_raw, cos, sin, by_matmul=by_matmul), ATTENTION_QKV)
        v_raw = checkpoint_name(v_raw, ATTENTION_QKV)
        q_axes = (x.resolve_axis(BATCH), x.resolve_axis(POSITION), self.q_proj.axes[0], self.q_proj.axes[1])
        impl = resolve_attention(self.implementation, kernels)
        if reference:
            out = reference_attention(q_raw, k_raw, v_raw, segment_ids)
        elif impl == "splash":
            kv_axes = (*q_axes[:2], self.k_proj.axes[0], self.k_proj.axes[1])
            out = splash_attention(
                q_raw,
                k_raw,
                v_raw,
                segment_ids,
                interpret=pallas_interpret(),
                specs=_shard_specs(q_axes, kv_axes),
            )
        else:
            out = attention(q_raw, k_raw, v_raw, segment_ids, implementation=impl)
        out = checkpoint_name(out, ATTENTION_OUTPUT)
        out_named = hax.named(out, q_axes)
        return named_dot(out_named, self.o_proj.astype(dtype), (HEADS, HEAD_DIM), kernels=kernels)
