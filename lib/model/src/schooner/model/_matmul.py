"""Matrix products of the model, on the two kernel paths of :mod:`._kernels`.

``kernels="xla"`` (GPU/TPU): named einsums / ``lax.dot_general`` with ``preferred_element_type`` and plain
autodiff. GPUs and TPUs accumulate 16-bit products in float32 whatever the output type, so 16-bit
products stay 16-bit unless a float32 result is asked for (the logits).

``kernels="cpu"``: every product is ONE 2-D GEMM. A multi-dimensional ``einsum`` lowers to a ``dot_general``
whose gradients XLA's CPU backend runs as batched or transposing products (the tiny Llama's MLP forward +
backward took 1.6x longer that way). 16-bit products accumulate in float32 (XLA:CPU runs bf16 GEMMs
natively, with AVX512-BF16/AMX kernels, only then; bf16 x bf16 -> bf16 is upcast to a float32 GEMM plus
converts), and their backward is hand-written: the forward keeps ``a^T`` so the weight gradient is the
canonical ``a^T @ g``, with barriers that keep XLA from folding the transposes back into the products
(XLA:CPU's fast 16-bit GEMMs take only [M, K] x [K, N]; a folded transpose sends the product to the generic
float32 path at about half the speed, or, where that path has no bf16 kernel, to a run-time error).
"""

from __future__ import annotations

import functools

import haliax as hax
import jax
import jax.numpy as jnp
from haliax import NamedArray


def _is_16bit(dtype: jnp.dtype) -> bool:
    return jnp.dtype(dtype).itemsize == 2


def barrier(x):
    """``jax.lax.optimization_barrier``: XLA may not fold a transpose on one side into a product on the
    other (used on the CPU path only; see the module docstring)."""
    return jax.lax.optimization_barrier(x)


# -- the CPU path --------------------------------------------------------------------------------------
def _mm_cpu(a: jax.Array, b: jax.Array, transpose_b: bool, out_dtype: jnp.dtype) -> jax.Array:
    acc = jnp.float32 if _is_16bit(a.dtype) else None
    out = jax.lax.dot_general(
        a, b, (((1,), (1 if transpose_b else 0,)), ((), ())), preferred_element_type=acc
    )
    return out.astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul_cpu16(a: jax.Array, b: jax.Array, transpose_b: bool, out_dtype: jnp.dtype) -> jax.Array:
    return _mm_cpu(a, b, transpose_b, out_dtype)


def _matmul_cpu16_fwd(a, b, transpose_b, out_dtype):
    # Keep a^T [K, M] for the weight gradient, so that it is the canonical a^T @ g.
    return _mm_cpu(a, b, transpose_b, out_dtype), (barrier(a.T), b)


def _matmul_cpu16_bwd(transpose_b, out_dtype, res, g):
    at, b = res
    g = g.astype(b.dtype)  # the cotangent in the compute dtype: both gradient GEMMs stay 16-bit
    da = _mm_cpu(g, b, not transpose_b, b.dtype)  # [M, N] x b -> [M, K]
    db = _mm_cpu(at, g, False, b.dtype)  # a^T [K, M] @ g [M, N] = [K, N]; b is [N, K] when transpose_b
    return da, barrier(db).T if transpose_b else db


_matmul_cpu16.defvjp(_matmul_cpu16_fwd, _matmul_cpu16_bwd)


# -- both paths ----------------------------------------------------------------------------------------
def _einsum(x: NamedArray, w: NamedArray, names: tuple[str, ...], preferred: jnp.dtype | None) -> NamedArray:
    """``hax.dot(x, w, axis=names)`` as one ``jnp.einsum`` (haliax 1.4.dev453's own einsum calls
    ``jax.core.is_constant_dim``, deprecated in jax 0.10, which warns on every trace)."""
    letters: dict[str, str] = {}
    for ax in (*x.axes, *w.axes):
        letters.setdefault(ax.name, chr(ord("a") + len(letters)))
    out_axes = [a for a in x.axes if a.name not in names]
    out_axes += [a for a in w.axes if a.name not in names and all(a.name != o.name for o in out_axes)]
    spec = "{},{}->{}".format(
        *("".join(letters[a.name] for a in axes) for axes in (x.axes, w.axes, out_axes))
    )
    return hax.named(jnp.einsum(spec, x.array, w.array, preferred_element_type=preferred), tuple(out_axes))


def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    transpose_b: bool = False,
    out_dtype: jnp.dtype | None = None,
    kernels: str = "xla",
) -> jax.Array:
    """``a @ b`` (``a @ b.T`` when ``transpose_b``) for 2-D ``a`` [M, K], in ``out_dtype`` (default a's).

    A float32 ``out_dtype`` of 16-bit operands is asked for as such (``preferred_element_type``) on both
    paths, not rounded to 16 bits first. On the CPU path 16-bit operands also take the hand-written backward
    (both gradient products with 16-bit operands and float32 accumulation).
    """
    out_dtype = jnp.dtype(a.dtype if out_dtype is None else out_dtype)
    if kernels == "cpu":
        if _is_16bit(a.dtype) and a.dtype == b.dtype:
            return _matmul_cpu16(a, b, transpose_b, out_dtype)
        return _mm_cpu(a, b, transpose_b, out_dtype)
    wide = out_dtype == jnp.float32 and _is_16bit(a.dtype)
    dims = (((1,), (1 if transpose_b else 0,)), ((), ()))
    out = jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32 if wide else None)
    return out.astype(out_dtype)


def named_dot(
    x: NamedArray,
    w: NamedArray,
    contract: str | tuple[str, ...],
    *,
    kernels: str = "xla",
    out_dtype: jnp.dtype | None = None,
) -> NamedArray:
    """Contract ``x`` and ``w`` over the named axes ``contract``; other axes are kept (x's, then w's).

    ``kernels="xla"``: one ``jnp.einsum`` (what ``hax.dot`` computes). ``kernels="cpu"``: one 2-D product,
    x's kept axes flattened into rows and w's into columns (the leading batch axis stays outermost, so a batch
    sharding carries over to the rows); operands whose layout does not flatten (an axis shared but not
    contracted) take the einsum.
    """
    names = (contract,) if isinstance(contract, str) else tuple(contract)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    x_free = [a for a in x.axes if a.name not in names]
    w_free = [a for a in w.axes if a.name not in names]
    x_names = [a.name for a in x.axes]
    flat = kernels == "cpu" and not {a.name for a in x_free} & {a.name for a in w.axes}
    if not flat:
        wide = out_dtype == jnp.float32 and _is_16bit(x.dtype)
        return _einsum(x, w, names, jnp.float32 if wide else None).astype(out_dtype)
    # Contracted axes in x's order; both operands are brought to that order (a no-op for the usual layouts).
    con = [n for n in x_names if n in names]
    xa = x.rearrange((*x_free, *con)).array if x_names != [a.name for a in x_free] + con else x.array
    k = 1
    for n in con:
        k *= x.resolve_axis(n).size
    x2 = xa.reshape(-1, k)
    w_names = [a.name for a in w.axes]
    if w_names[: len(con)] == con:
        w2, transpose = w.array.reshape(k, -1), False
    elif w_names[len(w_names) - len(con) :] == con:
        w2, transpose = w.array.reshape(-1, k), True
    else:
        w2, transpose = w.rearrange((*con, *w_free)).array.reshape(k, -1), False
    out = matmul(x2, w2, transpose_b=transpose, out_dtype=out_dtype, kernels="cpu")
    shape = tuple(a.size for a in x_free) + tuple(a.size for a in w_free)
    return hax.named(out.reshape(shape), (*x_free, *w_free))
