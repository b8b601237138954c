"""Rollouts: the layout `policy_loss` consumes (old log-probs equal the trainer's own recomputation, ratio 1),
the RNG a pure function of (seed, step), and prompts over the cap skipped, counted and named."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import LlamaConfig, SamplingConfig, init
from schooner.train._rl_objective import PolicyLossConfig, group_advantages, policy_loss, token_logprobs
from schooner.train._rl_rollout import RolloutBatch, chat_prompts, rollout, rollout_key

CONFIG = LlamaConfig(
    vocab_size=97, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2,
    max_seq_len=64, compute_dtype="float32", initializer_range=0.3,
)  # fmt: skip
PROMPTS = [[3, 4, 5], [7] * 11, [9, 2], [1] * 20, [8, 8, 6, 1]]
SAMPLING = SamplingConfig(temperature=0.9, top_p=0.95, n=3, max_new_tokens=20, stop_ids=(5, 11))


@pytest.fixture(scope="module")
def model():
    return init(CONFIG, key=jax.random.key(1))


@pytest.fixture(scope="module")
def batch(model) -> RolloutBatch:
    ids = [f"row-{i}" for i in range(len(PROMPTS))]
    return rollout(model, PROMPTS, SAMPLING, seed=7, step=3, max_prompt_tokens=16, row_ids=ids)


def test_a_prompt_over_the_cap_is_a_counted_skip_naming_the_row(model, batch, caplog):
    assert [(s.row_id, s.prompt_tokens) for s in batch.skipped] == [("row-3", 20)]
    assert "max_prompt_tokens=16" in batch.skipped[0].reason
    assert batch.row_ids == ("row-0", "row-1", "row-2", "row-4")
    assert batch.metrics()["rollout/skipped_prompts"] == 1.0
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(ValueError, match="every prompt of step 0 was skipped"),
    ):
        rollout(model, [[1] * 20, []], SAMPLING, seed=0, step=0, max_prompt_tokens=16)
    assert "skipped 2 prompt(s) over the cap or empty: 0 (20 tokens), 1 (0 tokens)" in caplog.text
    with pytest.raises(
        ValueError, match="max_prompt_tokens=50 plus max_new_tokens=20 exceeds .* max_seq_len=64"
    ):
        rollout(model, PROMPTS, SAMPLING, seed=0, step=0, max_prompt_tokens=50)


def test_the_layout_is_prompt_completion_padding_with_predictions_masked(batch):
    kept = [p for i, p in enumerate(PROMPTS) if i != 3]
    b, width = 4 * 3, 16 + 20
    assert batch.tokens.shape == (b, width) and batch.mask.shape == batch.old_logprobs.shape == (b, width - 1)
    for r in range(b):
        prompt, p, c = kept[r // 3], batch.prompt_lengths[r], batch.completion_lengths[r]
        assert batch.tokens[r, :p].tolist() == prompt and p == len(prompt)
        completion = batch.completions()[r]
        assert len(completion) == c >= 1 and (batch.tokens[r, p + c :] == 0).all()
        assert np.flatnonzero(batch.mask[r]).tolist() == list(range(p - 1, p - 1 + c))
        ended = completion[-1] in SAMPLING.stop_ids
        assert batch.stop_reasons[r] == ("stop_id" if ended else "length")
        assert ended or c == SAMPLING.max_new_tokens
        assert not any(t in SAMPLING.stop_ids for t in completion[:-1])
    assert (batch.old_logprobs[batch.mask == 0] == 0).all() and (
        batch.old_logprobs[batch.mask == 1] < 0
    ).all()


def test_old_logprobs_equal_the_policys_recomputation_and_the_loss_starts_at_ratio_one(model, batch):
    logits = model(jnp.asarray(batch.tokens))
    logp = token_logprobs(logits[:, :-1], jnp.asarray(batch.tokens[:, 1:]), temperature=SAMPLING.temperature)
    mask = jnp.asarray(batch.mask)
    np.testing.assert_allclose(np.asarray(logp * mask), batch.old_logprobs, atol=1e-5, rtol=0)
    rewards = np.arange(12, dtype=np.float32).reshape(len(batch.row_ids), batch.group_size) % 2
    adv = group_advantages(rewards).reshape(-1)
    loss, metrics = policy_loss(logp, jnp.asarray(batch.old_logprobs), adv, mask, PolicyLossConfig())
    assert float(metrics["clip_ratio/region_mean"]) == 0.0
    # ratio 1 everywhere: the dapo loss is minus the token-weighted mean advantage
    want = -float((adv[:, None] * mask).sum() / mask.sum())
    assert float(loss) == pytest.approx(want, abs=1e-5)


def test_the_rollout_rng_is_a_pure_function_of_seed_and_step(model, batch):
    again = rollout(model, PROMPTS, SAMPLING, seed=7, step=3, max_prompt_tokens=16)
    np.testing.assert_array_equal(again.tokens, batch.tokens)
    np.testing.assert_array_equal(again.old_logprobs, batch.old_logprobs)
    other_step = rollout(model, PROMPTS, SAMPLING, seed=7, step=4, max_prompt_tokens=16)
    other_seed = rollout(model, PROMPTS, SAMPLING, seed=8, step=3, max_prompt_tokens=16)
    assert not np.array_equal(other_step.tokens, batch.tokens)
    assert not np.array_equal(other_seed.tokens, batch.tokens)
    assert (
        jax.random.key_data(rollout_key(7, 3)).tolist()
        == jax.random.key_data(jax.random.fold_in(jax.random.key(7), 3)).tolist()
    )


def test_chat_prompts_render_as_sft_does_and_stop_at_eos_and_end_of_turn(data_dir):
    from schooner.tokenize import load_tokenizer, render_chat

    tok = load_tokenizer(f"{data_dir}/tokenizer.json")
    conversation = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "1 + 2?"},
    ]
    ids, stops = chat_prompts(tok, ["What is 40 + 2?", conversation])
    assert (
        ids[0]
        == render_chat(
            tok, [{"role": "user", "content": "What is 40 + 2?"}], add_generation_prompt=True
        ).ids.tolist()
    )
    assert ids[1] == render_chat(tok, conversation, add_generation_prompt=True).ids.tolist()
    assert tok.decode(ids[0]).endswith("<|assistant|>") and "What is 40 + 2?" in tok.decode(ids[0])
    assert stops == (tok.eos_id, tok.token_to_id("<|end_of_turn|>"))
