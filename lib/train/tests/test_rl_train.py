"""GRPO on the trainer (`schooner.train.Grpo`, the `rl_train` step): on the arithmetic task from a tiny
model the reward is finite and every metric is written; a run stopped mid rollout group and resumed ends
with the uninterrupted run's weights, bitwise; a reward that raises is counted and named, not fatal; bad
prompt files are errors naming the file and line, prompts over the cap are counted skips naming the row."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    Grpo,
    PolicyLossConfig,
    TrainerConfig,
    read_metrics,
    train,
)
from schooner.train._rl import read_prompts
from schooner.train._rl_sampling import prompt_indices

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

CAP, NEW = 112, 16  # prompt cap + completion cap = the nano model's max_seq_len (128)


@pytest.fixture(scope="module")
def straight_config(data_dir, task, start, grpo_config):
    """A function, run folder -> the config of 6 steps of GRPO on the arithmetic task (4 samples a prompt, 8
    rows a step), two updates per rollout batch, KL to the start, checkpoints at 3 and 6."""
    from schooner.eval.rewards import exact_answer

    def make(out: str) -> TrainerConfig:
        grpo = Grpo(
            reward=exact_answer(), num_generations=4, max_new_tokens=NEW, temperature=1.0, num_iterations=2,
            loss=PolicyLossConfig(beta=0.04),
        )  # fmt: skip
        return grpo_config(
            data_dir, task, start, out, grpo, steps=6, seq_len=CAP + NEW,
            checkpoint=CheckpointConfig(every=3, keep_last=10),
        )  # fmt: skip

    return make


@pytest.fixture(scope="module")
def straight(straight_config, tmp_path_factory) -> str:
    """The straight run: read by the metrics test, resumed by the resume test (one compilation for both)."""
    out = str(tmp_path_factory.mktemp("rl-straight") / "run")
    summary = train(straight_config(out))
    assert summary["steps"] == 6 and summary["checkpoint"].endswith("step-000006")
    return out


def test_grpo_on_arithmetic_writes_finite_rewards_and_every_metric(straight, metric_rows) -> None:
    rows = metric_rows(straight)
    for n in range(1, 7):
        for k in ("train/loss", "train/kl", "train/entropy", "train/clip_ratio/region_mean", "time/update"):
            assert np.isfinite(rows[n][k]), (n, k)
        assert rows[n]["train/kl"] >= 0 and rows[n]["train/entropy"] > 0
    for n in (1, 3, 5):  # the steps that made rollouts (two updates per batch)
        r = rows[n]
        assert 0.0 <= r["rollout/reward"] <= 1.0 and np.isfinite(r["rollout/reward_std"])
        assert 1 <= r["rollout/completions/mean_length"] <= NEW
        assert r["rollout/reward_errors"] == 0.0 and r["time/rollout"] > 0 and r["time/scoring"] >= 0
        assert r["rollout/skipped_prompts"] > 0  # the task has prompts over the 112-token cap: counted
    assert rows[2]["time/rollout"] == 0.0 and "rollout/reward" not in rows[2]  # the batch reused
    # step 1 updates from the starting weights, which are the reference: KL 0 (float rounding aside); once an
    # update with signal has moved the policy, the KL to the reference is clearly above 0. (Not step 2: this
    # task's first batch has no group whose rewards differ, so step 1's gradient is float rounding alone, which
    # Adam turned into a step at XLA's default level and which is exactly 0 at level 0.)
    assert rows[1]["train/kl"] < 1e-6 and max(rows[n]["train/kl"] for n in range(2, 7)) > 1e-4
    with open(f"{straight}/run.json") as f:
        run = json.load(f)
    assert run["rl"]["skipped_prompts"] and run["rl"]["reward"].endswith("exact_answer[answer]")
    assert os.path.exists(f"{straight}/reward.png")


def test_a_run_stopped_mid_group_and_resumed_ends_bitwise_equal(
    start, straight, straight_config, tmp_path
) -> None:
    from schooner.model import load_model, load_pytree

    # group 1's rollouts stay (a resume at 3 reads them); group 0's go once checkpoint 3 is complete (it is
    # written in the background: maybe not yet when group 2 was made)
    kept = set(os.listdir(f"{straight}/rollouts"))
    assert {"group-000001.npz", "group-000002.npz"} <= kept <= {f"group-00000{g}.npz" for g in range(3)}
    resumed = str(tmp_path / "resumed")
    shutil.copytree(straight, resumed)
    shutil.rmtree(f"{resumed}/step-000006")  # died after step 3's checkpoint: step 4 is mid group 1
    summary = train(straight_config(resumed))
    assert summary["start_step"] == 3
    a = {r["step"]: r["train/loss"] for r in read_metrics(straight) if "train/loss" in r}
    b = {r["step"]: r["train/loss"] for r in read_metrics(resumed) if "train/loss" in r}
    assert sorted(b) == list(range(1, 7)) and a == b
    ma, mb = load_model(f"{straight}/step-000006")[0], load_model(f"{resumed}/step-000006")[0]
    for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    sa, sb = (
        load_pytree(f"{straight}/step-000006/train_state"),
        load_pytree(f"{resumed}/step-000006/train_state"),
    )
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    # and the run moved: the weights are not the starting ones
    m0 = load_model(start)[0]
    assert any(
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(m0), jax.tree.leaves(ma), strict=True)
    )


def odd_answers_raise(prompt: str, completion: str, fields) -> float:
    """A reward that fails on every row with an odd answer (a module-level function, as a step needs)."""
    if fields["answer"] % 2:
        raise ZeroDivisionError(f"odd answer {fields['answer']}")
    return float(len(completion) % 2)


def test_a_reward_that_raises_is_counted_and_named_not_fatal(straight_config, metric_rows, tmp_path) -> None:
    out = str(tmp_path / "run")
    cfg = straight_config(out)  # the same compiled programs as the other runs
    summary = train(
        dataclasses.replace(
            cfg, num_train_steps=4, objective=dataclasses.replace(cfg.objective, reward=odd_answers_raise)
        )
    )
    assert summary["steps"] == 4 and np.isfinite(summary["final_loss"])
    rows = metric_rows(out)
    with open(f"{out}/reward_errors.jsonl") as f:
        errors = [json.loads(line) for line in f]
    for n in (1, 3):
        failed = rows[n]["rollout/reward_errors"]
        assert failed > 0 and failed % 4 == 0  # whole groups: the answer is the row's
        assert rows[n]["rollout/reward_errors/ZeroDivisionError"] == failed
        assert np.isfinite(rows[n]["train/loss"])
    assert np.isfinite(rows[4]["train/loss"])
    assert len(errors) == rows[1]["rollout/reward_errors"] + rows[3]["rollout/reward_errors"]
    assert errors[0]["type"] == "ZeroDivisionError" and errors[0]["message"].startswith("odd answer")
    assert errors[0]["row"].startswith("arith-train-")


def test_bad_prompt_files_name_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", "answer": 1}\n{"question": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2 has no 'prompt' field .*\['question'\]"):
        read_prompts(str(path))
    path.write_text('{"prompt": "hi"}\nnot json\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2 is not valid JSON"):
        read_prompts(str(path))
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        read_prompts(str(tmp_path))
    path.write_text('{"prompt": "hi", "answer": 1}\n\n{"prompt": [{"role": "user", "content": "yo"}]}\n')
    rows = read_prompts(str(path))
    assert [r.row_id for r in rows] == [f"{path}:1", f"{path}:3"] and rows[0].fields["answer"] == 1


def test_prompts_of_a_group_are_a_pure_function_of_seed_and_group() -> None:
    a = [prompt_indices(g, 5, 12, seed=1) for g in range(6)]
    assert all(np.array_equal(x, prompt_indices(g, 5, 12, seed=1)) for g, x in enumerate(a))
    flat = np.concatenate(a)  # 30 = 2.5 epochs: each epoch visits every row once
    assert sorted(flat[:12]) == sorted(flat[12:24]) == list(range(12))
    assert not np.array_equal(a[0], prompt_indices(0, 5, 12, seed=2))


def test_the_config_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="advantage must be one of"):
        Grpo(reward=odd_answers_raise, advantage="ppo")
    with pytest.raises(ValueError, match="max_completion_length=16"):
        Grpo(
            reward=odd_answers_raise,
            max_new_tokens=16,
            loss=PolicyLossConfig(aggregation="dr_grpo", max_completion_length=8),
        )
    with pytest.raises(TypeError, match="reward must be a callable"):
        Grpo(reward="exact_answer")
    # one sample per prompt: every group-relative advantage is 0, so the run would learn nothing
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        Grpo(reward=odd_answers_raise, num_generations=1)
    # the reward is named by module and qualified name: a resumed run's record compares equal
    assert str(Grpo(reward=odd_answers_raise).reward) == f"{__name__}:odd_answers_raise"


def test_the_rl_train_step_runs_and_its_key_follows_the_reward(
    data_dir, task, start, metric_rows, tmp_path
) -> None:
    from schooner.cluster import StepRunner, lower
    from schooner.eval.rewards import exact_answer
    from schooner.train.steps import rl_train

    def step(reward, name="rl/arith"):
        return rl_train(
            name,
            checkpoint=start,
            prompts=task,
            reward=reward,
            tokenizer=f"{data_dir}/tokenizer.json",
            num_train_steps=2,
            prompts_per_step=2,
            num_generations=4,
            max_prompt_tokens=CAP,
            max_new_tokens=NEW,
            num_iterations=2,
            loss=PolicyLossConfig(beta=0.04),
            optimizer=AdamConfig(learning_rate=3e-3, weight_decay=0.0, warmup=0, schedule="constant"),
            seed=3,
            resources=None,
        )

    key = lambda handle: lower(handle)[-1].key  # noqa: E731
    tuned = step(exact_answer())
    assert key(tuned) == key(step(exact_answer())) != key(step(odd_answers_raise))
    result = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([lower(tuned)])
    summary = result[tuned].result["summary"]
    assert summary["steps"] == 2 and summary["checkpoint"].endswith("step-000002")
    rows = metric_rows(result[tuned].output_path)
    assert np.isfinite(rows[1]["rollout/reward"]) and np.isfinite(rows[2]["train/loss"])


@pytest.mark.parametrize("aggregation", ["dapo", "grpo"])
def test_microbatch_weights_make_the_whole_batchs_loss_and_gradient(aggregation) -> None:
    """The trainer accumulates microbatches weighted by the loss's `token_count`: completion tokens for
    `dapo`, sequences for `grpo`. The weighted mean of two halves' losses and gradients equals the whole
    batch's (`dapo`: every token of the rollout batch weighs the same; `grpo`: every sequence)."""
    import equinox as eqx
    import jax.numpy as jnp

    from schooner.model import LlamaConfig, SamplingConfig, init
    from schooner.train._rl import make_grpo_loss
    from schooner.train._rl_rollout import rollout

    config = LlamaConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=48, num_layers=1, num_heads=4, num_kv_heads=2,
        max_seq_len=32, compute_dtype="float32", initializer_range=0.3,
    )  # fmt: skip
    model = init(config, key=jax.random.key(0))
    sampling = SamplingConfig(temperature=1.0, n=4, max_new_tokens=12, stop_ids=(3,))
    rb = rollout(model, [[5, 6, 7], [8, 9]], sampling, seed=0, step=0, max_prompt_tokens=8)
    assert len(set(rb.completion_lengths.tolist())) > 1  # rows of different lengths: the weights matter
    batch = {
        "tokens": jnp.asarray(rb.tokens),
        "mask": jnp.asarray(rb.mask),
        "old_logprobs": jnp.asarray(rb.old_logprobs),
        "advantages": jnp.linspace(-1.0, 1.0, rb.tokens.shape[0]),
    }
    loss = make_grpo_loss(
        Grpo(reward=odd_answers_raise, num_iterations=2, loss=PolicyLossConfig(aggregation=aggregation))
    )
    grad = eqx.filter_jit(eqx.filter_value_and_grad(lambda m, b: loss(m, b, None), has_aux=True))
    (whole, _), g_whole = grad(model, batch)
    halves = [{k: v[i * 4 : (i + 1) * 4] for k, v in batch.items()} for i in range(2)]
    parts = [grad(model, h) for h in halves]
    weights = [float(aux[0]["token_count"]) for (_, aux), _ in parts]  # what the trainer weighs by
    expected = [float(rb.mask[i * 4 : (i + 1) * 4].sum()) if aggregation == "dapo" else 4.0 for i in range(2)]
    assert weights == expected
    total = sum(weights)
    mixed = sum(w * float(v) for w, ((v, _), _) in zip(weights, parts, strict=True)) / total
    np.testing.assert_allclose(mixed, float(whole), rtol=1e-5, atol=1e-7)
    g_mixed = jax.tree.map(lambda a, b: (weights[0] * a + weights[1] * b) / total, parts[0][1], parts[1][1])
    for x, y in zip(jax.tree.leaves(g_mixed), jax.tree.leaves(g_whole), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
