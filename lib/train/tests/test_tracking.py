"""Trackers (JSONL, W&B offline, TensorBoard), the loss plot, progress lines and the MFU helpers."""

from __future__ import annotations

import logging
import os
import types

import pytest

from schooner.train import Progress, TrackerConfig, plot_losses, read_metrics
from schooner.train._mfu import datasheet_peak, matmul_ceiling, mfu
from schooner.train._tracking import JsonlTracker, make_trackers


def test_jsonl_resume_drops_steps_after_the_checkpoint(tmp_path) -> None:
    path = str(tmp_path / "metrics.jsonl")
    t = JsonlTracker(str(tmp_path))
    for s in range(1, 8):
        t.log({"train/loss": 10.0 - s}, s)
    t.log({"train/loss": float("nan")}, 8)
    t.finish()
    assert read_metrics(path)[-1]["train/loss"] is None  # JSON has no NaN: null, as schooner.cluster.records
    assert '"train/loss": null' in (tmp_path / "metrics.jsonl").read_text().splitlines()[-1]
    assert read_metrics(str(tmp_path)) == read_metrics(path)  # the run folder names the same file
    # the interrupted run had logged 6..8 after its checkpoint at 5
    t = JsonlTracker(str(tmp_path), resume_step=5)
    t.log({"train/loss": 4.5}, 6)
    t.finish()
    assert [(r["step"], r["train/loss"]) for r in read_metrics(path)] == [
        (1, 9.0),
        (2, 8.0),
        (3, 7.0),
        (4, 6.0),
        (5, 5.0),
        (6, 4.5),
    ]


def test_loss_plot_is_a_png(tmp_path) -> None:
    path = str(tmp_path / "metrics.jsonl")
    t = JsonlTracker(str(tmp_path))
    for s in range(1, 20):
        t.log({"train/loss": 5.0 / s}, s)
    t.log({"eval/docs/loss": 1.0}, 19)
    t.finish()
    plot_losses(path, str(tmp_path / "loss.png"), title="test")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wandb_offline_and_tensorboard(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboardX")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrackerConfig(wandb=True, wandb_mode="offline", tensorboard=True)
    trackers = make_trackers(cfg, run_dir=str(tmp_path), name="t", run_config={"lr": 1e-3}, resume_step=None)
    for s in range(1, 4):
        trackers.log({"train/loss": 3.0 - s}, s)
    trackers.finish()
    assert len(read_metrics(str(tmp_path / "metrics.jsonl"))) == 3
    runs = [p for p in os.listdir(tmp_path / "wandb") if p.startswith("offline-run-")]
    assert runs and any(f.endswith(".wandb") for f in os.listdir(tmp_path / "wandb" / runs[0]))
    events = os.listdir(tmp_path / "tensorboard")
    assert any(e.startswith("events.out.tfevents") for e in events)


def test_progress_lines(caplog) -> None:
    p = Progress(100, log_every=2, flops_per_token=6e6, peak_flops=1e12, use_rich=False)
    with caplog.at_level(logging.INFO, logger="schooner.train"):
        p.update(1, 1000, {"train/loss": 3.0})
        thr = p.update(2, 1000, {"train/loss": 2.5}, step_seconds=0.5)
    p.close()
    assert thr["throughput/tokens_per_second"] == pytest.approx(2000.0)
    assert thr["throughput/mfu"] == pytest.approx(6e6 * 2000.0 / 1e12)
    assert thr["throughput/eta_seconds"] == pytest.approx(98 * 0.5)
    line = caplog.records[-1].getMessage()
    assert line == "step 2/100 | loss 2.5000 | 2.0k tok/s | MFU 1.2% | ETA 49s"


def test_peaks() -> None:
    assert datasheet_peak(types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")) == 989e12
    assert datasheet_peak(types.SimpleNamespace(device_kind="TPU v5 lite")) == 197e12
    assert datasheet_peak(types.SimpleNamespace(device_kind="cpu")) is None
    assert mfu(100.0, 10.0, 2000.0) == 0.5


def test_matmul_ceiling_is_the_best_timed_run(monkeypatch) -> None:
    """2 n^3 FLOPs over the fastest of the timed runs (the clock is scripted: runs of 0.5, 0.25, 0.4 s)."""
    from schooner.train import _mfu

    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])
    monkeypatch.setattr(_mfu.time, "perf_counter", lambda: next(ticks))
    assert matmul_ceiling.__wrapped__(256, "float32", repeats=3) == 2 * 256**3 / 0.25


def _wandb_run(config: dict, output_path: str) -> dict:
    """A step writing an offline W&B run into its attempt folder: the folder and the run's id."""
    cfg = TrackerConfig(wandb=True, wandb_mode="offline", loss_plot=False)
    trackers = make_trackers(cfg, run_dir=output_path, name="t", run_config={}, resume_step=None)
    trackers.log({"train/loss": 1.0}, 1)
    trackers.finish()
    (run,) = [p for p in os.listdir(os.path.join(output_path, "wandb")) if p.startswith("offline-run-")]
    with open(config["seen"], "a") as f:  # the attempt's own folder (a step's result reads as published)
        f.write(output_path + "\n")
    return {"id": run.rsplit("-", 1)[1]}


def test_wandb_run_id_is_the_same_for_every_attempt_of_a_step(tmp_path, monkeypatch) -> None:
    """Each attempt of a step writes into a folder of its own (the runner publishes it on success): a resumed
    run must continue the same W&B run, so the id comes from the published folder, not the attempt's."""
    pytest.importorskip("wandb")
    from schooner.cluster import StepRunner, lower, step

    monkeypatch.setenv("WANDB_SILENT", "true")
    seen = tmp_path / "seen.txt"
    handle = step("wandb-ids", _wandb_run, {"seen": str(seen)})
    runner = StepRunner(str(tmp_path / "prefix"), quiet=True)
    attempts = [runner.run([lower(handle)], force="wandb-ids")[handle].result for _ in range(2)]
    folders = seen.read_text().split()
    assert len(folders) == 2 and folders[0] != folders[1]  # two attempts, each in a folder of its own
    assert attempts[0]["id"] == attempts[1]["id"]


@pytest.mark.parametrize(
    ("kind", "peak"),
    [
        # Dense BF16 tensor-core peaks from NVIDIA's datasheets (the sparsity figures halved). The PCIe and NVL
        # H100 run at lower clocks than the SXM part; the L40 is not the L40S; neither is an L4.
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA L40", 181e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
    ],
)
def test_the_peak_is_the_part_s_own_not_a_sibling_s(kind: str, peak: float) -> None:
    assert datasheet_peak(types.SimpleNamespace(device_kind=kind)) == peak
