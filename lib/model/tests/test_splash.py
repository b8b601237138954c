"""Splash attention (the TPU kernel path) equals the reference attention, forward and gradients.

CI has no TPU: jax's Pallas splash kernel runs here through Pallas's interpreter (``interpret=True``, what
``_kernels.pallas_interpret()`` picks off a TPU), which executes the kernel's own block program (the mask
tables, the block skipping, the online softmax and the saved log-sum-exp of its backward) in plain XLA. The
reference is :func:`reference_attention`: repeated kv heads, an explicit causal and segment mask, one softmax.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from schooner.model import (
    activation_sharding,
    batch_sharding,
    compute_axis_mapping,
    init,
    loss_fn,
    param_axis_mapping,
    shard_model,
)
from schooner.model._attention import attention, reference_attention
from schooner.model._kernels import pallas_interpret
from schooner.model._splash import splash_attention


def _qkv(b: int, t: int, n: int, kv: int, h: int, seed: int = 0) -> tuple[jax.Array, ...]:
    kq, kk, kv_ = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        jax.random.normal(kq, (b, t, n, h), jnp.float32),
        jax.random.normal(kk, (b, t, kv, h), jnp.float32),
        jax.random.normal(kv_, (b, t, kv, h), jnp.float32),
    )


def _out_and_grads(fn, q, k, v):
    """The output and the gradients of a weighted sum of it (weights vary along the head dim, so no symmetry
    hides an error), in one jitted program (the interpreted kernel is compiled once)."""
    w = jnp.cos(jnp.arange(q.shape[-1], dtype=jnp.float32))[None, None, None, :]

    def run(q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(jnp.broadcast_to(w, out.shape))

    out, grads = jax.jit(run)(q, k, v)
    return np.asarray(out), [np.asarray(g) for g in grads]


def _segments(b: int, t: int, cuts: list[list[int]]) -> jax.Array:
    """int[b, t] document ids starting a new document at each cut of each row."""
    rows = []
    for row_cuts in cuts:
        ids = np.zeros(t, np.int32)
        for c in row_cuts:
            ids[c:] += 1
        rows.append(ids)
    assert len(rows) == b
    return jnp.asarray(np.stack(rows))


def test_interpret_mode_is_what_runs_off_a_tpu():
    assert jax.default_backend() == "cpu"
    assert pallas_interpret()


@pytest.mark.parametrize(
    "t,n,kv,segments",
    [
        (200, 4, 2, True),  # padded to 256 (2 blocks, one skipped), GQA 2 query heads per kv head, documents
        # Interpreted Pallas is slow to compile: the other shapes run with the slow tests (~10-25 s each).
        pytest.param(128, 2, 2, False, marks=pytest.mark.slow),  # one block exactly, plain multi-head
        pytest.param(72, 4, 1, True, marks=pytest.mark.slow),  # padded to 128, multi-query, documents
        pytest.param(300, 6, 2, False, marks=pytest.mark.slow),  # padded to 384 (3 blocks), GQA 3 per kv head
    ],
)
def test_splash_equals_reference_forward_and_gradients(t, n, kv, segments):
    b, h = 2, 32
    q, k, v = _qkv(b, t, n, kv, h, seed=t)
    seg = _segments(b, t, [[t // 3, t // 2 + 1], [5]]) if segments else None
    splash = lambda q, k, v: splash_attention(q, k, v, seg, interpret=True)  # noqa: E731
    ref = lambda q, k, v: reference_attention(q, k, v, seg)  # noqa: E731

    out, grads = _out_and_grads(splash, q, k, v)
    want, want_grads = _out_and_grads(ref, q, k, v)
    assert out.shape == (b, t, n, h)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    for got, exp, name in zip(grads, want_grads, "qkv", strict=True):
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5, err_msg=name)


def test_documents_do_not_see_each_other():
    """A change to one document's keys and values leaves every other document's outputs unchanged, and
    a change to a later position leaves earlier outputs unchanged (causal), through the kernel."""
    b, t, n, kv, h = 1, 140, 2, 1, 32
    q, k, v = _qkv(b, t, n, kv, h, seed=1)
    seg = _segments(b, t, [[60]])
    run = jax.jit(lambda k, v: splash_attention(q, k, v, seg, interpret=True))
    base = np.asarray(run(k, v))
    k2 = k.at[:, 60:].add(3.0)  # the second document's keys
    v2 = v.at[:, 100:].add(5.0)  # and its later values
    moved = np.asarray(run(k2, v2))
    np.testing.assert_array_equal(moved[:, :60], base[:, :60])
    assert np.abs(moved[:, 60:] - base[:, 60:]).max() > 1e-2


def test_attention_dispatches_splash_by_name():
    q, k, v = _qkv(1, 40, 4, 2, 32, seed=2)
    seg = _segments(1, 40, [[17]])
    got = np.asarray(jax.jit(lambda q, k, v: attention(q, k, v, seg, implementation="splash"))(q, k, v))
    np.testing.assert_allclose(got, np.asarray(reference_attention(q, k, v, seg)), rtol=1e-5, atol=1e-5)


def _loss_and_grads(cfg, toks, segs):
    model = init(cfg, key=jax.random.PRNGKey(0))
    f = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss_fn(m, toks, segment_ids=segs)[0]))
    value, grads = f(model)
    return float(value), [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]


@pytest.mark.slow  # ~15-35 s on 2 shared cores (the interpreted kernel inside the model's scan, and its backward)
def test_model_with_splash_equals_model_with_reference_attention(tiny_dense, tokens):
    """The whole model (xla kernel path, float32) with splash attention: loss and every gradient equal the
    same model with the plain jax attention (T=24 padded to 128 inside the kernel; two documents)."""
    toks = tokens(2, 24, tiny_dense.vocab_size)
    segs = jnp.asarray([[0] * 10 + [1] * 14, [0] * 24], jnp.int32)
    base = dataclasses.replace(tiny_dense, kernels="xla", compute_dtype="float32")
    splash = _loss_and_grads(dataclasses.replace(base, attention_implementation="splash"), toks, segs)
    plain = _loss_and_grads(dataclasses.replace(base, attention_implementation="xla"), toks, segs)
    assert splash[0] == pytest.approx(plain[0], rel=1e-6)
    for got, want in zip(splash[1], plain[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # ~30 s on 2 shared cores: shard_map around the interpreted kernel on 8 fake devices
def test_splash_under_a_mesh_runs_per_shard_and_equals_unsharded(tiny_dense, tokens):
    """Under an activation mapping the kernel runs per shard in ``shard_map`` (batch and heads split)."""
    cfg = dataclasses.replace(
        tiny_dense, kernels="xla", compute_dtype="float32", attention_implementation="splash", vocab_size=96
    )
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(4, 16, cfg.vocab_size)
    seg = jnp.repeat(jnp.array([[0] * 6 + [1] * 10]), 4, axis=0)
    f = lambda m, t, s: jax.value_and_grad(lambda m: loss_fn(m, t, segment_ids=s)[0])(m)  # noqa: E731
    ref = eqx.filter_jit(f)(model, toks, seg)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    axes = dict(data_axis="data", model_axis="model")
    sharded = shard_model(model, mesh, param_axis_mapping(**axes))
    cmap = compute_axis_mapping(**axes)
    bs = batch_sharding(mesh, cmap)
    with activation_sharding(mesh, cmap):
        jaxpr = str(eqx.filter_make_jaxpr(f)(sharded, toks, seg)[0])
        got = eqx.filter_jit(f)(sharded, jax.device_put(toks, bs), jax.device_put(seg, bs))
    assert "shard_map" in jaxpr
    np.testing.assert_allclose(float(got[0]), float(ref[0]), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(ref[1]), jax.tree_util.tree_leaves(got[1]), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=1e-6)


@pytest.mark.slow  # ~15-35 s on 2 shared cores, as the test above
def test_the_whole_tpu_path_equals_the_cpu_path(tiny_dense, tokens):
    """kernels="tpu" off a TPU (splash and the grouped matmul interpreted, RoPE by the product, norms and
    SwiGLU recomputed) gives the loss and gradients of the CPU path, float32."""
    toks = tokens(2, 24, tiny_dense.vocab_size)
    segs = jnp.asarray([[0] * 10 + [1] * 14, [0] * 24], jnp.int32)
    tpu = _loss_and_grads(dataclasses.replace(tiny_dense, kernels="tpu", compute_dtype="float32"), toks, segs)
    cpu = _loss_and_grads(dataclasses.replace(tiny_dense, kernels="cpu", compute_dtype="float32"), toks, segs)
    assert tpu[0] == pytest.approx(cpu[0], rel=1e-6)
    for got, want in zip(tpu[1], cpu[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
