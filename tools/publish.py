"""Publish a released package version to a package index with `uv publish`.

    uv run python -m tools.publish schooner-data 0.2.0 --publish-url https://upload.example/legacy/ \\
        [--check-url https://example/simple/] [any other `uv publish` option]

The version must be released (its tag `NAME-vA.B.C` exists: tools/release.py made it). The sdist and wheel
are built again from the tag's tree, so what is published is exactly what the tag holds; when dist/ still
has the files the release built and tested, they must be byte-identical (uv_build is reproducible), and the
tool says so. The index is configurable: `--publish-url` (or `UV_PUBLISH_URL`), credentials through uv's own
options or environment (`UV_PUBLISH_TOKEN`, or `UV_PUBLISH_USERNAME` / `UV_PUBLISH_PASSWORD`); every
argument the tool does not know is passed to `uv publish` as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .workspace import ROOT, Release, ToolError, build, get_package, git, run, tag_name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def released_files(
    name: str, version: Version, out: Path, root: Path = ROOT, dist: Path | None = None
) -> list[Path]:
    """The sdist and wheel of a tagged version, built from the tag into `out` and checked against `dist`."""
    pkg = get_package(name, root)
    tag = tag_name(pkg.name, version)
    if not git(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).strip():
        raise ToolError(
            f"{pkg.name} {version} is not released: no tag {tag}; release it with tools.release first"
        )
    files = build(Release(pkg.name, version, tag, f"tag {tag}"), out, root=root, sdist=True)
    dist = dist if dist is not None else root / "dist"
    for f in files:
        tested = dist / f.name
        if tested.is_file():
            if sha256(tested) != sha256(f):
                raise ToolError(
                    f"{tested} differs from the build of tag {tag}; it was not built from the tag's tree "
                    "(remove it, or release again)"
                )
            print(f"publish: {f.name} is byte-identical to the tested {tested}")
        print(f"publish: {f.name} sha256 {sha256(f)}")
    return files


def publish(
    name: str, version: Version, uv_args: list[str], root: Path = ROOT, dist: Path | None = None
) -> list[str]:
    """Build the tagged version and `uv publish` it with `uv_args`; returns the names of the files published."""
    with tempfile.TemporaryDirectory(prefix="schooner-publish-") as tmp:
        files = released_files(name, version, Path(tmp), root, dist)
        run(["uv", "publish", *uv_args, *files], root)
        return [f.name for f in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.publish",
        description=__doc__.split("\n\n")[0],
        epilog="Unknown options go to `uv publish` (e.g. --publish-url, --check-url, --token, --index).",
    )
    parser.add_argument("package", help="the distribution, e.g. schooner-data")
    parser.add_argument("version", help="the released version, e.g. 0.2.0")
    parser.add_argument("--dist", type=Path, help="where the release put its tested files (default: dist/)")
    args, uv_args = parser.parse_known_args(argv)
    try:
        version = Version(args.version)
    except InvalidVersion:
        parser.error(f"not a version: {args.version!r}")
    try:
        names = publish(args.package, version, uv_args, dist=args.dist)
    except ToolError as e:
        print(f"publish refused: {e}", file=sys.stderr)
        return 1
    print(f"publish: {', '.join(names)} published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
