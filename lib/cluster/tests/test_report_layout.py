"""The report as a reader uses it: errors that stay inside the page, the reason that names the field, charts
whose labels fit and whose colours follow each series, samples, results before bookkeeping, and several runs
overlaid with a sortable table of their hyperparameters and results (issue 36).

Steps run for real (StepRunner, in-process); what the page shows is compared with the files they wrote. Where
headless Chromium is installed, the layout is measured in it (the page's width, every label's box, a click on
a table header).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from schooner.cluster import StepRunner, step
from schooner.cluster.views._report import render_report, write_report

# the page reader of test_report.py (tests are imported by path: --import-mode=importlib)
_spec = importlib.util.spec_from_file_location(
    "_report_page_reader", Path(__file__).with_name("test_report.py")
)
_reader = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _reader  # dataclasses look their module up
_spec.loader.exec_module(_reader)
CHROMIUM, Node, _chromium = _reader.CHROMIUM, _reader.Node, _reader._chromium
assert_points_close, card_of, chart_series = (
    _reader.assert_points_close,
    _reader.card_of,
    _reader.chart_series,
)
file_series, parse, table_rows = _reader.file_series, _reader.parse, _reader.table_rows

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)


@dataclass(frozen=True)
class RunConfig:
    lr: float
    steps: int = 8
    extra: bool = False
    """Also log a metric the other runs do not (a series present in some charts only)."""


@dataclass(frozen=True)
class FailConfig:
    text: str


LONG_TOKEN = "x" * 900
"""An error line with no place to break it: a path or a repr that long is not rare."""


def _run(config: RunConfig, output_path: str) -> dict:
    """Logs as the trainer does (`step`, `time` in Unix seconds, losses), and writes eval-style samples."""
    os.makedirs(output_path, exist_ok=True)
    with open(os.path.join(output_path, "metrics.jsonl"), "w") as f:
        for s in range(config.steps):
            row = {"step": 10 * s, "time": 1_765_000_000.0 + 2.5 * s, "train/loss": 3.0 / (1 + config.lr * s)}
            row["lr"] = config.lr * min(1.0, (s + 1) / 3)
            if config.extra:
                row["grad_norm"] = 0.5 + s
            f.write(json.dumps(row) + "\n")
    samples = [
        {"prompt": f"def add(a, b):  # <{i}>", "completion": f"    return a + b  # lr={config.lr} & {i}"}
        for i in range(3)
    ]
    with open(os.path.join(output_path, "samples.json"), "w") as f:
        json.dump(samples, f)
    return {"final_loss": 3.0 / (1 + config.lr * (config.steps - 1)), "score": round(config.lr * 2, 3)}


def _fails_long(config: FailConfig, output_path: str) -> None:
    raise ValueError(f"cannot read {config.text}")


def _fails_with_field(config: FailConfig, output_path: str) -> None:
    raise ValueError(
        "train: /runs/a holds a different run; 1 field differs:\n"
        f"  'batch_size' differs: the folder has batch_size=8, this run batch_size={config.text}\n"
        "use another output folder, or the run's own config"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout") / "prefix"
    h = {
        "a": step("runs/a", _run, RunConfig(lr=0.1)),
        "b": step("runs/b", _run, RunConfig(lr=0.3, extra=True)),
        "c": step("runs/c", _run, RunConfig(lr=0.2)),
        "long": step("broken/long", _fails_long, FailConfig(LONG_TOKEN)),
        "field": step("broken/field", _fails_with_field, FailConfig("16")),
    }
    runner = StepRunner(prefix=str(root), quiet=True)
    result = runner.run(list(h.values()), raise_on_failure=False)
    # a second version of runs/a that logs one more metric: it is in some of the overlaid charts only
    h["a2"] = step("runs/a", _run, RunConfig(lr=0.1, extra=True, steps=9))
    runner.run([h["a2"]])
    return str(root), runner, h, result


@pytest.fixture(scope="module")
def page(runs) -> str:
    root, *_ = runs
    return Path(write_report(root)).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------------------
# A failed step's error stays inside its cell; the reason keeps the line naming the field
# ----------------------------------------------------------------------------------------------------------
def _css_rules(page: str) -> dict[str, str]:
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    rules: dict[str, str] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        for sel in selectors.split(","):
            rules[sel.strip()] = rules.get(sel.strip(), "") + ";" + body
    return rules


def test_an_error_wraps_inside_its_table_cell(page: str):
    rules = _css_rules(page)
    # a <pre> or a summary inside a cell breaks its lines (anywhere, for a token with no spaces)
    for sel in ("td pre", "td summary"):
        assert sel in rules, f"no CSS rule for {sel!r}: a long error line widens the table past the page"
        assert "overflow-wrap:anywhere" in rules[sel].replace(" ", ""), rules[sel]
    assert "white-space:pre-wrap" in rules["td pre"].replace(" ", "")
    doc = parse(page)
    cells = [td for t in doc.all("table") for td in t.all("td") if LONG_TOKEN[:200] in td.text()]
    assert cells, "the long error is shown in a table"


def test_the_reason_keeps_the_line_naming_the_differing_field(runs, page: str):
    _root, _runner, h, result = runs
    outcome = result[h["field"]]
    assert "'batch_size' differs" in outcome.error_line()
    assert outcome.error_line().startswith("ValueError: train: /runs/a holds a different run")
    # the report shows the same where the error is not collapsed: the run's table and the step's card
    doc = parse(page)
    run = doc.all("section", "run")[-1]  # the first run (newest first)
    (row,) = [tr for tr in run.all("tr") if tr.all("td") and tr.all("td")[0].text() == "broken/field"]
    cell = row.all("td")[-1]
    assert not cell.all("details") and "ValueError" in cell.text() and "'batch_size' differs" in cell.text()
    card = card_of(doc, h["field"].key)
    shown = card.all("details", "error")[0]  # the card's error (its attempts table has it again)
    summary = shown.one("summary").text()
    assert "ValueError" in summary and "'batch_size' differs" in summary and "use another" in summary
    assert "Traceback" in shown.one("pre").text()


def test_the_reason_of_a_one_line_error_is_that_line(runs):
    _root, _runner, h, result = runs
    assert result[h["long"]].error_line() == f"ValueError: cannot read {LONG_TOKEN}"


# ----------------------------------------------------------------------------------------------------------
# Charts: wall-clock time is a stat, not a curve; labels fit; one colour per series on the whole page
# ----------------------------------------------------------------------------------------------------------
def test_wall_clock_time_is_a_stat_not_a_metric(runs, page: str):
    root, runner, h, _ = runs
    card = card_of(parse(page), h["b"].key)
    drawn = {label for f in card.all("figure", "chart") for label in chart_series(f)}
    assert "time" not in drawn and "train/loss" in drawn
    rows = {r[0] for r in table_rows(card.one("table", "metrics"))[1:]}
    assert "time" not in rows
    lines = Path(runner.output_path(h["b"]), "metrics.jsonl").read_text().splitlines()
    times = [json.loads(ln)["time"] for ln in lines]
    stat = card.one("p", "wall-clock").text()
    assert f"{times[-1] - times[0]:.1f} s" in stat and f"{len(times)} rows" in stat


def _text_box(text: Node) -> tuple[float, float, float, float]:
    """A generous box of an SVG label: 0.62 em per character at its font size (digits are ~0.55 em)."""
    size = float(text.attrs.get("font-size", 11))
    width = 0.62 * size * len(text.text())
    x, y = float(text.attrs["x"]), float(text.attrs["y"])
    anchor = text.attrs.get("text-anchor", "start")
    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
    return left, y - size, left + width, y + 0.25 * size


def test_tick_labels_fit_inside_the_chart(tmp_path):
    from schooner.cluster.views._svg import line_chart

    wide = [(float(s), 1_765_000_000.0 + 0.001234 * s) for s in range(0, 123_457, 1000)]
    small = [(float(s), 0.000123456 * (1 + s)) for s in range(0, 50)]
    for series in ([("big", wide)], [("small", small)]):
        svg = parse(line_chart(series, title="t")).one("svg")
        width, height = float(svg.attrs["width"]), float(svg.attrs["height"])
        for text in svg.all("text"):
            x0, y0, x1, y1 = _text_box(text)
            assert x0 >= 0 and x1 <= width and y0 >= 0 and y1 <= height, (
                f"label {text.text()!r} is clipped: box ({x0:.0f}, {y0:.0f})-({x1:.0f}, {y1:.0f}) in "
                f"{width:.0f}x{height:.0f}"
            )


def _colours(doc: Node) -> dict[str, set[str]]:
    """Label -> every colour it is drawn in on the page (lines, markers, legend swatches)."""
    seen: dict[str, set[str]] = {}
    for figure in doc.all("figure", "chart"):
        for g in figure.all("g", "series"):
            label = next(c for c in g.children if isinstance(c, Node) and c.tag == "title").text()
            seen.setdefault(label, set()).add(g.one("polyline").attrs["stroke"])
        for li in figure.all("li"):
            style = li.one("span", "swatch").attrs["style"]
            seen.setdefault(li.text(), set()).add(style.split("background:")[1].strip(" ;"))
    return seen


def test_a_series_has_one_colour_in_every_chart(page: str):
    doc = parse(page)
    colours = _colours(doc)
    assert len(colours) > 4
    assert {k: v for k, v in colours.items() if len(v) != 1} == {}
    for figure in doc.all("figure", "chart"):  # and series of one chart are told apart
        strokes = [g.one("polyline").attrs["stroke"] for g in figure.all("g", "series")]
        assert len(set(strokes)) == len(strokes)


# ----------------------------------------------------------------------------------------------------------
# Samples; results before bookkeeping
# ----------------------------------------------------------------------------------------------------------
def test_generated_samples_are_shown(runs, page: str):
    root, runner, h, _ = runs
    card = card_of(parse(page), h["c"].key)
    want = json.loads(Path(runner.output_path(h["c"]), "samples.json").read_text())
    header, *rows = table_rows(card.one("table", "samples"))
    assert header == ["#", "prompt", "completion"]
    assert [r[1:] for r in rows] == [[s["prompt"].strip(), s["completion"].strip()] for s in want]
    assert "    return a + b" in card.one("table", "samples").text()  # indentation kept


def _pos(page: str, pattern: str) -> int:
    m = re.search(pattern, page)
    assert m, pattern
    return m.start()


def test_results_come_before_the_bookkeeping(runs, page: str):
    _root, _runner, h, _ = runs
    # on the page: the first chart before any run's or step's record table
    assert _pos(page, '<figure class="chart"') < _pos(page, '<table class="kv"')
    # on a card: result, charts and samples before the record (function, key, files)
    card = re.search(rf'<section class="card step" id="step-{h["c"].key[:16]}">(.*?)</section>', page, re.S)
    body = card.group(1)
    for results in ('<table class="result"', '<figure class="chart"', '<table class="samples"'):
        assert _pos(body, results) < _pos(body, '<table class="kv"'), results


# ----------------------------------------------------------------------------------------------------------
# Several runs overlaid, with a sortable table of hyperparameters and results
# ----------------------------------------------------------------------------------------------------------
def test_several_runs_overlaid_with_a_table_of_their_hyperparameters(runs, tmp_path):
    root, runner, h, _ = runs
    out = write_report(root, str(tmp_path / "runs.html"), runs=["runs/a", "runs/b", "runs/c"])
    doc = parse(Path(out).read_text(encoding="utf-8"))
    section = doc.one("section", "runs")
    figures = {f.one("figcaption").text(): f for f in section.all("figure", "chart")}
    overlaid = chart_series(figures["train/loss"])
    assert len(overlaid) == 3
    for handle in (h["a2"], h["b"], h["c"]):  # runs/a: its latest version
        (label,) = [lb for lb in overlaid if handle.key[:8] in lb]
        assert_points_close(overlaid[label], file_series(runner.output_path(handle))["train/loss"], label)
    head, *rows = table_rows(section.one("table", "sortable"))
    assert head[:3] == ["run", "key", "state"]
    by_key = {r[1]: dict(zip(head, r, strict=True)) for r in rows}
    assert set(by_key) == {h[k].key[:8] for k in ("a2", "b", "c")}
    assert float(by_key[h["b"].key[:8]]["lr"]) == 0.3 and by_key[h["a2"].key[:8]]["steps"] == "9"
    assert float(by_key[h["c"].key[:8]]["score"]) == 0.4
    final = file_series(runner.output_path(h["b"]))["train/loss"][-1][1]
    assert float(by_key[h["b"].key[:8]]["train/loss"]) == pytest.approx(final, rel=1e-5)
    # cells carry the value to sort on; the script is inline (the page works offline)
    cells = section.one("table", "sortable").all("td")
    assert all("data-sort" in td.attrs for td in cells)
    scripts = doc.all("script")
    assert scripts and all("src" not in s.attrs for s in scripts)


def test_report_and_compare_command_lines_write_the_runs_page(runs, tmp_path):
    root, _runner, h, _ = runs
    for args, out in (
        (["report", "runs/b", "runs/c", "--prefix", root, "--out"], tmp_path / "r.html"),
        (["compare", "runs/b", "runs/c", "--prefix", root, "--html"], tmp_path / "c.html"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "schooner.cluster.cli", *args, str(out)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        section = parse(out.read_text(encoding="utf-8")).one("section", "runs")
        assert {r[1] for r in table_rows(section.one("table", "sortable"))[1:]} == {
            h["b"].key[:8],
            h["c"].key[:8],
        }


def test_an_unknown_run_is_named_with_the_steps_that_exist(runs, tmp_path):
    from schooner.cluster.runner._version import ConfigError

    root, *_ = runs
    with pytest.raises(ConfigError, match=r"no step named 'runs/zz'.*runs/a"):
        render_report(root, runs=["runs/a", "runs/zz"])


# ----------------------------------------------------------------------------------------------------------
# In a browser
# ----------------------------------------------------------------------------------------------------------
_MEASURE = """<script>
(function(){
  var out = {pageWidth: document.documentElement.scrollWidth, viewWidth: document.documentElement.clientWidth,
             clipped: []};
  document.querySelectorAll('svg.chart').forEach(function(svg){
    var w = svg.viewBox.baseVal.width, h = svg.viewBox.baseVal.height;
    svg.querySelectorAll('text').forEach(function(t){
      var b = t.getBBox();
      if (b.x < 0 || b.y < 0 || b.x + b.width > w + 0.5 || b.y + b.height > h + 0.5)
        out.clipped.push(t.textContent + ' ' + [b.x, b.y, b.width, b.height].join(','));
    });
  });
  var th = Array.prototype.find.call(document.querySelectorAll('table.sortable th'),
                                     function(x){ return x.textContent.trim() === 'lr'; });
  if (th) { th.click(); out.ascending = rows(); th.click(); out.descending = rows(); }
  function rows(){ return Array.prototype.map.call(document.querySelectorAll('table.sortable tr'),
      function(tr){ var c = tr.querySelectorAll('td'); return c.length ? c[1].textContent : null; })
      .filter(function(x){ return x; }); }
  var pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body>"""


@needs_chromium
def test_in_chromium_the_page_fits_labels_fit_and_the_table_sorts(runs, tmp_path):
    root, _runner, h, _ = runs
    out = Path(write_report(root, str(tmp_path / "m.html"), runs=["runs/a", "runs/b", "runs/c"]))
    measured = tmp_path / "measured.html"
    measured.write_text(out.read_text(encoding="utf-8").replace("</body>", _MEASURE), encoding="utf-8")
    dom, console = _chromium(measured.as_uri() + "", tmp_path)
    assert console == []
    got = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    assert got["pageWidth"] <= got["viewWidth"], (
        f"the page is {got['pageWidth']} px wide in {got['viewWidth']}"
    )
    assert got["clipped"] == []
    by_lr = [h[k].key[:8] for k in ("a2", "c", "b")]  # lr 0.1, 0.2, 0.3
    assert got["ascending"] == by_lr and got["descending"] == by_lr[::-1]
