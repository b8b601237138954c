"""The trainer is configured, not subclassed: an objective's setup, extra hooks and a batch source that reads
the policy (RL's rollouts) plug into `Trainer` without touching the loop."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    LanguageModeling,
    StepInfo,
    TrackerConfig,
    Trainer,
    TrainerConfig,
    read_metrics,
    train,
)


def _config(nano, data_dir, out: str, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets=[(f"{data_dir}/train", 1.0)],
        seq_len=32,
        validation={},
        batch_size=8,
        num_train_steps=4,
        seed=2,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=0),  # every step moves the model
        checkpoint=CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False, log_every=1),
        output_path=out,
    )
    return TrainerConfig(**{**args, **kw})


class _Seen:
    """A hook: records each step it sees and logs one metric of its own."""

    every = 2

    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(self, info: StepInfo) -> dict[str, float]:
        self.steps.append(info.step)
        assert info.trainer.state is not None and "train/loss" in info.metrics
        return {"hook/loss_seen": info.metrics["train/loss"]}


class _OnPolicy:
    """A `PolicyBatches` source (as RL's rollouts would be): the LM mixture's batches, asked in the loop with
    the current model; remembers a fingerprint of each model it was given."""

    on_policy = True

    def __init__(self, mixture) -> None:
        self.mixture, self.models = mixture, []

    def batch_for(self, step: int, batch_size: int, model) -> dict[str, np.ndarray]:
        self.models.append(float(np.asarray(jax.tree.leaves(model)[0]).sum()))
        return self.mixture.batch(step, batch_size)


def _losses(out: str) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_metrics(f"{out}/metrics.jsonl") if "train/loss" in r}


def test_a_hook_and_a_policy_batch_source_configure_the_same_loop(nano, data_dir, tmp_path) -> None:
    base = _config(nano, data_dir, str(tmp_path / "base"))
    train(base)
    want = _losses(str(tmp_path / "base"))
    assert sorted(want) == [1, 2, 3, 4]

    # The language-modeling setup, a hook added and its batches asked in the loop with the policy: the same
    # losses, the hook's metric at steps 2 and 4, and each batch request saw a newer model.
    out = str(tmp_path / "configured")
    cfg = dataclasses.replace(base, output_path=out)
    setup = LanguageModeling().setup(cfg, out)
    hook, source = _Seen(), _OnPolicy(setup.data)
    Trainer(cfg, output_path=out, **{**vars(setup), "hooks": [hook], "data": source}).run()
    assert _losses(out) == pytest.approx(want, rel=1e-6)
    assert hook.steps == [2, 4]
    rows = [r for r in read_metrics(f"{out}/metrics.jsonl") if "hook/loss_seen" in r]
    assert [r["step"] for r in rows] == [2, 4]
    assert [r["hook/loss_seen"] for r in rows] == pytest.approx([want[2], want[4]], rel=1e-6)
    assert len(source.models) == 4 and len(set(source.models)) == 4


def test_the_config_names_what_is_wrong(nano) -> None:
    with pytest.raises(ValueError, match=r"datasets is empty"):
        TrainerConfig(model=nano(), datasets=[], seq_len=32, num_train_steps=1)
    with pytest.raises(ValueError, match=r"\(input, weight\) pairs"):
        TrainerConfig(model=nano(), datasets=["a", "b"][0], seq_len=32, num_train_steps=1)
    with pytest.raises(TypeError, match=r"objective must be None \(language modeling\)"):
        TrainerConfig(model=nano(), datasets={"a": 1.0}, seq_len=32, num_train_steps=1, objective="dpo")
    c = TrainerConfig(model=nano(), datasets={"a": 1.0, "b": 2.0}, seq_len=32, num_train_steps=1)
    assert c.datasets == (("a", 1.0), ("b", 2.0)) and c.inputs == ["a", "b"]


def test_the_step_on_the_states_leaves_is_the_step_on_the_state() -> None:
    """`on_leaves`: the step the trainer dispatches from the state's leaves returns, bit for bit, the state
    and metrics of the step jitted on the pytree itself (haliax arrays in an equinox module), the metrics as
    one vector in sorted-name order."""
    import equinox as eqx
    import haliax as hax
    import jax.numpy as jnp

    from schooner.train._trainer import on_leaves

    class S(eqx.Module):
        w: hax.NamedArray
        b: jax.Array

    Embed = hax.Axis("embed", 5)

    def step(s: S, x: jax.Array) -> tuple[S, dict[str, jax.Array]]:
        w = s.w * 0.9 + hax.named(x, Embed)
        loss = jnp.sum(w.array**2) / 3.0
        return S(w=w, b=s.b + 1), {"loss": loss, "b": jnp.asarray(s.b, jnp.float32), "a_norm": jnp.sqrt(loss)}

    s0 = S(w=hax.named(jnp.linspace(-1.0, 2.0, 5), Embed), b=jnp.asarray(3, jnp.int32))
    x = jnp.linspace(0.1, 0.7, 5)
    want_state, want = jax.jit(step)(s0, x)
    names: list[str] = []
    treedef = jax.tree.structure(s0)
    leaves, vec = jax.jit(on_leaves(step, treedef, names), donate_argnums=(0,))(jax.tree.leaves(s0), x)
    assert names == ["a_norm", "b", "loss"] and vec.dtype == jnp.float32
    assert np.asarray(vec).tolist() == [float(want[k]) for k in names]
    got = jax.tree.unflatten(treedef, leaves)
    assert isinstance(got.w, hax.NamedArray) and got.w.axes == (Embed,)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
