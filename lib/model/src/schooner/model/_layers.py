"""Small building blocks: named axes, init helpers, RMSNorm, rotary embeddings, the SwiGLU MLP."""

from __future__ import annotations

import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis, NamedArray
from jax.ad_checkpoint import checkpoint_name

from ._config import LlamaConfig, RopeConfig
from ._matmul import named_dot

# The logical axis names the package uses; sharding maps them onto mesh axes (see _sharding.py).
BATCH = "batch"
POSITION = "position"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
VOCAB = "vocab"
EXPERTS = "experts"
LAYERS = "layers"


def axes_for(config: LlamaConfig) -> dict[str, Axis]:
    """The sized named axes of ``config`` (keys are the logical axis names)."""
    return {
        EMBED: Axis(EMBED, config.hidden_dim),
        MLP: Axis(MLP, config.intermediate_dim),
        HEADS: Axis(HEADS, config.num_heads),
        KV_HEADS: Axis(KV_HEADS, config.num_kv_heads),
        HEAD_DIM: Axis(HEAD_DIM, config.resolved_head_dim),
        VOCAB: Axis(VOCAB, config.vocab_size),
        LAYERS: Axis(LAYERS, config.num_layers),
    }


class ParamFactory:
    """Hands out initial weights as slices of ONE flat truncated-normal draw.

    One RNG op instead of one per tensor: threefry is expensive to compile, and a model has dozens of
    tensors. ``init`` runs the model builder twice under one jit: first with ``buffer=None`` to count the
    values needed (those zeros are dead code), then with the real draw.
    """

    def __init__(self, buffer: jax.Array | None = None):
        self.buffer = buffer
        self.offset = 0

    def normal(self, axes: tuple[Axis, ...], std: float) -> NamedArray:
        """Truncated (at 3 std) normal float32 weights of the named shape ``axes``, scaled by ``std``."""
        shape = tuple(a.size for a in axes)
        n = math.prod(shape)
        start, self.offset = self.offset, self.offset + n
        if self.buffer is None:
            return hax.named(jnp.zeros(shape, jnp.float32), axes)
        return hax.named(self.buffer[start : start + n].reshape(shape) * std, axes)


def ones(axes: tuple[Axis, ...]) -> NamedArray:
    return hax.named(jnp.ones(tuple(a.size for a in axes), jnp.float32), axes)


MLP_GATE_UP = "mlp_gate_up"
"""``checkpoint_name`` of the SwiGLU's gate and up products (dense and expert MLPs; see the "dots" remat)."""


def rms_norm(
    x: NamedArray, weight: NamedArray, axis: str, eps: float, *, recompute: bool = False
) -> NamedArray:
    """RMSNorm over ``axis``, computed in float32 (bf16 variance is too coarse), returned in x's dtype.

    ``recompute``: the backward recomputes the float32 work from ``x`` instead of keeping float32 copies of
    the activations (on accelerators they would be the largest thing a layer keeps; the "xla"/"tpu" kernel
    paths set it).
    """
    if recompute:
        return jax.checkpoint(lambda a, w: rms_norm(a, w, axis, eps))(x, weight)
    dtype = x.dtype
    xf = x.astype(jnp.float32)
    inv = hax.rsqrt(hax.mean(hax.square(xf), axis=axis) + eps)
    return ((xf * inv) * weight.astype(jnp.float32)).astype(dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> jax.Array:
    """Inverse rotary frequencies (float32[head_dim // 2]), with Llama-3 scaling when configured.

    Mirrors HF ``_compute_default_rope_parameters`` and ``_compute_llama3_parameters``.
    """
    inv_freq = 1.0 / (rope.theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if rope.kind == "default":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def rope_cos_sin(seq_len: int, head_dim: int, rope: RopeConfig) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables float32[seq_len, head_dim] in the HF "rotate half" layout."""
    inv_freq = rope_inv_freq(head_dim, rope)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, *, by_matmul: bool = False) -> jax.Array:
    """Rotate x[B, T, N, H] by position (HF ``apply_rotary_pos_emb``: halves, not interleaved pairs).

    Positions are absolute within the packed row; attention never crosses segments and RoPE scores depend
    only on relative position, so restarting positions per document would give identical results.

    ``by_matmul`` (the TPU kernel path): the rotated halves ``[-x2, x1]`` come from one product with a
    signed permutation matrix instead of slicing the head dimension in two: a TPU keeps the minor dimension
    in 128-wide lanes, so halves of a 64-wide head are lane shuffles (about 6% of a 134M Llama's step), while
    the product runs on the matrix unit. Exact: each output is one input times +-1.
    """
    half = x.shape[-1] // 2
    if by_matmul:
        eye = jnp.eye(half, dtype=x.dtype)
        zero = jnp.zeros((half, half), x.dtype)
        rotate = jnp.block([[zero, eye], [-eye, zero]])  # x @ rotate == concat([-x2, x1])
        exact = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None  # no bf16 passes for float32
        rotated = jnp.einsum(
            "btnh,hk->btnk", x, rotate, precision=exact, preferred_element_type=jnp.float32
        ).astype(x.dtype)
    else:
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c = cos[None, :, None, :].astype(x.dtype)
    s = sin[None, :, None, :].astype(x.dtype)
    return x * c + rotated * s


class SwiGLU(eqx.Module):
    """``down(silu(gate(x)) * up(x))`` with HF-shaped weights: gate/up (mlp, embed), down (embed, mlp)."""

    gate: NamedArray
    up: NamedArray
    down: NamedArray

    @staticmethod
    def init(
        embed: Axis,
        mlp: Axis,
        params: ParamFactory,
        *,
        std: float,
        out_std: float,
        lead: tuple[Axis, ...] = (),
    ) -> SwiGLU:
        return SwiGLU(
            gate=params.normal((*lead, mlp, embed), std),
            up=params.normal((*lead, mlp, embed), std),
            down=params.normal((*lead, embed, mlp), out_std),
        )

    def __call__(self, x: NamedArray, *, kernels: str) -> NamedArray:
        dtype = x.dtype
        mlp_axis = self.gate.axes[0].name
        g = checkpoint_name(named_dot(x, self.gate.astype(dtype), EMBED, kernels=kernels), MLP_GATE_UP)
        u = checkpoint_name(named_dot(x, self.up.astype(dtype), EMBED, kernels=kernels), MLP_GATE_UP)

        def down(g: NamedArray, u: NamedArray, w: NamedArray) -> NamedArray:
            return named_dot(hax.nn.silu(g) * u, w, mlp_axis, kernels=kernels)

        if kernels != "cpu":  # keep g and u only; silu(g) * u is recomputed in the backward (elementwise)
            down = jax.checkpoint(down)
        return down(g, u, self.down.astype(dtype))
