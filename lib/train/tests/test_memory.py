"""The preflight memory check of ``train()``: a step that does not fit is refused before it runs, with the
options that fit it; the check can be turned off; a retry at a smaller batch in the same process works.

The device limit is set through ``SCHOONER_DEVICE_MEMORY_BYTES`` (the documented override): the real check,
the real compiled step and its ``memory_analysis()``, on the test's CPU devices.
"""

from __future__ import annotations

import re
import traceback

import jax
import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    StepMemoryError,
    TrackerConfig,
    TrainerConfig,
    _memory,
    train,
)


def _config(nano, data_dir: str, out: str, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        validation={},
        output_path=out,
        batch_size=8,
        num_train_steps=1,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        checkpoint=CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False),
    )
    args.update(kw)
    return TrainerConfig(**args)


def test_format_bytes_reads_in_binary_units():
    assert _memory.format_bytes(900) == "900 B"
    assert _memory.format_bytes(1536) == "1.50 KiB"
    assert _memory.format_bytes(5.5 * 2**20) == "5.50 MiB"
    assert _memory.format_bytes(15.75 * 2**30) == "15.75 GiB"
    assert _memory.format_bytes(3 * 2**40) == "3.00 TiB"


def test_the_limit_is_read_from_a_device_of_this_process():
    """The step's batch sharding spans the mesh; the device asked is one this process addresses (on several
    hosts the lowest-id device of the mesh belongs to process 0, which other processes cannot ask)."""
    mesh = jax.sharding.Mesh(jax.devices(), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    device = _memory.local_device(sharding)
    assert device in jax.local_devices() and device.process_index == jax.process_index()
    assert device.id == min(d.id for d in jax.local_devices())


def test_a_step_that_does_not_fit_is_refused_naming_the_options(nano, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SCHOONER_DEVICE_MEMORY_BYTES", str(2**20))  # 1 MiB
    cfg = _config(nano, data_dir, str(tmp_path / "small"), batch_size=16, microbatches=2)
    with pytest.raises(StepMemoryError) as err:
        train(cfg)
    msg = str(err.value)
    # A traceback names the error where users import it from, not the private module.
    assert "".join(traceback.format_exception_only(err.value)).startswith("schooner.train.StepMemoryError: ")
    assert "the device holds 1.00 MiB (SCHOONER_DEVICE_MEMORY_BYTES)" in msg
    assert "a smaller batch_size (now 16)" in msg
    assert "`microbatches=` of train_lm or TrainerConfig, now 2" in msg
    assert "gradient_checkpointing='dots'" in msg and "(now 'none'" in msg  # nano trains without remat
    assert "SCHOONER_MEMORY_CHECK=0" in msg
    # The figures read in binary units (not "0.00 GiB" for a small step): the need and each part of it.
    need = re.search(r"needs ([\d.]+) (KiB|MiB|GiB) \(arguments", msg)
    assert need is not None, msg
    assert " 0.00 GiB" not in msg
    # The step really was not run: no step's metrics were written.
    assert (
        not (tmp_path / "small" / "metrics.jsonl").exists()
        or "train/loss" not in (tmp_path / "small" / "metrics.jsonl").read_text()
    )


def test_memory_check_off_lets_the_same_step_run(nano, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SCHOONER_DEVICE_MEMORY_BYTES", str(2**20))
    monkeypatch.setenv("SCHOONER_MEMORY_CHECK", "0")
    summary = train(_config(nano, data_dir, str(tmp_path / "off")))
    assert summary["steps"] == 1
    assert summary["step_memory_bytes"] > 2**20  # it would not have fitted


@pytest.mark.slow  # three train() runs: 25-75 s on 2 shared cores
def test_a_retry_at_a_smaller_batch_in_the_same_process_trains(nano, data_dir, tmp_path, monkeypatch):
    """The limit between the needs of batch 8 and batch 64 (one and eight rows per device): batch 64 is
    refused, then ``train()`` called again in this process at batch 8 (as the benchmark's batch halving
    does) trains."""
    monkeypatch.setenv("SCHOONER_MEMORY_CHECK", "0")
    small = train(_config(nano, data_dir, str(tmp_path / "probe"), batch_size=8))["step_memory_bytes"]
    monkeypatch.delenv("SCHOONER_MEMORY_CHECK")
    monkeypatch.setenv("SCHOONER_DEVICE_MEMORY_BYTES", str(small + 2**10))
    with pytest.raises(StepMemoryError, match=r"batch_size \(now 64\)"):
        train(_config(nano, data_dir, str(tmp_path / "big"), batch_size=64))
    summary = train(_config(nano, data_dir, str(tmp_path / "retry"), batch_size=8))
    assert summary["step_memory_bytes"] == small
    assert summary["final_loss"] > 0
