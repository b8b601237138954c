import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schooner.model import (
    BalanceStats,
    MoEConfig,
    balance_router,
    init,
    loss_and_balance,
    loss_fn,
    rate_take_back,
    trainable_mask,
)
from schooner.model._balancing import balancing_shift, margin_quantiles
from schooner.model._layers import ParamFactory
from schooner.model._moe import MoE


def _layer(cfg: MoEConfig, seed: int = 0) -> MoE:
    buffer = jax.random.truncated_normal(jax.random.PRNGKey(seed), -3.0, 3.0, (200_000,))
    layer = MoE.init(cfg, ParamFactory(buffer))
    # Larger router weights than the 0.02 init so routing decisions are well separated.
    return eqx.tree_at(lambda m: m.router.array, layer, layer.router.array * 20)


def _cfg(**kw) -> MoEConfig:
    base = dict(
        vocab_size=11,
        hidden_dim=16,
        intermediate_dim=8,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        num_experts=4,
        num_experts_per_token=2,
        compute_dtype="float32",
    )
    return MoEConfig(**{**base, **kw})


@eqx.filter_jit
def _apply(layer, x):
    out, stats = layer(hax.named(x, (hax.Axis("batch", x.shape[0]), hax.Axis("embed", x.shape[1]))))
    return out.array, stats


def _silu(x):
    return x / (1 + np.exp(-x))


def _reference(layer: MoE, x: np.ndarray, capacity: int | None = None) -> np.ndarray:
    """Token-by-token numpy MoE: top-k of logits + bias, unbiased (renormalised) weights, optional capacity."""
    cfg = layer.config
    router, bias = np.asarray(layer.router.array, np.float64), np.asarray(layer.router_bias.array, np.float64)
    gate, up, down = (np.asarray(w.array, np.float64) for w in (layer.gate, layer.up, layer.down))
    logits = x @ router.T
    if cfg.router_activation == "softmax":
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    select = logits + bias
    out = np.zeros_like(x)
    used = np.zeros(cfg.num_experts, int)
    picks = []
    for t in range(x.shape[0]):
        chosen = np.argsort(-select[t], kind="stable")[: cfg.num_experts_per_token]
        w = scores[t, chosen]
        if cfg.normalize_topk:
            w = w / w.sum()
        picks.append((chosen, w))
    # Capacity is granted per expert in token order.
    for t, (chosen, w) in enumerate(picks):
        for e, we in zip(chosen, w):
            used[e] += 1
            if capacity is not None and used[e] > capacity:
                continue
            out[t] += we * ((_silu(x[t] @ gate[e]) * (x[t] @ up[e])) @ down[e])
    if layer.shared is not None:
        sg, su, sd = (
            np.asarray(w.array, np.float64) for w in (layer.shared.gate, layer.shared.up, layer.shared.down)
        )
        out += (_silu(x @ sg.T) * (x @ su.T)) @ sd.T
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"router_activation": "sigmoid", "normalize_topk": False},
        {"num_shared_experts": 1, "shared_intermediate_dim": 8},
        {"num_experts_per_token": 1, "load_balancing": "aux_loss"},
    ],
)
def test_dropless_moe_matches_token_loop(kw):
    layer = _layer(_cfg(**kw))
    layer = eqx.tree_at(lambda m: m.router_bias.array, layer, jnp.array([0.3, -0.2, 0.0, 0.1]))
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (24, 16)))
    got, stats = _apply(layer, jnp.asarray(x))
    np.testing.assert_allclose(got, _reference(layer, x), atol=1e-5, rtol=1e-4)
    assert float(stats["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(float(jnp.sum(stats["load"])), 1.0, rtol=1e-6)


def test_capacity_mode_drops_overflow_in_token_order():
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (32, 16)))
    # Enough capacity for everything: identical to dropless.
    roomy = _layer(_cfg(capacity_factor=4.0))
    got, stats = _apply(roomy, jnp.asarray(x))
    np.testing.assert_allclose(got, _reference(roomy, x), atol=1e-5, rtol=1e-4)
    assert float(stats["dropped_fraction"]) == 0.0
    # capacity = ceil(0.5 * 32 * 2 / 4) = 8 per expert: overflow is dropped, earlier tokens first.
    tight = _layer(_cfg(capacity_factor=0.5))
    got, stats = _apply(tight, jnp.asarray(x))
    np.testing.assert_allclose(got, _reference(tight, x, capacity=8), atol=1e-5, rtol=1e-4)
    assert float(stats["dropped_fraction"]) >= 0.5


def _loads(select: np.ndarray, k: int) -> np.ndarray:
    """Fraction of the assignments each expert gets under top-k selection (numpy, by argsort)."""
    picks = np.argsort(-select, axis=-1, kind="stable")[:, :k]
    return np.bincount(picks.ravel(), minlength=select.shape[-1]) / picks.size


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), k=st.sampled_from([1, 2, 3]), skew=st.floats(0.0, 4.0))
def test_the_balancing_shift_balances_its_batch(seed, k, skew):
    """Jointly: after the shift every expert gets its share of the batch within a few tokens' worth, however
    skewed the router; moving each expert by its own quantile alone (others held fixed) does not."""
    rng = np.random.default_rng(seed)
    n, e = 2048, 8
    select = rng.normal(size=(n, e)) + skew * np.linspace(1, 0, e)  # experts 0, 1, ... favoured
    shift = np.asarray(balancing_shift(jnp.asarray(select, jnp.float32), k))
    assert abs(float(shift.mean())) < 1e-5
    balanced = _loads(select + shift, k) * e
    assert balanced.max() < 1.06 and balanced.min() > 0.94, balanced
    if skew > 2:
        q = np.asarray(margin_quantiles(jnp.asarray(select, jnp.float32), k))
        assert (_loads(select - (q - q.mean()), k) * e).max() > balanced.max()


def test_margin_quantiles_follow_their_definition():
    rng = np.random.default_rng(0)
    select = rng.normal(size=(301, 5)).astype(np.float32)
    k = 2
    got = np.asarray(margin_quantiles(jnp.asarray(select), k))
    for j in range(5):
        others = np.delete(select, j, axis=1)
        kth_other = -np.sort(-others, axis=1)[:, k - 1]  # the k-th largest of the other experts
        want = np.quantile(select[:, j] - kth_other, 1 - k / 5)
        np.testing.assert_allclose(got[j], want, rtol=1e-5, atol=1e-6)
        # Lowering the bias by it leaves exactly the share k/E of tokens picking j (others held fixed).
        moved = select.copy()
        moved[:, j] -= got[j]
        share = np.mean(np.any(np.argsort(-moved, axis=1)[:, :k] == j, axis=1))
        assert abs(share - k / 5) <= 2 / 301  # up to the tokens tied at the quantile


def test_balance_router_follows_its_formula(tokens):
    """bias + rate * (shift - mean) - (x_mean . dW - mean over experts), per layer."""
    cfg = _cfg(num_layers=2, vocab_size=50, router_bias_rate=0.7, num_heads=1, num_kv_heads=1)
    before = init(cfg, key=jax.random.PRNGKey(0))
    dw = jax.random.normal(jax.random.PRNGKey(1), before.layers.stacked.mlp.router.array.shape) * 0.1
    after = eqx.tree_at(
        lambda m: m.layers.stacked.mlp.router.array, before, before.layers.stacked.mlp.router.array + dw
    )
    shift = jax.random.normal(jax.random.PRNGKey(2), (2, 4))
    mean = jax.random.normal(jax.random.PRNGKey(3), (2, 16))
    got = balance_router(before, after, BalanceStats(shift=shift, input_mean=mean))
    moved = np.einsum("ld,led->le", np.asarray(mean, np.float64), np.asarray(dw, np.float64))
    s = np.asarray(shift, np.float64)
    want = 0.7 * (s - s.mean(-1, keepdims=True)) - (moved - moved.mean(-1, keepdims=True))
    np.testing.assert_allclose(got.layers.stacked.mlp.router_bias.array, want, rtol=1e-5, atol=1e-6)
    assert balance_router(before, after, None) is after
    with pytest.raises(ValueError, match="balancing shift of shape"):
        balance_router(before, after, BalanceStats(shift=jnp.zeros((3, 4)), input_mean=mean))


def test_rate_take_back_is_the_rest_of_the_rate_of_the_own_shift():
    """(1 - rate) * (own shift - mean), per layer, the rate at least 1 / (step + 1); zeros at rate 1; and
    `balance_router` subtracts a take-back and refuses a rate outside (0, 1]."""
    cfg = _cfg(num_layers=2, vocab_size=50, router_bias_rate=0.3, num_heads=1, num_kv_heads=1)
    model = init(cfg, key=jax.random.PRNGKey(0))
    shift = jax.random.normal(jax.random.PRNGKey(2), (2, 4))
    stats = BalanceStats(shift=shift, input_mean=jnp.zeros((2, 16)))
    s = np.asarray(shift, np.float64)
    centred = s - s.mean(-1, keepdims=True)
    for step, rate in ((0, 1.0), (1, 0.5), (2, 1 / 3), (5, 0.3)):  # the rate is at least 1 / (step + 1)
        np.testing.assert_allclose(rate_take_back(model, stats, step=step), (1 - rate) * centred, atol=1e-6)
    full = init(dataclasses.replace(cfg, router_bias_rate=1.0), key=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(rate_take_back(full, stats, step=7), np.zeros((2, 4)))
    back = rate_take_back(model, stats, step=5)
    moved = balance_router(model, model, stats, rate=1.0, take_back=back).layers.stacked.mlp.router_bias.array
    np.testing.assert_allclose(moved, centred - 0.7 * centred, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="rate must be in"):
        balance_router(model, model, stats, rate=0.0)
    with pytest.raises(ValueError, match=r"rebalance must be float32\[layers, experts\] = \(2, 4\)"):
        model.hidden_states(jnp.zeros((1, 4), jnp.int32), rebalance=True)  # an old caller's flag


def test_balance_router_refuses_stats_for_a_dense_model(tiny_dense):
    dense = init(tiny_dense, key=jax.random.PRNGKey(0))
    stats = BalanceStats(shift=jnp.zeros((2, 4)), input_mean=jnp.zeros((2, 32)))
    with pytest.raises(ValueError, match="without MoE layers .LlamaConfig.; pass stats=None"):
        balance_router(dense, dense, stats)


def test_loss_and_balance_statistics_and_the_frozen_bias(tokens):
    cfg = _cfg(num_layers=2, vocab_size=50, num_heads=1, num_kv_heads=1)
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, 50)
    # loss_fn's loss in the same compiled program (run op by op outside jit it cost ~5 s of CPU time).
    f = eqx.filter_jit(
        lambda m: (
            jax.value_and_grad(lambda mm: loss_and_balance(mm, toks), has_aux=True)(m),
            loss_fn(m, toks)[0],
        )
    )
    ((loss, (metrics, balance)), grads), plain_loss = f(model)
    assert balance.shift.shape == (2, 4) and balance.input_mean.shape == (2, 16)
    assert all(jnp.ndim(v) == 0 for v in metrics.values())  # scalars only: nothing else rides along
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    # The bias gets no gradient, and the mask marks it (only it) untrainable.
    assert float(jnp.abs(grads.layers.stacked.mlp.router_bias.array).max()) == 0.0
    flags = jax.tree_util.tree_leaves(trainable_mask(model))
    assert flags.count(False) == 1 and len(flags) == len(jax.tree_util.tree_leaves(model))
    # Other balancing modes ask nothing of the bias.
    # (traced, not run: the question is what it returns, and tracing runs the same Python)
    other = init(dataclasses.replace(cfg, load_balancing="aux_loss"), key=jax.random.PRNGKey(0))
    assert eqx.filter_eval_shape(loss_and_balance, other, toks)[1][1] is None


@pytest.mark.slow
def test_aux_loss_mode_adds_the_weighted_balancing_loss(tokens):
    cfg = _cfg(
        num_layers=2, vocab_size=50, load_balancing="aux_loss", aux_loss_weight=0.5, router_z_loss_weight=0.1
    )
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, 50)
    (loss, m), grads = eqx.filter_jit(jax.value_and_grad(lambda mm: loss_fn(mm, toks), has_aux=True))(model)
    np.testing.assert_allclose(
        loss, m["ce_loss"] + 0.5 * m["moe/aux_loss"] + 0.1 * m["moe/router_z_loss"], rtol=1e-6
    )
    assert float(m["moe/aux_loss"]) >= 1.0 - 1e-5  # E * sum(f * P) >= 1 when f == P; ~1 near uniform
    assert float(jnp.abs(grads.layers.stacked.mlp.router.array).max()) > 0
