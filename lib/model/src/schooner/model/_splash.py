"""Attention on TPU without the score matrix: jax's Pallas splash-attention kernel.

``jax.experimental.pallas.ops.tpu.splash_attention`` computes causal, segment-masked attention block by
block in VMEM (a flash-attention kernel that also skips the blocks a mask rules out), with a backward that
recomputes the scores from the saved log-sum-exp. Nothing of size [T, T] is ever in HBM: at 16 x 2048
tokens the plain ``jax.nn.dot_product_attention`` of a 134M Llama held 80+ GB of float32 scores.

Grouped-query attention runs the kernel's multi-query form once per key/value head (``vmap``), so keys and
values are never repeated. Sequences are padded to a multiple of 128 (the kernel's smallest block); the
padded keys come after every real query, so causality keeps them out, and the padded queries are dropped.

The kernel runs on TPUs; elsewhere (tests on CPU) it runs through Pallas's interpreter, which computes the
same blocks in plain XLA (slow, for checking the math only). On a device mesh it runs per shard under
``shard_map`` (batch and heads split as the activation mapping says; the sequence stays whole).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

_LANE = 128  # the kernel's smallest block along the sequence
BLOCK = 512
"""Query and key block of the kernel (or the largest of 256, 128 that divides the padded sequence)."""
RESIDUALS = "splash_residuals"
"""``checkpoint_name`` of the kernel's saved output and log-sum-exp (see ``Remat`` policies)."""


@dataclasses.dataclass(frozen=True)
class SplashSettings:
    """Block sizes of the kernel (performance only; the result does not depend on them).

    Attributes:
        block: query/key block of the forward and backward kernels (capped by the padded sequence).
        fused_backward: one backward kernel for dq, dk and dv (else separate dq and dkv kernels).
    """

    block: int = BLOCK
    fused_backward: bool = True


SETTINGS = SplashSettings()


def _block_for(t: int, block: int) -> int:
    for b in (block, 512, 256, _LANE):
        if b <= block and t % b == 0:
            return b
    return _LANE


@functools.lru_cache(maxsize=32)
def _kernel(t: int, groups: int, block: int, fused: bool, interpret: bool) -> Any:
    """The splash kernel for sequence ``t`` (a multiple of 128) and ``groups`` query heads per key head."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b = _block_for(t, block)
    bwd: dict[str, Any] = dict(block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b)
    if fused:
        bwd["use_fused_bwd_kernel"] = True
    else:
        bwd.update(block_q_dq=b, block_kv_dq=b)
    sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, **bwd)
    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(groups)])
    # Built once and cached across traces: its mask tables must be concrete arrays, not this trace's.
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mqa_single_device(
            mask, block_sizes=sizes, residual_checkpoint_name=RESIDUALS, interpret=interpret
        )


def _splash_local(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, *, interpret: bool
) -> jax.Array:
    """[B, T, N, H] attention of one shard (every row's sequence whole)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    pad = (-t) % _LANE
    if pad:
        widths = [(0, 0), (0, pad), (0, 0), (0, 0)]
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
        if segment_ids is not None:
            segment_ids = jnp.pad(segment_ids, [(0, 0), (0, pad)], constant_values=-1)
    tp = t + pad
    kernel = _kernel(tp, g, SETTINGS.block, SETTINGS.fused_backward, interpret)
    # [B, T, N, H] -> [B, K, G, T, H] (query heads of one key head together); the kernel does not scale q.
    qh = (q * jnp.asarray(h**-0.5, q.dtype)).reshape(b, tp, kv, g, h).transpose(0, 2, 3, 1, 4)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, H]

    def row(q1: jax.Array, k1: jax.Array, v1: jax.Array, s1: jax.Array | None) -> jax.Array:
        ids = None if s1 is None else sk.SegmentIds(q=s1, kv=s1)
        return jax.vmap(lambda qq, kk, vv: kernel(qq, kk, vv, segment_ids=ids))(q1, k1, v1)

    if segment_ids is None:
        out = jax.vmap(lambda a, b_, c: row(a, b_, c, None))(qh, kh, vh)
    else:
        out = jax.vmap(row)(qh, kh, vh, segment_ids.astype(jnp.int32))
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, tp, n, h)  # [B, K, G, T, H] -> [B, T, N, H]
    return out[:, :t] if pad else out


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    interpret: bool,
    specs: tuple[Any, PartitionSpec, PartitionSpec] | None = None,
) -> jax.Array:
    """Causal (and segment-masked) attention by the splash kernel; arguments and result as ``attention``.

    Args:
        q, k, v: [B, T, N, H] queries, [B, T, K, H] keys and values (K divides N).
        segment_ids: int[B, T] or None.
        interpret: run through Pallas's interpreter (any backend) instead of compiling for a TPU.
        specs: ``(mesh, qkv_spec_q, qkv_spec_kv)``: run per shard with ``shard_map`` on ``mesh``, q split as
            ``qkv_spec_q`` and k/v as ``qkv_spec_kv`` (dims 0 and 2 only: batch and heads); None: as is.
    """
    fn = functools.partial(_splash_local, interpret=interpret)
    if specs is None:
        return fn(q, k, v, segment_ids)
    mesh, spec_q, spec_kv = specs
    spec_s = PartitionSpec(spec_q[0], None)
    if segment_ids is None:
        body = jax.shard_map(
            lambda a, b, c: fn(a, b, c, None),
            mesh=mesh,
            in_specs=(spec_q, spec_kv, spec_kv),
            out_specs=spec_q,
            check_vma=False,
        )
        return body(q, k, v)
    body = jax.shard_map(
        fn, mesh=mesh, in_specs=(spec_q, spec_kv, spec_kv, spec_s), out_specs=spec_q, check_vma=False
    )
    return body(q, k, v, segment_ids)
