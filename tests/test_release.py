"""The release tools' rules (tools/): versions, ranges, changelogs, and the release's refusals, run for real in
a throwaway clone of the repository (git, uv and the tools as a user runs them; the real tree is never
touched). The slow end-to-end runs (a whole release, publishing, the compatibility matrix) are in
test_release_e2e.py."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import changelog  # noqa: E402
from tools.compat import plan  # noqa: E402
from tools.release import next_version, prepare, widen  # noqa: E402
from tools.testing import clone, commit, git, tool  # noqa: E402
from tools.wheeltest import select_tests  # noqa: E402
from tools.workspace import ToolError, get_package  # noqa: E402


@pytest.mark.parametrize(
    ("current", "part", "expected"),
    [
        ("0.1.2", "patch", "0.1.3"),
        ("0.1.2", "minor", "0.2.0"),
        ("0.1.2", "major", "1.0.0"),
        ("1.4.2", "minor", "1.5.0"),
        ("1.4", "patch", "1.4.1"),
        ("0.1.2", "0.3.0", "0.3.0"),
    ],
)
def test_next_version(current: str, part: str, expected: str) -> None:
    assert next_version(Version(current), part) == Version(expected)


@pytest.mark.parametrize(("current", "part"), [("0.2.0", "0.1.9"), ("0.2.0", "0.2.0"), ("0.2.0rc1", "minor")])
def test_next_version_refuses(current: str, part: str) -> None:
    with pytest.raises(ToolError):
        next_version(Version(current), part)


@pytest.mark.parametrize(
    ("raw", "new", "expected"),
    [
        ("schooner-data[hf,curation]>=0.1,<0.2", "0.2.0", "schooner-data[hf,curation]>=0.1,<0.3"),
        ("schooner-data>=0.1.2,<0.2", "0.2.0", "schooner-data>=0.1.2,<0.3"),
        ("schooner-model>=1.2,<2", "2.0.0", "schooner-model>=1.2,<3"),
        ("schooner-model==0.1.2", "0.2.0", "schooner-model>=0.1.2,<0.3"),
        ("schooner-model>=0.1,!=0.1.5,<0.2", "0.2.0", "schooner-model>=0.1,<0.3,!=0.1.5"),
    ],
)
def test_widen_keeps_the_lower_bound_and_admits_the_new_version(raw: str, new: str, expected: str) -> None:
    assert widen(raw, Version(new)) == expected


LOG = """# Changelog — schooner-x

## Unreleased

- **Faster.** Two lines
  of text.
- Fixed a bug.

## 0.1.0 — 2026-11-29 (first landing on main)

- Created.
"""


def test_changelog_release_moves_unreleased_under_the_version() -> None:
    out = changelog.release(LOG, "0.2.0", "2026-12-24")
    assert out == (
        "# Changelog — schooner-x\n\n## Unreleased\n\n## 0.2.0 — 2026-12-24\n\n"
        "- **Faster.** Two lines\n  of text.\n- Fixed a bug.\n\n"
        "## 0.1.0 — 2026-11-29 (first landing on main)\n\n- Created.\n"
    )
    assert changelog.unreleased_text(out) == ""
    assert changelog.released_versions(out) == {"0.2.0", "0.1.0"}


def test_changelog_folds_sections_that_named_their_coming_version() -> None:
    text = "# C\n\n## Unreleased\n\n- new\n\n## 0.1.2 — unreleased\n\n- older\n\n## 0.1.1 — 2026-11-29\n\n- old\n"
    assert changelog.unreleased_text(text) == "- new\n- older"
    out = changelog.release(text, "0.2.0", "2026-12-24")
    assert out == (
        "# C\n\n## Unreleased\n\n## 0.2.0 — 2026-12-24\n\n- new\n\n"
        "### Listed as 0.1.2 before this release\n\n- older\n\n## 0.1.1 — 2026-11-29\n\n- old\n"
    )
    same = "# C\n\n## 0.2.0 — unreleased\n\n- a\n"
    assert (
        changelog.release(same, "0.2.0", "2026-12-24")
        == "# C\n\n## Unreleased\n\n## 0.2.0 — 2026-12-24\n\n- a\n\n"
    )


def test_changelog_with_nothing_unreleased_is_refused() -> None:
    empty = "# C\n\n## Unreleased\n\n## 0.1.0 — 2026-11-29\n\n- x\n"
    assert changelog.unreleased_text(empty) == ""
    with pytest.raises(ValueError, match="nothing under 'Unreleased'"):
        changelog.release(empty, "0.2.0", "2026-12-24")


def test_changelog_add_line() -> None:
    assert changelog.add_line(LOG, "Admits y 0.2.0.").startswith(
        "# Changelog — schooner-x\n\n## Unreleased\n\n- **Faster.** Two lines\n  of text.\n- Fixed a bug.\n"
        "- Admits y 0.2.0.\n\n## 0.1.0"
    )
    released = "# C\n\n## 0.1.0 — 2026-11-29\n\n- x\n"
    assert (
        changelog.add_line(released, "y") == "# C\n\n## Unreleased\n\n- y\n\n## 0.1.0 — 2026-11-29\n\n- x\n"
    )
    empty = "# C\n\n## Unreleased\n\n## 0.1.0 — 2026-11-29\n\n- x\n"
    assert changelog.add_line(empty, "y") == "# C\n\n## Unreleased\n\n- y\n\n## 0.1.0 — 2026-11-29\n\n- x\n"


# --- refusals, in a clone: each leaves the clone exactly as it was ---


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return clone(tmp_path / "repo")


def _state(repo: Path) -> tuple[str, str, str]:
    return git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"), git(repo, "tag", "--list")


def _refused(repo: Path, *args: str) -> str:
    before = _state(repo)
    proc = tool(repo, "release", *args)
    assert proc.returncode == 1, proc.stdout
    assert _state(repo) == before, "a refused release changed the repository"
    return proc.stdout


def test_refuses_a_dirty_tree(repo: Path) -> None:
    (repo / "lib/model/notes.txt").write_text("work in progress\n")
    out = _refused(repo, "schooner-model", "patch")
    assert "release refused: the working tree is not clean" in out
    assert "?? lib/model/notes.txt" in out


def test_refuses_an_empty_unreleased_section(repo: Path) -> None:
    log = repo / "lib/model/CHANGELOG.md"
    log.write_text("# Changelog — schooner-model\n\n## Unreleased\n\n## 0.1.2 — 2026-11-30\n\n- Released.\n")
    commit(repo, "model 0.1.2 released")
    out = _refused(repo, "schooner-model", "patch")
    assert "nothing to release: the 'Unreleased' section of lib/model/CHANGELOG.md is empty" in out


def test_refuses_a_version_that_has_a_tag(repo: Path) -> None:
    current = Version(
        re.search(r'^version = "(.*)"', (repo / "lib/model/pyproject.toml").read_text(), re.M)[1]
    )
    taken = f"{current.major}.{current.minor}.{current.micro + 1}"
    git(repo, "tag", f"schooner-model-v{current}")  # released: `patch` counts from it
    git(repo, "tag", f"schooner-model-v{taken}")
    out = _refused(repo, "schooner-model", "patch")
    assert f"tag schooner-model-v{taken} exists already" in out


def test_refuses_a_version_the_changelog_has_released(repo: Path) -> None:
    log = repo / "lib/model/CHANGELOG.md"
    log.write_text(
        "# Changelog — schooner-model\n\n## Unreleased\n\n- More.\n\n## 0.5.0 — 2026-11-30\n\n- Old.\n"
    )
    commit(repo, "a changelog that already released 0.5.0")
    out = _refused(repo, "schooner-model", "0.5.0")
    assert "lib/model/CHANGELOG.md already has a dated section for 0.5.0" in out


def test_refuses_a_version_outside_sibling_ranges_unless_asked(repo: Path) -> None:
    # Set up: tokenize and the root project pin schooner-data below 0.2; data has something to release.
    for rel in ("lib/tokenize/pyproject.toml", "pyproject.toml"):
        text = (repo / rel).read_text()
        (repo / rel).write_text(
            re.sub(r'"schooner-data(\[[^\]]*\])?[^";]*"', r'"schooner-data\1>=0.1,<0.2"', text)
        )
    log = repo / "lib/data/CHANGELOG.md"
    log.write_text(
        log.read_text().replace(
            "# Changelog — schooner-data\n", "# Changelog — schooner-data\n\n## Unreleased\n\n- x\n", 1
        )
    )
    commit(repo, "ranges below 0.2")
    out = _refused(repo, "schooner-data", "0.2.0")
    assert "schooner-data 0.2.0 is outside the range of siblings that depend on it" in out
    assert (
        "lib/tokenize/pyproject.toml (dependencies): 'schooner-data>=0.1,<0.2' -> 'schooner-data>=0.1,<0.3'"
        in out
    )
    assert "pyproject.toml (dependencies): 'schooner-data[hf,curation]>=0.1,<0.2' -> " in out
    assert "rerun with --update-ranges" in out


def test_compat_plan_takes_the_oldest_admitted_version_from_git(repo: Path) -> None:
    # Set up a history: cluster 0.5.0 (commit A), then 0.5.1 (commit B, tagged later); data's range decides.
    cluster = repo / "lib/cluster/pyproject.toml"
    data = repo / "lib/data/pyproject.toml"
    text = cluster.read_text()
    cluster.write_text(re.sub(r'^version = ".*"', 'version = "0.5.0"', text, count=1, flags=re.M))
    commit(repo, "cluster 0.5.0")
    a = git(repo, "rev-parse", "HEAD").strip()
    cluster.write_text(re.sub(r'^version = ".*"', 'version = "0.5.1"', text, count=1, flags=re.M))
    commit(repo, "cluster 0.5.1")
    b = git(repo, "rev-parse", "HEAD").strip()
    dtext = data.read_text()
    data.write_text(re.sub(r'"schooner-cluster(\[ray\])?[^"]*"', r'"schooner-cluster\1>=0.5,<0.6"', dtext))
    p = plan("schooner-data", repo)
    assert p is not None and list(p.direct) == ["schooner-cluster"]
    assert (p.direct["schooner-cluster"].version, p.direct["schooner-cluster"].ref) == (Version("0.5.0"), a)
    data.write_text(re.sub(r'"schooner-cluster(\[ray\])?[^"]*"', r'"schooner-cluster\1>=0.5.1,<0.6"', dtext))
    # 0.5.1 is the current version and not released: it is whatever the tree holds, not commit B.
    assert plan("schooner-data", repo).direct["schooner-cluster"].ref is None
    git(repo, "tag", "schooner-cluster-v0.5.1", b)  # once tagged, the tag is what 0.5.1 is
    assert plan("schooner-data", repo).direct["schooner-cluster"].ref == "schooner-cluster-v0.5.1"
    assert plan("schooner-model", repo) is None  # no sibling: nothing to vary


def test_contributing_links_resolve() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) >= 10, local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"CONTRIBUTING.md links to paths that do not exist: {missing}"


# --- the first release of a version: the one pyproject.toml and the changelog were written for ---


def _set_version(repo: Path, lib: str, version: str, log: str) -> None:
    path = repo / f"lib/{lib}/pyproject.toml"
    path.write_text(
        re.sub(r'^version = ".*"', f'version = "{version}"', path.read_text(), count=1, flags=re.M)
    )
    (repo / f"lib/{lib}/CHANGELOG.md").write_text(log)
    commit(repo, f"{lib} {version}, not released yet")


MODEL_LOG = """# Changelog — schooner-model

## Unreleased

- Newer.

## 0.2.0 — unreleased

- Written for 0.2.0.

## 0.1.1 — 2026-11-29 (landed on main)

- Old.
"""


def test_an_unreleased_version_is_released_as_itself(repo: Path) -> None:
    """pyproject.toml says 0.2.0, never released (no tag, no dated section); the last release is 0.1.1. The
    release is 0.2.0 (given, or `minor` from 0.1.1), not 0.2.1 / 0.3.0, which would skip it."""
    _set_version(repo, "model", "0.2.0", MODEL_LOG)
    assert prepare("schooner-model", "0.2.0", repo, True)[1] == Version("0.2.0")
    assert prepare("schooner-model", "minor", repo, True)[1] == Version("0.2.0")
    assert prepare("schooner-model", "major", repo, True)[1] == Version("1.0.0")
    assert prepare("schooner-model", "0.2.1", repo, True)[1] == Version("0.2.1")  # skipping it, knowingly
    out = _refused(repo, "schooner-model", "patch")  # 0.1.2 is below the version the changelog is for
    assert "a patch release after 0.1.1 (the last release) is 0.1.2, below 0.2.0" in out
    assert "release 0.2.0" in out
    out = _refused(repo, "schooner-model", "0.1.5")
    assert "at least 0.2.0, the unreleased version lib/model/pyproject.toml names" in out


def test_the_changelog_data_and_train_were_written_for(repo: Path) -> None:
    """As the tree stands: data says 0.2.0 (last dated 0.1.1; its defaults changed), train 0.2.0 (last dated
    0.1.0; one run config): `minor` releases each exactly; `patch` (data 0.1.2, train 0.1.1) is below what the
    tree names and refused."""
    data = get_package("schooner-data", repo)
    train = get_package("schooner-train", repo)
    assert prepare("schooner-data", "minor", repo, False)[1] == data.version == Version("0.2.0")
    assert prepare("schooner-train", "minor", repo, False)[1] == train.version == Version("0.2.0")
    assert "below 0.2.0" in _refused(repo, "schooner-data", "patch")
    assert "below 0.2.0" in _refused(repo, "schooner-train", "patch")


def test_a_first_ever_release_names_its_version(repo: Path) -> None:
    # eval has never been released; the tree names 0.2.0 (the root requires >=0.2)
    _set_version(repo, "eval", "0.2.0", "# Changelog — schooner-eval\n\n## 0.2.0 — unreleased\n\n- All.\n")
    assert prepare("schooner-eval", "0.2.0", repo, False)[1] == Version("0.2.0")
    out = _refused(repo, "schooner-eval", "patch")
    assert "schooner-eval has never been released" in out
    assert "give the version: 0.2.0" in out


def test_a_released_version_bumps_from_itself(repo: Path) -> None:
    _set_version(repo, "model", "0.2.0", MODEL_LOG)
    git(repo, "tag", "schooner-model-v0.2.0")
    assert prepare("schooner-model", "patch", repo, True)[1] == Version("0.2.1")
    out = _refused(repo, "schooner-model", "0.2.0")
    assert "the new version must be above the current one: got 0.2.0, current is 0.2.0" in out


# --- --pytest-args: test files and node ids, as given from the repository, the package or its tests ---


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["-q"], ["tests", "-q"]),
        (["-n", "2", "-k", "not slow", "-p", "no:randomly"], ["tests", "-n", "2", "-k", "not slow", "-p", "no:randomly"]),
        (["lib/model/tests/test_config.py", "-q"], ["tests/test_config.py", "-q"]),
        (["tests/test_config.py::test_x", "-x"], ["tests/test_config.py::test_x", "-x"]),
        (["test_config.py", "test_loss.py"], ["tests/test_config.py", "tests/test_loss.py"]),
        (["lib/model/tests"], ["tests"]),
        (["--deselect", "lib/model/tests/test_config.py::test_x"], ["tests", "--deselect", "tests/test_config.py::test_x"]),
    ],
)  # fmt: skip
def test_pytest_args_narrow_to_files(given: list[str], expected: list[str]) -> None:
    model = get_package("schooner-model", ROOT)
    for f in ("test_config.py", "test_loss.py"):
        assert (model.dir / "tests" / f).is_file(), f
    assert select_tests(model, given, ROOT) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["tests/test_nope.py"], "names 'tests/test_nope.py', which is not a file or folder"),
        (
            ["lib/data/tests/test_formats.py"],
            "names 'lib/data/tests/test_formats.py', which is outside lib/model/tests",
        ),
    ],
)
def test_pytest_args_naming_no_test_of_the_package_are_refused(given: list[str], message: str) -> None:
    with pytest.raises(ToolError, match=re.escape(message)):
        select_tests(get_package("schooner-model", ROOT), given, ROOT)


def test_a_release_with_a_wrong_test_path_is_refused_before_any_edit(repo: Path) -> None:
    out = _refused(repo, "schooner-model", "patch", "--pytest-args", "tests/test_nope.py -q")
    assert "release refused: --pytest-args names 'tests/test_nope.py', which is not a file or folder" in out
    assert "+ uv build" not in out  # refused before building anything


# --- what the wheel and the sdist carry: README, CHANGELOG, project URLs ---

LIBS = sorted(p.parent.name for p in ROOT.glob("lib/*/pyproject.toml"))


def _urls(pyproject: Path) -> dict[str, str]:
    return tomllib.loads(pyproject.read_text())["project"].get("urls", {})


def test_project_urls_agree() -> None:
    """Every library names the same home, source and issue tracker, and its own CHANGELOG.md in the source."""
    first = _urls(ROOT / "lib" / LIBS[0] / "pyproject.toml")
    assert sorted(first) == ["Changelog", "Homepage", "Issues", "Source"], first
    for lib in LIBS:
        urls = _urls(ROOT / "lib" / lib / "pyproject.toml")
        assert {k: urls.get(k) for k in ("Homepage", "Source", "Issues")} == {
            k: first[k] for k in ("Homepage", "Source", "Issues")
        }, lib
        assert urls["Issues"] == f"{urls['Source']}/issues", lib
        assert urls["Changelog"] == f"{urls['Source']}/blob/main/lib/{lib}/CHANGELOG.md", lib


@pytest.mark.parametrize("lib", LIBS)
def test_wheel_and_sdist_carry_readme_changelog_and_urls(lib: str, tmp_path: Path) -> None:
    name = f"schooner-{lib}"
    pkg = ROOT / "lib" / lib
    subprocess.run(["uv", "build", "--package", name, "--out-dir", str(tmp_path), "-q"], cwd=ROOT, check=True)
    (wheel,) = tmp_path.glob("*.whl")
    (sdist,) = tmp_path.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(
            z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        )
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls == _urls(pkg / "pyproject.toml") and sorted(urls) == [
        "Changelog",
        "Homepage",
        "Issues",
        "Source",
    ]
    assert urls["Changelog"].endswith(f"/lib/{lib}/CHANGELOG.md")
    assert meta.get_payload().strip() == (pkg / "README.md").read_text().strip()  # the long description
    assert meta["Description-Content-Type"] == "text/markdown"
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        for f in ("README.md", "CHANGELOG.md"):
            member = tar.extractfile(f"{top}/{f}")
            assert member is not None and member.read() == (pkg / f).read_bytes(), f
