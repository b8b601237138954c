"""cuDNN attention's document masks, checked on CPU (no GPU here).

- ``packed_segments`` (segment ids -> cuDNN's packed offsets and lengths) describes exactly the reference mask
  (same id, same document) when it says it fits, and says it does not past the cap or for decreasing ids;
- every path a GPU's attention can take honours document boundaries: the cuDNN dispatch runs here with the
  cuDNN calls emulated (the packed call from the offsets and lengths alone; the mask-bias call through the
  same mask construction on jax's XLA path), and its fallbacks (past the cap, decreasing ids, a shape cuDNN
  refuses) are the real blocked path;
- ``keep_residuals`` makes a "save these names" remat keep the kernel's residuals instead of running the
  forward again;
- the private jax entry point of the packed layout still has the signature the model calls.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

from schooner.model._attention import blocked_attention, reference_attention, remat_blocked_attention
from schooner.model._cudnn import (
    CudnnKernels,
    _causal,
    _masked,
    cudnn_attention,
    keep_residuals,
    packed_segments,
)


def _mask_from_packed(offsets: np.ndarray, lengths: np.ndarray, t: int) -> np.ndarray:
    """bool[B, T, T]: q and k in one document as the packed layout describes it (numpy)."""
    b, m = lengths.shape
    mask = np.zeros((b, t, t), bool)
    for row in range(b):
        assert offsets[row, m] == -1
        for r in range(m):
            start, size = offsets[row, r], lengths[row, r]
            if size == -1:
                assert start == -1
                continue
            mask[row, start : start + size, start : start + size] = True
    return mask


def _monotone_ids(rng: np.random.Generator, b: int, t: int, max_runs: int) -> np.ndarray:
    out = np.zeros((b, t), np.int32)
    for row in range(b):
        runs = rng.integers(1, max_runs + 1)
        cuts = np.sort(rng.choice(np.arange(1, t), size=runs - 1, replace=False))
        ids = np.zeros(t, np.int32)
        for i, c in enumerate(cuts):
            ids[c:] = i + 1 + rng.integers(0, 2)  # ids may skip values; they never decrease
        out[row] = np.maximum.accumulate(ids)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_packed_segments_describe_the_reference_mask(seed):
    rng = np.random.default_rng(seed)
    t, m = 40, 6
    ids = _monotone_ids(rng, 5, t, m)
    packed = packed_segments(jnp.asarray(ids), max_segments=m)
    assert bool(packed.fits)
    offsets, lengths = np.asarray(packed.offsets), np.asarray(packed.lengths)
    assert offsets.shape == (5, m + 1) and lengths.shape == (5, m)
    assert offsets.dtype == np.int32 and lengths.dtype == np.int32
    np.testing.assert_array_equal(np.where(lengths > 0, lengths, 0).sum(axis=1), t)  # every position once
    reference = ids[:, :, None] == ids[:, None, :]
    np.testing.assert_array_equal(_mask_from_packed(offsets, lengths, t), reference)


def test_packed_segments_take_jax_s_example_layout():
    # The layout of jax's own packed-layout test (fused_attention_stablehlo_multigpu_test): starts, then -1.
    ids = np.array([[0] * 170 + [1] * 170 + [2] * 172, [0] * 400 + [3] * 112], np.int32)
    packed = packed_segments(jnp.asarray(ids), max_segments=3)
    assert np.asarray(packed.offsets).tolist() == [[0, 170, 340, -1], [0, 400, -1, -1]]
    assert np.asarray(packed.lengths).tolist() == [[170, 170, 172], [400, 112, -1]]


def test_packed_segments_refuse_what_they_cannot_describe():
    at_cap = np.array([[0, 1, 2, 3, 3, 3]], np.int32)
    assert bool(packed_segments(jnp.asarray(at_cap), max_segments=4).fits)
    assert not bool(packed_segments(jnp.asarray(at_cap), max_segments=3).fits)  # 4 documents, cap 3
    reused = np.array([[0, 0, 1, 1, 0, 0]], np.int32)  # id 0 again after id 1: the mask joins them
    assert not bool(packed_segments(jnp.asarray(reused), max_segments=8).fits)
    with pytest.raises(ValueError, match="max_segments must be a positive int"):
        packed_segments(jnp.asarray(at_cap), max_segments=0)


def _emulated_packed(q, k, v, offsets, lengths):
    """cuDNN's packed causal attention, from the offsets and lengths alone (not the segment ids)."""
    t = q.shape[1]
    m = lengths.shape[1]
    pos = jnp.arange(t)
    start = offsets[:, :m, None]
    inside = (pos[None, None, :] >= start) & (pos[None, None, :] < start + lengths[:, :, None])
    inside = inside & (lengths[:, :, None] > 0)
    doc = jnp.where(jnp.any(inside, axis=1), jnp.argmax(inside, axis=1), -1 - pos[None, :])
    return reference_attention(q, k, v, doc)


EMULATED = CudnnKernels(
    functools.partial(_causal, implementation="xla"),
    functools.partial(_masked, implementation="xla"),
    _emulated_packed,
)


def _qkv(b=2, t=24, n=4, kv=2, h=16, dtype=jnp.bfloat16, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(
        jax.random.normal(kk, (b, t, heads, h), jnp.float32).astype(dtype)
        for kk, heads in zip(ks, (n, kv, kv))
    )


SEGS = {
    "one document": None,
    "packed": np.array([[0] * 7 + [1] * 9 + [2] * 8, [0] * 20 + [4] * 4], np.int32),
    "past the cap": np.array([[0, 1, 2, 3, 4, 5] * 4, [0] * 24], np.int32).cumsum(axis=1) // 3,
    "decreasing ids": np.array([[0] * 8 + [1] * 8 + [0] * 8, [2] * 12 + [1] * 12], np.int32),
}


PATHS = [
    ("cudnn packed", (9, 0), jnp.bfloat16),
    ("cudnn bias", (9, 0), jnp.bfloat16),
    ("cudnn before Hopper", (8, 0), jnp.bfloat16),
    ("cudnn refuses float32", (9, 0), jnp.float32),
    ("blocked", None, jnp.bfloat16),
    ("blocked remat", None, jnp.float32),
    ("xla", None, jnp.float32),
]
# The default run: the packed path on every case, every path on packed documents; the rest is `slow`.
_CASES = [
    pytest.param(
        *p, c, id=f"{p[0]}-{c}", marks=() if p[0] == "cudnn packed" or c == "packed" else pytest.mark.slow
    )
    for p in PATHS
    for c in SEGS
]


@pytest.mark.parametrize("path,cap,dtype,case", _CASES)
def test_every_gpu_attention_path_honours_documents(path, cap, dtype, case):
    q, k, v = _qkv(dtype=dtype)
    segs = None if SEGS[case] is None else jnp.asarray(SEGS[case])
    if path.startswith("cudnn"):
        fn = functools.partial(
            cudnn_attention,
            fallback=remat_blocked_attention,
            packed=path != "cudnn bias",
            max_segments=4,
            capability=cap,
            kernels=EMULATED,
        )
    elif path == "blocked":
        fn = functools.partial(blocked_attention, block=8)
    elif path == "blocked remat":
        fn = functools.partial(blocked_attention, block=8, remat=True)
    else:

        def fn(q, k, v, s):
            if s is None:
                return _causal(q, k, v, implementation="xla")
            return _masked(q, k, v, s, implementation="xla")

    def loss(q, k, v, f):
        return jnp.sum(
            f(q, k, v, segs).astype(jnp.float32) * jnp.cos(jnp.arange(q.shape[-1]))[None, None, None, :]
        )

    # Everything jitted: op by op (each op compiled on its own) these cases took 10-24 s each under load.
    got, got_grads = jax.jit(jax.value_and_grad(lambda *a: loss(*a, fn), argnums=(0, 1, 2)))(q, k, v)
    want, want_grads = jax.jit(
        jax.value_and_grad(lambda *a: loss(*a, reference_attention), argnums=(0, 1, 2))
    )(q, k, v)
    out = np.asarray(jax.jit(fn)(q, k, v, segs), np.float32)
    ref = np.asarray(jax.jit(reference_attention)(q, k, v, segs), np.float32)
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(
            np.asarray(g, np.float32), np.asarray(w, np.float32), atol=4 * tol, rtol=4 * tol
        )
    if segs is not None:  # the check can fail: ignoring the documents changes the output far past tol
        leaky = np.asarray(jax.jit(reference_attention)(q, k, v, None), np.float32)
        assert np.abs(leaky - ref).max() > 10 * tol


def _count(jaxpr, name: str) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == name
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += _count(sub, name)
    return total


def test_keep_residuals_stops_the_remat_recomputing_the_forward():
    q, k, v = _qkv(dtype=jnp.float32)
    attn = functools.partial(_causal, implementation="xla")  # two products forward, four backward
    policy = jax.checkpoint_policies.save_only_these_names("kept")

    def dots(fn):
        def f(q, k, v):
            return jnp.sum(jax.checkpoint(lambda *a: checkpoint_name(fn(*a), "kept"), policy=policy)(q, k, v))

        return _count(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(q, k, v).jaxpr, "dot_general")

    assert dots(attn) == 2 + 1 + 4  # the forward, its scores again in the backward, then the backward
    assert dots(keep_residuals(attn, "kept", 3)) == 2 + 4
    np.testing.assert_allclose(keep_residuals(attn, "kept", 3)(q, k, v), attn(q, k, v))


def test_the_private_packed_layout_entry_point_keeps_its_signature():
    from jax._src.cudnn import fused_attention_stablehlo as fa

    params = list(inspect.signature(fa.dot_product_attention).parameters)
    assert params[:9] == [
        "query",
        "key",
        "value",
        "bias",
        "mask",
        "q_seqlen",
        "kv_seqlen",
        "q_offsets",
        "kv_offsets",
    ]
    assert {"scale", "mask_type", "qkv_layout"} <= set(params)
    assert hasattr(fa.MaskType, "PADDING_CAUSAL")


def test_the_packed_dispatch_under_a_dots_remat_keeps_the_kernel_residuals():
    # The packed branch inside the lax.cond, its residuals named: the backward must not run its forward again.
    q, k, v = _qkv()
    segs = jnp.asarray(SEGS["packed"])
    policy = jax.checkpoint_policies.save_only_these_names("attention_output")

    def count(residual_name):
        def f(q, k, v):
            attn = functools.partial(
                cudnn_attention,
                fallback=lambda q, k, v, s: q,  # no products: only the packed branch's are counted
                max_segments=4,
                capability=(9, 0),
                kernels=EMULATED,
                residual_name=residual_name,
            )
            return jnp.sum(
                jax.checkpoint(lambda *a: attn(*a, segs), policy=policy)(q, k, v).astype(jnp.float32)
            )

        return _count(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(q, k, v).jaxpr, "dot_general")

    assert count("something else") == 2 + 1 + 4  # the scores computed again in the backward
    assert count("attention_output") == 2 + 4
