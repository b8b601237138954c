"""`schooner report`: what a reader of the page sees, checked against the files the steps wrote.

The steps here run for real (StepRunner, in-process) and write `metrics.jsonl`, PNGs and subfolders; the
tests parse the HTML into a small tree and compare what it shows (chart points read back through the
chart's own tick marks, table cells, embedded images) with values read from those files, never with
values computed by the report's code.
"""

from __future__ import annotations

import base64
import html
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pytest

from schooner.cluster import StepRunner, step
from schooner.cluster.views._report import collect, render_report, write_report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


# ----------------------------------------------------------------------------------------------------------
# The steps
# ----------------------------------------------------------------------------------------------------------
def _png(width: int, height: int, grey: int) -> bytes:
    """A real (tiny, grey) PNG, written by hand so the test needs no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes([grey]) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class WriteConfig:
    text: str


@dataclass(frozen=True)
class FitConfig:
    lr: float
    steps: int


@dataclass(frozen=True)
class FlakyConfig:
    flag: str
    """The step fails while this file does not exist."""


def _write_text(config: WriteConfig, output_path: str) -> dict:
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "data.txt"), "w") as f:
        f.write(config.text)
    return {"chars": len(config.text)}


def _fit(config: FitConfig, output_path: str) -> dict:
    """Writes metrics of several kinds (none of them special to the report), two PNGs and a subfolder."""
    os.makedirs(os.path.join(output_path, "nested"), exist_ok=True)
    with open(os.path.join(output_path, "metrics.jsonl"), "w") as f:
        for s in range(config.steps):
            row = {"step": 10 * s, "train/loss": 3.0 / (1 + config.lr * s), "lr": config.lr}
            row |= {"widgets/count": s * s, "note": "text is not a series", "finite": True}
            if s % 4 == 0:
                row["eval/docs/loss"] = 3.5 / (1 + config.lr * s)
            f.write(json.dumps(row) + "\n")
    for name, grey in (("curve.png", 90), ("other.png", 200)):
        with open(os.path.join(output_path, name), "wb") as f:
            f.write(_png(8, 6, grey))
    with open(os.path.join(output_path, "nested", "inner.png"), "wb") as f:
        f.write(_png(4, 4, 10))
    return {"final_loss": 3.0 / (1 + config.lr * (config.steps - 1)), "eval": {"docs": {"bpb": 1.25}},
            "config": {"hidden_dim": 77}}  # fmt: skip


def _fails(config: WriteConfig, output_path: str) -> None:
    raise RuntimeError(f"deliberate failure <{config.text}>")


def _flaky(config: FlakyConfig, output_path: str) -> dict:
    if not os.path.exists(config.flag):
        raise ValueError("flag file missing: first attempt fails")
    return {"ok": 1}


def _interrupted(config: WriteConfig, output_path: str) -> None:
    raise KeyboardInterrupt


@dataclass
class Prefix:
    root: str
    runner: StepRunner
    handles: dict
    run_ok: list = field(default_factory=list)
    """Per run, in order: True/False (its RunResult.ok) or 'interrupted'."""


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Prefix:
    root = tmp_path_factory.mktemp("report") / "prefix"
    flag = tmp_path_factory.mktemp("flag") / "flag"
    h = {
        "data": step(
            "data/raw", _write_text, WriteConfig("hello & goodbye"), description="raw <text> & more"
        ),
        "fit1": step("fit/curve", _fit, FitConfig(lr=0.1, steps=12)),
        "fit2": step("fit/curve", _fit, FitConfig(lr=0.3, steps=12)),
        "bad": step("broken", _fails, WriteConfig("x")),
        "flaky": step("flaky", _flaky, FlakyConfig(str(flag))),
        "intr": step("interrupted", _interrupted, WriteConfig("y")),
    }
    runner = StepRunner(prefix=str(root), quiet=True)
    p = Prefix(str(root), runner, h)
    p.run_ok.append(runner.run([h["data"], h["fit1"], h["bad"], h["flaky"]], raise_on_failure=False).ok)
    flag.write_text("now the flaky step succeeds")
    p.run_ok.append(runner.run([h["fit2"], h["flaky"]], raise_on_failure=False).ok)
    with pytest.raises(KeyboardInterrupt):
        runner.run([h["intr"]], raise_on_failure=False)
    p.run_ok.append("interrupted")
    assert p.run_ok[:2] == [False, True]
    return p


# ----------------------------------------------------------------------------------------------------------
# A small HTML tree, to read the page as a reader would (tables by rows, charts by their marks)
# ----------------------------------------------------------------------------------------------------------
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict
    children: list = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str, cls: str | None = None) -> list[Node]:
        found = []
        for c in self.children:
            if isinstance(c, Node):
                if c.tag == tag and (cls is None or cls in (c.attrs.get("class") or "").split()):
                    found.append(c)
                found += c.all(tag, cls)
        return found

    def one(self, tag: str, cls: str | None = None) -> Node:
        found = self.all(tag, cls)
        assert len(found) == 1, f"expected one <{tag} class={cls}>, found {len(found)}"
        return found[0]


class _TreeBuilder(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert tag not in _VOID, f"</{tag}> closes a void element"
        assert self.stack[-1].tag == tag, (
            f"</{tag}> closes <{self.stack[-1].tag}>: the page is not well nested"
        )
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(page)
    builder.close()
    assert builder.stack == [builder.root], "unclosed elements at the end of the page"
    return builder.root


def table_rows(table: Node) -> list[list[str]]:
    return [[cell.text().strip() for cell in tr.all("td") + tr.all("th")] for tr in table.all("tr")]


def card_of(doc: Node, key: str) -> Node:
    """The step card of the step with this key (its id is made from the key)."""
    cards = [s for s in doc.all("section", "step") if key.startswith(s.attrs["id"].removeprefix("step-"))]
    assert len(cards) == 1, f"{len(cards)} cards for key {key}"
    return cards[0]


def chart_series(figure: Node) -> dict[str, list[tuple[float, float]]]:
    """The data points of each series of a chart, read back from pixel coordinates through its tick marks."""

    def axis(cls: str, coord: str) -> tuple[float, float, float, float]:
        ticks = sorted(
            (float(g.one("line").attrs[coord]), float(g.one("text").text())) for g in figure.all("g", cls)
        )
        (p0, v0), (p1, v1) = ticks[0], ticks[-1]
        return p0, v0, p1, v1

    xp0, xv0, xp1, xv1 = axis("xtick", "x1")
    yp0, yv0, yp1, yv1 = axis("ytick", "y1")
    assert xv1 > xv0 and yv1 < yv0, "steps must grow to the right and values upwards (SVG y points down)"
    out = {}
    for g in figure.all("g", "series"):
        label = next(c for c in g.children if isinstance(c, Node) and c.tag == "title").text()
        pts = []
        for pair in g.one("polyline").attrs["points"].split():
            px, py = map(float, pair.split(","))
            pts.append(
                (xv0 + (px - xp0) * (xv1 - xv0) / (xp1 - xp0), yv0 + (py - yp0) * (yv1 - yv0) / (yp1 - yp0))
            )
        out[label] = pts
    return out


def file_series(folder: str) -> dict[str, list[tuple[float, float]]]:
    """The numeric (non-bool) columns of a metrics.jsonl against its `step` field, read by the test."""
    series: dict[str, list[tuple[float, float]]] = {}
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                    series.setdefault(k, []).append((row["step"], v))
    return series


def assert_points_close(got: list[tuple[float, float]], want: list[tuple[float, float]], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} points drawn, the file has {len(want)}"
    xs, ys = [x for x, _ in want], [y for _, y in want]
    tol_x = 1e-3 * max(1.0, max(xs) - min(xs))
    tol_y = 1e-3 * max(1.0, max(ys) - min(ys))
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert abs(gx - wx) <= tol_x and abs(gy - wy) <= tol_y, (
            f"{what}: drew ({gx}, {gy}), file has ({wx}, {wy})"
        )


@pytest.fixture(scope="module")
def page(prefix: Prefix) -> str:
    return Path(write_report(prefix.root)).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def doc(page: str) -> Node:
    return parse(page)


# ----------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------
def test_collect_finds_every_step_folder_and_every_run(prefix: Prefix):
    data = collect(prefix.root)
    folders = {v.folder: v for v in data["steps"]}
    assert set(folders) == {prefix.runner.output_path(h) for h in prefix.handles.values()}
    assert folders[prefix.runner.output_path(prefix.handles["bad"])].state == "FAILED"
    records = list(Path(prefix.root, "experiments").glob("*/*.json"))
    assert len(data["experiments"]) == len(records) == len(prefix.run_ok)


def test_metric_charts_draw_every_numeric_series_of_the_file(prefix: Prefix, doc: Node):
    folder = prefix.runner.output_path(prefix.handles["fit1"])
    want = file_series(folder)
    card = card_of(doc, prefix.handles["fit1"].key)
    drawn = {}
    for figure in card.all("figure", "chart"):
        series = chart_series(figure)
        for label in series:
            # one chart per family: its caption is the last part of every series name in it
            assert label.rsplit("/", 1)[-1] == figure.one("figcaption").text()
        drawn |= series
    assert set(drawn) == set(want) == {"train/loss", "lr", "widgets/count", "eval/docs/loss"}
    for name, points in want.items():
        assert_points_close(drawn[name], points, name)
    # train and eval losses share a chart, the learning rate has its own
    captions = [f.one("figcaption").text() for f in card.all("figure", "chart")]
    assert sorted(captions) == ["count", "loss", "lr"]
    # the summary table's final and minimum come from the file
    rows = {r[0]: r for r in table_rows(card.one("table", "metrics"))[1:]}
    final_step, final_loss = want["train/loss"][-1]
    assert float(rows["train/loss"][1]) == pytest.approx(final_loss, rel=1e-5)
    assert float(rows["train/loss"][2]) == final_step
    assert float(rows["widgets/count"][3]) == min(y for _, y in want["widgets/count"])


def test_versions_of_a_step_side_by_side_with_config_diff(prefix: Prefix, doc: Node):
    old, new = prefix.handles["fit1"], prefix.handles["fit2"]
    cards = doc.all("section", "versions")
    assert len(cards) == 1, "only fit/curve has two versions"
    card = cards[0]
    assert card.one("h3").text().startswith("fit/curve")
    overview = table_rows(card.one("table", "versions"))
    assert overview[0][1:] == [old.key[:8], new.key[:8]]  # oldest first
    assert {r[0]: r[1:] for r in overview}["state"] == ["SUCCESS", "SUCCESS"]
    diff = table_rows(card.one("table", "config-diff"))
    assert diff[0] == ["field", old.key[:8], new.key[:8]]
    assert diff[1:] == [["lr", "0.1", "0.3"]]  # `steps` is equal in both: not a row
    # each metric overlaid: one line per version, labelled by key and the differing field
    figures = {f.one("figcaption").text(): f for f in card.all("figure", "chart")}
    overlaid = chart_series(figures["train/loss"])
    labels = sorted(overlaid)
    assert labels == sorted([f"{old.key[:8]} (lr=0.1)", f"{new.key[:8]} (lr=0.3)"])
    for h in (old, new):
        want = file_series(prefix.runner.output_path(h))["train/loss"]
        assert_points_close(overlaid[next(lb for lb in labels if lb.startswith(h.key[:8]))], want, h.key[:8])


def test_many_versions_compare_the_newest_eight(tmp_path):
    runner = StepRunner(prefix=str(tmp_path), quiet=True)
    handles = [step("many", _write_text, WriteConfig(f"v{i}")) for i in range(10)]
    for h in handles:  # one run each: start times order them
        runner.run([h])
    card = parse(render_report(str(tmp_path))).one("section", "versions")
    assert table_rows(card.one("table", "versions"))[0][1:] == [h.key[:8] for h in handles[2:]]
    assert "2 older versions are not compared here" in card.text()
    assert table_rows(card.one("table", "config-diff"))[1] == ["text", *(f'"v{i}"' for i in range(2, 10))]


def test_attempts_keep_the_failed_one_with_its_traceback(prefix: Prefix, doc: Node):
    card = card_of(doc, prefix.handles["flaky"].key)
    history = card.one("table", "history")
    rows = table_rows(history)[1:]
    assert [r[1] for r in rows] == ["FAILED", "SUCCESS"]
    failed = history.all("tr")[1]
    details = failed.one("details")
    assert details.one("summary").text() == "ValueError: flag file missing: first attempt fails"
    assert "Traceback (most recent call last)" in details.one("pre").text()
    assert "_flaky" in details.one("pre").text()
    # a step that only failed shows its error on its card
    bad = card_of(doc, prefix.handles["bad"].key)
    assert "RuntimeError: deliberate failure <x>" in [s.text() for s in bad.all("summary")]


def test_experiments_table_has_every_run_with_its_outcome(prefix: Prefix, doc: Node):
    rows = table_rows(doc.one("table", "experiments"))[1:]
    expected = [
        "interrupted" if ok == "interrupted" else "succeeded" if ok else "failed" for ok in prefix.run_ok
    ]
    assert [r[1] for r in rows] == list(reversed(expected))  # newest first


def test_pngs_at_the_top_of_a_folder_are_embedded_byte_for_byte(prefix: Prefix, doc: Node):
    folder = prefix.runner.output_path(prefix.handles["fit1"])
    card = card_of(doc, prefix.handles["fit1"].key)
    images = {img.attrs["alt"]: img.attrs["src"] for img in card.all("img", "plot")}
    assert set(images) == {"curve.png", "other.png"}  # nested/inner.png is not at the top level
    for name, src in images.items():
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == Path(folder, name).read_bytes()


def test_result_table_escaping_and_links(prefix: Prefix, page: str, doc: Node):
    # names are escaped, never injected as markup
    assert "raw &lt;text&gt; &amp; more" in page and "<text>" not in page
    fit = card_of(doc, prefix.handles["fit1"].key)
    result = {r[0]: r[1] for r in table_rows(fit.one("table", "result"))}
    assert result["eval.docs.bpb"] == "1.25" and "config.hidden_dim" not in result
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    ids = {n.attrs["id"] for tag in ("section",) for n in doc.all(tag) if "id" in n.attrs}
    for a in doc.all("a"):
        href = a.attrs["href"]
        if href.startswith("#"):
            assert href[1:] in ids, f"dangling anchor {href}"
        else:
            target = os.path.normpath(os.path.join(prefix.root, unquote(href)))
            assert os.path.exists(target), f"link {href} points to nothing ({target})"
    for h in prefix.handles.values():
        assert f'href="{os.path.relpath(prefix.runner.output_path(h), prefix.root)}"' in page


@dataclass(frozen=True)
class TablesConfig:
    rows: int


def _tables(config: TablesConfig, output_path: str) -> dict:
    """A result naming tables: one well formed (numbers, markup-like text, None), two that are not tables."""
    os.makedirs(output_path, exist_ok=True)
    rows = [[f"task <{i}>", i / 7, 10**i, None] for i in range(config.rows)]
    good = {"title": "scores at step <3>", "columns": ["task", "acc", "count", "note"], "rows": rows}
    return {"loss": 1.5, "tables": [good, {"title": "ragged", "columns": ["a"], "rows": [[1, 2]]}, "text"]}


def test_tables_a_result_names_are_drawn_cell_for_cell(tmp_path):
    handle = step("eval/tables", _tables, TablesConfig(rows=3))
    runner = StepRunner(prefix=str(tmp_path), quiet=True)
    assert runner.run([handle]).ok
    folder = runner.output_path(handle)
    want = json.loads(Path(folder, ".schooner", "step.json").read_text())["result"]["tables"][0]
    card = card_of(parse(Path(write_report(str(tmp_path))).read_text(encoding="utf-8")), handle.key)
    (drawn,) = card.all("table", "named")
    assert "scores at step <3>" in [h.text() for h in card.all("h4")]
    header, *rows = table_rows(drawn)
    assert header == want["columns"] and len(rows) == len(want["rows"])
    for got, row in zip(rows, want["rows"], strict=True):
        assert got[0] == row[0]  # escaped in the page, read back as written
        assert float(got[1]) == pytest.approx(row[1], rel=1e-5) and int(got[2]) == row[2]
        assert got[3] == "—"
    text = card.text()
    assert "result.tables[1] is not a table: row 0 has 2 values for 1 columns" in text
    assert "result.tables[2] is not a table: a str" in text


def _one_table_unwrapped(config: TablesConfig, output_path: str) -> dict:
    os.makedirs(output_path, exist_ok=True)
    return {"tables": {"title": "t", "columns": ["a"], "rows": [[config.rows]]}}


def test_tables_that_are_not_a_list_are_named_not_dropped(tmp_path):
    handle = step("eval/unwrapped", _one_table_unwrapped, TablesConfig(rows=1))
    runner = StepRunner(prefix=str(tmp_path), quiet=True)
    assert runner.run([handle]).ok
    card = card_of(parse(Path(write_report(str(tmp_path))).read_text(encoding="utf-8")), handle.key)
    assert "result.tables is not a list of tables (got dict)" in card.text()


def test_report_to_another_folder_links_relative_to_it(prefix: Prefix, tmp_path):
    out = write_report(prefix.root, str(tmp_path / "elsewhere" / "r.html"))
    page = Path(out).read_text(encoding="utf-8")
    rel = os.path.relpath(prefix.runner.output_path(prefix.handles["fit1"]), tmp_path / "elsewhere")
    assert f'href="{rel}"' in page


def test_report_of_an_empty_prefix_says_so(tmp_path):
    page = render_report(str(tmp_path / "nothing"))
    assert "No steps under this prefix" in page and "No experiment records" in page


def _mem_step(config: WriteConfig, output_path: str) -> dict:
    import fsspec

    with fsspec.open(f"{output_path}/metrics.jsonl", "w") as f:
        f.write("".join(json.dumps({"step": s, "chars": len(config.text) * s}) + "\n" for s in range(3)))
    return {"chars": len(config.text)}


def test_report_on_a_memory_prefix():
    import fsspec

    root = "memory://report-test-memory"
    try:
        runner = StepRunner(prefix=root, quiet=True)
        runner.run([step("mem/one", _mem_step, WriteConfig("abc"))])
        out = write_report(root)
        with fsspec.open(out, "r") as f:
            doc = parse(f.read())
        assert out == f"{root}/report.html"
        (card,) = doc.all("section", "step")
        assert card.one("h3").text().startswith("mem/one")
        assert_points_close(
            chart_series(card.one("figure", "chart"))["chars"], [(0, 0), (1, 3), (2, 6)], "chars"
        )
    finally:
        fsspec.filesystem("memory").rm("/report-test-memory", recursive=True)


def test_report_command_line(prefix: Prefix, tmp_path):
    out = tmp_path / "cli.html"
    proc = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", "report", "--prefix", prefix.root, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    names = [s.one("h3").text() for s in parse(out.read_text()).all("section", "step")]
    assert sum(n.startswith("fit/curve") for n in names) == 2


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
def test_report_loads_in_headless_chromium_without_console_errors(prefix: Prefix, tmp_path):
    out = write_report(prefix.root)
    # the scan can fail: a page with a script error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>throw new Error('report-boom')</script></body></html>")
    _, bad_console = _chromium(bad.as_uri(), tmp_path)
    assert any("report-boom" in ln for ln in bad_console)
    dom, console = _chromium("file://" + out, tmp_path)
    assert console == []
    tree = parse(dom)
    names = {s.one("h3").text().split(" ")[0] for s in tree.all("section", "step")}
    assert names == {html.unescape(h.name) for h in prefix.handles.values()}
    # the browser parsed the charts as SVG: each series still has its points
    figures = tree.all("figure", "chart")
    assert figures and all(chart_series(f) for f in figures)


def test_every_state_an_attempt_can_have_is_coloured_in_the_report() -> None:
    """A badge is white text on its state's colour: a state without a CSS rule is invisible (LOST was)."""
    from schooner.cluster.records import LOST_STATE, StepState
    from schooner.cluster.views._report import _CSS

    for state in [*StepState, LOST_STATE]:
        assert re.search(rf"\.{state}[,{{]", _CSS), f"no CSS rule for the badge of {state}"
