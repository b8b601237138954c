"""Rollout workers (`Grpo(rollout_workers=N)`): a rollout group sampled in chunks by N cluster-layer workers
(local processes here, Ray in the `ray`-marked test) is bitwise the rollout the trainer samples itself with
the same `rollout_chunk`; the weights a worker samples with are the version the trainer published (a stale or
torn weights file is refused, naming both versions); a whole run with two workers ends with the weights of the
run without workers, bitwise."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest

from schooner.cluster import LocalClient, using_client
from schooner.cluster.pytest_fixtures import ray_client as ray_client
from schooner.model import LlamaConfig, SamplingConfig, init
from schooner.train import Grpo
from schooner.train._rl_workers import (
    ChunkJob,
    RolloutPool,
    StaleWeightsError,
    chunk_slices,
    load_weights,
    publish_weights,
    sample_chunk,
)

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

CONFIG = LlamaConfig(
    vocab_size=61, hidden_dim=32, intermediate_dim=48, num_layers=1, num_heads=4, num_kv_heads=2,
    max_seq_len=48, compute_dtype="float32", initializer_range=0.3,
)  # fmt: skip
SAMPLING = SamplingConfig(temperature=1.0, top_p=0.9, n=4, max_new_tokens=12, stop_ids=(3,))
PROMPTS = [
    [5, 6, 7],
    [8, 9],
    [10, 11, 12, 13, 14],
    [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28],
]


def _rewards(prompt, completion, fields) -> float:
    return float(len(completion) % 3)


@pytest.fixture(scope="module")
def two_workers():
    client = LocalClient(max_workers=2)
    yield client
    client.shutdown()


def test_chunks_split_the_prompts_in_order_whatever_the_worker_count() -> None:
    assert chunk_slices(5, None) == [slice(0, 5)]
    assert chunk_slices(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert chunk_slices(4, 8) == [slice(0, 4)]
    with pytest.raises(ValueError, match="rollout_chunk must be an int >= 1, got rollout_chunk=0"):
        Grpo(reward=_rewards, rollout_chunk=0)
    with pytest.raises(ValueError, match="rollout_workers must be an int >= 0, got rollout_workers=-1"):
        Grpo(reward=_rewards, rollout_workers=-1)


@pytest.mark.parametrize("sampling_round", [0, 2])  # 2: a round of dynamic sampling, its own key
def test_the_worker_job_samples_bitwise_what_the_trainer_samples(tmp_path, sampling_round) -> None:
    """The fast variant (no other process): each chunk's job, run here from the published weights file,
    gives the rows the trainer samples for that chunk with its live model."""
    model = init(CONFIG, key=jax.random.key(0))
    kw = dict(sampling=SAMPLING, seed=7, group=3, max_prompt_tokens=16, pad_id=0, chunk=2)
    pool = RolloutPool(workers=0, root=str(tmp_path), model_config=CONFIG)
    here = pool.rollout(model, PROMPTS, **kw, sampling_round=sampling_round)
    ref = publish_weights(model, str(tmp_path), version=3)
    rows = [
        sample_chunk(
            ChunkJob(
                weights=ref, model_config=CONFIG, prompts=PROMPTS[s], sampling=SAMPLING, seed=7, group=3,
                chunk=c, chunks=2, max_prompt_tokens=16, pad_id=0, sampling_round=sampling_round,
            )
        )
        for c, s in enumerate(chunk_slices(len(PROMPTS), 2))
    ]  # fmt: skip
    assert [r["version"] for r in rows] == [3, 3]
    for f in ("tokens", "mask", "old_logprobs", "completion_lengths"):
        np.testing.assert_array_equal(np.concatenate([r[f] for r in rows]), getattr(here, f), err_msg=f)
    assert len(set(here.completion_lengths.tolist())) > 1  # rows that stopped and rows that ran to the cap
    other = pool.rollout(model, PROMPTS, **kw, sampling_round=1 - min(sampling_round, 1))
    assert not np.array_equal(other.tokens, here.tokens)  # another round draws other completions


@pytest.mark.slow  # two fresh worker processes import jax and compile the sampler: ~50 s of CPU
def test_two_local_workers_sample_bitwise_what_the_trainer_samples(tmp_path, two_workers) -> None:
    model = init(CONFIG, key=jax.random.key(0))
    kw = dict(sampling=SAMPLING, seed=7, group=3, max_prompt_tokens=16, pad_id=0, chunk=2)
    here = RolloutPool(workers=0, root=str(tmp_path / "a"), model_config=CONFIG).rollout(model, PROMPTS, **kw)
    with using_client(two_workers):
        pool = RolloutPool(workers=2, root=str(tmp_path / "b"), model_config=CONFIG)
        there = pool.rollout(model, PROMPTS, **kw)
        assert pool.last_versions == [3, 3]  # every chunk sampled with the weights of group 3
        assert len(set(pool.last_pids)) == 2 and os.getpid() not in pool.last_pids  # two other processes
    for f in ("tokens", "mask", "old_logprobs", "prompt_lengths", "completion_lengths"):
        np.testing.assert_array_equal(getattr(here, f), getattr(there, f), err_msg=f)
    assert here.stop_reasons == there.stop_reasons and here.tokens.shape[0] == len(PROMPTS) * 4
    assert len(set(here.completion_lengths.tolist())) > 1  # rows that stopped and rows that ran to the cap
    # one chunk (rollout_chunk None) is the single call `rollout` makes, key `fold_in(key(seed), group)`
    from schooner.train._rl_rollout import rollout

    whole = RolloutPool(workers=0, root=str(tmp_path / "c"), model_config=CONFIG).rollout(
        model, PROMPTS, **(kw | {"chunk": None})
    )
    single = rollout(model, PROMPTS, SAMPLING, seed=7, step=3, max_prompt_tokens=16)
    np.testing.assert_array_equal(whole.tokens, single.tokens)
    np.testing.assert_array_equal(whole.old_logprobs, single.old_logprobs)


def test_a_worker_refuses_weights_of_another_version(tmp_path) -> None:
    a = init(CONFIG, key=jax.random.key(0))
    b = init(CONFIG, key=jax.random.key(1))
    ref_a = publish_weights(a, str(tmp_path), version=4)
    loaded = load_weights(ref_a, CONFIG)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ref_b = publish_weights(b, str(tmp_path), version=4)  # the same version written again with other weights
    with pytest.raises(
        StaleWeightsError, match=r"\(version 4\) has digest \w+, not the \w+ the trainer published"
    ):
        load_weights(ref_a, CONFIG)
    job = ChunkJob(
        weights=dataclasses.replace(ref_b, version=5), model_config=CONFIG, prompts=[[5, 6]], sampling=SAMPLING,
        seed=0, group=5, chunk=0, chunks=1, max_prompt_tokens=8, pad_id=0,
    )  # fmt: skip
    with pytest.raises(StaleWeightsError, match=r"asked for version 5 .* holds version 4"):
        sample_chunk(job)


def _equal_runs(a: str, b: str) -> None:
    from schooner.model import load_model
    from schooner.train import read_metrics

    def losses(run):
        return {
            r["step"]: (r["train/loss"], r.get("rollout/reward"))
            for r in read_metrics(run)
            if "train/loss" in r
        }

    assert losses(a) == losses(b) and len(losses(a)) == 3
    ma, mb = load_model(f"{a}/step-000003")[0], load_model(f"{b}/step-000003")[0]
    for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def run(data_dir, task, start, grpo_config):
    """A function (out, workers): 3 steps of GRPO on the arithmetic task (2 prompts x 4 samples a step, one
    prompt a chunk)."""
    from schooner.eval.rewards import exact_answer
    from schooner.train import CheckpointConfig, train

    def go(out: str, workers: int) -> None:
        grpo = Grpo(
            reward=exact_answer(),
            num_generations=4,
            max_new_tokens=16,
            rollout_chunk=1,
            rollout_workers=workers,
        )
        train(grpo_config(data_dir, task, start, out, grpo, steps=3, checkpoint=CheckpointConfig(every=3)))

    return go


@pytest.mark.slow  # three trainer compilations and two worker processes: ~60 s on a loaded 2-core machine
def test_a_run_with_two_local_workers_ends_with_the_weights_of_a_run_without(
    run, tmp_path, two_workers
) -> None:
    run(str(tmp_path / "none"), 0)
    with using_client(two_workers):
        run(str(tmp_path / "two"), 2)
    _equal_runs(str(tmp_path / "none"), str(tmp_path / "two"))
    assert not os.listdir(
        tmp_path / "two" / "rollout-weights"
    )  # each version removed once its chunks came back


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_a_run_with_two_ray_workers_ends_with_the_weights_of_a_run_without(run, tmp_path, ray_client) -> None:
    run(str(tmp_path / "none"), 0)
    with using_client(ray_client):
        run(str(tmp_path / "ray"), 2)
    _equal_runs(str(tmp_path / "none"), str(tmp_path / "ray"))


def test_a_run_may_resume_with_another_number_of_workers() -> None:
    """Only where the rollouts are sampled changes: `run.json`'s comparison lets it through, not the chunk."""
    from schooner.train._resume_checks import _differences

    old = {"rollout_workers": 0, "rollout_chunk": 1, "num_generations": 4}
    assert _differences(old, old | {"rollout_workers": 2}, "objective") == []
    assert _differences(old, old | {"rollout_chunk": 2}, "objective") == ["objective.rollout_chunk: 1 -> 2"]


def test_the_number_of_workers_is_not_part_of_the_steps_key(data_dir, task, start) -> None:
    from schooner.cluster import lower
    from schooner.eval.rewards import exact_answer
    from schooner.train.steps import rl_train

    def key(**kw) -> str:
        handle = rl_train(
            "rl/w", checkpoint=start, prompts=task, reward=exact_answer(), tokenizer=f"{data_dir}/tokenizer.json",
            num_train_steps=2, max_prompt_tokens=112, max_new_tokens=16, resources=None, **kw,
        )  # fmt: skip
        return lower(handle)[-1].key

    assert key(rollout_chunk=1) == key(rollout_chunk=1, rollout_workers=2) != key(rollout_chunk=2)
