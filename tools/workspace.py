"""The workspace as the release tools see it: its packages, their sibling requirements, the versions each
package has had in git, and wheels built from the working tree or from any commit."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent


class ToolError(Exception):
    """A refusal or failure the tools report as one message (what failed and what to do) and exit 1."""


@dataclass(frozen=True)
class Package:
    """One project of the workspace: a library under lib/ or the root project `schooner`."""

    name: str
    """The distribution name, e.g. `schooner-data`."""
    dir: Path
    """The folder holding its pyproject.toml."""
    pyproject: dict
    """The parsed pyproject.toml."""

    @property
    def project(self) -> dict:
        return self.pyproject["project"]

    @property
    def version(self) -> Version:
        return Version(self.project["version"])

    @property
    def module(self) -> str:
        """The import name, e.g. `schooner.data`."""
        return self.name.replace("-", ".", 1)

    @property
    def is_library(self) -> bool:
        return self.dir.parent.name == "lib"

    @property
    def extras(self) -> list[str]:
        return sorted(self.project.get("optional-dependencies", {}))

    @property
    def dev_group(self) -> list[str]:
        """The plain requirements of its `dev` dependency group (what its tests need besides the package)."""
        return [r for r in self.pyproject.get("dependency-groups", {}).get("dev", []) if isinstance(r, str)]

    def requirements(self) -> list[tuple[str, str]]:
        """Every requirement string with where it is declared: `("dependencies" | "extra NAME", raw)`."""
        out = [("dependencies", r) for r in self.project.get("dependencies", [])]
        for extra, reqs in sorted(self.project.get("optional-dependencies", {}).items()):
            out += [(f"extra {extra}", r) for r in reqs]
        return out

    def sibling_specifiers(self, siblings: set[str]) -> dict[str, SpecifierSet]:
        """sibling -> the intersection of every range this package declares on it (base and extras)."""
        out: dict[str, SpecifierSet] = {}
        for _, raw in self.requirements():
            req = Requirement(raw)
            name = canonicalize_name(req.name)
            if name in siblings and name != self.name:
                out[name] = out.get(name, SpecifierSet()) & req.specifier
        return out


def load_package(pyproject: Path) -> Package:
    data = tomllib.loads(pyproject.read_text())
    return Package(canonicalize_name(data["project"]["name"]), pyproject.parent, data)


def packages(root: Path = ROOT) -> dict[str, Package]:
    """name -> Package for every library under lib/ (not the root project)."""
    found = [load_package(p) for p in sorted(root.glob("lib/*/pyproject.toml"))]
    return {p.name: p for p in found}


def root_project(root: Path = ROOT) -> Package:
    return load_package(root / "pyproject.toml")


def get_package(name: str, root: Path = ROOT) -> Package:
    pkgs = packages(root)
    key = canonicalize_name(name)
    if key not in pkgs:
        raise ToolError(f"no package {name!r} in {root}/lib; the packages are: {', '.join(sorted(pkgs))}")
    return pkgs[key]


def git(root: Path, *args: str, check: bool = True) -> str:
    """stdout of `git ARGS` in `root`; a failure raises ToolError with git's message."""
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ToolError(f"`git {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def run(cmd: Sequence[str | Path], cwd: Path, *, env: dict | None = None) -> None:
    """Run a command, echoing it, its output going to ours. A failure raises ToolError."""
    print("+", " ".join(map(str, cmd)), flush=True)
    if subprocess.run(list(map(str, cmd)), cwd=cwd, env=env).returncode != 0:
        raise ToolError(f"`{' '.join(map(str, cmd))}` failed (its output is above)")


def tag_name(name: str, version: Version | str) -> str:
    """The release tag of a package version, e.g. `schooner-data-v0.2.0`."""
    return f"{name}-v{version}"


@dataclass(frozen=True)
class Release:
    """Where a version of a package comes from: a tag, the commit that set the version, or the working tree."""

    name: str
    version: Version
    ref: str | None
    """A commit (or tag); None for the working tree."""
    how: str
    """`tag schooner-x-vA.B.C`, `set in <sha>` or `working tree`."""


def version_history(name: str, root: Path = ROOT) -> dict[Version, Release]:
    """Every version `name` has had on the current branch, each from its tag when one exists, else from the
    first commit whose pyproject.toml carries it. The working tree's version, unless tagged, is the working tree:
    an unreleased version is still being written, so the first commit that named it is not what it will be."""
    pkg = get_package(name, root)
    if git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        raise ToolError(
            f"{root} is a shallow clone: the versions of {name} need the whole history (git fetch --unshallow)"
        )
    rel = pkg.dir.relative_to(root).as_posix() + "/pyproject.toml"
    out: dict[Version, Release] = {}
    for sha in git(root, "log", "--format=%H", "--reverse", "--", rel).split():
        text = git(root, "show", f"{sha}:{rel}", check=False)
        try:
            v = Version(tomllib.loads(text)["project"]["version"])
        except (tomllib.TOMLDecodeError, KeyError, InvalidVersion):
            continue
        if v not in out:
            out[v] = Release(name, v, sha, f"set in {sha[:10]}")
    for tag in git(root, "tag", "--list", f"{name}-v*").split():
        try:
            v = Version(tag.removeprefix(f"{name}-v"))
        except InvalidVersion:
            continue
        out[v] = Release(name, v, tag, f"tag {tag}")
    if pkg.version not in out or not out[pkg.version].how.startswith("tag "):
        out[pkg.version] = Release(name, pkg.version, None, "working tree")
    return dict(sorted(out.items()))


def package_at(release: Release, root: Path = ROOT) -> Package:
    """The package as it was at `release` (its pyproject.toml there)."""
    current = get_package(release.name, root)
    if release.ref is None:
        return current
    rel = current.dir.relative_to(root).as_posix() + "/pyproject.toml"
    data = tomllib.loads(git(root, "show", f"{release.ref}:{rel}"))
    return Package(release.name, current.dir, data)


def export_tree(root: Path, ref: str, paths: list[str], dest: Path) -> Path:
    """Write the files of `paths` as they are at `ref` under `dest` (a `git archive`); returns `dest`."""
    proc = subprocess.run(["git", "archive", "--format=tar", ref, *paths], cwd=root, capture_output=True)
    if proc.returncode != 0:
        raise ToolError(f"`git archive {ref} {' '.join(paths)}` failed: {proc.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def build(
    release: Release, out: Path, *, root: Path = ROOT, sdist: bool = False, source: Path | None = None
) -> list[Path]:
    """Build the wheel (and the sdist) of `release` into `out`; returns the files built, wheel first.

    A commit's tree is exported to `source` (kept) or to a temporary folder, and built with `--no-sources`."""
    pkg = get_package(release.name, root)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    kinds = [] if sdist else ["--wheel"]
    if release.ref is None:
        run(["uv", "build", "--package", pkg.name, *kinds, "--out-dir", out, "-q"], root)
    else:
        rel = pkg.dir.relative_to(root).as_posix()
        with tempfile.TemporaryDirectory(prefix="schooner-src-") as tmp:
            where = source if source is not None else Path(tmp)
            export_tree(root, release.ref, [rel], where)
            run(["uv", "build", "--no-sources", *kinds, "--out-dir", out, "-q", where / rel], root)
    built = sorted(set(out.iterdir()) - before, key=lambda p: not p.name.endswith(".whl"))
    stem = f"{pkg.name.replace('-', '_')}-{release.version}"
    wanted = [p for p in built if p.name.startswith(stem)]
    if not wanted or not wanted[0].name.endswith(".whl"):
        raise ToolError(f"building {pkg.name} {release.version} ({release.how}) made {built}, no {stem}*.whl")
    return wanted


def sibling_closure(names: set[str], root: Path = ROOT) -> set[str]:
    """`names` and every sibling they need with all their extras, transitively (working-tree pyprojects)."""
    pkgs = packages(root)
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += pkgs[n].sibling_specifiers(set(pkgs))
    return seen


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
