"""GRPO learns: on a reward a tiny model can learn in a few steps (1 when the completion holds a digit, ~15% of
random completions at the start), `rl_train`'s trainer (chat-rendered prompts, rollouts, scoring, GRPO
advantages, the dapo-aggregated clipped loss, Adam) raises the mean rollout reward far above where it
started. With the advantage's sign flipped the same run does not rise (checked by hand when this test was
written): the test sees the direction of the update, not just that the run moves."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from schooner.train import (
    CheckpointConfig,
    Grpo,
    train,
)


def has_digit(prompt: str, completion: str, fields: dict) -> float:
    return float(any(c.isdigit() for c in completion))


@pytest.mark.slow  # ~30 s: compiles the trainer's step and sampler
def test_grpo_raises_the_reward_of_a_learnable_task(
    data_dir, nano, saved_model, grpo_config, metric_rows, tmp_path
) -> None:
    config = dataclasses.replace(nano(), num_layers=1, max_seq_len=48)
    start = saved_model(config, jax.random.PRNGKey(5))
    prompts = tmp_path / "train.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": str(i), "prompt": f"def f{i}(x):"}) + "\n" for i in range(16))
    )
    out = str(tmp_path / "run")
    train(
        grpo_config(
            data_dir,
            str(prompts),
            start,
            out,
            Grpo(reward=has_digit, num_generations=8, max_new_tokens=4),
            steps=10,
            seq_len=32,  # the chat-rendered prompt (< 28 tokens) + 4 new tokens
            batch_size=64,  # 8 prompts x 8 samples
            learning_rate=2e-2,
            checkpoint=CheckpointConfig(every=1000, keep_last=1),
            model=config,
        )
    )
    rows = metric_rows(out)
    reward = np.array([rows[s]["rollout/reward"] for s in range(1, 11)])
    assert rows[1]["rollout/skipped_prompts"] == 0
    assert reward[:2].mean() < 0.35, reward  # the start: digits are rare
    assert reward[-3:].mean() > reward[:2].mean() + 0.4, reward  # learned: most completions hold one
    assert rows[10]["train/entropy"] < rows[1]["train/entropy"]  # sharper toward the rewarded tokens


def _first_token_rewards(flip: bool = False) -> np.ndarray:
    """The mean reward of each of 6 on-policy GRPO steps where a completion earns 1 when its first token is
    one of ids 0-11 (~20% at the start), with `rollout`, `group_advantages` and the trainer's own loss
    (`make_grpo_loss`) under Adam; `flip` negates the advantages."""
    import equinox as eqx
    import jax.numpy as jnp
    import optax

    from schooner.model import LlamaConfig, SamplingConfig, init
    from schooner.train import PolicyLossConfig
    from schooner.train._rl import make_grpo_loss
    from schooner.train._rl_objective import group_advantages
    from schooner.train._rl_rollout import rollout

    config = LlamaConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=48, num_layers=1, num_heads=4, num_kv_heads=2,
        max_seq_len=16, compute_dtype="float32", initializer_range=0.3,
    )  # fmt: skip
    model = init(config, key=jax.random.key(0))
    sampling = SamplingConfig(temperature=1.0, n=8, max_new_tokens=3, stop_ids=(60,))
    prompts = [[20 + i, 30 + i, 40 + i] for i in range(8)]
    loss = make_grpo_loss(
        Grpo(reward=has_digit, num_generations=8, loss=PolicyLossConfig(aggregation="dapo"))
    )
    opt = optax.adam(3e-2)
    state = opt.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def update(model, state, batch):
        grads = eqx.filter_grad(lambda m: loss(m, batch, None)[0])(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state

    means = []
    for step in range(6):
        rb = rollout(model, prompts, sampling, seed=0, step=step, max_prompt_tokens=4)
        first = rb.tokens[np.arange(len(rb.tokens)), rb.prompt_lengths]
        rewards = (first < 12).astype(np.float64).reshape(len(prompts), 8)
        means.append(rewards.mean())
        adv = np.asarray(group_advantages(rewards, "grpo")).reshape(-1) * (-1.0 if flip else 1.0)
        batch = {k: jnp.asarray(getattr(rb, k)) for k in ("tokens", "mask", "old_logprobs")}
        model, state = update(model, state, batch | {"advantages": jnp.asarray(adv, jnp.float32)})
    return np.array(means)


def test_grpo_updates_raise_the_reward_and_flipped_advantages_lower_it() -> None:
    """The rollouts, the advantages and the trainer's loss, without the trainer (a few seconds): the reward
    rises from ~0.2 to most completions; with the advantages' sign flipped it falls toward 0. A sampler whose
    log-probs or mask were off by a position, or a loss of the wrong sign, fails one of the two."""
    up, down = _first_token_rewards(), _first_token_rewards(flip=True)
    assert 0.05 < up[0] < 0.4 and down[0] == up[0], (up, down)  # the same start
    assert up[-2:].mean() > up[0] + 0.5, up
    assert down[-2:].mean() < down[0] - 0.1, down
