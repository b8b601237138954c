"""Releases, publishing and the compatibility matrix end to end, for real, in a throwaway clone: real git,
`uv build`, `uv publish` to a local pypiserver, fresh venvs outside the workspace, the packages' own tests
against the built wheels. Slow (minutes each; the release runs schooner-data's whole test suite)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.testing import PackageIndex, clone, commit, env, git, tool  # noqa: E402
from tools.wheeltest import installed_sources, lock_constraints, site_packages  # noqa: E402
from tools.workspace import get_package  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("release-e2e")]

DATE = "2026-12-24"

MODEL_PROBE = """
import jax
import jax.numpy as jnp

import schooner.model as sm

cfg = sm.LlamaConfig(
    vocab_size=97, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2,
    max_seq_len=64, compute_dtype="float32",
)
model = sm.init(cfg, key=jax.random.PRNGKey(0))
tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, cfg.vocab_size)
logits = model(tokens)
assert logits.shape == (2, 16, cfg.vocab_size), logits.shape
assert bool(jnp.isfinite(logits).all())
print("forward pass ok:", tuple(logits.shape), "from", sm.__file__)
"""

DATA_PROBE = """
import sys

from schooner.cluster import LocalClient
from schooner.data import Dataset, list_shards, make_record, read_records

records = [make_record(f"record {i} " + "x" * i, source="probe") for i in range(20)]
want = sorted(r["id"] for r in records if len(r["text"]) > 15)
client = LocalClient(max_workers=2)
try:
    Dataset.from_records(records, num_shards=2).filter(lambda r: len(r["text"]) > 15).write_jsonl(
        sys.argv[1], client=client
    )
finally:
    client.shutdown()
got = sorted(r["id"] for shard in list_shards(sys.argv[1]) for r in read_records(shard))
assert got == want, (got, want)
print("data pipeline ok:", len(got), "records in", len(list_shards(sys.argv[1])), "shards")
"""


def _version(repo: Path, lib: str) -> Version:
    return Version(re.search(r'^version = "(.*)"', (repo / lib / "pyproject.toml").read_text(), re.M)[1])


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Version, Version, str]:
    """A clone in which `python -m tools.release schooner-data minor --update-ranges` ran: (clone, old version,
    new version, what the tool printed)."""
    repo = clone(tmp_path_factory.mktemp("released") / "repo")
    # Set up: the ranges of tokenize, eval and the root project on data must not admit the next minor version,
    # so --update-ranges has work.
    old = _version(repo, "lib/data")
    below = f">={old.major}.{old.minor},<0.{old.minor + 1}"
    for rel in ("lib/tokenize/pyproject.toml", "lib/eval/pyproject.toml", "pyproject.toml"):
        text = (repo / rel).read_text()
        (repo / rel).write_text(
            re.sub(r'"schooner-data(\[[^\]]*\])?[^";]*"', rf'"schooner-data\1{below}"', text)
        )
    commit(repo, "ranges on data below its next minor version")
    proc = tool(repo, "release", "schooner-data", "minor", "--update-ranges", "--date", DATE)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return repo, old, Version(f"{old.major}.{old.minor + 1}.0"), proc.stdout


def test_release_end_to_end(released: tuple[Path, Version, Version, str]) -> None:
    repo, old, new, out = released
    tag = f"schooner-data-v{new}"
    assert git(repo, "status", "--porcelain") == "", "the release left the tree dirty"
    assert git(repo, "log", "-1", "--format=%s").strip() == f"release: schooner-data {new}"
    assert git(repo, "rev-parse", f"{tag}^{{commit}}") == git(repo, "rev-parse", "HEAD")
    changed = set(git(repo, "show", "--name-only", "--format=", "HEAD").split())
    assert changed == {
        "lib/data/pyproject.toml",
        "lib/data/CHANGELOG.md",
        "lib/tokenize/pyproject.toml",
        "lib/tokenize/CHANGELOG.md",
        "lib/eval/pyproject.toml",  # eval reads records and the embedded corpus through schooner-data
        "lib/eval/CHANGELOG.md",
        "pyproject.toml",
        "uv.lock",
    }
    assert _version(repo, "lib/data") == new
    log = (repo / "lib/data/CHANGELOG.md").read_text()
    assert re.search(rf"^## Unreleased\n\n## {re.escape(str(new))} — {DATE}\n", log, re.M)
    tok = (repo / "lib/tokenize/pyproject.toml").read_text()
    widened = f"schooner-data>={old.major}.{old.minor},<0.{new.minor + 1}"
    assert f'"{widened}"' in tok
    assert f"Admits schooner-data {new}: `{widened}`" in (repo / "lib/tokenize/CHANGELOG.md").read_text()
    assert re.search(
        r'name = "schooner-data"\nversion = "' + re.escape(str(new)) + '"', (repo / "uv.lock").read_text()
    )
    wheel = repo / "dist" / f"schooner_data-{new}-py3-none-any.whl"
    assert wheel.is_file() and (repo / "dist" / f"schooner_data-{new}.tar.gz").is_file()
    # The tests ran against the wheel, in a venv outside the workspace, and passed.
    assert re.search(r"release: tests against the wheel: \d+ passed", out)
    assert f"schooner-data[curation,hf,ray] @ file://{wheel}" in out
    assert " failed" not in out.split("release: tests against the wheel")[1].splitlines()[0]
    # The workspace is consistent after it: ranges admit, the lock matches.
    proc = subprocess.run(["uv", "lock", "--check"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, ".ci/guards.py", "ranges"], cwd=repo, capture_output=True, text=True
    )
    assert "0 problems" in proc.stdout, proc.stdout


def test_release_refuses_a_failing_test(tmp_path: Path) -> None:
    repo = clone(tmp_path / "repo")
    (repo / "lib/model/tests/test_release_canary.py").write_text(
        "def test_release_canary():\n    assert 1 + 1 == 3\n"
    )
    commit(repo, "a failing test")
    before = (git(repo, "rev-parse", "HEAD"), git(repo, "tag", "--list"))
    old = (repo / "lib/model/pyproject.toml").read_text(), (repo / "lib/model/CHANGELOG.md").read_text()
    proc = tool(repo, "release", "schooner-model", "patch", "--pytest-args", "-q -k release_canary")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "release refused: schooner-model's tests failed against the built wheel (1 failed" in proc.stdout
    assert "nothing was committed" in proc.stdout
    assert (git(repo, "rev-parse", "HEAD"), git(repo, "tag", "--list")) == before
    assert git(repo, "status", "--porcelain") == ""
    assert (
        (repo / "lib/model/pyproject.toml").read_text(),
        (repo / "lib/model/CHANGELOG.md").read_text(),
    ) == old


def test_first_release_of_the_changelog_version_with_narrowed_tests(tmp_path: Path) -> None:
    """schooner-model's pyproject.toml names a version never released (the one its changelog was written for):
    `patch` from the last dated release reaches it, and it is what gets released; `--pytest-args` naming one
    test file runs that file only against the wheel (a failing test elsewhere stays out); the wheel links the
    changelog, the sdist holds it."""
    repo = clone(tmp_path / "repo")
    current = _version(repo, "lib/model")
    assert not git(repo, "tag", "--list", f"schooner-model-v{current}").strip()
    assert not re.search(
        rf"^## {re.escape(str(current))} — \d{{4}}-", (repo / "lib/model/CHANGELOG.md").read_text(), re.M
    )
    (repo / "lib/model/tests/test_release_canary.py").write_text(
        "def test_release_canary():\n    assert 1 + 1 == 3\n"
    )
    commit(repo, "a failing test outside the file the release runs")
    proc = tool(
        repo, "release", "schooner-model", "patch", "--date", DATE,
        "--pytest-args", "lib/model/tests/test_config.py -q -p no:randomly",
    )  # fmt: skip
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert (
        f"release: schooner-model {current} (patch; the unreleased version pyproject.toml names)"
        in proc.stdout
    )
    assert git(repo, "log", "-1", "--format=%s").strip() == f"release: schooner-model {current}"
    assert git(repo, "rev-parse", f"schooner-model-v{current}^{{commit}}") == git(repo, "rev-parse", "HEAD")
    assert set(git(repo, "show", "--name-only", "--format=", "HEAD").split()) == {"lib/model/CHANGELOG.md"}
    assert _version(repo, "lib/model") == current
    log = (repo / "lib/model/CHANGELOG.md").read_text()
    assert re.search(rf"^## Unreleased\n\n## {re.escape(str(current))} — {DATE}\n", log, re.M)
    assert re.search(r"pytest -p no:cacheprovider tests/test_config.py -q -p no:randomly \(in ", proc.stdout)
    assert "test_release_canary" not in proc.stdout
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "lib/model/tests/test_config.py"],
        cwd=repo, capture_output=True, text=True, env=env(),
    ).stdout  # fmt: skip
    n_config = sum(
        1 for line in collected.splitlines() if line.startswith("lib/model/tests/test_config.py::")
    )
    assert n_config > 10, collected
    assert f"release: tests against the wheel: {n_config} passed" in proc.stdout
    wheel = repo / "dist" / f"schooner_model-{current}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"schooner_model-{current}.dist-info/METADATA").decode()
    assert "Project-URL: Changelog, " in meta and "/blob/main/lib/model/CHANGELOG.md" in meta
    with tarfile.open(repo / "dist" / f"schooner_model-{current}.tar.gz") as tar:
        shipped = tar.extractfile(f"schooner_model-{current}/CHANGELOG.md")
        assert shipped is not None and shipped.read().decode() == log


def _fresh_install(where: Path, index: PackageIndex, name: str, repo: Path) -> Path:
    """A venv outside the workspace with `name` installed from the local index: Schooner packages can come
    only from there (it is the first index, and uv's first-index strategy never looks further for a name
    it has); third-party packages come from the default registry, pinned to the lock."""
    subprocess.run(["uv", "venv", "-q", "--python", "3.11", str(where)], check=True, env=env())
    python = where / "bin" / "python"
    constraints = lock_constraints(get_package(name, repo), where.parent, repo)
    cmd = [
        "uv", "pip", "install", "-q", "--python", str(python), "--index", f"local={index.simple}",
        "--index-strategy", "first-index", "--constraints", str(constraints), name,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=where.parent, capture_output=True, text=True, env=env())
    assert proc.returncode == 0, proc.stderr
    return python


def _assert_installed_from(python: Path, wheels: list[Path]) -> None:
    """Exactly these Schooner distributions, each file byte-identical to the wheel built in the test."""
    installed = installed_sources(python)
    assert sorted(n for n in installed if n.startswith("schooner")) == sorted(
        w.name.split("-")[0].replace("_", "-") for w in wheels
    )
    site = site_packages(python)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.endswith("/") or member.endswith(".dist-info/RECORD"):
                    continue  # folders; RECORD, which the installer rewrites (adds INSTALLER, REQUESTED)
                assert (site / member).read_bytes() == z.read(member), f"{member} differs from {wheel.name}"


def _publish(repo: Path, index: PackageIndex, lib: str) -> Path:
    """Tag the package's current version (a release in all but the bump), build it into dist/ as the release
    would, publish it with tools.publish; returns the built wheel."""
    name = f"schooner-{lib}"
    version = _version(repo, f"lib/{lib}")
    if not git(repo, "tag", "--list", f"{name}-v{version}").strip():
        git(repo, "tag", f"{name}-v{version}")
    dist = repo / "dist"
    wheel = dist / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.is_file():
        subprocess.run(["uv", "build", "--package", name, "--out-dir", str(dist), "-q"], cwd=repo, check=True)
    proc = tool(
        repo, "publish", name, str(version), "--publish-url", index.url, "--username", "u", "--password", "p"
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert f"publish: {wheel.name} is byte-identical to the tested {wheel}" in proc.stdout
    assert (index.folder / wheel.name).read_bytes() == wheel.read_bytes()
    return wheel


def test_publish_model_and_install_it_alone(tmp_path: Path) -> None:
    repo = clone(tmp_path / "repo")
    with PackageIndex(tmp_path / "index") as index:
        wheel = _publish(repo, index, "model")
        python = _fresh_install(tmp_path / "venv", index, "schooner-model", repo)
        downloads = [line for line in index.log.read_text().splitlines() if "/packages/" in line]
    _assert_installed_from(python, [wheel])
    assert any(wheel.name in d for d in downloads), downloads
    probe = subprocess.run(
        [str(python), "-c", MODEL_PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**env(), "JAX_PLATFORMS": "cpu"},
    )
    assert probe.returncode == 0, probe.stderr
    assert (
        f"forward pass ok: (2, 16, 97) from {site_packages(python)}/schooner/model/__init__.py"
        in probe.stdout
    )
    for other in ("cluster", "data", "tokenize", "train", "eval"):
        gone = subprocess.run([str(python), "-c", f"import schooner.{other}"], capture_output=True, text=True)
        assert "ModuleNotFoundError" in gone.stderr, other


def test_publish_data_with_its_sibling(released: tuple[Path, Version, Version, str], tmp_path: Path) -> None:
    repo, _, new, _ = released  # schooner-data was released by tools.release; cluster is tagged here
    with PackageIndex(tmp_path / "index") as index:
        cluster = _publish(repo, index, "cluster")
        data = _publish(repo, index, "data")
        assert data.name == f"schooner_data-{new}-py3-none-any.whl"
        python = _fresh_install(tmp_path / "venv", index, "schooner-data", repo)
        downloads = [line for line in index.log.read_text().splitlines() if "/packages/" in line]
    _assert_installed_from(python, [cluster, data])
    assert any(cluster.name in d for d in downloads) and any(data.name in d for d in downloads), downloads
    out = tmp_path / "records"
    probe = subprocess.run(
        [str(python), "-c", DATA_PROBE, str(out)], cwd=tmp_path, capture_output=True, text=True, env=env()
    )
    assert probe.returncode == 0, probe.stderr
    assert "data pipeline ok: 13 records in 2 shards" in probe.stdout
    for other in ("tokenize", "model", "train", "eval"):
        gone = subprocess.run([str(python), "-c", f"import schooner.{other}"], capture_output=True, text=True)
        assert "ModuleNotFoundError" in gone.stderr, other
    assert json.loads((out / "manifest.json").read_text())["records"] == 13


def test_compat_fails_a_range_that_claims_too_much(tmp_path: Path) -> None:
    repo = clone(tmp_path / "repo")
    # Set up a history: cluster 0.5.0 (commit A), then release_probe() added with 0.5.1 (commit B); data's
    # tests use release_probe; data's range first admits 0.5.0 (too much), then only 0.5.1.
    cluster = repo / "lib/cluster/pyproject.toml"
    text = cluster.read_text()
    cluster.write_text(re.sub(r'^version = ".*"', 'version = "0.5.0"', text, count=1, flags=re.M))
    commit(repo, "cluster 0.5.0")
    a = git(repo, "rev-parse", "HEAD").strip()
    init = repo / "lib/cluster/src/schooner/cluster/__init__.py"
    init.write_text(init.read_text() + "\n\ndef release_probe() -> int:\n    return 42\n")
    cluster.write_text(re.sub(r'^version = ".*"', 'version = "0.5.1"', text, count=1, flags=re.M))
    commit(repo, "cluster 0.5.1: release_probe")
    tests = repo / "lib/data/tests"
    for f in tests.glob("test_*.py"):
        f.unlink()
    (tests / "test_probe.py").write_text(
        "from schooner.cluster import release_probe\n\n\ndef test_probe():\n    assert release_probe() == 42\n"
    )
    data_text = (repo / "lib/data/pyproject.toml").read_text()

    def claim(spec: str) -> subprocess.CompletedProcess:
        """Commit data's range on cluster as `spec`, then run the compat guard for data."""
        data = repo / "lib/data/pyproject.toml"
        data.write_text(
            re.sub(r'"schooner-cluster(\[ray\])?[^"]*"', rf'"schooner-cluster\1{spec}"', data_text)
        )
        commit(repo, f"data: claims schooner-cluster{spec}")
        cmd = [sys.executable, ".ci/guards.py", "compat", "schooner-data"]
        proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env())
        print(proc.stdout, proc.stderr)
        return proc

    too_much = claim(">=0.5,<0.6")
    assert too_much.returncode == 1
    assert f"FAIL schooner-data against schooner-cluster 0.5.0 (set in {a[:10]})" in too_much.stdout
    assert "cannot import name 'release_probe'" in too_much.stdout
    right = claim(">=0.5.1,<0.6")
    assert right.returncode == 0
    assert "admit no sibling version older than the working tree" in right.stdout  # the exact guard's case
    # 0.5.1 is not released (no tag): what it holds is the tree, not the commit that first named it, so a
    # function added to it later serves data's tests too.
    init.write_text(init.read_text() + "\n\ndef release_probe_two() -> int:\n    return 43\n")
    commit(repo, "cluster: release_probe_two, still 0.5.1")
    (tests / "test_probe.py").write_text(
        "from schooner.cluster import release_probe_two\n\n\ndef test_probe():\n"
        "    assert release_probe_two() == 43\n"
    )
    later = claim(">=0.5,<0.6")  # 0.5.0 is still tested, and 0.5.1 is the tree: only 0.5.0 fails
    assert later.returncode == 1
    assert f"FAIL schooner-data against schooner-cluster 0.5.0 (set in {a[:10]})" in later.stdout
    assert "cannot import name 'release_probe_two'" in later.stdout


def test_pre_commit_runs_ruff_and_the_fast_guards(tmp_path: Path) -> None:
    repo = clone(tmp_path / "repo")
    # The hooks' `uv run --frozen` uses this test's environment as it is (no sync), not a new one per clone.
    hook_env = {**env(), "UV_PROJECT_ENVIRONMENT": sys.prefix, "UV_NO_SYNC": "1"}
    cmd = ["uv", "tool", "run", "--from", "pre-commit==4.7.0", "pre-commit", "run", "--all-files"]
    clean = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=hook_env)
    for hook in ("ruff check", "ruff format", "sibling ranges"):
        assert re.search(rf"^{re.escape(hook)}.*Passed$", clean.stdout, re.M), (hook, clean.stdout)
    # The workspace hook runs tests/test_workspace.py (its outcome is that of the tests at this commit).
    direct = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_workspace.py", "-q", "-p", "no:cacheprovider", "-k", "not heavy_imports"],
        cwd=repo, capture_output=True, text=True, env=hook_env,
    )  # fmt: skip
    outcome = "Passed" if direct.returncode == 0 else "Failed"
    assert re.search(rf"^workspace rules.*{outcome}$", clean.stdout, re.M), clean.stdout
    assert clean.returncode == direct.returncode
    # Set up three problems: an unused import, unformatted code, a range that excludes its sibling.
    (repo / "lib/model/src/schooner/model/style_probe.py").write_text("import os\nx=1\n")
    tok = repo / "lib/tokenize/pyproject.toml"
    tok.write_text(re.sub(r'"schooner-data[^"]*"', '"schooner-data>=9.0,<9.1"', tok.read_text()))
    git(repo, "add", "-A")
    dirty = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=hook_env)
    assert dirty.returncode == 1
    for hook in ("ruff check", "ruff format", "sibling ranges"):
        assert re.search(rf"^{re.escape(hook)}.*Failed$", dirty.stdout, re.M), (hook, dirty.stdout)
    assert "F401" in dirty.stdout and "'schooner-data>=9.0,<9.1' does not admit schooner-data" in dirty.stdout
