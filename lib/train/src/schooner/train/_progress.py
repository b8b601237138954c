"""Progress while training runs: step, loss, tokens/s, MFU and ETA.

On a terminal a rich progress bar updates every step; otherwise (logs, CI, Ray workers) a plain line goes
to the `schooner.train` logger every `log_every` steps. Either way the same line is logged every
`log_every` steps so the run's log holds the history.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from typing import Any

logger = logging.getLogger("schooner.train")


def format_duration(seconds: float) -> str:
    """`1h02m03s`, `4m05s` or `6s`."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Tracks throughput over a sliding window and reports progress.

    Args:
        total_steps: the run's last step.
        start_step: the step the run (re)starts from.
        log_every: log a line every this many steps.
        flops_per_token: training FLOPs per token (for MFU); 0 disables MFU.
        peak_flops: the peak FLOP/s MFU is relative to.
        use_rich: force (True) or forbid (False) the rich bar; None = when stderr is a terminal.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        log_every: int = 10,
        flops_per_token: float = 0.0,
        peak_flops: float = 0.0,
        use_rich: bool | None = None,
    ) -> None:
        self.total = total_steps
        self.start_step = start_step
        self.log_every = log_every
        self.flops_per_token = flops_per_token
        self.peak = peak_flops
        self._window: deque[tuple[float, int]] = deque(maxlen=20)
        self._last_time: float | None = None
        self._bar: Any = None
        if use_rich is None:
            use_rich = sys.stderr.isatty()
        if use_rich:
            try:
                from rich.progress import BarColumn, TextColumn
                from rich.progress import Progress as RichProgress

                self._bar = RichProgress(
                    TextColumn("[bold]train"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TextColumn("{task.fields[info]}"),
                    transient=False,
                )
                self._task = self._bar.add_task("train", total=total_steps, completed=start_step, info="")
                self._bar.start()
            except ImportError:  # rich is optional: fall back to log lines
                self._bar = None

    def update(
        self, step: int, tokens: int, metrics: dict[str, float], *, step_seconds: float | None = None
    ) -> dict:
        """Record that `step` finished after processing `tokens` tokens; returns throughput metrics.

        The first step after (re)start includes compilation; it is excluded from the throughput window.
        """
        now = time.perf_counter()
        out: dict[str, float] = {}
        if self._last_time is not None:
            dt = step_seconds if step_seconds is not None else now - self._last_time
            self._window.append((dt, tokens))
        self._last_time = now
        if self._window:
            secs = sum(d for d, _ in self._window)
            toks = sum(t for _, t in self._window)
            tps = toks / secs if secs > 0 else 0.0
            out["throughput/tokens_per_second"] = tps
            out["throughput/step_seconds"] = secs / len(self._window)
            if self.flops_per_token and self.peak:
                out["throughput/mfu"] = self.flops_per_token * tps / self.peak
            out["throughput/eta_seconds"] = (self.total - step) * secs / len(self._window)
        logged = step % self.log_every == 0 or step == self.total
        if self._bar is None and not logged:
            return out  # the line is only formatted to be shown
        line = self.format_line(step, metrics, out)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=line)
        if logged:
            logger.info(line)
            if self._bar is None and not logger.isEnabledFor(logging.INFO):
                print(line, file=sys.stderr, flush=True)
        return out

    def format_line(self, step: int, metrics: dict[str, float], throughput: dict[str, float]) -> str:
        """`step 120/200 | loss 3.412 | 41.2k tok/s | MFU 38.1% | ETA 1m05s`."""
        parts = [f"step {step}/{self.total}"]
        if "train/loss" in metrics:
            parts.append(f"loss {metrics['train/loss']:.4f}")
        if "throughput/tokens_per_second" in throughput:
            tps = throughput["throughput/tokens_per_second"]
            parts.append(f"{tps / 1e3:.1f}k tok/s" if tps >= 1e3 else f"{tps:.0f} tok/s")
        if "throughput/mfu" in throughput:
            parts.append(f"MFU {100 * throughput['throughput/mfu']:.1f}%")
        if "throughput/eta_seconds" in throughput:
            parts.append(f"ETA {format_duration(throughput['throughput/eta_seconds'])}")
        return " | ".join(parts)

    def close(self) -> None:
        """Stop the bar (if any)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
