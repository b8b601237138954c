"""`schooner report`: the static HTML page of a prefix, checked as text and in headless Chromium."""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from schooner.cluster import StepRunner, step
from schooner.cluster.cli._report import collect, render_report, write_report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def _png(width: int = 8, height: int = 6) -> bytes:
    """A real (tiny, grey) PNG, written by hand so the test needs no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes([120]) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class WriteConfig:
    text: str


@dataclass(frozen=True)
class TrainLikeConfig:
    data: object
    steps: int


def _write_text(config: WriteConfig, output_path: str) -> dict:
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "data.txt"), "w") as f:
        f.write(config.text)
    return {"chars": len(config.text)}


def _train_like(config: TrainLikeConfig, output_path: str) -> dict:
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "metrics.jsonl"), "w") as f:
        for s in range(config.steps):
            row = {"step": s, "train/loss": 5.0 / (1 + s), "train/z_loss": 70.0, "lr": 1e-3}
            if s % 4 == 0:
                row["eval/loss"] = 5.5 / (1 + s)
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(output_path, "loss.png"), "wb") as f:
        f.write(_png())
    os.makedirs(os.path.join(output_path, "step-000003"), exist_ok=True)
    return {"final_loss": 5.0 / config.steps, "eval": {"docs": {"bpb": 1.25}}, "config": {"hidden_dim": 77}}


def _fails(config: WriteConfig, output_path: str) -> None:
    raise RuntimeError(f"deliberate failure <{config.text}>")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    root = tmp_path_factory.mktemp("report") / "prefix"
    data = step("data/raw", _write_text, WriteConfig("hello & goodbye"), description="raw <text> & more")
    train = step("checkpoints/tiny", _train_like, TrainLikeConfig(data=data, steps=12))
    bad = step("broken", _fails, WriteConfig("x"))
    runner = StepRunner(prefix=str(root), quiet=True)
    result = runner.run([train, bad], raise_on_failure=False)
    assert not result.ok and len(result.failed) == 1
    return str(root), runner, (data, train, bad)


def test_collect_finds_every_step_and_the_experiment(prefix):
    root, runner, handles = prefix
    data = collect(root)
    assert len(data["experiments"]) == 1
    by_name = {s["record"]["name"]: s for s in data["steps"]}
    assert set(by_name) == {h.name for h in handles}
    assert by_name["checkpoints/tiny"]["status"].state.value == "SUCCESS"
    assert by_name["broken"]["status"].state.value == "FAILED"
    assert by_name["checkpoints/tiny"]["folder"] == runner.output_path(handles[1])


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.srcs, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "href" in a:
            self.hrefs.append(a["href"])
        if "src" in a:
            self.srcs.append(a["src"])
        if "id" in a:
            self.ids.add(a["id"])


def test_report_shows_states_results_metrics_plots_and_valid_links(prefix):
    root, runner, (data, train, bad) = prefix
    out = write_report(root)
    assert out == os.path.join(root, "report.html")
    page = Path(out).read_text(encoding="utf-8")
    # names are escaped, never injected as markup
    assert "raw &lt;text&gt; &amp; more" in page and "<text>" not in page
    assert "deliberate failure &lt;x&gt;" in page
    assert page.count('class="badge FAILED"') >= 1 and 'class="badge SUCCESS"' in page
    # the result is shown as a table, nested values flattened
    assert "eval.docs.bpb" in page and "1.25" in page
    # metrics.jsonl drawn as an SVG chart of its loss column, and its last row shown
    assert "<polyline" in page and "12 rows of metrics.jsonl" in page
    legend = re.findall(r'fill="#[0-9a-f]{6}">([^<]+)</text>', page)
    assert legend == ["train/loss", "eval/loss"]  # headline losses; the z-loss term is not drawn
    assert page.count("<circle") == 12 + 3  # short series have their measured points marked
    # a copy of the config inside the result stays out of the result table (it is in the JSON view)
    assert "config.hidden_dim" not in page and "&quot;hidden_dim&quot;: 77" in page
    # the PNG is embedded, so the page is self-contained
    assert "data:image/png;base64," in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    parser = _Links()
    parser.feed(page)
    for href in parser.hrefs:
        if href.startswith("#"):
            assert href[1:] in parser.ids, f"dangling anchor {href}"
        else:
            target = os.path.normpath(os.path.join(root, unquote(href)))
            assert os.path.exists(target), f"link {href} points to nothing ({target})"
    assert all(src.startswith("data:image/png;base64,") for src in parser.srcs)
    # every output folder is linked
    for h in (data, train, bad):
        rel = os.path.relpath(runner.output_path(h), root)
        assert f'href="{rel}"' in page


def test_report_to_another_folder_links_relative_to_it(prefix, tmp_path):
    root, runner, (_, train, _) = prefix
    out = write_report(root, str(tmp_path / "elsewhere" / "r.html"))
    page = Path(out).read_text(encoding="utf-8")
    rel = os.path.relpath(runner.output_path(train), tmp_path / "elsewhere")
    assert f'href="{rel}"' in page


def test_report_of_an_empty_prefix_says_so(tmp_path):
    page = render_report(str(tmp_path / "nothing"))
    assert "No steps under this prefix" in page and "No experiment records" in page


def test_report_on_a_memory_prefix():
    root = "memory://h7-report-test"
    try:
        StepRunner(prefix=root, quiet=True).run([step("mem/one", _mem_step, WriteConfig("abc"))])
        out = write_report(root)
        import fsspec

        with fsspec.open(out, "r") as f:
            page = f.read()
        assert out == f"{root}/report.html" and "mem/one" in page and 'class="badge SUCCESS"' in page
        assert "chars" in page
    finally:
        import fsspec

        fsspec.filesystem("memory").rm("/h7-report-test", recursive=True)


def _mem_step(config: WriteConfig, output_path: str) -> dict:
    import fsspec

    with fsspec.open(f"{output_path}/data.txt", "w") as f:
        f.write(config.text)
    return {"chars": len(config.text)}


def test_report_command_line(prefix, tmp_path):
    root, _, _ = prefix
    out = tmp_path / "cli.html"
    proc = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", "report", "--prefix", root, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    assert "checkpoints/tiny" in out.read_text()


def _chromium(url: str, tmp_path) -> tuple[str, list[str]]:
    """(DOM after load, console messages) of `url` in headless Chromium, offline."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    return proc.stdout, console


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)"
)
def test_report_loads_in_headless_chromium_without_console_errors(prefix, tmp_path):
    root, _, handles = prefix
    out = write_report(root)
    # the scan can fail: a page with a script error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>throw new Error('h7-boom')</script></body></html>")
    _, bad_console = _chromium(bad.as_uri(), tmp_path)
    assert any("h7-boom" in ln for ln in bad_console)
    dom, console = _chromium("file://" + out, tmp_path)
    assert console == []
    assert "Schooner report" in dom
    for h in handles:
        assert html.escape(h.name) in dom
    assert dom.count("<section") >= 1 + len(handles)
