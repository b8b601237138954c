"""Configuration errors are raised before anything is built or compiled, naming the value and the fix."""

from __future__ import annotations

import os

import pytest

from schooner.train import (
    AdamConfig,
    BatchSchedule,
    CheckpointConfig,
    MeshConfig,
    TrainerConfig,
    check_run,
    train,
)


def cfg(nano, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets={"/nonexistent/train": 1.0},
        seq_len=32,
        output_path="/tmp/x",
        batch_size=8,
        num_train_steps=10,
        optimizer=AdamConfig(warmup=2),
    )
    args.update(kw)
    return TrainerConfig(**args)


def test_batch_not_divisible_by_data_parallel_size(nano) -> None:
    with pytest.raises(ValueError, match=r"batch size 6 is not divisible by the data-parallel size 8"):
        check_run(cfg(nano, batch_size=6), num_devices=8)
    with pytest.raises(ValueError, match=r"data-parallel size 4 x microbatches 2"):
        check_run(cfg(nano, batch_size=12, microbatches=2, mesh=MeshConfig(data=4, tensor=2)), num_devices=8)
    check_run(cfg(nano, batch_size=8, mesh=MeshConfig(data=2, tensor=4)), num_devices=8)  # 8 % 2 == 0


def test_a_tensor_axis_that_does_not_divide_the_heads_is_refused(nano, caplog) -> None:
    # tensor=3 with 8 heads used to run with attention replicated on every tensor device, only the MLP split
    model = nano(num_heads=8, num_kv_heads=8, intermediate_dim=192)  # 192 = 3 x 64: the MLP would split
    with pytest.raises(
        ValueError, match=r"MeshConfig\.tensor=3 does not divide the model's num_heads=8"
    ) as e:
        check_run(cfg(nano, model=model, batch_size=2, mesh=MeshConfig(data=-1, tensor=3)), num_devices=6)
    assert "tensor in (1, 2)" in str(e.value)  # the sizes that divide the heads and the 6 devices
    with pytest.raises(ValueError, match=r"does not divide the model's intermediate_dim=128"):
        wide = nano(hidden_dim=96, num_heads=6, num_kv_heads=6)  # heads split 3 ways, the MLP (128) not
        check_run(cfg(nano, model=wide, batch_size=4, mesh=MeshConfig(data=-1, tensor=3)), num_devices=6)
    # heads that divide, a vocabulary that does not: allowed, and said (the embedding and head replicate)
    with caplog.at_level("WARNING", logger="schooner.train"):
        check_run(cfg(nano, model=nano(vocab_size=321), batch_size=4, mesh=MeshConfig(data=2, tensor=4)),
                  num_devices=8)  # fmt: skip
    assert "vocab_size=321 is not divisible by MeshConfig.tensor=4" in caplog.text


def test_sequence_longer_than_the_model(nano) -> None:
    with pytest.raises(ValueError, match=r"seq_len=256 is beyond the model's max_seq_len=128"):
        cfg(nano, datasets={"c": 1.0}, seq_len=256)


def test_vocab_smaller_than_the_caches_tokenizer(nano) -> None:
    with pytest.raises(
        ValueError, match=r"vocab_size=320 is smaller than the tokenizer of cache 'c' \(1000 ids\)"
    ):
        check_run(cfg(nano), num_devices=1, cache_vocab_sizes={"c": 1000})


def test_schedule_longer_than_the_run(nano) -> None:
    with pytest.raises(
        ValueError, match=r"warmup=50 means 50 steps, longer than the run \(num_train_steps=10\)"
    ):
        cfg(nano, optimizer=AdamConfig(warmup=50))
    with pytest.raises(ValueError, match=r"longer than the run"):
        cfg(nano, optimizer=AdamConfig(warmup=5, decay=6, schedule="wsd"))


def test_steps_or_tokens(nano) -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        cfg(nano, num_train_steps=None)
    with pytest.raises(ValueError, match="exactly one of"):
        cfg(nano, train_tokens=100)
    c = cfg(nano, num_train_steps=None, train_tokens=1000)
    assert c.steps == 4  # ceil(1000 / (8 * 32))
    with pytest.raises(ValueError, match="constant batch_size"):
        cfg(nano, num_train_steps=None, train_tokens=1000, batch_size=BatchSchedule(((0, 8), (5, 16))))


def test_other_field_errors(nano) -> None:
    with pytest.raises(ValueError, match="not divisible by microbatches=3"):
        cfg(nano, microbatches=3)
    with pytest.raises(ValueError, match="compute_dtype"):
        cfg(nano, compute_dtype="fp8")
    with pytest.raises(ValueError, match="must start at step 0"):
        BatchSchedule(((5, 8),))
    with pytest.raises(ValueError, match="must increase"):
        BatchSchedule(((0, 8), (10, 16), (10, 32)))
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="needs 4 devices but 8"):
        MeshConfig(data=2, tensor=2).shape(8)
    with pytest.raises(ValueError, match="unknown mesh axis"):
        MeshConfig(param_mapping={"embed": "model"})
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointConfig(keep_last=0)
    with pytest.raises(ValueError, match="weight must be a finite number"):
        cfg(nano, datasets={"c": float("nan")})
    assert cfg(nano, batch_size=[(0, 8), (4, 16)]).batch_size_at(5) == 16


def test_train_fails_before_compiling(nano, data_dir, tmp_path) -> None:
    out = tmp_path / "run"
    bad = cfg(nano, datasets={f"{data_dir}/train": 1.0}, seq_len=32, batch_size=6, output_path=str(out))
    with pytest.raises(ValueError, match="not divisible by the data-parallel size 8"):
        train(bad)
    assert not [p for p in os.listdir(out) if p.startswith("step-")]
    small_vocab = cfg(
        nano,
        model=nano(vocab_size=100),
        fit_vocab=False,
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        output_path=str(out),
    )
    with pytest.raises(ValueError, match="vocab_size=100 is smaller than the tokenizer"):
        train(small_vocab)


def test_bool_fields_take_only_bools_and_counts_no_bools(nano) -> None:
    """The string "false" is truthy: fit_vocab="false" would grow the model's vocabulary, asynchronous="false"
    write on a thread; every=True would checkpoint every step (True == 1)."""
    with pytest.raises(ValueError, match=r"TrainerConfig\.fit_vocab must be True or False, got 'false'"):
        cfg(nano, fit_vocab="false")
    with pytest.raises(
        ValueError, match=r"CheckpointConfig\.asynchronous must be True or False, got 'false'"
    ):
        CheckpointConfig(asynchronous="false")
    with pytest.raises(ValueError, match=r"CheckpointConfig\.save_final must be True or False, got 0"):
        CheckpointConfig(save_final=0)
    with pytest.raises(ValueError, match="every must be a positive int or None, got every=True"):
        CheckpointConfig(every=True)
    with pytest.raises(ValueError, match="keep_last must be an int >= 1"):
        CheckpointConfig(keep_last=True)
    with pytest.raises(ValueError, match="keep_every must be a positive int or None"):
        CheckpointConfig(keep_every=True)


def test_a_seed_jax_cannot_tell_apart_is_refused(nano) -> None:
    """JAX's keys hold 32 bits of a seed: seed 2**32 gave seed 0's initialisation and rollouts (and -1 those of
    2**32 - 1) under a new step key, while numpy's data order took the whole seed. Refused, naming the range."""
    import jax
    import numpy as np

    # what made it a defect: the two seeds' keys are the same
    assert np.array_equal(jax.random.key_data(jax.random.key(2**32)), jax.random.key_data(jax.random.key(0)))
    for seed in (2**32, 99_999_999_999, -1):
        with pytest.raises(
            ValueError, match=rf"TrainerConfig.seed must be an int in \[0, 2\*\*32\), got {seed}"
        ):
            cfg(nano, seed=seed)
    for seed in ("1", 1.0, True):
        with pytest.raises(ValueError, match="TrainerConfig.seed must be an int"):
            cfg(nano, seed=seed)
    assert cfg(nano, seed=2**32 - 1).seed == 2**32 - 1 and cfg(nano, seed=np.int64(3)).seed == 3
