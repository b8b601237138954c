"""The GPU grouped matmul (``_gmm.py``, a Pallas Triton kernel) and the GPU/TPU kernel choices, checked on CPU.

The kernel runs here through Pallas's interpreter (the same kernel program the GPU compiles); forward and
gradients must equal a per-group float64 numpy product, empty groups included. The tiled layout must place
every row once, every tile in one group. And the backend choices a GPU makes (``_kernels.py``) are checked by
naming the backend: cuDNN attention and the Triton kernel by default, the Pallas TPU interpreter refused.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import MoEConfig
from schooner.model._gmm import padded_rows, tiled_layout, triton_grouped_matmul
from schooner.model._kernels import (
    pallas_interpret,
    resolve_attention,
    resolve_grouped_matmul,
    resolve_kernels,
    triton_interpret,
)
from schooner.model._moe import grouped_matmul


def _reference(x, w, sizes, cot):
    x, w, cot = (np.asarray(a, np.float64) for a in (x, w, cot))
    out, dx, dw = np.zeros((x.shape[0], w.shape[2])), np.zeros_like(x), np.zeros_like(w)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + int(size))
        out[rows], dx[rows], dw[g] = x[rows] @ w[g], cot[rows] @ w[g].T, x[rows].T @ cot[rows]
        start += int(size)
    return out, dx, dw


@pytest.mark.parametrize(
    "m,k,n,sizes",
    [
        (60, 32, 48, [20, 0, 7, 33]),  # an empty group in the middle; groups not multiples of the tile
        pytest.param(45, 16, 16, [0, 45, 0], marks=pytest.mark.slow),  # empty first and last groups
    ],
)
def test_triton_grouped_matmul_equals_per_group_products(m, k, n, sizes):
    rng = np.random.default_rng(0)
    x, w, cot = rng.normal(size=(m, k)), rng.normal(size=(len(sizes), k, n)), rng.normal(size=(m, n))
    gs = jnp.asarray(sizes, jnp.int32)

    def f(x, w):
        out = triton_grouped_matmul(x, w, gs, interpret=True, block_m=16)
        return jnp.sum(out * cot), out

    args = (jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
    (_, out), (dx, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(*args)
    want = _reference(x, w, sizes, cot)
    for got, ref in zip((out, dx, dw), want):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-4)
    for g, size in enumerate(sizes):
        if size == 0:
            assert np.all(np.asarray(dw)[g] == 0.0)


@pytest.mark.parametrize("sizes", [[5, 0, 16, 1], [0, 0, 37], [16, 16], [1, 1, 1, 1, 1]])
def test_tiled_layout_places_every_row_once_and_each_tile_in_one_group(sizes):
    m, bm = sum(sizes), 16
    lay = tiled_layout(jnp.asarray(sizes, jnp.int32), m, bm)
    source, dest = np.asarray(lay.source), np.asarray(lay.dest)
    tile_group, group_tiles = np.asarray(lay.tile_group), np.asarray(lay.group_tiles)
    assert source.shape == (padded_rows(m, len(sizes), bm),)
    np.testing.assert_array_equal(source[dest], np.arange(m))  # gather in, gather out: the identity
    assert np.sum(source < m) == m  # every other tiled row reads the zero row
    group_of_row = np.repeat(np.arange(len(sizes)), sizes)
    np.testing.assert_array_equal(tile_group[dest // bm], group_of_row)
    for g in range(len(sizes)):
        assert group_tiles[g + 1] - group_tiles[g] == -(-sizes[g] // bm)
        assert np.all(tile_group[group_tiles[g] : group_tiles[g + 1]] == g)


def test_a_gpu_takes_cudnn_and_the_triton_kernel_and_refuses_the_pallas_interpreter():
    assert resolve_kernels("auto", backend="gpu") == "xla"
    assert resolve_attention(None, "xla", backend="gpu") == "cudnn"
    assert resolve_attention(None, "xla", backend="cpu") is None  # jax's XLA attention
    assert resolve_attention("cudnn_bias", "xla", backend="gpu") == "cudnn_bias"
    assert resolve_grouped_matmul("auto", "xla", backend="gpu") == "triton"
    assert resolve_grouped_matmul("auto", "xla", backend="cpu") == "ragged_dot"
    assert resolve_grouped_matmul("auto", "tpu", backend="tpu") == "ragged_dot"
    assert resolve_grouped_matmul("megablox", "xla", backend="gpu") == "ragged_dot"
    with pytest.raises(ValueError, match=r"kernels='tpu'.*Pallas interpreter"):
        resolve_kernels("tpu", backend="gpu")
    with pytest.raises(ValueError, match=r"attention_implementation='splash'.*Pallas interpreter"):
        resolve_attention("splash", "xla", backend="gpu")
    with pytest.raises(ValueError, match="Pallas interpreter"):
        pallas_interpret("gpu")
    with pytest.raises(ValueError, match=r"grouped_matmul='triton'.*cannot be compiled"):
        resolve_grouped_matmul("triton", "tpu", backend="tpu")
    # The CPU keeps every interpreter (the tests run the kernels through them); a TPU compiles its own.
    assert resolve_kernels("tpu", backend="cpu") == "tpu" and pallas_interpret("cpu")
    assert not pallas_interpret("tpu") and triton_interpret("cpu") and not triton_interpret("gpu")


def test_the_triton_choice_reaches_the_kernel_and_the_config():
    x, w = jnp.zeros((40, 32), jnp.float32), jnp.zeros((3, 32, 16), jnp.float32)
    sizes = jnp.asarray([10, 0, 30], jnp.int32)

    def jaxpr(impl, k=32):
        f = lambda x, w: grouped_matmul(x, w, sizes, kernels="xla", implementation=impl)  # noqa: E731
        return str(jax.make_jaxpr(f)(x[:, :k], w[:, :k]))

    assert "pallas_call" in jaxpr("triton") and "ragged_dot" not in jaxpr("triton")
    assert "ragged_dot" in jaxpr("auto") and "pallas_call" not in jaxpr("auto")  # auto on the CPU
    assert "ragged_dot" in jaxpr("triton", k=24)  # k not a multiple of 16: ragged_dot (logged)
    cfg = MoEConfig(
        vocab_size=64, hidden_dim=32, intermediate_dim=16, num_layers=1, num_heads=2, num_kv_heads=2
    )
    assert cfg.grouped_matmul == "auto" and dataclasses.replace(cfg, grouped_matmul="triton")


@pytest.mark.slow  # the kernel interpreted inside a whole model's forward and backward (about a minute)
def test_a_moe_on_the_triton_kernel_trains_like_ragged_dot(tiny_moe, tokens):
    import equinox as eqx

    from schooner.model import init, loss_fn

    toks = tokens(2, 16, 97)
    segs = jnp.asarray([[0] * 6 + [1] * 10, [0] * 16], jnp.int32)

    def run(impl):
        cfg = dataclasses.replace(tiny_moe, kernels="xla", grouped_matmul=impl, load_balancing="aux_loss")
        model = init(cfg, key=jax.random.PRNGKey(0))
        f = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss_fn(m, toks, segment_ids=segs)[0]))
        value, grads = f(model)
        return float(value), [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]

    (v_t, g_t), (v_r, g_r) = run("triton"), run("ragged_dot")
    assert v_t == pytest.approx(v_r, rel=1e-6)
    for a, b in zip(g_t, g_r, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(b).max())))
