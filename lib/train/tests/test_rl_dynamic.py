"""Dynamic sampling (`Grpo(dynamic_sampling=True)`, DAPO): the group filter and the refill from later rounds
equal a numpy reference written from the documented rule, on real rollouts of a tiny model; round 0 is the
batch plain GRPO makes; a shortfall is counted and logged, never silent; the option left at its default keeps
the step's key; a run stopped and resumed (at a group boundary, where the extra rounds are sampled again, and
mid group) ends bitwise equal to the uninterrupted run. The kill -9 variant is in `test_rl_run.py`."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import jax
import numpy as np
import pytest

from schooner.train import CheckpointConfig, Grpo, read_metrics, train
from schooner.train._rl_batches import PromptRow, RolloutBatches, encode_prompts, score
from schooner.train._rl_sampling import has_signal, round_prompt_indices, select_groups
from schooner.train._rl_workers import RolloutPool

pytest.importorskip("schooner.eval")

CAP, NEW, G = 112, 12, 4


def char_sum_reward(prompt: str, completion: str, fields) -> float:
    """1 for about one completion in seven (by the sum of its characters): groups with and without signal."""
    return float(sum(map(ord, completion)) % 7 == 0)


def constant_reward(prompt: str, completion: str, fields) -> float:
    return 0.5


# -- the rule, by numpy -------------------------------------------------------------------------------------
def reference_signal(rewards: np.ndarray) -> np.ndarray:
    """A group has signal when at least two of its rewards are finite and they are not all the same."""
    out = []
    for row in rewards:
        finite = row[np.isfinite(row)]
        out.append(len(finite) >= 2 and len(np.unique(finite)) > 1)
    return np.array(out, bool)


def reference_selection(signal: np.ndarray, per_batch: int) -> tuple[list[int], int]:
    """Walk the groups in sampling order: take those with signal until the batch is full; then, if it is not,
    the first ones without."""
    chosen = [i for i in range(len(signal)) if signal[i]][:per_batch]
    kept = len(chosen)
    for i in range(len(signal)):
        if len(chosen) == per_batch:
            break
        if not signal[i]:
            chosen.append(i)
    return sorted(chosen), kept


def test_the_filter_and_the_choice_equal_the_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        rounds = int(rng.integers(1, 4))
        per_batch, g = int(rng.integers(1, 6)), int(rng.integers(2, 5))
        parts = []
        for _ in range(rounds):
            r = rng.integers(0, 3, size=(per_batch, g)).astype(np.float64) / 2
            r[rng.random(r.shape) < 0.2] = np.nan  # failed rewards
            r[rng.random(per_batch) < 0.3] = 1.0  # whole groups alike
            parts.append(r)
        signal = [has_signal(p) for p in parts]
        for p, s in zip(parts, signal, strict=True):
            np.testing.assert_array_equal(s, reference_signal(p), err_msg=f"trial {trial}: {p}")
        chosen, kept = select_groups(signal, per_batch)
        want, want_kept = reference_selection(np.concatenate(signal), per_batch)
        assert (chosen.tolist(), kept) == (want, want_kept), trial
    assert has_signal(np.array([[np.nan, np.nan], [1.0, np.nan], [0.0, 1.0], [2.0, 2.0]])).tolist() == [
        False,
        False,
        True,
        False,
    ]
    # every round and chunk draws from its own key; round 0's are the keys without dynamic sampling
    from schooner.train._rl_rollout import rollout_key
    from schooner.train._rl_workers import chunk_key

    keys = [jax.random.key_data(chunk_key(3, 1, c, 2, r)).tolist() for r in range(3) for c in range(2)]
    assert len({str(k) for k in keys}) == 6
    assert (
        jax.random.key_data(chunk_key(3, 1, 0, 1, 0)).tolist()
        == jax.random.key_data(rollout_key(3, 1)).tolist()
    )
    with pytest.raises(ValueError, match="2 groups sampled, fewer than the batch's 3"):
        select_groups([np.array([True, False])], 3)


# -- on real rollouts ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parts(data_dir, task):
    """The tokenizer, the task's rows that fit the cap and their prompt ids, the sampling config."""
    from schooner.tokenize import load_tokenizer
    from schooner.train._rl_batches import read_prompts

    tok = load_tokenizer(f"{data_dir}/tokenizer.json")
    rows = read_prompts(task)
    ids, stops = encode_prompts(tok, [r.prompt for r in rows], chat=True)
    keep = [i for i, p in enumerate(ids) if len(p) <= CAP]
    grpo = Grpo(reward=char_sum_reward, num_generations=G, max_new_tokens=NEW)
    return tok, [rows[i] for i in keep], [ids[i] for i in keep], grpo.sampling(stops)


def _batches(cfg: Grpo, parts, root: str) -> RolloutBatches:
    tok, rows, ids, sampling = parts
    return RolloutBatches(
        cfg, rows=rows, prompts=ids, tokenizer=tok, sampling=sampling, seed=3, max_prompt_tokens=CAP,
        pad_id=0, root=root,
    )  # fmt: skip


def _reference_round(model, parts, reward, group: int, r: int, rounds: int, per: int):
    """One round sampled and scored by hand: the pool's rollout and `score`, the prompts of the round."""
    tok, rows, ids, sampling = parts
    idx = round_prompt_indices(group, r, per, len(rows), 3, rounds)
    picked: list[PromptRow] = [rows[i] for i in idx]
    rb = RolloutPool(0, "", None).rollout(
        model, [ids[i] for i in idx], sampling=sampling, seed=3, group=group, max_prompt_tokens=CAP, pad_id=0,
        chunk=None, sampling_round=r,
    )  # fmt: skip
    texts = []
    for c, why in zip(rb.completions(), rb.stop_reasons, strict=True):
        texts.append(tok.decode(c[:-1] if why == "stop_id" and c[-1] in sampling.stop_ids else c))
    rewards, _ = score(
        reward, [p.prompt for p in picked for _ in range(G)], texts, [p.fields for p in picked for _ in range(G)],
        [str(i) for i in range(len(texts))],
    )  # fmt: skip
    return rb, rewards.reshape(-1, G)


def _grpo_numpy(r: np.ndarray) -> np.ndarray:
    """GRPO's advantages by the documented formula: (r - mean) / (Bessel std + 1e-4) per group."""
    return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)


def test_a_batch_is_the_first_groups_with_signal_over_the_rounds_as_numpy_chooses(parts, start, tmp_path):
    from schooner.model import load_model

    model = load_model(start)[0]
    per, rounds, group = 4, 3, 1
    dynamic = Grpo(
        reward=char_sum_reward, num_generations=G, max_new_tokens=NEW, dynamic_sampling=True,
        max_sampling_rounds=rounds,
    )  # fmt: skip
    batch, m = _batches(dynamic, parts, str(tmp_path / "d")).make(group, per * G, model)

    refs = [_reference_round(model, parts, char_sum_reward, group, r, rounds, per) for r in range(rounds)]
    signal = [reference_signal(rw) for _, rw in refs]
    used = next((k + 1 for k in range(rounds) if sum(s.sum() for s in signal[: k + 1]) >= per), rounds)
    assert used >= 2, "the test needs a batch that round 0 cannot fill: change the seed or the reward"
    chosen, kept = reference_selection(np.concatenate(signal[:used]), per)
    tokens = np.concatenate([rb.tokens for rb, _ in refs[:used]])
    rewards = np.concatenate([rw for _, rw in refs[:used]])
    rows = [j * G + k for j in chosen for k in range(G)]
    np.testing.assert_array_equal(batch["tokens"], tokens[rows])
    np.testing.assert_allclose(batch["advantages"], _grpo_numpy(rewards[chosen]).reshape(-1), atol=1e-6)
    assert m["rollout/dynamic/rounds"] == used and m["rollout/dynamic/sampled_groups"] == used * per
    assert m["rollout/dynamic/kept_groups"] == kept and m["rollout/dynamic/shortfall"] == per - kept
    assert m["rollout/frac_reward_zero_std"] == pytest.approx(1 - kept / per)
    assert m["rollout/dynamic/first_round/frac_reward_zero_std"] == pytest.approx(1 - signal[0].mean())
    assert m["rollout/dynamic/sampled/reward"] == pytest.approx(rewards.mean())
    # each round its own prompts and draws; round 0 is the batch plain GRPO makes
    assert not np.array_equal(refs[0][0].tokens, refs[1][0].tokens)
    plain = dataclasses.replace(dynamic, dynamic_sampling=False, max_sampling_rounds=3)
    plain_batch, plain_m = _batches(plain, parts, str(tmp_path / "p")).make(group, per * G, model)
    np.testing.assert_array_equal(plain_batch["tokens"], refs[0][0].tokens)
    assert not any(k.startswith("rollout/dynamic/") for k in plain_m)
    again, _ = _batches(dynamic, parts, str(tmp_path / "d2")).make(group, per * G, model)
    for k in batch:  # same seed, same batch
        np.testing.assert_array_equal(batch[k], again[k])


def test_a_shortfall_is_counted_logged_and_filled_with_groups_without_signal(parts, start, tmp_path, caplog):
    from schooner.model import load_model

    model = load_model(start)[0]
    cfg = Grpo(
        reward=constant_reward, num_generations=G, max_new_tokens=NEW, dynamic_sampling=True,
        max_sampling_rounds=2,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        batch, m = _batches(cfg, parts, str(tmp_path)).make(0, 3 * G, model)
    assert m["rollout/dynamic/rounds"] == 2 and m["rollout/dynamic/kept_groups"] == 0
    assert m["rollout/dynamic/shortfall"] == 3 and m["rollout/frac_reward_zero_std"] == 1.0
    assert not batch["advantages"].any() and batch["tokens"].shape[0] == 3 * G  # round 0's groups, in order
    rb, _ = _reference_round(model, parts, constant_reward, 0, 0, 2, 3)
    np.testing.assert_array_equal(batch["tokens"], rb.tokens)
    assert "dynamic sampling found 0 of 3 prompt groups with reward signal in 2 round(s)" in caplog.text
    assert "raise max_sampling_rounds or num_generations" in caplog.text


def test_the_option_left_at_its_default_keeps_the_steps_key_and_bad_settings_are_named(data_dir, task, start):
    from schooner.cluster import lower
    from schooner.eval.rewards import exact_answer
    from schooner.train import AdamConfig
    from schooner.train.steps import rl_train

    def canonical_objective(handle) -> dict:
        return handle.canonical_config["objective"]

    def key(**options) -> str:
        handle = rl_train(
            "rl/arith", checkpoint=start, prompts=task, reward=exact_answer(), tokenizer=f"{data_dir}/tokenizer.json",
            num_train_steps=2, prompts_per_step=2, num_generations=4, max_prompt_tokens=CAP, max_new_tokens=16,
            optimizer=AdamConfig(learning_rate=3e-3, weight_decay=0.0, warmup=0, schedule="constant"),
            resources=None, **options,
        )  # fmt: skip
        return lower(handle)[-1].key

    default = key()
    # the objective's canonical form (its part of the key) has no trace of the option while it is off
    handle = rl_train(
        "rl/arith", checkpoint=start, prompts=task, reward=exact_answer(), tokenizer=f"{data_dir}/tokenizer.json",
        num_train_steps=2, max_prompt_tokens=CAP, max_new_tokens=16, resources=None,
    )  # fmt: skip
    objective = canonical_objective(handle)
    assert objective["__class__"] == "Grpo" and "num_generations" in objective
    assert not {"dynamic_sampling", "max_sampling_rounds"} & set(objective)
    assert key(dynamic_sampling=False, max_sampling_rounds=3) == default
    on = key(dynamic_sampling=True)
    assert on != default and key(dynamic_sampling=True, max_sampling_rounds=4) not in (on, default)
    with pytest.raises(ValueError, match="max_sampling_rounds=5 applies only with dynamic sampling"):
        Grpo(reward=exact_answer(), max_sampling_rounds=5)
    with pytest.raises(
        ValueError, match="max_sampling_rounds must be an int >= 1, got max_sampling_rounds=0"
    ):
        Grpo(reward=exact_answer(), dynamic_sampling=True, max_sampling_rounds=0)
    with pytest.raises(ValueError, match="dynamic_sampling must be True or False, got 1"):
        Grpo(reward=exact_answer(), dynamic_sampling=1)
    # one round samples nothing beyond the batch plain GRPO makes: a new key for the same batch (a review)
    with pytest.raises(ValueError, match="max_sampling_rounds=1 samples no round beyond the first"):
        Grpo(reward=exact_answer(), dynamic_sampling=True, max_sampling_rounds=1)


# -- resume -------------------------------------------------------------------------------------------------
@pytest.mark.slow  # two RL runs of 6 steps (two compilations): ~40 s on the loaded 2-core machine
def test_a_dynamic_sampling_run_stopped_and_resumed_ends_bitwise_equal(
    data_dir, task, start, grpo_config, tmp_path
) -> None:
    from schooner.model import load_model, load_pytree

    def config(out: str):
        grpo = Grpo(
            reward=char_sum_reward, num_generations=G, max_new_tokens=NEW, num_iterations=2,
            dynamic_sampling=True, max_sampling_rounds=3,
        )  # fmt: skip
        return grpo_config(
            data_dir, task, start, out, grpo, steps=6, seq_len=CAP + NEW,
            checkpoint=CheckpointConfig(every=1, keep_last=10),
        )  # fmt: skip

    straight = str(tmp_path / "straight")
    train(config(straight))
    rows = {r["step"]: r for r in read_metrics(straight) if "rollout/dynamic/rounds" in r}
    assert sorted(rows) == [1, 3, 5] and max(r["rollout/dynamic/rounds"] for r in rows.values()) >= 2
    # a rerun after a kill resumes from the last checkpoint: at a group's start its rounds are sampled again
    # (prompts and RNG from (seed, group, round)); mid group the stored rollouts are read back
    for start_at, why in (
        (2, "a group boundary: its rounds sampled again"),
        (5, "mid group: stored rollouts"),
    ):
        resumed = str(tmp_path / f"resumed-{start_at}")
        shutil.copytree(straight, resumed)
        for s in range(start_at + 1, 7):
            shutil.rmtree(f"{resumed}/step-{s:06d}")
        summary = train(config(resumed))
        assert summary["start_step"] == start_at, why
        a = {r["step"]: r["train/loss"] for r in read_metrics(straight) if "train/loss" in r}
        b = {r["step"]: r["train/loss"] for r in read_metrics(resumed) if "train/loss" in r}
        assert sorted(b) == list(range(1, 7)) and a == b, why
        ma, mb = load_model(f"{straight}/step-000006")[0], load_model(f"{resumed}/step-000006")[0]
        for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=why)
        sa = load_pytree(f"{straight}/step-000006/train_state")
        sb = load_pytree(f"{resumed}/step-000006/train_state")
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=f"{k}: {why}")
