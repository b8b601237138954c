"""`schooner compare`: versions of a step side by side in the terminal, and their metrics in a PNG.

Three versions of one step run for real (StepRunner, in-process), each writing a `metrics.jsonl`; the
expected numbers are read back from those files by the test.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from schooner.cluster import StepRunner, step
from schooner.cluster.cli import main


@dataclass(frozen=True)
class CurveConfig:
    lr: float
    steps: int = 9
    label: str = "same"


def _curve(config: CurveConfig, output_path: str) -> dict:
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "metrics.jsonl"), "w") as f:
        for s in range(config.steps):
            # a loss that bottoms out mid-run: its final value is neither its first, its largest nor its smallest
            row = {"step": 5 * s, "train/loss": 2.0 + (s - 5) ** 2 * config.lr, "lr": config.lr}
            f.write(json.dumps(row) + "\n")
    return {"score": round(10 * config.lr, 6)}


@dataclass
class Versions:
    root: str
    folders: list[str]
    keys: list[str]


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Versions:
    root = str(tmp_path_factory.mktemp("compare") / "prefix")
    runner = StepRunner(prefix=root, quiet=True)
    handles = [step("fit/curve", _curve, CurveConfig(lr)) for lr in (0.1, 0.25, 0.5)]
    for h in handles:  # one run each, so their start times order them
        assert runner.run([h]).ok
    runner.run([step("other/step", _curve, CurveConfig(0.1, label="x"))])
    return Versions(root, [runner.output_path(h) for h in handles], [h.key for h in handles])


def _file_summary(folder: str, metric: str) -> tuple[float, float, float]:
    """(final, minimum, step of the minimum) of `metric`, read from the folder's metrics.jsonl."""
    rows = [json.loads(line) for line in Path(folder, "metrics.jsonl").read_text().splitlines()]
    points = [(r["step"], r[metric]) for r in rows if metric in r]
    low = min(points, key=lambda p: (p[1], p[0]))
    return points[-1][1], low[1], low[0]


def _compare(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", "400")  # rich tables one line per row
    code = main(["compare", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").strip().strip("│").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def _num(cell: str) -> float:
    return float(cell.split(" @ ")[0])


def test_a_name_alone_compares_its_two_latest_versions(versions: Versions, capsys, monkeypatch):
    code, out = _compare(capsys, monkeypatch, "fit/curve", "--prefix", versions.root)
    assert code == 0, out
    middle, newest = versions.keys[1][:8], versions.keys[2][:8]
    assert versions.keys[0][:8] not in out  # the oldest version is not one of the two latest
    assert _row(out, "field") == ["field", middle, newest]
    assert _row(out, "lr") == ["lr", "0.25", "0.5"]  # the one config field that differs, old and new
    with pytest.raises(AssertionError):
        _row(out, "label")  # equal in every version: not a row of the diff
    finals = _row(out, "train/loss")
    for i, folder in enumerate(versions.folders[1:]):
        final, low, at = _file_summary(folder, "train/loss")
        assert _num(finals[1 + i]) == pytest.approx(final, rel=1e-5)
        assert _num(finals[3 + i]) == pytest.approx(low, rel=1e-5) and finals[3 + i].endswith(f"@ {at}")


def test_folders_and_name_at_key_in_the_order_given(versions: Versions, capsys, monkeypatch):
    newest = f"fit/curve@{versions.keys[2][:5]}"
    code, out = _compare(capsys, monkeypatch, newest, versions.folders[0], "--prefix", versions.root)
    assert code == 0, out
    assert _row(out, "field") == ["field", versions.keys[2][:8], versions.keys[0][:8]]
    assert _row(out, "lr") == ["lr", "0.5", "0.1"]
    assert _row(out, "score") == ["score", "5", "1"]  # the results, from each step.json


def test_an_unknown_step_names_the_steps_that_exist(versions: Versions, capsys, monkeypatch):
    code, out = _compare(capsys, monkeypatch, "fit/curv", "--prefix", versions.root)
    assert code == 2
    assert "no step named 'fit/curv'" in out and "fit/curve" in out and "other/step" in out


def test_an_unknown_or_ambiguous_key_lists_the_keys(versions: Versions, capsys, monkeypatch):
    code, out = _compare(capsys, monkeypatch, "fit/curve@zz", "fit/curve", "--prefix", versions.root)
    assert code == 2 and all(k[:12] in out for k in versions.keys)
    code, out = _compare(capsys, monkeypatch, "fit/curve@", "fit/curve", "--prefix", versions.root)
    assert code == 2 and "matches 3 versions" in out


def test_one_version_is_nothing_to_compare(versions: Versions, capsys, monkeypatch):
    code, out = _compare(capsys, monkeypatch, "other/step", "--prefix", versions.root)
    assert code == 2 and "has one version" in out and "name@key" in out


def test_plot_overlays_each_version(versions: Versions, capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the [plot] extra")
    from matplotlib.image import imread

    out_png = tmp_path / "plots" / "curves.png"
    code, out = _compare(
        capsys,
        monkeypatch,
        "fit/curve",
        "--prefix",
        versions.root,
        "--plot",
        str(out_png),
        "--metric",
        "loss",
    )
    assert code == 0, out
    assert str(out_png) in out
    pixels = imread(str(out_png))[..., :3]
    # one line per version in matplotlib's first two colours (C0 blue, C1 orange), one panel (the loss)
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        near = (abs(pixels - [c / 255 for c in rgb]).max(axis=-1) < 0.02).sum()
        assert near > 200, f"no line drawn in {rgb}"
    assert pixels.shape[1] < 1000  # one panel wide: --metric kept `train/loss` only, not `lr`


def test_plot_with_no_matching_metric_names_the_metrics(versions: Versions, capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the [plot] extra")
    code, out = _compare(
        capsys, monkeypatch, "fit/curve", "--prefix", versions.root, "--plot", str(tmp_path / "x.png"),
        "--metric", "accuracy",
    )  # fmt: skip
    assert code == 2 and "train/loss" in out and "lr" in out
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_says_how_to_install_it(versions: Versions, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without the extra sees
    code, out = _compare(
        capsys, monkeypatch, "fit/curve", "--prefix", versions.root, "--plot", str(tmp_path / "x.png")
    )
    assert code == 2 and "schooner-cluster[plot]" in out
    assert _row(out, "lr") == ["lr", "0.25", "0.5"]  # the terminal comparison is still printed
    assert not (tmp_path / "x.png").exists()


def test_a_step_name_holding_an_at_sign_is_a_name(tmp_path: Path, capsys, monkeypatch):
    # '@' is allowed in step names ('eval/nano@3e-4'); compare split every such name as name@key and said
    # "no step named 'eval/nano'", even for the explicit 'eval/nano@3e-4@KEY'.
    root = str(tmp_path / "prefix")
    runner = StepRunner(prefix=root, quiet=True)
    handles = [step("eval/nano@3e-4", _curve, CurveConfig(lr)) for lr in (0.1, 0.5)]
    for h in handles:
        assert runner.run([h]).ok
    old, new = handles[0].key, handles[1].key
    code, out = _compare(capsys, monkeypatch, "eval/nano@3e-4", "--prefix", root)
    assert code == 0, out
    assert _row(out, "field") == ["field", old[:8], new[:8]] and _row(out, "lr") == ["lr", "0.1", "0.5"]
    code, out = _compare(
        capsys, monkeypatch, f"eval/nano@3e-4@{new[:6]}", f"eval/nano@3e-4@{old[:6]}", "--prefix", root
    )
    assert code == 0, out
    assert _row(out, "lr") == ["lr", "0.5", "0.1"]
