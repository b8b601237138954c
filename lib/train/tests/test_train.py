"""End-to-end training: the train_lm step, checkpoints loadable without schooner.train, evaluation,
NaN stops, and the same losses on 1 device, FSDP over 8 and tensor parallel."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    MeshConfig,
    NonFiniteLossError,
    TrackerConfig,
    TrainerConfig,
    latest_checkpoint,
    read_metrics,
    train,
)
from schooner.train._checkpoint import read_marker


def test_train_lm_step_end_to_end(nano, data_dir, tmp_path, read_losses) -> None:
    from schooner.cluster import StepRunner, lower
    from schooner.train.steps import train_lm

    handle = train_lm(
        "runs/nano",
        model=nano(vocab_size=64),  # smaller than the tokenizer's 320: fitted by the step
        optimizer=AdamConfig(learning_rate=3e-3, warmup=2, weight_decay=0.1),
        datasets={data_dir: 1.0},  # a tokenized folder: train/, validation/, tokenizer.json
        batch_size=8,
        seq_len=32,
        num_train_steps=12,
        eval_every=6,
        eval_max_tokens=700,
        evals={"extra": f"{data_dir}/validation"},
        checkpoint_every=4,
        keep_checkpoints=2,
        resources=None,  # in this process (the cluster path is the step runner's, tested there)
    )
    result = StepRunner(prefix=str(tmp_path / "prefix")).run([lower(handle)])
    (outcome,) = result.steps
    assert outcome.state == "succeeded", outcome.error
    out = outcome.output_path
    assert sorted(p for p in os.listdir(out) if p.startswith("step-")) == ["step-000008", "step-000012"]
    losses = read_losses(out)
    assert sorted(losses) == list(range(1, 13))
    assert all(np.isfinite(v) for v in losses.values()) and losses[12] < losses[1] - 0.3
    rows = read_metrics(f"{out}/metrics.jsonl")
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [6, 12]
    name = os.path.basename(data_dir)
    final = evals[-1]
    assert {f"eval/{name}/loss", f"eval/{name}/bpb", "eval/extra/loss", "eval/extra/bpb", "eval/bpb"} <= set(
        final
    )
    assert final[f"eval/{name}/loss"] == final["eval/extra/loss"]  # the same cache twice
    with open(f"{out}/loss.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"
    with open(f"{out}/run.json") as f:
        assert "jax" in json.load(f)["versions"]
    with open(f"{out}/step-000012/config.json") as f:
        assert json.load(f)["vocab_size"] == 320

    # The checkpoint loads with schooner.model alone.
    probe = (
        "import sys; from schooner.model import load_model; m, c = load_model(sys.argv[1]); "
        "assert not any(k.startswith('schooner.train') for k in sys.modules), 'schooner.train was imported'; "
        "print(c.vocab_size)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, f"{out}/step-000012"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "320"

    from schooner.tokenize import TokenCache, load_tokenizer

    cache = TokenCache.open(f"{data_dir}/validation")
    assert read_marker(f"{out}/step-000012")["tokenizer_fingerprint"] == cache.tokenizer_fingerprint
    tok = load_tokenizer(data_dir)  # and the special ids its documents end with (evaluation compares them)
    assert read_marker(f"{out}/step-000012")["tokenizer_special_ids"] == {
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
    }
    # The logged eval numbers, from the loaded checkpoint by hand: plain logits, float64 log-softmax, windows
    # of 32 tokens every 31 over the cache's first 700 tokens, targets within a document.
    from schooner.model import load_model

    model, _ = load_model(f"{out}/step-000012")
    want_loss, want_bpb = _by_hand(model, cache, load_tokenizer(data_dir), seq_len=32, max_tokens=700)
    assert final["eval/extra/loss"] == pytest.approx(want_loss, rel=1e-5)
    assert final["eval/extra/bpb"] == pytest.approx(want_bpb, rel=1e-5)


def _by_hand(model, cache, tokenizer, *, seq_len: int, max_tokens: int) -> tuple[float, float]:
    tokens = np.asarray(cache.tokens(0, max_tokens))
    docs = np.searchsorted(np.asarray(cache.offsets()), np.arange(len(tokens)), side="right")
    byte_lengths = tokenizer.token_byte_lengths()
    nats, count, nbytes = 0.0, 0, 0
    for start in range(0, len(tokens) - 1, seq_len - 1):
        window, wdocs = tokens[start : start + seq_len], docs[start : start + seq_len]
        logits = np.asarray(model(window[None].astype(np.int32), segment_ids=wdocs[None].astype(np.int32)))
        logp = logits[0].astype(np.float64)
        logp = logp - logp.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        for t in range(len(window) - 1):
            if wdocs[t] == wdocs[t + 1]:
                nats -= logp[t, window[t + 1]]
                count += 1
                nbytes += int(byte_lengths[window[t + 1]])
    return nats / count, nats / np.log(2) / nbytes


def _run_config(nano, data_dir: str, out: str, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        validation={},
        output_path=out,
        batch_size=8,
        num_train_steps=3,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        checkpoint=CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False),
    )
    args.update(kw)
    return TrainerConfig(**args)


def test_tokens_held_in_memory_give_the_same_run(nano, data_dir, tmp_path, read_losses, caplog) -> None:
    disk, memory = str(tmp_path / "disk"), str(tmp_path / "memory")
    train(_run_config(nano, data_dir, disk))
    with caplog.at_level(logging.INFO, logger="schooner.train"):
        train(_run_config(nano, data_dir, memory, data_in_memory_bytes=2**30))
    held = [r.getMessage() for r in caplog.records if "held in memory" in r.getMessage()]
    assert held and not held[0].startswith("training tokens held in memory: 0.0 MiB"), held
    assert read_losses(memory) == read_losses(disk)
    assert len(read_losses(disk)) == 3
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="schooner.train"):  # a budget too small says what did not fit
        from schooner.train import LanguageModeling

        LanguageModeling().setup(_run_config(nano, data_dir, "unused", data_in_memory_bytes=1000), "unused")
    (small,) = [r.getMessage() for r in caplog.records if "held in memory" in r.getMessage()]
    assert small.startswith("training tokens held in memory: 0.0 MiB of data_in_memory_bytes=1000; not held")
    assert f"{data_dir}/train needs" in small


def test_data_in_memory_bytes_is_runtime_only_and_checked(nano, data_dir) -> None:
    from schooner.train.steps import train_lm

    def step(**kw):
        return train_lm("t", model=nano(), datasets={f"{data_dir}/train": 1.0}, batch_size=8, seq_len=32,
                        num_train_steps=3, **kw)  # fmt: skip

    assert step(data_in_memory_bytes=2**30).key == step().key
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="data_in_memory_bytes must be an int >= 0"):
            _run_config(nano, data_dir, "unused", data_in_memory_bytes=bad)


@pytest.mark.slow
def test_fsdp_and_tensor_parallel_match_one_device(nano, data_dir, tmp_path, read_losses) -> None:
    assert len(jax.devices()) == 8
    runs = {
        "single": MeshConfig(devices=1),
        "fsdp8_microbatch2": MeshConfig(data=1, fsdp=8),
        "data2_tensor4": MeshConfig(data=2, tensor=4),
    }
    losses = {}
    for name, mesh in runs.items():
        out = str(tmp_path / name)
        mb = 2 if "microbatch" in name else 1
        train(_run_config(nano, data_dir, out, mesh=mesh, microbatches=mb, batch_size=16))
        losses[name] = read_losses(out)
    ref = losses.pop("single")
    assert sorted(ref) == [1, 2, 3] and len(set(ref.values())) == 3
    for name, got in losses.items():
        for step in ref:
            assert got[step] == pytest.approx(ref[step], rel=1e-4, abs=1e-5), (name, step)


def test_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(nano, data_dir, tmp_path) -> None:
    out = str(tmp_path / "run")
    # A constant learning rate of 1e38 overflows the parameters after the first update.
    cfg = _run_config(
        nano,
        data_dir,
        out,
        num_train_steps=6,
        optimizer=AdamConfig(learning_rate=1e38, warmup=0, schedule="constant", max_grad_norm=None),
        checkpoint=CheckpointConfig(every=1, keep_last=5),
    )
    with pytest.raises(NonFiniteLossError) as info:
        train(cfg)
    bad = int(re.match(r"step (\d+):", str(info.value)).group(1))
    assert bad >= 2 and "Last good checkpoint" in str(info.value)
    step, path = latest_checkpoint(out)
    assert step == bad - 1 and path in str(info.value)
    from schooner.model import load_model

    model, _ = load_model(path)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(model))


def test_a_tokenizer_other_than_the_caches_is_refused_before_training(nano, data_dir, tmp_path) -> None:
    from schooner.tokenize import TokenizerMismatchError, train_bpe

    other = train_bpe(["an entirely different corpus, tokenized differently"] * 20, vocab_size=300)
    other.save(str(tmp_path / "tok"))
    cfg = _run_config(nano, data_dir, str(tmp_path / "run"), tokenizer=str(tmp_path / "tok"))
    with pytest.raises(TokenizerMismatchError, match="built with tokenizer"):
        train(cfg)
    assert latest_checkpoint(str(tmp_path / "run")) is None


def test_a_validation_cache_with_other_special_tokens_is_refused_without_a_run_tokenizer(
    nano, data_dir, tmp_path
) -> None:
    """No `tokenizer=`: the caches are checked against the first training cache. A validation cache of the same
    tokenizer.json whose documents end with another EOS (its tokenizer_config.json named another one) is refused
    before training, naming both ids; the fingerprint alone let it through."""
    from schooner.tokenize import TokenizerMismatchError, load_tokenizer, write_cache

    tok = load_tokenizer(data_dir)
    other = load_tokenizer(data_dir, eos_token=tok.pad_token)
    assert other.fingerprint == tok.fingerprint and other.eos_id != tok.eos_id
    val = str(tmp_path / "val")
    write_cache(val, [other.encode("a validation text that ends with another end of text")] * 4, other)
    cfg = _run_config(
        nano, data_dir, str(tmp_path / "run"),
        datasets={f"{data_dir}/train": 1.0}, seq_len=32, validation={"held-out": val},
    )  # fmt: skip
    with pytest.raises(TokenizerMismatchError, match=rf"eos_id={other.eos_id}.*eos_id={tok.eos_id}"):
        train(cfg)
    assert latest_checkpoint(str(tmp_path / "run")) is None


def test_training_caches_with_other_special_tokens_are_named_as_training_caches(
    nano, data_dir, tmp_path
) -> None:
    """No `tokenizer=`, two training caches of one tokenizer.json whose documents end with different EOS ids: the
    error names the two training caches (it blamed a validation cache, whose rebuild could not fix it)."""
    from schooner.tokenize import MixtureError, load_tokenizer, write_cache

    tok = load_tokenizer(data_dir)
    other = load_tokenizer(data_dir, eos_token=tok.pad_token)
    second = str(tmp_path / "second")
    write_cache(second, [other.encode("a training text that ends with another end of text")] * 4, other)
    cfg = _run_config(
        nano, data_dir, str(tmp_path / "run"),
        datasets={f"{data_dir}/train": 0.5, second: 0.5}, seq_len=32, validation={},
    )  # fmt: skip
    with pytest.raises(MixtureError, match=rf"{second}.*eos_id={other.eos_id}.*eos_id={tok.eos_id}"):
        train(cfg)


def test_non_finite_updated_parameters_are_not_applied(nano) -> None:
    """A finite loss and gradient with an update that makes the parameters Inf/NaN: the step keeps the old
    state and reports it (before, such a state was taken, and checkpointed as good)."""
    import equinox as eqx
    import optax

    from schooner.model import init
    from schooner.train import init_state, make_train_step

    model = init(nano(), key=jax.random.PRNGKey(0))
    tx = optax.scale(float("inf"))  # every update infinite (or NaN where a gradient is 0)
    state = init_state(model, tx, jax.random.PRNGKey(1))
    step = jax.jit(make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=lambda s: 1.0))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 0, 320)
    new, metrics = step(state, {"tokens": tokens, "segment_ids": jax.numpy.zeros_like(tokens)})
    assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])
    assert not np.isfinite(metrics["param_norm"]) and metrics["finite"] == 0.0
    for a, b in zip(
        jax.tree.leaves(eqx.filter(new.model, eqx.is_array)), jax.tree.leaves(model), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_learning_rate_that_overflows_float32_is_refused() -> None:
    with pytest.raises(ValueError, match="learning_rate=1e\\+39 overflows float32"):
        AdamConfig(learning_rate=1e39)


def test_a_validation_split_left_empty_on_purpose_is_not_warned_about(data_dir, tmp_path, caplog) -> None:
    """`validation_fraction=0` builds no held-out set, as the tokenize warning suggests: the run's default
    validation passes the empty split over quietly; a split the fraction left empty by chance is still said."""
    import logging

    from schooner.data import make_record, write_records
    from schooner.tokenize import build_cache
    from schooner.train._evaluate import default_validation

    records = str(tmp_path / "records")
    write_records([make_record(f"document number {i} of a few", source="t") for i in range(6)], records,
                  format="jsonl", num_shards=1)  # fmt: skip

    build_cache(records, str(tmp_path / "none"), f"{data_dir}/tokenizer.json", validation_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        assert default_validation({f"{tmp_path}/none/train": 1.0}) == {}
    assert not [r for r in caplog.records if "is empty" in r.getMessage()]
    build_cache(records, str(tmp_path / "chance"), f"{data_dir}/tokenizer.json", validation_fraction=1e-6)
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        assert default_validation({f"{tmp_path}/chance/train": 1.0}) == {}
    assert [r for r in caplog.records if "is empty" in r.getMessage()]
