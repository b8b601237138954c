"""AdamHConfig: the trainer's AdamH (schedule, clipping, labels from the model), a nano run that resumes
exactly, a JSON round trip like AdamConfig's, and bad settings named by field."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import numpy as np
import optax
import pytest

from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig, train
from schooner.train._adamh import AdamHConfig, Sphere, model_labels
from schooner.train._run_info import config_to_json


def _model(nano):
    from schooner.model import init

    return init(nano(), key=jax.random.PRNGKey(0))


def _grads(model, seed: int, scale: float):
    leaves, treedef = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def test_build_clips_then_steps_both_groups_on_their_own_schedules(nano) -> None:
    """Three steps on a nano model against numpy: the gradients clipped to the global norm, plain Adam on the
    embedding at the `adam_learning_rate` schedule, each q_proj layer kept on its initial sphere."""
    cfg = AdamHConfig(
        learning_rate=0.05, adam_learning_rate=0.01, max_grad_norm=0.5, schedule="linear", warmup=1,
        min_lr_ratio=0.2, beta1=0.8, beta2=0.9, eps=1e-6,
    )  # fmt: skip
    steps = 4
    model = _model(nano)
    tx = cfg.build(model, steps)
    state = tx.init(model)
    update = jax.jit(tx.update)
    adam_sched = AdamConfig(learning_rate=0.01, schedule="linear", warmup=1, min_lr_ratio=0.2).lr_schedule(
        steps
    )  # the same shape, the Adam group's peak
    e = np.asarray(model.embed.array, np.float64)
    m = v = np.zeros_like(e)
    q0 = np.asarray(model.layers.stacked.attn.q_proj.array)
    params = model
    for t in range(3):
        g = _grads(params, t, scale=3.0)  # global norm far above 0.5: clipping is active
        norm = np.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in jax.tree.leaves(g)))
        ge = np.asarray(g.embed.array, np.float64) * min(1.0, 0.5 / norm)
        m = 0.8 * m + 0.2 * ge
        v = 0.9 * v + 0.1 * ge**2
        u = (m / (1 - 0.8 ** (t + 1))) / (np.sqrt(v / (1 - 0.9 ** (t + 1))) + 1e-6)
        e = e - float(adam_sched(t)) * u
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.asarray(params.embed.array), e, rtol=1e-5, atol=1e-7)
    q = np.asarray(params.layers.stacked.attn.q_proj.array)
    per_layer = lambda x: np.linalg.norm(x.reshape(x.shape[0], -1), axis=1)  # noqa: E731
    np.testing.assert_allclose(per_layer(q), per_layer(q0), rtol=1e-5)
    assert np.linalg.norm(q - q0) > 0.02 * np.linalg.norm(q0)  # it moved
    assert float(adam_sched(0)) == 0.0 and float(adam_sched(1)) == pytest.approx(0.01)  # warmup, then peak


def test_sphere_kinds_choose_the_labels(nano) -> None:
    from schooner.model import init

    untied = jax.eval_shape(lambda: init(nano(tie_embeddings=False), key=jax.random.PRNGKey(0)))
    tx = AdamHConfig(sphere_kinds=("matrix", "head")).build(untied, 10)
    assert model_labels(untied, ("matrix", "head")).lm_head == Sphere(axes=(0, 1))
    state = jax.eval_shape(tx.init, untied)  # shapes only, as the trainer does before restoring
    radii = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, tuple) and not hasattr(x, "_fields"))
    assert radii  # one radius per sphere leaf: the 7 projections and the head
    from schooner.model import ParamGroup, parameter_groups

    groups = parameter_groups(untied)
    rules = {
        g.kind: AdamHConfig(sphere_kinds=("matrix", "head")).group_rule(g)
        for g in jax.tree.leaves(groups, is_leaf=lambda x: isinstance(x, ParamGroup))
    }
    assert rules == {"embedding": "adam", "head": "adamh", "norm": "adam", "matrix": "adamh"}
    assert AdamHConfig().group_rule(ParamGroup("balancing")) == "frozen"
    with pytest.raises(TypeError, match="needs a schooner.model model"):
        AdamHConfig().build({"w": np.ones((2, 2))}, 10)


def test_trains_a_nano_model(nano, data_dir, tmp_path, read_losses) -> None:
    out = str(tmp_path / "run")
    train(
        TrainerConfig(
            model=nano(),
            datasets=[(f"{data_dir}/train", 1.0)], seq_len=32, validation={},
            output_path=out, batch_size=8, num_train_steps=4, seed=1,
            optimizer=AdamHConfig(learning_rate=0.05, adam_learning_rate=1e-2, warmup=1, schedule="constant"),
            checkpoint=CheckpointConfig(every=None, save_final=False),
            trackers=TrackerConfig(loss_plot=False, log_every=1),
        )
    )  # fmt: skip
    losses = read_losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
    assert losses[4] < losses[1] - 0.2


@pytest.mark.slow  # three compilations: ~40 s of CPU; run with -m slow
def test_trains_a_nano_model_and_resumes_exactly(nano, data_dir, tmp_path, read_losses) -> None:
    from schooner.model import load_model, load_pytree

    def cfg(out: str) -> TrainerConfig:
        return TrainerConfig(
            model=nano(),
            datasets=[(f"{data_dir}/train", 1.0)], seq_len=32, validation={},
            output_path=out, batch_size=8, num_train_steps=6, seed=3,
            optimizer=AdamHConfig(learning_rate=0.05, adam_learning_rate=1e-2, warmup=1, schedule="wsd"),
            checkpoint=CheckpointConfig(every=3, keep_last=5),
            trackers=TrackerConfig(loss_plot=False, log_every=1),
        )  # fmt: skip

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train(cfg(straight))
    train(cfg(resumed))
    shutil.rmtree(f"{resumed}/step-000006")  # the run "died" after step 3's checkpoint
    summary = train(cfg(resumed))
    assert summary["start_step"] == 3
    a, b = read_losses(straight), read_losses(resumed)
    assert sorted(a) == list(range(1, 7)) and a == b  # bitwise, step by step
    assert a[6] < a[1] - 0.3  # it learns
    m3, _ = load_model(f"{straight}/step-000003")
    m6, _ = load_model(f"{straight}/step-000006")
    for path in ("attn.q_proj", "mlp.down"):
        x3 = np.asarray(eval(f"m3.layers.stacked.{path}.array"))  # noqa: S307
        x6 = np.asarray(eval(f"m6.layers.stacked.{path}.array"))  # noqa: S307
        norms = lambda x: np.linalg.norm(x.reshape(x.shape[0], -1), axis=1)  # noqa: E731
        np.testing.assert_allclose(norms(x6), norms(x3), rtol=1e-5, err_msg=path)  # on their spheres
        assert not np.allclose(x6, x3)
    sa = load_pytree(f"{straight}/step-000006/train_state")
    sb = load_pytree(f"{resumed}/step-000006/train_state")
    assert sa.keys() == sb.keys() and any("radius" in k for k in sa)
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


@pytest.mark.parametrize(
    "config",
    [
        AdamConfig(learning_rate=6e-4, weight_decay=0.1),
        AdamHConfig(),
        AdamHConfig(learning_rate=0.02, adam_learning_rate=1e-3, schedule="wsd", warmup=0.1, decay=0.2,
                    min_lr_ratio=0.0, beta2=0.99, eps=1e-9, max_grad_norm=None, sphere_kinds=("matrix", "head")),
    ],
)  # fmt: skip
def test_json_round_trip_like_adam_config(config) -> None:
    """What run.json records (`config_to_json`) rebuilds the same config: lists back to tuples."""
    data = json.loads(json.dumps(config_to_json(config)))
    assert data.pop("class") == type(config).__name__
    back = type(config)(**data)
    assert back == config
    assert hash(back) == hash(config)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weight_decay": 0.1}, r"AdamHConfig.weight_decay must be 0, got weight_decay=0.1"),
        ({"adam_learning_rate": 0.0}, r"AdamHConfig.adam_learning_rate must be a finite number > 0"),
        (
            {"adam_learning_rate": "3e-3"},
            r"AdamHConfig.adam_learning_rate must be a number > 0, got .*'3e-3'",
        ),
        ({"beta2": 1.0}, r"AdamHConfig.beta2 must be in \[0, 1\), got beta2=1.0"),
        ({"eps": 0.0}, r"AdamHConfig.eps must be > 0, got eps=0.0"),
        ({"sphere_kinds": ("norm",)}, r"sphere_kinds must be among .*\(norm scales are vectors"),
        ({"sphere_kinds": "matrix"}, r"AdamHConfig.sphere_kinds must be a tuple of group kinds"),
        ({"learning_rate": -1.0}, r"AdamHConfig.learning_rate must be > 0"),
        ({"max_grad_norm": 0.0}, r"AdamHConfig.max_grad_norm must be > 0 or None"),
    ],
)
def test_bad_settings_are_named(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamHConfig(**kw)


def test_replace_keeps_validation() -> None:
    cfg = AdamHConfig()
    assert dataclasses.replace(cfg, learning_rate=0.03).learning_rate == 0.03
    with pytest.raises(ValueError, match="weight_decay must be 0"):
        dataclasses.replace(cfg, weight_decay=0.01)


def test_describe_param_groups_reports_adamh_rules_and_no_decay(nano) -> None:
    """The optimizer table of a run names AdamH's own rule per group: "adamh" for the sphere kinds, "adam"
    for the rest, and no group decays (AdamH has no weight decay); AdamConfig's table is unchanged."""
    from schooner.train import describe_param_groups

    model = _model(nano)
    rows = describe_param_groups(model, AdamHConfig())
    by_kind = {r["kind"]: r["rule"] for r in rows}
    assert by_kind["matrix"] == "adamh"
    assert {r["rule"] for r in rows if r["kind"] != "matrix"} <= {"adam", "frozen"}
    assert not any(r["decay"] for r in rows)
    assert any(r["decay"] for r in describe_param_groups(model, AdamConfig(weight_decay=0.1)))
