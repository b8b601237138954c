"""The browse page of a record folder: written outside the folder (a step's output is not changed by
looking at it), with samples drawn from every shard (not the first records of shard 0) and the bad input
skipped counted by reason."""

from __future__ import annotations

import os
import re

from schooner.data import SkipLog, write_records
from schooner.data.curation.browse import render_browse, write_browse


def _folder(tmp_path, shards: int = 5, per: int = 40) -> str:
    recs = [{"id": f"s{i // per}-r{i % per}", "text": f"text {i}", "source": "t", "metadata": {}}
            for i in range(shards * per)]  # fmt: skip
    skips = SkipLog()
    from schooner.data import DataError

    for kind, n in (("empty_body", 3), ("damaged_stream", 1)):
        for j in range(n):
            skips.add(DataError(f"crawl-{j}.warc.gz", f"record {j}: {kind}", kind=kind))
    folder = str(tmp_path / "data" / "pages-1234abcd")
    write_records(recs, folder, num_shards=shards)
    # the skips of the run that wrote the folder, in its manifest
    import json
    import pathlib

    manifest = pathlib.Path(folder, "manifest.json")
    m = json.loads(manifest.read_text())
    m["errors"] = skips.to_dict()
    manifest.write_text(json.dumps(m))
    return folder


def test_the_page_is_not_written_into_the_data_folder(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    before = sorted(os.listdir(folder))
    monkeypatch.chdir(tmp_path)
    out = write_browse(folder)
    assert sorted(os.listdir(folder)) == before
    assert not os.path.abspath(out).startswith(os.path.abspath(folder) + os.sep)
    assert os.path.basename(out) == "browse-pages-1234abcd.html" and os.path.exists(out)


def test_samples_come_from_every_shard_and_are_the_same_each_time(tmp_path):
    folder = _folder(tmp_path)
    page = render_browse(folder, sample=25)
    shown = re.findall(r"<h3>(s\d+-r\d+) ", page)
    assert len(shown) == 25
    assert {s.split("-")[0] for s in shown} == {f"s{i}" for i in range(5)}
    assert any(int(s.split("-r")[1]) >= 10 for s in shown)  # not only each shard's first records
    assert re.findall(r"<h3>(s\d+-r\d+) ", render_browse(folder, sample=25)) == shown


def test_skipped_bad_input_is_counted_by_reason(tmp_path):
    page = render_browse(_folder(tmp_path))
    assert "Skipped bad input, by reason" in page
    assert re.search(r"<td>empty_body</td><td>3</td>", page) and re.search(
        r"<td>damaged_stream</td><td>1</td>", page
    )
