"""Small building blocks: named axes, init helpers, RMSNorm, rotary embeddings, the SwiGLU MLP."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis, NamedArray

from ._config import LlamaConfig, RopeConfig

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


def named_dot(x: NamedArray, w: NamedArray, contract: str | tuple[str, ...]) -> NamedArray:
    """Contract ``x`` and ``w`` over the named axes ``contract``; other axes are kept (x's, then w's).

    Computed as ONE 2-D matrix product: x's kept axes are flattened into rows and w's into columns. A
    multi-dimensional ``einsum`` lowers to a ``dot_general`` whose gradients XLA's CPU backend runs as
    batched or transposing products (the tiny Llama's MLP forward + backward took 1.6x longer that way);
    the 2-D form gives plain GEMMs forward and backward on every backend. Flattening keeps the leading
    (batch) axis outermost, so a batch sharding carries over to the rows unchanged.
    """
    names = (contract,) if isinstance(contract, str) else tuple(contract)
    x_names = [a.name for a in x.axes]
    w_names = [a.name for a in w.axes]
    shared_free = {n for n in x_names if n in w_names and n not in names}
    if shared_free or any(n not in x_names or n not in w_names for n in names):
        return _named_einsum(x, w, names)
    x_free = [a for a in x.axes if a.name not in names]
    w_free = [a for a in w.axes if a.name not in names]
    # Contracted axes in x's order; both operands are brought to that order (a no-op for the usual layouts).
    con = [n for n in x_names if n in names]
    xa = x.rearrange((*x_free, *con)).array if x_names != [a.name for a in x_free] + con else x.array
    k = 1
    for n in con:
        k *= x.resolve_axis(n).size
    x2 = xa.reshape(-1, k)
    w_con_first = w_names[: len(con)] == con
    w_con_last = w_names[len(w_names) - len(con) :] == con
    if w_con_first:
        w2, w_dims = w.array.reshape(k, -1), 0
    elif w_con_last:
        w2, w_dims = w.array.reshape(-1, k), 1
    else:
        w2, w_dims = w.rearrange((*con, *w_free)).array.reshape(k, -1), 0
    out = matmul(x2, w2, transpose_b=w_dims == 1, out_dtype=x.dtype)
    shape = tuple(a.size for a in x_free) + tuple(a.size for a in w_free)
    return hax.named(out.reshape(shape), (*x_free, *w_free))


def _accumulate_f32(dtype: jnp.dtype) -> bool:
    # 16-bit float GEMMs on XLA:CPU run natively (AVX512-BF16/AMX kernels) only when they accumulate into
    # float32 (`preferred_element_type`); bf16 x bf16 -> bf16 is upcast to a float32 GEMM plus converts.
    # GPUs and TPUs accumulate 16-bit GEMMs in float32 internally whatever the output type.
    return jnp.dtype(dtype).itemsize == 2 and jax.default_backend() == "cpu"


def _mm(a: jax.Array, b: jax.Array, transpose_b: bool, out_dtype: jnp.dtype) -> jax.Array:
    # A float32 result of 16-bit operands (the logits, the weight gradients of the fused loss) is asked for
    # as such on every backend, not rounded to 16 bits first and cast up.
    wide = jnp.dtype(out_dtype) == jnp.float32 and jnp.dtype(a.dtype).itemsize == 2
    acc = jnp.float32 if wide or _accumulate_f32(a.dtype) else None
    out = jax.lax.dot_general(
        a, b, (((1,), (1 if transpose_b else 0,)), ((), ())), preferred_element_type=acc
    )
    return out.astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul_lowp(a: jax.Array, b: jax.Array, transpose_b: bool, out_dtype: jnp.dtype) -> jax.Array:
    return _mm(a, b, transpose_b, out_dtype)


def cpu_barrier(x):
    """``jax.lax.optimization_barrier`` on CPU, the identity elsewhere.

    XLA folds a transpose feeding a product into the product's dimension numbers. XLA:CPU's fast 16-bit
    GEMMs take only the canonical [M, K] x [K, N] form, so a folded transpose sends a bf16 product to the
    generic float32 path (operands converted, about half the speed) or, where that path has no bf16 kernel,
    to a run-time error. A barrier between the transpose and the product keeps the transpose a copy.
    """
    return jax.lax.optimization_barrier(x) if jax.default_backend() == "cpu" else x


def _matmul_lowp_fwd(a, b, transpose_b, out_dtype):
    # Keep a^T [K, M] for the weight gradient, so that it is the canonical a^T @ g (see cpu_barrier).
    return _mm(a, b, transpose_b, out_dtype), (cpu_barrier(a.T), b)


def _matmul_lowp_bwd(transpose_b, out_dtype, res, g):
    at, b = res
    g = g.astype(b.dtype)  # the cotangent in the compute dtype: both gradient GEMMs stay 16-bit
    da = _mm(g, b, not transpose_b, b.dtype)  # [M, N] x b -> [M, K]
    db = _mm(at, g, False, b.dtype)  # a^T [K, M] @ g [M, N] = [K, N]; b is [N, K] when transpose_b
    return da, cpu_barrier(db).T if transpose_b else db


_matmul_lowp.defvjp(_matmul_lowp_fwd, _matmul_lowp_bwd)


def matmul(
    a: jax.Array, b: jax.Array, *, transpose_b: bool = False, out_dtype: jnp.dtype | None = None
) -> jax.Array:
    """``a @ b`` (``a @ b.T`` when ``transpose_b``) for 2-D ``a`` [M, K], in ``out_dtype`` (default a's).

    Mixed precision: when the operands are 16-bit floats the forward product and both gradient products
    take 16-bit operands (the incoming cotangent is cast to the compute dtype, as in Megatron-style bf16
    training) and accumulate in float32. Float32 operands take the plain path.
    """
    out_dtype = jnp.dtype(a.dtype if out_dtype is None else out_dtype)
    if jnp.dtype(a.dtype).itemsize == 2 and a.dtype == b.dtype:
        return _matmul_lowp(a, b, transpose_b, out_dtype)
    return _mm(a, b, transpose_b, out_dtype)


def _named_einsum(x: NamedArray, w: NamedArray, names: tuple[str, ...]) -> NamedArray:
    letters: dict[str, str] = {}
    for ax in (*x.axes, *w.axes):
        letters.setdefault(ax.name, chr(ord("a") + len(letters)))
    out_axes = [a for a in x.axes if a.name not in names]
    out_axes += [a for a in w.axes if a.name not in names and all(a.name != o.name for o in out_axes)]
    spec_x = "".join(letters[a.name] for a in x.axes)
    spec_w = "".join(letters[a.name] for a in w.axes)
    spec_o = "".join(letters[a.name] for a in out_axes)
    return hax.named(jnp.einsum(f"{spec_x},{spec_w}->{spec_o}", x.array, w.array), tuple(out_axes))


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


def rms_norm(x: NamedArray, weight: NamedArray, axis: str, eps: float) -> NamedArray:
    """RMSNorm over ``axis``, computed in float32 (bf16 variance is too coarse), returned in x's dtype."""
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


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x[B, T, N, H] by position (HF ``apply_rotary_pos_emb``: halves, not interleaved pairs).

    Positions are absolute within the packed row; attention never crosses segments and RoPE scores depend
    only on relative position, so restarting positions per document would give identical results.
    """
    half = x.shape[-1] // 2
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

    def __call__(self, x: NamedArray) -> NamedArray:
        dtype = x.dtype
        mlp_axis = self.gate.axes[0].name
        g = named_dot(x, self.gate.astype(dtype), EMBED)
        u = named_dot(x, self.up.astype(dtype), EMBED)
        h = hax.nn.silu(g) * u
        return named_dot(h, self.down.astype(dtype), mlp_axis)
