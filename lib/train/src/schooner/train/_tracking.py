"""Trackers: a JSONL metrics file always; Weights & Biases and TensorBoard optionally; the loss-curve PNG.

wandb, tensorboardX and matplotlib are imported only inside the tracker that needs them.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class TrackerConfig:
    """Where metrics go besides `metrics.jsonl` (always written), and how often progress is printed."""

    wandb: bool = False
    """Log to Weights & Biases (install `schooner-train[wandb]`)."""
    wandb_project: str = "schooner"
    """W&B project."""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """W&B mode: "offline" (default: writes under the run folder, `wandb sync` later), "online", "disabled"."""
    tensorboard: bool = False
    """Write TensorBoard event files under `<run>/tensorboard` (install `schooner-train[tensorboard]`)."""
    loss_plot: bool = True
    """Write `loss.png` (train and eval loss per step) at the end of the run."""
    log_every: int = 10
    """Print a progress line (and flush trackers) every this many steps."""

    def __post_init__(self) -> None:
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(
                f"TrackerConfig.wandb_mode must be offline/online/disabled, got {self.wandb_mode!r}"
            )
        if not isinstance(self.log_every, int) or self.log_every <= 0:
            raise ValueError(f"TrackerConfig.log_every must be a positive int, got {self.log_every!r}")


class Tracker(Protocol):
    """Receives metrics dicts (flat, str -> float) per step."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...
    def finish(self) -> None: ...


class JsonlTracker:
    """Writes the run's `metrics.jsonl` through `schooner.cluster.records.MetricsWriter`: one row per logged
    step, `{"step", "time", ...}`, NaN and infinities as `null` (JSON has no such numbers).

    On resume from step S, rows for steps after S (logged by the interrupted run after its last checkpoint)
    are dropped first, so the file reads as one uninterrupted run. On an object store, which cannot append,
    the whole file is uploaded again at `flush()` (the loop calls it with every checkpoint), now and then
    otherwise, and at the end; a killed run keeps every row up to its last checkpoint.
    """

    def __init__(self, run_dir: str, *, resume_step: int | None = None) -> None:
        from schooner.cluster.records import MetricsWriter

        self._writer = MetricsWriter(run_dir.rstrip("/"), resume_step=resume_step)
        self.path = self._writer.path

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._writer.append({"step": step, "time": time.time(), **metrics})

    def flush(self) -> None:
        """Make every logged row durable (an object store: upload the file again)."""
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The rows of a run's `metrics.jsonl` (`path`: the file, or the run folder), in file order; none when
    there is no such file. NaN and infinities read back as None (see `schooner.cluster.records`)."""
    from schooner.cluster import records

    folder = path.rstrip("/")
    if folder.rsplit("/", 1)[-1] == records.METRICS_FILE:
        folder = folder.rsplit("/", 1)[0] if "/" in folder else "."
    return records.read_metrics(folder)


class WandbTracker:
    """Weights & Biases; offline mode writes under `<run>/wandb`."""

    def __init__(
        self, config: TrackerConfig, *, run_dir: str, name: str, run_config: Mapping[str, Any]
    ) -> None:
        import wandb

        # A stable id from the run folder lets a resumed run continue the same W&B run: the folder the step
        # publishes, not the attempt's own (each attempt of a step writes into a folder of its own).
        from schooner.cluster import published_path

        run_id = hashlib.sha256(published_path(run_dir.rstrip("/")).encode()).hexdigest()[:16]
        os.makedirs(run_dir, exist_ok=True)
        self._run = wandb.init(
            project=config.wandb_project,
            name=name,
            id=run_id,
            resume="allow",
            dir=run_dir,
            mode=config.wandb_mode,
            config=dict(run_config),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self) -> None:
        self._run.finish()


class TensorBoardTracker:
    """TensorBoard event files under `<run>/tensorboard` (tensorboardX writer)."""

    def __init__(self, run_dir: str) -> None:
        from tensorboardX import SummaryWriter

        self._w = SummaryWriter(logdir=os.path.join(run_dir, "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, int | float):
                self._w.add_scalar(k, v, step)

    def finish(self) -> None:
        self._w.close()


class Trackers:
    """Fan-out to several trackers."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def flush(self) -> None:
        """Make what was logged durable where a tracker can (the loop calls it with each checkpoint)."""
        for t in self.trackers:
            if hasattr(t, "flush"):
                t.flush()

    def finish(self) -> None:
        for t in self.trackers:
            t.finish()


def make_trackers(
    config: TrackerConfig | None,
    *,
    run_dir: str,
    name: str,
    run_config: Mapping[str, Any],
    resume_step: int | None,
) -> Trackers:
    """The JSONL tracker plus whichever optional trackers `config` enables; None: no tracker at all (the
    processes other than 0 of a multi-host run)."""
    if config is None:
        return Trackers([])
    trackers: list[Tracker] = [JsonlTracker(run_dir, resume_step=resume_step)]
    if config.wandb:
        trackers.append(WandbTracker(config, run_dir=run_dir, name=name, run_config=run_config))
    if config.tensorboard:
        trackers.append(TensorBoardTracker(run_dir))
    return Trackers(trackers)


def plot_losses(metrics_path: str, out_path: str, *, title: str = "") -> None:
    """Draw train loss (and eval losses when present) against step into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [(r["step"], r["train/loss"]) for r in rows if isinstance(r.get("train/loss"), float | int)]
    evals: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("eval/") and k.endswith("/loss") and isinstance(v, float | int):
                evals.setdefault(k, []).append((r["step"], v))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot(*zip(*train), label="train/loss", linewidth=1)
    for k, pts in sorted(evals.items()):
        ax.plot(*zip(*pts), marker="o", markersize=3, label=k)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if train or evals:
        ax.legend()
    fig.tight_layout()
    from schooner.cluster import storage

    with storage.atomic_open(out_path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
