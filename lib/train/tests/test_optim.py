"""Optimizers on the real model: parameter groups, decay masks, AdamW against a numpy reference, Muon's
orthogonalized updates, clipping, and frozen leaves (the MoE router bias)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.train import (
    AdamConfig,
    MuonConfig,
    build_optimizer,
    describe_param_groups,
    muon_dimension_numbers,
)


@pytest.fixture(scope="module")
def model(nano):
    from schooner.model import init

    return init(nano(), key=jax.random.PRNGKey(0))


def _grads(model, seed: int = 1):
    leaves, treedef = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def _by_path(model, tree):
    from haliax import NamedArray

    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, NamedArray))[0]
    return {jax.tree_util.keystr(p): np.asarray(x.array if isinstance(x, NamedArray) else x) for p, x in flat}


def test_groups_and_decay_mask(model) -> None:
    rows = {r["path"]: r for r in describe_param_groups(model, MuonConfig(weight_decay=0.1))}
    assert (
        rows[".embed"]["kind"] == "embedding"
        and rows[".embed"]["rule"] == "adamw"
        and rows[".embed"]["decay"]
    )
    assert rows[".final_norm"]["kind"] == "norm" and not rows[".final_norm"]["decay"]
    assert not rows[".layers.stacked.attn_norm"]["decay"]  # stacked norm: [layers, embed]
    for name in ("attn.q_proj", "attn.o_proj", "mlp.gate", "mlp.down"):
        r = rows[f".layers.stacked.{name}"]
        assert r["kind"] == "matrix" and r["rule"] == "muon" and r["decay"]
    rows = {r["path"]: r for r in describe_param_groups(model, AdamConfig(decay_norms_and_biases=True))}
    assert rows[".final_norm"]["decay"] and all(r["rule"] == "adamw" for r in rows.values())


def test_muon_axes_come_from_the_declared_groups(model) -> None:
    """Input (reduction) axes of each matrix as the model declares them; layers are batch axes."""
    from optax.contrib import MuonDimensionNumbers

    dims = {  # keyed by the parameter: "[<flat index 0>]" is the NamedArray's array
        jax.tree_util.keystr(p).split("[")[0]: d
        for p, d in jax.tree_util.tree_flatten_with_path(
            muon_dimension_numbers(model), is_leaf=lambda x: isinstance(x, MuonDimensionNumbers)
        )[0]
        if isinstance(d, MuonDimensionNumbers)
    }
    # q_proj [layers, heads, head_dim, embed] reads embed; o_proj [layers, embed, heads, head_dim] writes it.
    assert dims[".layers.stacked.attn.q_proj"] == MuonDimensionNumbers((3,), (1, 2))
    assert dims[".layers.stacked.attn.o_proj"] == MuonDimensionNumbers((2, 3), (1,))
    assert dims[".layers.stacked.mlp.gate"] == MuonDimensionNumbers((2,), (1,))  # [layers, mlp, embed]
    assert dims[".layers.stacked.mlp.down"] == MuonDimensionNumbers((2,), (1,))  # [layers, embed, mlp]
    assert not any("norm" in k or k.split(".")[1] == "embed" for k in dims)


def test_shape_scaling_follows_the_published_rules() -> None:
    import optax

    from schooner.train._optim import Fans, scale_by_shape

    u = {"a": jax.numpy.ones((3,)), "b": jax.numpy.ones((2,))}
    fans = {"a": Fans(64, 256), "b": Fans(512, 128)}
    rms, _ = scale_by_shape(fans, 0.2).update(u, optax.EmptyState())
    np.testing.assert_allclose(rms["a"], 0.2 * np.sqrt(256.0))  # consistent RMS: rms * sqrt(max fan)
    np.testing.assert_allclose(rms["b"], 0.2 * np.sqrt(512.0))
    width, _ = scale_by_shape(fans, None).update(u, optax.EmptyState())
    np.testing.assert_allclose(width["a"], 2.0)  # sqrt(max(1, fan_out / fan_in))
    np.testing.assert_allclose(width["b"], 1.0)


def test_adamw_first_step_matches_numpy(model) -> None:
    lr, wd, eps, b1, b2 = 0.01, 0.1, 1e-8, 0.9, 0.95
    cfg = AdamConfig(
        learning_rate=lr,
        weight_decay=wd,
        eps=eps,
        beta1=b1,
        beta2=b2,
        warmup=0,
        schedule="constant",
        max_grad_norm=None,
    )
    tx = build_optimizer(cfg, model, 10)
    g = _grads(model)
    updates, _ = jax.jit(tx.update)(g, tx.init(model), model)
    got, gs, ps = _by_path(model, updates), _by_path(model, g), _by_path(model, model)
    for path in (".embed", ".final_norm", ".layers.stacked.mlp.up"):
        m = (1 - b1) * gs[path] / (1 - b1)  # bias-corrected first step moments
        v = (1 - b2) * gs[path] ** 2 / (1 - b2)
        decay = wd * ps[path] if path != ".final_norm" else 0.0
        np.testing.assert_allclose(got[path], -lr * (m / (np.sqrt(v) + eps) + decay), rtol=2e-5, atol=1e-7)


def test_clipping_scales_gradients_before_adam(model) -> None:
    # With a large eps Adam is not scale invariant, so clipping is visible in the update.
    lr, eps = 1.0, 1.0
    cfg = AdamConfig(learning_rate=lr, eps=eps, warmup=0, schedule="constant", max_grad_norm=0.5)
    tx = build_optimizer(cfg, model, 10)
    g = _grads(model)
    updates, _ = jax.jit(tx.update)(g, tx.init(model), model)
    gs = _by_path(model, g)
    norm = np.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in gs.values()))
    scale = min(1.0, 0.5 / norm)
    gc = gs[".embed"] * scale
    np.testing.assert_allclose(
        _by_path(model, updates)[".embed"], -lr * gc / (np.abs(gc) + eps), rtol=1e-4, atol=1e-7
    )


def test_muon_updates_are_orthogonalized(model) -> None:
    cfg = MuonConfig(
        learning_rate=1.0, warmup=0, schedule="constant", max_grad_norm=None, consistent_rms=None
    )
    tx = build_optimizer(cfg, model, 10)
    updates, _ = jax.jit(tx.update)(_grads(model), tx.init(model), model)
    u = _by_path(model, updates)
    up = u[".layers.stacked.mlp.up"]  # [layers, mlp, embed]
    for layer in up:
        s = np.linalg.svd(layer.astype(np.float64), compute_uv=False)
        # Newton-Schulz (5 steps, Muon's coefficients) maps every singular value into roughly [0.7, 1.2],
        # times the width factor sqrt(max(1, fan_out / fan_in)) = sqrt(128 / 64) here.
        scaled = s / np.sqrt(2.0)
        assert scaled.min() > 0.5 and scaled.max() < 1.3, scaled
    # A random Gaussian gradient's singular values spread much more widely.
    g = _by_path(model, _grads(model))[".layers.stacked.mlp.up"][0]
    sg = np.linalg.svd(g.astype(np.float64), compute_uv=False)
    assert sg.max() / sg.min() > 3
    # Norms go to AdamW: the first step is -lr * sign(g) (nesterov off for AdamW).
    assert np.allclose(np.abs(u[".final_norm"]), 1.0, atol=1e-4)


def test_moe_groups_router_and_frozen_bias(nano) -> None:
    from schooner.model import MoEConfig, init

    cfg = MoEConfig(
        **{f.name: getattr(nano(), f.name) for f in dataclasses.fields(nano()) if f.name != "type"},
        num_experts=4,
        num_experts_per_token=2,
    )
    moe = init(cfg, key=jax.random.PRNGKey(0))
    lr = 0.01
    for opt in (
        AdamConfig(learning_rate=lr, warmup=0, schedule="constant", weight_decay=0.0, max_grad_norm=None),
        MuonConfig(learning_rate=lr, warmup=0, schedule="constant", weight_decay=0.0, max_grad_norm=None),
    ):
        rows = {r["path"]: r for r in describe_param_groups(moe, opt)}
        assert rows[".layers.stacked.mlp.router_bias"]["rule"] == "frozen"
        assert rows[".layers.stacked.mlp.router"]["kind"] == "router"
        assert rows[".layers.stacked.mlp.router"]["rule"] == "adamw"  # under Muon too
        tx = build_optimizer(opt, moe, 10)
        g = _grads(moe)
        updates, _ = jax.jit(tx.update)(g, tx.init(moe), moe)
        u = _by_path(moe, updates)
        assert np.all(u[".layers.stacked.mlp.router_bias"] == 0.0)
        # AdamW's first step is -lr * sign(g) per entry: the router takes it under both optimizers.
        sign = -lr * np.sign(_by_path(moe, g)[".layers.stacked.mlp.router"])
        np.testing.assert_allclose(u[".layers.stacked.mlp.router"], sign, rtol=1e-4)
        for name in ("gate", "up", "down"):  # the experts: [layers, experts, ...], all updated
            assert np.all(np.abs(u[f".layers.stacked.mlp.{name}"]).reshape(cfg.num_layers, 4, -1).max(-1) > 0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(learning_rate=-1.0), "learning_rate"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(schedule="cos"), "schedule"),
        (dict(beta2=1.0), "beta2"),
    ],
)
def test_config_errors(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamConfig(**kw)


def test_muon_config_errors() -> None:
    with pytest.raises(ValueError, match="momentum"):
        MuonConfig(momentum=1.0)
    with pytest.raises(ValueError, match="ns_steps"):
        MuonConfig(ns_steps=0)
    assert jnp.isfinite(MuonConfig().lr_schedule(10)(5))


@pytest.mark.parametrize(
    ("cls", "kw", "message"),
    [
        # Numbers from a YAML file or a command line arrive as strings: named, not "'<' not supported".
        (AdamConfig, dict(weight_decay="0.1"), "weight_decay must be a number >= 0, got weight_decay='0.1'"),
        (AdamConfig, dict(max_grad_norm="1.0"), "max_grad_norm must be a number > 0 or None"),
        (
            AdamConfig,
            dict(min_lr_ratio=None),
            "min_lr_ratio must be a number in [0, 1], got min_lr_ratio=None",
        ),
        (AdamConfig, dict(beta1="0.9"), "beta1 must be a number in [0, 1), got beta1='0.9'"),
        (AdamConfig, dict(eps="1e-8"), "eps must be a number > 0, got eps='1e-8'"),
        (AdamConfig, dict(decay_embeddings="no"), "decay_embeddings must be True or False, got 'no'"),
        (AdamConfig, dict(decay_norms_and_biases="false"), "decay_norms_and_biases must be True or False"),
        (MuonConfig, dict(momentum="0.95"), "momentum must be a number in [0, 1), got momentum='0.95'"),
        (MuonConfig, dict(consistent_rms="0.2"), "consistent_rms must be a number > 0 or None"),
        (MuonConfig, dict(adam_learning_rate="3e-4"), "adam_learning_rate must be a number > 0 or None"),
        (MuonConfig, dict(nesterov="yes"), "nesterov must be True or False, got 'yes'"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(cls: type, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(**kw)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("cls", [AdamConfig, MuonConfig])
@pytest.mark.parametrize(
    "field",
    ["weight_decay", "max_grad_norm", "min_lr_ratio", "beta1", "beta2", "eps", "warmup", "decay"],
)
@pytest.mark.parametrize("value", [NAN, INF])
def test_a_non_finite_number_is_refused_naming_its_field(cls: type, field: str, value: float) -> None:
    # NaN passes every `< 0` check; AdamConfig(weight_decay=nan) used to fail at step 1 telling the user to
    # lower the learning rate.
    with pytest.raises(
        ValueError, match=rf"{cls.__name__}\.{field} must be a finite number.*{field}={value}"
    ):
        cls(**{field: value})


@pytest.mark.parametrize("field", ["momentum", "consistent_rms", "adam_learning_rate"])
@pytest.mark.parametrize("value", [NAN, INF])
def test_muon_refuses_non_finite_numbers_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"MuonConfig\.{field} must be a finite number.*{field}={value}"):
        MuonConfig(**{field: value})
