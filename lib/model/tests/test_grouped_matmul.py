"""The experts' grouped matmul and dispatch of the TPU kernel path, checked on CPU.

``grouped_matmul`` is ``jax.lax.ragged_dot``, or with ``implementation="megablox"`` on the "tpu" path jax's
megablox ``gmm`` Pallas kernel (run here through Pallas's interpreter); both must equal a per-group numpy product (float64),
forward and gradients, empty groups included. ``permute_rows`` (the scatter-free dispatch) must have
plain indexing's gradient. And a whole MoE model on the "tpu" dispatch must give the loss, gradients and
quantile-balancing statistics of the CPU path.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import MoEConfig, init, loss_and_balance
from schooner.model._moe import grouped_matmul, permute_rows


def _reference(x: np.ndarray, w: np.ndarray, sizes: np.ndarray, cot: np.ndarray):
    """Per group in float64: out[rows of g] = x[rows] @ w[g]; the gradients of sum(out * cot)."""
    x, w, cot = (np.asarray(a, np.float64) for a in (x, w, cot))
    out = np.zeros((x.shape[0], w.shape[2]))
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + int(size))
        out[rows] = x[rows] @ w[g]
        dx[rows] = cot[rows] @ w[g].T
        dw[g] = x[rows].T @ cot[rows]
        start += int(size)
    assert start == x.shape[0]
    return out, dx, dw


def _run(x, w, sizes, cot, kernels, implementation):
    def f(x, w):
        out = grouped_matmul(x, w, sizes, kernels=kernels, implementation=implementation)
        return jnp.sum(out * cot), out

    (_, out), (dx, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(x, w)
    return np.asarray(out), np.asarray(dx), np.asarray(dw)


@pytest.mark.parametrize(
    "m,k,n,sizes",
    [
        # Rows padded to the 128-row tile; empty groups in the middle and at the end (the padding is
        # counted in the last group, which is empty here).
        (200, 128, 256, [50, 0, 120, 30, 0]),
        (128, 256, 128, [0, 128, 0]),  # no padding; every row in one group, the others empty
        (96, 48, 80, [10, 0, 86]),  # k, n not multiples of 128: ragged_dot even on the tpu path
    ],
)
@pytest.mark.parametrize(
    "kernels,implementation", [("tpu", "megablox"), ("tpu", "ragged_dot"), ("xla", "ragged_dot")]
)
def test_grouped_matmul_equals_per_group_products(m, k, n, sizes, kernels, implementation):
    ks = jax.random.split(jax.random.PRNGKey(m + k), 3)
    x = jax.random.normal(ks[0], (m, k), jnp.float32)
    w = jax.random.normal(ks[1], (len(sizes), k, n), jnp.float32) / np.sqrt(k)
    cot = jax.random.normal(ks[2], (m, n), jnp.float32)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out, dx, dw = _run(x, w, group_sizes, cot, kernels, implementation)
    want, want_dx, want_dw = _reference(x, w, np.asarray(sizes), cot)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-4)
    for g, size in enumerate(sizes):
        if size == 0:  # an empty group's weights get exactly no gradient
            assert np.all(dw[g] == 0.0)


def test_megablox_runs_on_the_tpu_path_only_when_asked():
    x = jnp.zeros((128, 128), jnp.float32)
    w = jnp.zeros((2, 128, 128), jnp.float32)
    sizes = jnp.asarray([64, 64], jnp.int32)

    def jaxpr(kernels, implementation):
        f = lambda x, w: grouped_matmul(x, w, sizes, kernels=kernels, implementation=implementation)  # noqa: E731
        return str(jax.make_jaxpr(f)(x, w))

    tpu = jaxpr("tpu", "megablox")
    assert "pallas_call" in tpu and "ragged_dot" not in tpu
    for kernels, implementation in (("tpu", "ragged_dot"), ("xla", "megablox"), ("cpu", "ragged_dot")):
        other = jaxpr(kernels, implementation)
        assert "ragged_dot" in other and "pallas_call" not in other, (kernels, implementation)
    with pytest.raises(ValueError, match="implementation must be one of .*'gmm'"):
        jaxpr("tpu", "gmm")
    with pytest.raises(ValueError, match="grouped_matmul must be one of .*'ragged_dot'.*'triton'"):
        _moe_cfg(grouped_matmul="gmm")


def test_permute_rows_gradient_equals_plain_indexing():
    """The custom VJP (the inverse permutation, a gather) equals autodiff of ``x[perm]`` (a scatter-add)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (12, 5), jnp.float32)
    perm = jax.random.permutation(jax.random.PRNGKey(1), 12)
    inverse = jnp.argsort(perm)
    cot = jax.random.normal(jax.random.PRNGKey(2), (12, 5), jnp.float32)
    np.testing.assert_array_equal(permute_rows(x, perm, inverse), x[perm])
    got = jax.grad(lambda x: jnp.sum(permute_rows(x, perm, inverse) * cot))(x)
    want = jax.grad(lambda x: jnp.sum(x[perm] * cot))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Its jaxpr has no scatter in the backward (the reason it exists); plain indexing's has one.
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(permute_rows(x, perm, inverse) * cot)))(x))
    assert "scatter" not in jaxpr
    assert "scatter" in str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(x[perm] * cot)))(x))


def _moe_cfg(**kw) -> MoEConfig:
    """Expert widths of 128 so the "tpu" path with megablox really takes the kernel (not its ragged_dot
    fallback)."""
    base = dict(
        vocab_size=61,
        hidden_dim=128,
        intermediate_dim=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        max_seq_len=32,
        num_experts=4,
        num_experts_per_token=2,
        compute_dtype="float32",
        load_balancing="quantile",
        # Plain jax attention on both paths: this test is about the experts (splash has test_splash.py).
        attention_implementation="xla",
    )
    base.update(kw)
    return MoEConfig(**base)


@pytest.mark.slow  # 20-50 s on 2 shared cores: six interpreted gmm kernels per layer, forward and backward
@pytest.mark.parametrize("implementation", ["megablox", "ragged_dot"])
def test_moe_on_the_tpu_dispatch_equals_the_cpu_path_with_quantile_balancing(tokens, implementation):
    """Loss, every gradient, the ``moe/...`` metrics and the balancing statistics (shift and input mean) of
    a MoE model with the "tpu" kernels (megablox gmm interpreted, or ragged_dot) equal those of the "cpu"
    kernels, float32, with a non-zero router bias steering the routing."""
    results = {}
    toks = tokens(2, 24, 61)
    segs = jnp.asarray([[0] * 9 + [1] * 15, [0] * 24], jnp.int32)
    for kernels in ("cpu", "tpu"):
        cfg = _moe_cfg(kernels=kernels, grouped_matmul=implementation)
        model = init(cfg, key=jax.random.PRNGKey(0))
        bias = jax.random.normal(jax.random.PRNGKey(5), model.layers.stacked.mlp.router_bias.array.shape)
        model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, 0.05 * bias)
        if kernels == "tpu":
            loss_of = lambda m: loss_and_balance(m, toks, segment_ids=segs)[0]  # noqa: E731
            jaxpr = str(eqx.filter_make_jaxpr(loss_of)(model)[0])
            assert ("pallas_call" in jaxpr) == (implementation == "megablox")
        f = eqx.filter_jit(
            eqx.filter_value_and_grad(lambda m: loss_and_balance(m, toks, segment_ids=segs), has_aux=True)
        )
        results[kernels] = f(model)
    (l_cpu, (m_cpu, b_cpu)), g_cpu = results["cpu"]
    (l_tpu, (m_tpu, b_tpu)), g_tpu = results["tpu"]
    assert float(l_tpu) == pytest.approx(float(l_cpu), rel=1e-5)
    assert m_tpu.keys() == m_cpu.keys() and any(k.startswith("moe/") for k in m_cpu)
    for key in m_cpu:
        np.testing.assert_allclose(float(m_tpu[key]), float(m_cpu[key]), rtol=1e-4, atol=1e-6, err_msg=key)
    assert b_cpu is not None and b_tpu is not None
    np.testing.assert_allclose(np.asarray(b_tpu.shift), np.asarray(b_cpu.shift), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(b_tpu.input_mean), np.asarray(b_cpu.input_mean), rtol=1e-4, atol=1e-6
    )
    leaves_cpu, leaves_tpu = jax.tree_util.tree_leaves(g_cpu), jax.tree_util.tree_leaves(g_tpu)
    assert len(leaves_cpu) == len(leaves_tpu)
    for a, b in zip(leaves_tpu, leaves_cpu, strict=True):
        scale = max(float(np.abs(np.asarray(b)).max()), 1e-12)
        assert float(np.abs(np.asarray(a) - np.asarray(b)).max()) / scale < 1e-4
