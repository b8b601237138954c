"""When a scored run began: the earliest evidence of any attempt, so a forecast written between a killed
attempt and its resumption does not count as registered before the run."""

from __future__ import annotations

import json

from schooner.train.scaling._forecast import run_started


def _train_folder(tmp_path, history_starts: list[float], metrics_times: list[float]):
    (tmp_path / ".schooner").mkdir()
    (tmp_path / ".schooner" / "history.jsonl").write_text(
        "".join(json.dumps({"started": t, "state": "SUCCESS"}) + "\n" for t in history_starts)
    )
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "time": t}) + "\n" for i, t in enumerate(metrics_times))
    )
    return str(tmp_path)


def test_a_killed_first_attempt_that_left_no_history_line_still_dates_the_run(tmp_path) -> None:
    """A `kill -9`ed attempt writes no history line (the runner appends one at an attempt's end), but its
    metrics stay and the resumed attempt appends to them: the first metrics row is the earlier evidence."""
    first_row, resumed = 1_000.0, 5_000.0
    folder = _train_folder(
        tmp_path, history_starts=[resumed], metrics_times=[first_row, first_row + 10, resumed + 30]
    )
    assert run_started(folder) == (first_row, "first metrics row")


def test_the_history_s_earliest_start_precedes_the_first_metrics_row(tmp_path) -> None:
    """Normally the earliest attempt's start (before compiling) is the earliest evidence."""
    folder = _train_folder(tmp_path, history_starts=[3_000.0, 900.0], metrics_times=[960.0, 970.0])
    assert run_started(folder) == (900.0, "step history")


def test_a_torn_history_line_is_skipped_not_fatal(tmp_path) -> None:
    folder = _train_folder(tmp_path, history_starts=[900.0], metrics_times=[960.0])
    with open(tmp_path / ".schooner" / "history.jsonl", "a") as f:
        f.write('{"started": 12')  # a writer killed mid-line
    assert run_started(folder) == (900.0, "step history")
