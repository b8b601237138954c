"""Release one package of the workspace.

    uv run python -m tools.release schooner-data minor [--update-ranges] [--date YYYY-MM-DD]

In order, stopping at the first refusal with nothing changed:
1. refuses a dirty working tree, a tag or changelog section that already holds the new version, an empty
   "Unreleased" section in the package's CHANGELOG.md, and a `--pytest-args` path that is no test of the package;
2. sets the version (`major`, `minor`, `patch`, or an explicit `A.B.C`). A version is released when it has a tag
   or a dated CHANGELOG section. When the one pyproject.toml names is released, the new one comes after it; when
   it is not (the version its changelog is being written for), it is what gets released: a bump counts from the
   last release and may not fall below it, an explicit version may be it, and a package never released names
   its first version explicitly;
3. checks that every sibling depending on the package (and the root project) still admits the new version;
   when one does not, it shows the range change and stops, unless `--update-ranges` is given: then the range
   keeps its lower bound, gets the next breaking version as upper bound, and the sibling's CHANGELOG gets a line;
4. moves "Unreleased" under `## A.B.C — DATE`, updates uv.lock;
5. builds the sdist and the wheel into dist/ and runs the package's tests against the wheel in a fresh venv
   outside the workspace (tools/wheeltest.py; siblings as wheels built from the tree);
6. commits `release: NAME A.B.C` and tags `NAME-vA.B.C`.
A failure after step 2 puts every edited file back. Publishing is a separate step: tools/publish.py.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shlex
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import changelog
from .wheeltest import Wheel, run_against_wheels, select_tests
from .workspace import (
    ROOT,
    Package,
    Release,
    ToolError,
    build,
    get_package,
    git,
    packages,
    root_project,
    run,
    sibling_closure,
    tag_name,
)

PARTS = ("major", "minor", "patch")
_REQUIREMENT = re.compile(r"^(?P<head>\s*[A-Za-z0-9._-]+\s*(?:\[[^\]]*\])?)[^;]*(?P<marker>;.*)?$")


def next_version(current: Version, part: str) -> Version:
    """The version after `current`: semver `major` / `minor` / `patch`, or an explicit higher version."""
    if part in PARTS:
        if current.pre or current.dev or current.local:
            raise ToolError(
                f"{current} is a pre-release; give the version to release explicitly (e.g. 1.0.0)"
            )
        major, minor, patch = (list(current.release) + [0, 0])[:3]
        if part == "major":
            return Version(f"{major + 1}.0.0")
        if part == "minor":
            return Version(f"{major}.{minor + 1}.0")
        return Version(f"{major}.{minor}.{patch + 1}")
    try:
        new = Version(part)
    except InvalidVersion:
        raise ToolError(f"{part!r} is neither {', '.join(PARTS)} nor a version such as 1.2.3") from None
    if new <= current:
        raise ToolError(f"the new version must be above the current one: got {new}, current is {current}")
    return new


def released_versions(pkg: Package, root: Path) -> set[Version]:
    """The versions of `pkg` that were released: its tags `NAME-vA.B.C` and its CHANGELOG's dated sections."""
    out: set[Version] = set()
    tags = [t.removeprefix(f"{pkg.name}-v") for t in git(root, "tag", "--list", f"{pkg.name}-v*").split()]
    log = pkg.dir / "CHANGELOG.md"
    dated = changelog.released_versions(log.read_text()) if log.is_file() else set()
    for raw in [*tags, *dated]:
        try:
            out.add(Version(raw))
        except InvalidVersion:
            continue
    return out


def version_to_release(pkg: Package, part: str, released: set[Version], root: Path) -> Version:
    """The version this release cuts (see the module docstring, step 2)."""
    current = pkg.version
    where = (pkg.dir / "pyproject.toml").relative_to(root)
    if current in released:
        return next_version(current, part)
    last = max((v for v in released if v < current), default=None)
    if part in PARTS:
        if last is None:
            raise ToolError(
                f"{pkg.name} has never been released (no tag, no dated CHANGELOG section), so `{part}` has "
                f"nothing to count from; give the version: {current} (what {where} names) or another"
            )
        new = next_version(last, part)
        if new < current:
            raise ToolError(
                f"a {part} release after {last} (the last release) is {new}, below {current}, the unreleased "
                f"version {where} names (and its changelog was written for); release {current} (give it, or "
                "the part that reaches it) or a version above it"
            )
        return new
    try:
        new = Version(part)
    except InvalidVersion:
        raise ToolError(f"{part!r} is neither {', '.join(PARTS)} nor a version such as 1.2.3") from None
    if new < current:
        raise ToolError(
            f"the new version must be at least {current}, the unreleased version {where} names: got {new}"
        )
    return new  # one already released (a tag, a dated section) is refused by `prepare`


def next_breaking(version: Version) -> Version:
    """The first version semver lets break `version`'s API: the next minor below 1.0, else the next major."""
    major, minor = (list(version.release) + [0])[:2]
    return Version(f"{major + 1}") if major >= 1 else Version(f"0.{minor + 1}")


def widen(raw: str, new: Version) -> str:
    """`raw` with its upper bound moved so it admits `new` (lower bounds and exclusions kept)."""
    req = Requirement(raw)
    lower, excluded = [], []
    for spec in req.specifier:
        if spec.operator in (">=", ">"):
            lower.append(str(spec))
        elif spec.operator == "!=":
            excluded.append(str(spec))
        elif spec.operator in ("==", "~=", "==="):
            lower.append(f">={spec.version.rstrip('.*')}")
    clauses = sorted(lower) + [f"<{next_breaking(new)}"] + sorted(excluded)
    m = _REQUIREMENT.match(raw)
    assert m is not None, raw  # Requirement(raw) parsed
    out = f"{m['head'].strip()}{','.join(clauses)}{m['marker'] or ''}"
    if new not in Requirement(out).specifier:
        raise ToolError(f"cannot widen {raw!r} to admit {new}: excluded explicitly")
    return out


@dataclass(frozen=True)
class RangeChange:
    dependent: Package
    where: str
    """`dependencies` or `extra NAME`."""
    old: str
    new: str

    def describe(self, root: Path) -> str:
        path = (self.dependent.dir / "pyproject.toml").relative_to(root)
        return f"{path} ({self.where}): {self.old!r} -> {self.new!r}"


def range_changes(name: str, new: Version, root: Path = ROOT) -> list[RangeChange]:
    """Every sibling range on `name` (libraries and the root project) that does not admit `new`."""
    out = []
    for dep in [*packages(root).values(), root_project(root)]:
        for where, raw in dep.requirements():
            req = Requirement(raw)
            if canonicalize_name(req.name) == name and new not in req.specifier:
                out.append(RangeChange(dep, where, raw, widen(raw, new)))
    return out


def set_version(text: str, new: Version) -> str:
    """pyproject.toml text with the [project] version set to `new` (the rest untouched)."""
    project = re.search(r"^\[project\]\s*$", text, re.M)
    if project is None:
        raise ToolError("no [project] table in pyproject.toml")
    line = re.compile(r'^version\s*=\s*"[^"]*"\s*$', re.M)
    m = line.search(text, project.end())
    if m is None:
        raise ToolError('no `version = "..."` line under [project] in pyproject.toml')
    out = text[: m.start()] + f'version = "{new}"' + text[m.end() :]
    if tomllib.loads(out)["project"]["version"] != str(new):
        raise ToolError("setting the version rewrote the wrong line of pyproject.toml")
    return out


def check_clean(root: Path) -> None:
    dirty = git(root, "status", "--porcelain", "--untracked-files=normal").splitlines()
    if dirty:
        shown = "\n  ".join(dirty[:15]) + ("\n  ..." if len(dirty) > 15 else "")
        raise ToolError(
            f"the working tree is not clean; commit or remove these first (a release is cut from a commit):\n  {shown}"
        )


class Edits:
    """Files rewritten by the release, put back as they were when anything fails."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.original: dict[Path, str] = {}

    def write(self, path: Path, text: str) -> None:
        self.original.setdefault(path, path.read_text())
        path.write_text(text)

    def track(self, path: Path) -> None:
        self.original.setdefault(path, path.read_text())

    def restore(self) -> None:
        for path, text in self.original.items():
            path.write_text(text)

    @property
    def paths(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p, t in self.original.items() if p.read_text() != t)


def prepare(
    name: str, part: str, root: Path, update_ranges: bool
) -> tuple[Package, Version, list[RangeChange]]:
    """The checks that need no edit: clean tree, new version free, something to release, ranges."""
    pkg = get_package(name, root)
    check_clean(root)
    new = version_to_release(pkg, part, released_versions(pkg, root), root)
    tag = tag_name(pkg.name, new)
    if git(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).strip():
        raise ToolError(f"tag {tag} exists already: {pkg.name} {new} was released; choose another version")
    log = pkg.dir / "CHANGELOG.md"
    text = log.read_text()
    if str(new) in changelog.released_versions(text):
        raise ToolError(
            f"{log.relative_to(root)} already has a dated section for {new}; choose another version"
        )
    if not changelog.unreleased_text(text):
        raise ToolError(
            f"nothing to release: the 'Unreleased' section of {log.relative_to(root)} is empty; "
            "add a line for each change first (CONTRIBUTING.md, 'Changelog lines')"
        )
    changes = range_changes(pkg.name, new, root)
    if changes and not update_ranges:
        shown = "\n  ".join(c.describe(root) for c in changes)
        raise ToolError(
            f"{pkg.name} {new} is outside the range of siblings that depend on it:\n  {shown}\n"
            "rerun with --update-ranges to make these changes (each with a CHANGELOG line in that sibling), "
            "or choose a version they admit"
        )
    return pkg, new, changes


def apply(pkg: Package, new: Version, date: str, changes: list[RangeChange], edits: Edits) -> None:
    """Version, changelog, sibling ranges and their changelog lines, uv.lock."""
    root = edits.root
    edits.write(pkg.dir / "pyproject.toml", set_version((pkg.dir / "pyproject.toml").read_text(), new))
    log = pkg.dir / "CHANGELOG.md"
    edits.write(log, changelog.release(log.read_text(), str(new), date))
    print(f"release: {log.relative_to(root)}: 'Unreleased' is now '{new} — {date}'")
    for c in changes:
        path = c.dependent.dir / "pyproject.toml"
        text = path.read_text()
        edits.write(path, text.replace(f'"{c.old}"', f'"{c.new}"'))
        print(f"release: range {c.describe(root)}")
        dep_log = c.dependent.dir / "CHANGELOG.md"
        if c.dependent.is_library and dep_log.is_file():
            line = f"Admits {pkg.name} {new}: `{c.new}` (was `{c.old}`)."
            edits.write(dep_log, changelog.add_line(dep_log.read_text(), line))
            print(f"release: {dep_log.relative_to(root)}: added '- {line}'")
    edits.track(root / "uv.lock")
    run(["uv", "lock", "-q"], root)


def build_and_test(pkg: Package, new: Version, root: Path, dist: Path, pytest_args: list[str]) -> list[Path]:
    """sdist and wheel into `dist`; the package's tests against the wheel; returns the two files."""
    stem = f"{pkg.name.replace('-', '_')}-{new}"
    for old in dist.glob(f"{stem}*"):
        old.unlink()
    files = build(Release(pkg.name, new, None, "working tree"), dist, root=root, sdist=True)
    for f in files:
        print(f"release: built {f.relative_to(root) if f.is_relative_to(root) else f}")
    with tempfile.TemporaryDirectory(prefix=f"schooner-release-{pkg.name}-") as tmp:
        work = Path(tmp)
        wheels = [Wheel(pkg.name, files[0], pkg.dir)]
        for sib in sorted(sibling_closure({pkg.name}, root) - {pkg.name}):
            sp = get_package(sib, root)
            built = build(Release(sib, sp.version, None, "working tree"), work / "wheels", root=root)
            wheels.append(Wheel(sib, built[0], sp.dir))
        result = run_against_wheels(get_package(pkg.name, root), wheels, work, pytest_args, root)
    if result.returncode != 0:
        raise ToolError(
            f"{pkg.name}'s tests failed against the built wheel ({result.summary}); nothing was committed"
        )
    print(f"release: tests against the wheel: {result.summary} ({result.seconds:.0f} s)")
    return files


def release(
    name: str,
    part: str,
    *,
    root: Path = ROOT,
    update_ranges: bool = False,
    date: str | None = None,
    dist: Path | None = None,
    pytest_args: list[str] | None = None,
) -> str:
    """Cut the release; returns its tag."""
    pkg, new, changes = prepare(name, part, root, update_ranges)
    pytest_args = pytest_args or ["-n", "auto", "-q"]
    select_tests(pkg, pytest_args, root)  # a path that is no test of the package: refused before any edit
    date = date or datetime.date.today().isoformat()
    if new == pkg.version:
        print(f"release: {pkg.name} {new} ({part}; the unreleased version pyproject.toml names)", flush=True)
    else:
        print(f"release: {pkg.name} {pkg.version} -> {new} ({part})", flush=True)
    edits = Edits(root)
    try:
        apply(pkg, new, date, changes, edits)
        build_and_test(pkg, new, root, dist or root / "dist", pytest_args)
        paths = edits.paths
        message = f"release: {pkg.name} {new}"
        if changes:
            message += "\n\n" + "\n".join(f"Range: {c.describe(root)}" for c in changes)
        git(root, "add", "--", *paths)
        git(root, "commit", "-q", "-m", message, "--", *paths)
    except BaseException:
        edits.restore()
        raise
    tag = tag_name(pkg.name, new)
    git(root, "tag", "-a", tag, "-m", f"{pkg.name} {new}")
    sha = git(root, "rev-parse", "--short", "HEAD").strip()
    print(f"release: committed {sha} '{message.splitlines()[0]}' ({', '.join(paths)})")
    print(f"release: tagged {tag}")
    print(
        f"release: next: git push origin HEAD {tag}; uv run python -m tools.publish {pkg.name} {new} --publish-url URL"
    )
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("package", help="the distribution to release, e.g. schooner-data")
    parser.add_argument("part", help="major | minor | patch, or the version itself (A.B.C)")
    parser.add_argument("--update-ranges", action="store_true", help="widen sibling ranges that exclude it")
    parser.add_argument("--date", help="the release date in the changelog (default: today)")
    parser.add_argument("--dist", type=Path, help="where the sdist and wheel go (default: dist/)")
    parser.add_argument(
        "--pytest-args",
        default="-n auto -q",
        help="arguments for the test run against the wheel; test files, folders and node ids narrow it "
        "(given from the repository, the package folder or its tests/ folder)",
    )
    args = parser.parse_args(argv)
    if args.date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.date):
        parser.error(f"--date must be YYYY-MM-DD, got {args.date!r}")
    try:
        release(
            args.package,
            args.part,
            update_ranges=args.update_ranges,
            date=args.date,
            dist=args.dist,
            pytest_args=shlex.split(args.pytest_args),
        )
    except ToolError as e:
        print(f"release refused: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
