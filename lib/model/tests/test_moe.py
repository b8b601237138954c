import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schooner.model import MoEConfig, init, loss_fn, trainable_mask, update_router_bias
from schooner.model._layers import ParamFactory
from schooner.model._moe import MoE, bias_update


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
    """Token-by-token numpy MoE: biased top-k selection, unbiased (renormalised) weights, optional capacity."""
    cfg = layer.config
    router, bias = np.asarray(layer.router.array, np.float64), np.asarray(layer.router_bias.array, np.float64)
    gate, up, down = (np.asarray(w.array, np.float64) for w in (layer.gate, layer.up, layer.down))
    logits = x @ router.T
    if cfg.router_activation == "softmax":
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    select = scores + (bias if cfg.load_balancing == "quantile" else 0)
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


@eqx.filter_jit
def _toy_step(layer, key, mu, teacher):
    x = jax.random.normal(key, (512, mu.shape[0])) + mu[None, :]

    def loss(m):
        y, stats = _apply(m, x)
        return jnp.mean((y - x @ teacher) ** 2), stats

    (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(layer)
    layer = jax.tree_util.tree_map(
        lambda p, g, t: p - 0.05 * g if t else p, layer, grads, trainable_mask_layer(layer)
    )
    if layer.config.load_balancing == "quantile":
        new_bias = bias_update(
            layer.router_bias.array, stats["router_quantiles"], layer.config.router_bias_rate
        )
        layer = eqx.tree_at(lambda m: m.router_bias.array, layer, new_bias)
    return layer, jnp.max(stats["load"]) * layer.config.num_experts


def trainable_mask_layer(layer: MoE):
    mask = jax.tree_util.tree_map(lambda _: True, layer)
    return eqx.tree_at(lambda m: m.router_bias.array, mask, False)


def _train_toy(seed: int, balancing: str, steps: int = 200) -> list[float]:
    cfg = _cfg(num_experts=8, num_experts_per_token=2, load_balancing=balancing, router_z_loss_weight=0.0)
    layer = _layer(cfg, seed)
    key = jax.random.PRNGKey(seed)
    mu = jax.random.normal(jax.random.fold_in(key, 1), (16,))
    mu = 1.5 * mu / jnp.linalg.norm(mu)
    # Deliberately skewed router: experts 0 and 1 score high on every input (inputs share the mean mu).
    router = layer.router.array.at[0].add(2.0 * mu).at[1].add(1.5 * mu)
    layer = eqx.tree_at(lambda m: m.router.array, layer, router)
    teacher = jax.random.normal(jax.random.fold_in(key, 2), (16, 16)) / 4
    ratios = []
    for i in range(steps):
        layer, ratio = _toy_step(layer, jax.random.PRNGKey(10_000 + i), mu, teacher)
        ratios.append(float(ratio))
    return ratios


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16))
def test_quantile_balancing_evens_out_a_skewed_router(seed):
    ratios = _train_toy(seed, "quantile")
    assert ratios[0] > 2.5, "the toy router should start skewed"
    # Near-uniform: the busiest expert gets < 1.3x its share (512 tokens x 2 picks over 8 experts).
    assert np.mean(ratios[-20:]) < 1.3, ratios[-20:]


def test_without_balancing_the_skew_stays():
    ratios = _train_toy(0, "none", steps=100)
    assert np.mean(ratios[-20:]) > 2.5


def test_update_router_bias_and_trainable_mask_on_a_model(tokens):
    cfg = _cfg(num_layers=2, vocab_size=50, router_bias_rate=0.5, num_heads=1, num_kv_heads=1)
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, 50)
    (_, metrics), grads = eqx.filter_jit(jax.value_and_grad(lambda m: loss_fn(m, toks), has_aux=True))(model)
    q = metrics["aux/router_quantiles"]
    assert q.shape == (2, 4)
    updated = update_router_bias(model, metrics)
    want = -0.5 * (q - q.mean(axis=-1, keepdims=True))
    np.testing.assert_allclose(updated.layers.stacked.mlp.router_bias.array, want, rtol=1e-6)
    np.testing.assert_allclose(bias_update(jnp.zeros((2, 4)), q, 0.5), want, rtol=1e-6)
    # The bias gets no gradient, and the mask marks it (only it) untrainable.
    assert float(jnp.abs(grads.layers.stacked.mlp.router_bias.array).max()) == 0.0
    mask = trainable_mask(model)
    flags = jax.tree_util.tree_leaves(mask)
    assert flags.count(False) == 1 and len(flags) == len(jax.tree_util.tree_leaves(model))
    # Dense models and other balancing modes are left alone.
    other = init(dataclasses.replace(cfg, load_balancing="aux_loss"), key=jax.random.PRNGKey(0))
    assert update_router_bias(other, metrics) is other
    with pytest.raises(ValueError, match="router quantiles have shape"):
        update_router_bias(model, {"aux/router_quantiles": jnp.zeros((3, 4))})


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
    assert "aux/router_quantiles" not in m
    assert float(m["moe/aux_loss"]) >= 1.0 - 1e-5  # E * sum(f * P) >= 1 when f == P; ~1 near uniform
    assert float(jnp.abs(grads.layers.stacked.mlp.router.array).max()) > 0
