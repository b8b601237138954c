"""The Delphi suite (experiments/scaling/delphi_suite.py): its data collection and task on small folders,
and (slow) the whole wiring at tiny budgets: sweep, fits, registered forecasts, held-out seeds, scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments.scaling.cloze import ClozeConfig, build_cloze
from experiments.scaling.site_packages import (
    SitePackagesConfig,
    collect_site_packages,
    current_installed,
    held_out_files,
    installed_digest,
    installed_distributions,
)


def _tree(root) -> None:
    (root / "pkg_a").mkdir()
    (root / "pkg_b" / "__pycache__").mkdir(parents=True)
    (root / "pkg_a" / "mod.py").write_text("def f(x):\n    return x + 1\n" * 20)
    (root / "pkg_b" / "copy.py").write_text("def f(x):\n    return x + 1\n" * 20)  # a vendored duplicate
    (root / "pkg_b" / "README.md").write_text("# B\n\nA package that does things.\n" * 10)
    (root / "pkg_b" / "empty.py").write_text("\n\n")
    (root / "pkg_b" / "data.bin").write_bytes(b"\x00\x01")  # not an extension collected
    (root / "pkg_b" / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))  # not UTF-8
    (root / "pkg_b" / "__pycache__" / "x.py").write_text("ignored = True\n")
    (root / "pkg_b" / "big.py").write_text("x = 1\n" * 400)


def test_collect_site_packages_dedups_skips_and_counts(tmp_path) -> None:
    _tree(tmp_path)
    records, report = collect_site_packages(SitePackagesConfig(max_file_bytes=1000), str(tmp_path))
    ids = sorted(r["id"] for r in records)
    # one of the two identical files (the first in sorted order), the README; not the empty, latin-1, big,
    # binary or __pycache__ files
    assert ids == ["pkg_a/mod.py", "pkg_b/README.md"]
    assert report["skipped"] == {
        "installer_metadata": 0,
        "too_large": 1,
        "not_utf8": 1,
        "empty": 1,
        "duplicate": 1,
    }
    assert report["records"] == 2 and report["bytes"] == sum(len(r["text"].encode()) for r in records)
    assert all(
        r["source"] == "site-packages" and r["metadata"]["package"] in ("pkg_a", "pkg_b") for r in records
    )
    again, _ = collect_site_packages(SitePackagesConfig(max_file_bytes=1000), str(tmp_path))
    assert again == records  # deterministic


def test_the_byte_cut_and_the_held_out_files_split_the_collection(tmp_path) -> None:
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"value_{i} = {i}\n" * (i + 3))
    every, _ = collect_site_packages(SitePackagesConfig(), str(tmp_path))
    cut = sum(len(r["text"].encode()) for r in every[:5])
    config = SitePackagesConfig(max_bytes=cut)
    train, report = collect_site_packages(config, str(tmp_path))
    rest = held_out_files(config, str(tmp_path))
    assert train == every[:5] and rest == every[5:] and report["beyond_max_bytes"] == 7
    assert not {r["id"] for r in train} & {r["id"] for r in rest}


def _dist(root, name: str, version: str, *, editable: bool = False) -> None:
    """An installed distribution's metadata folder, as an installer writes it."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{name}-cli = {name}.cli:main\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    if editable:  # what uv and pip write for `pip install -e` / a workspace member
        (info / "direct_url.json").write_text('{"url": "file:///src", "dir_info": {"editable": true}}')


def test_a_version_bump_of_the_project_s_own_package_leaves_the_corpus_unchanged(tmp_path) -> None:
    # Found 2026-12-07: schooner-eval 0.1.1 -> 0.2.0 renamed its dist-info folder, which moved its
    # entry_points.txt in the path-hash order; a rebuilt corpus kept 9,715 files instead of 9,714 under the same
    # step key, and every sweep run trained on a shifted token stream. Installer metadata is not collected.
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"value_{i} = {i}\n" * (i + 3))
    _dist(tmp_path, "ourpkg", "0.1.1", editable=True)
    _dist(tmp_path, "theirpkg", "2.0", editable=False)
    config = SitePackagesConfig()
    before, report = collect_site_packages(config, str(tmp_path))
    (tmp_path / "ourpkg-0.1.1.dist-info").rename(tmp_path / "ourpkg-0.2.0.dist-info")
    after, _ = collect_site_packages(config, str(tmp_path))
    assert after == before
    assert len(before) == 12 and not [r["id"] for r in before if ".dist-info" in r["id"]]
    assert report["skipped"]["installer_metadata"] == 4  # entry_points.txt, top_level.txt x 2


def test_the_corpus_key_follows_the_installed_distributions_not_the_project_s_own(tmp_path) -> None:
    _dist(tmp_path, "ourpkg", "0.1.1", editable=True)
    _dist(tmp_path, "theirpkg", "2.0")
    first = installed_distributions(str(tmp_path))
    assert first == ["theirpkg==2.0"]  # an editable install's files are not in site-packages
    (tmp_path / "ourpkg-0.1.1.dist-info").rename(tmp_path / "ourpkg-0.2.0.dist-info")
    assert installed_distributions(str(tmp_path)) == first
    (tmp_path / "theirpkg-2.0.dist-info").rename(tmp_path / "theirpkg-2.1.dist-info")
    (tmp_path / "theirpkg-2.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: theirpkg\nVersion: 2.1\n"
    )
    assert installed_distributions(str(tmp_path)) == ["theirpkg==2.1"]
    # the step's config (its key) carries a digest of them, so an upgraded dependency is a new step
    a = SitePackagesConfig(installed=installed_digest(["theirpkg==2.0"]))
    b = SitePackagesConfig(installed=installed_digest(["theirpkg==2.1"]))
    assert a != b and len(a.installed) == 16
    assert SitePackagesConfig().installed == installed_digest(installed_distributions())


def test_a_data_step_refuses_to_build_from_other_installed_distributions(tmp_path) -> None:
    # A prefix packed here and used on a lent machine names this machine's distributions in its keys; a step
    # missing from the pack must not be built there from that machine's site-packages under this key.
    from experiments.scaling.cloze import _write as write_cloze
    from experiments.scaling.site_packages import _write as write_corpus

    other = "0123456789abcdef"
    assert current_installed() != other
    with pytest.raises(
        ValueError,
        match=f"names the installed-distributions digest '{other}'.*this interpreter's is.*unset SCHOONER_DELPHI_INSTALLED",
    ):
        write_corpus(SitePackagesConfig(max_bytes=1000, installed=other), str(tmp_path / "corpus"))
    with pytest.raises(ValueError, match="the cloze task: the step's config names"):
        write_cloze(ClozeConfig(skip_bytes=1000, documents=2, installed=other), str(tmp_path / "cloze"))
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "cloze").exists()


def test_the_suite_s_data_steps_take_the_packed_digest_from_the_environment() -> None:
    code = (
        "from experiments.scaling import delphi_data as d\n"
        "print(d.corpus.config.installed, d.cloze.config.installed)"
    )
    env = {**os.environ, "SCHOONER_DELPHI_INSTALLED": "0123456789abcdef"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0123456789abcdef"] * 2
    env.pop("SCHOONER_DELPHI_INSTALLED")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [current_installed()] * 2


def test_build_cloze_rows_hold_the_true_next_line() -> None:
    files = [
        {
            "id": f"f{i}.py",
            "text": "\n".join(f"line number {i}-{j} of some python text here" for j in range(30)),
        }
        for i in range(40)
    ]
    cfg = ClozeConfig(skip_bytes=0, documents=10, seed=3)
    rows = build_cloze(files, cfg)
    assert rows == build_cloze(files, cfg) and len(rows) == 10
    by_id = {f["id"]: f["text"].split("\n") for f in files}
    for r in rows:
        (context,) = r["contexts"]
        assert len(r["continuations"]) == 4 and len(set(r["continuations"])) == 4
        answer = r["continuations"][r["gold"]]
        lines = by_id[r["source"]]
        i = lines.index(answer)
        assert ("\n".join(lines[:i]) + "\n").endswith(context) and len(context) <= cfg.context_chars
    with pytest.raises(ValueError, match="held-out files have usable lines"):
        build_cloze(files[:5], cfg)


@pytest.fixture
def fresh_suite(monkeypatch):
    """`fresh_suite(VARIABLE=value, ...)`: experiments.scaling.delphi_suite imported afresh with those environment
    variables set (None: unset); later importers get the defaults again."""
    import importlib

    def load(**env: str | None):
        for variable, value in env.items():
            if value is None:
                monkeypatch.delenv(variable, raising=False)
            else:
                monkeypatch.setenv(variable, value)
        sys.modules.pop("experiments.scaling.delphi_suite", None)
        return importlib.import_module("experiments.scaling.delphi_suite")

    yield load
    sys.modules.pop("experiments.scaling.delphi_suite", None)


def test_checkpoint_every_reaches_the_runs_and_leaves_their_keys(monkeypatch, fresh_suite) -> None:
    """SCHOONER_DELPHI_CHECKPOINT_EVERY (run.sh: 1000, so a call cut off on a lent machine resumes) is
    runtime-only: the runs checkpoint at it, and their keys (the cached steps) stay the same."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11")
    handles = {
        every: fresh_suite(SCHOONER_DELPHI_CHECKPOINT_EVERY=every).runs[0].train for every in ("0", "1000")
    }
    assert handles["0"].config.checkpoint.every is None  # only at the end
    assert handles["1000"].config.checkpoint.every == 1000
    assert handles["0"].key == handles["1000"].key


def test_sweep_seeds_add_runs_beside_seed_0_s_and_a_bad_count_is_refused(monkeypatch, fresh_suite) -> None:
    """SCHOONER_DELPHI_SWEEP_SEEDS=2 adds a seed-1 run per sweep point; seed 0's runs keep their keys (unset or 1:
    the sweep as it always was)."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11")
    one, two = fresh_suite(SCHOONER_DELPHI_SWEEP_SEEDS="1"), fresh_suite(SCHOONER_DELPHI_SWEEP_SEEDS="2")
    assert len(two.runs) == 2 * len(one.runs)
    assert [r.train.key for r in two.runs if r.train.config.seed == 0] == [r.train.key for r in one.runs]
    assert {r.train.config.seed for r in two.runs} == {0, 1}
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="SCHOONER_DELPHI_SWEEP_SEEDS"):
            fresh_suite(SCHOONER_DELPHI_SWEEP_SEEDS=bad)


def test_train_held_out_picks_registered_multiples_and_refuses_others(monkeypatch, fresh_suite) -> None:
    """SCHOONER_DELPHI_TRAIN_HELD_OUT trains some registered multiples now (the CPU suite's 30x runs take hours);
    a multiple that is not registered (not in SCHOONER_DELPHI_HELD_OUT) is refused by name."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11")
    monkeypatch.setenv("SCHOONER_DELPHI_HELD_OUT", "10,30")
    assert fresh_suite(SCHOONER_DELPHI_TRAIN_HELD_OUT=None).TRAIN_HELD_OUT == (10, 30)
    assert fresh_suite(SCHOONER_DELPHI_TRAIN_HELD_OUT="10").TRAIN_HELD_OUT == (10,)
    with pytest.raises(ValueError, match=r"SCHOONER_DELPHI_TRAIN_HELD_OUT='3'.*HELD_OUT=10,30"):
        fresh_suite(SCHOONER_DELPHI_TRAIN_HELD_OUT="3")


@pytest.mark.slow
@pytest.mark.timeout(7200)  # about an hour on a busy 2-core machine (pyproject's default of 600 s stopped it)
def test_the_suite_wiring_at_tiny_budgets(tmp_path) -> None:
    """The whole suite at the smallest budgets whose isoFLOP runs bracket a minimum with this family (3e10 to
    1.2e11 FLOPs; below them the optimum lies under the smallest member, width 8, and the Delphi fit drops
    the budget): every step runs, each forecast is written before its held-out runs start, and every seed is
    scored. About an hour on a busy 2-core machine."""
    # One CPU device, as a user's run has: the suite's smallest runs take 4 sequences a step, which the 8 fake
    # devices the root conftest gives the test process cannot split
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env = {
        **os.environ,
        "XLA_FLAGS": flags,
        "SCHOONER_PREFIX": str(tmp_path),
        "SCHOONER_DELPHI_BUDGETS": "3e10,6e10,1.2e11",
        "SCHOONER_DELPHI_HELD_OUT": "2",
        "SCHOONER_DELPHI_SEEDS": "2",
        "SCHOONER_DELPHI_TRAIN_BYTES": "10e6",
        "SCHOONER_DELPHI_DOCS": "20",
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "experiments/scaling/delphi_suite.py", "--max-concurrent", "2"]
    # the loss forecasts alone first (SCHOONER_DELPHI_DOWNSTREAM=0: no cloze scores, as a lent machine's records
    # allow): it printed the downstream step it had not run and failed (a KeyError) after registering them
    out = subprocess.run(
        command, cwd=root, env={**env, "SCHOONER_DELPHI_PHASE": "forecast", "SCHOONER_DELPHI_DOWNSTREAM": "0"},
        capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(list((tmp_path / "scaling").glob("delphi-forecast-2x-*"))) == 1
    assert not list((tmp_path / "scaling").glob("delphi-downstream-[0-9a-f]*"))
    # the noise test's forecast phase registers its forecast and trains no held-out run (it trained them)
    noise = subprocess.run(
        [sys.executable, "experiments/scaling/delphi_noise.py"], cwd=root,
        env={**env, "SCHOONER_DELPHI_PHASE": "forecast", "SCHOONER_DELPHI_NOISE_SEEDS": "3e10:1,6e10:1,1.2e11:1"},
        capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert noise.returncode == 0, noise.stderr[-4000:]
    assert len(list((tmp_path / "scaling").glob("delphi-noise-forecast-2x-*"))) == 1
    assert not (tmp_path / "scaling" / "delphi-heldout").exists()
    # the forecast phase registers the forecasts and stops: no held-out run is declared yet
    out = subprocess.run(
        command, cwd=root, env={**env, "SCHOONER_DELPHI_PHASE": "forecast"}, capture_output=True, text=True,
        timeout=3000,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(list((tmp_path / "scaling").glob("delphi-forecast-2x-*"))) == 1
    (registered,) = (tmp_path / "scaling").glob("delphi-downstream-[0-9a-f]*")  # the downstream forecasts too
    assert (registered / "downstream.json").exists()
    assert not (tmp_path / "scaling" / "delphi-heldout").exists()
    out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, out.stderr[-4000:]
    scores = list((tmp_path / "scaling").glob("delphi-forecast-2x-score-s*"))
    assert len(scores) == 2
    for s in scores:
        result = json.loads((s / "score.json").read_text())
        assert result["method"] == "delphi" and result["registered_before_run"] is True
        assert result["matches_target"] is True and result["same_data"] is True
    (down,) = (tmp_path / "scaling").glob("delphi-downstream-score-*")
    rows = json.loads((down / "score.json").read_text())
    assert len(rows) == 2 and all(r["registered_before_run"] for r in rows)


@pytest.mark.parametrize("variable", ["SCHOONER_DELPHI_TRAIN_HELD_OUT", "SCHOONER_DELPHI_HELD_OUT"])
@pytest.mark.parametrize("bad", ["10,x", "10,", "0"])
def test_a_held_out_multiple_that_is_not_a_positive_integer_is_refused_by_name(
    monkeypatch, fresh_suite, variable, bad
) -> None:
    """`int()`'s own message ("invalid literal for int() with base 10: 'x'") named neither variable nor value."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e11")
    monkeypatch.setenv("SCHOONER_DELPHI_HELD_OUT", "10,30")
    with pytest.raises(ValueError, match=rf"{variable}='{bad}'.*positive integers.*e\.g\. 10,30"):
        fresh_suite(**{variable: bad})


def test_spread_narrows_the_grid_keeps_shared_runs_and_refuses_a_bad_value(monkeypatch, fresh_suite) -> None:
    """SCHOONER_DELPHI_SPREAD=1.3: each budget's sizes closer together (the runs both grids share keep their
    keys); unset, the grid and every key as before; not a number > 1, refused by name."""
    monkeypatch.setenv("SCHOONER_DELPHI_BUDGETS", "1e12")
    wide, default, narrow = (fresh_suite(SCHOONER_DELPHI_SPREAD=v) for v in (None, "1.7", "1.3"))
    assert [r.train.key for r in wide.runs] == [r.train.key for r in default.runs]
    span = {
        m: max(r.recipe.tokens for r in m.runs) / min(r.recipe.tokens for r in m.runs) for m in (wide, narrow)
    }
    assert span[narrow] < span[wide] / 2, span
    shared = {r.train.name for r in wide.runs} & {r.train.name for r in narrow.runs}
    assert shared  # the widths near the prior optimum are in both grids, as the same steps
    keys = {r.train.name: r.train.key for r in wide.runs}
    assert all(keys[r.train.name] == r.train.key for r in narrow.runs if r.train.name in shared)
    for bad in ("1", "0.5", "wide", "nan"):
        with pytest.raises(ValueError, match="SCHOONER_DELPHI_SPREAD"):
            fresh_suite(SCHOONER_DELPHI_SPREAD=bad)
