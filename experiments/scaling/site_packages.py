"""Training text that is never repeated: the Python source and documentation of the installed packages.

The embedded corpus (Python's own docs and standard library, 5.8M tokens) is too small for a scaling suite
that must not repeat data: its largest runs would read it several times. The virtual environment's
site-packages holds hundreds of MB of real Python source and prose (docstrings, READMEs, reStructuredText),
offline. `site_packages_records` is a step that collects it deterministically:

1. every file under the purelib directory with one of `extensions` and at most `max_file_bytes`, decoded as
   UTF-8 (files that are not are counted and skipped: binary data misnamed, latin-1 leftovers), outside the
   installers' metadata folders (`*.dist-info`, `*.egg-info`: their names carry version numbers, and this
   project's own packages, installed editable, are renamed at every release; see below);
2. exact duplicates dropped by the SHA-256 of their text (vendored copies: pip's and setuptools' vendored
   packages, identical `__init__.py` files), the first path in sorted order kept;
3. the files ordered by the hash of their relative path (a uniform sample across packages rather than the
   alphabet's first ones) and kept until `max_bytes` of text;
4. written as records `{"id": relative path, "text", "source": "site-packages", "metadata": {"package"}}`.

The collection is a function of the installed distributions (uv.lock pins them) and of the config, and the
config says so: `SitePackagesConfig.installed` is a digest of every non-editable distribution's `name==version`
(`installed_distributions`), so an upgraded dependency makes another step key instead of other text under the
same one. Editable installs (this workspace's packages) leave no files here but their metadata, which is not
collected, so a release of one of them changes neither the text nor the key. The step's manifest records the
Python version, the distributions, the file counts, the skips by reason and the bytes kept.

Version 1 collected the metadata folders too: its corpus moved whenever a workspace package's version changed
(2026-12-07: schooner-eval 0.1.1 -> 0.2.0 renamed `schooner_eval-0.1.1.dist-info/entry_points.txt`, which
moved in the path-hash order, and a rebuilt corpus kept 9,715 files instead of 9,714 under the same key).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from schooner.cluster import StepHandle, step

__all__ = [
    "SitePackagesConfig",
    "check_installed",
    "collect_site_packages",
    "current_installed",
    "held_out_files",
    "installed_digest",
    "installed_distributions",
    "site_packages_records",
]

VERSION = "site-packages-v2"
METADATA_FOLDERS = (".dist-info", ".egg-info")


def installed_distributions(root: str | None = None) -> list[str]:
    """`name==version` of every distribution installed under `root` (default: this interpreter's purelib)
    whose files live there, sorted: editable installs (their `direct_url.json` says `"editable": true`) are
    left out, since their code is elsewhere and only their metadata, which is not collected, is here."""
    root = root or sysconfig.get_paths()["purelib"]
    found = set()
    for dist in metadata.distributions(path=[root]):
        direct = dist.read_text("direct_url.json")
        if direct and json.loads(direct).get("dir_info", {}).get("editable"):
            continue
        found.add(f"{dist.metadata['Name']}=={dist.version}")
    return sorted(found)


def installed_digest(distributions: list[str]) -> str:
    """16 hex digits of SHA-256 over `installed_distributions()`'s lines."""
    return hashlib.sha256("\n".join(distributions).encode("utf-8")).hexdigest()[:16]


def current_installed() -> str:
    """The digest of this interpreter's installed distributions (`installed_digest(installed_distributions())`)."""
    return installed_digest(installed_distributions())


def check_installed(installed: str, what: str) -> None:
    """Refuse to build `what` from this interpreter's site-packages when its distributions are not the ones the
    step's config (its key) names: the step's output would be other text under that key. This happens where a
    prefix built on one machine is used on another (a lent accelerator: `experiments/scaling/device/run.sh`
    passes the packed steps' digest), if a step it needs was not packed."""
    here = current_installed()
    if installed != here:
        raise ValueError(
            f"{what}: the step's config names the installed-distributions digest {installed!r}, but this "
            f"interpreter's is {here!r} (`installed_distributions()` lists them): building here would write other "
            "text under that step's key. Build it where those distributions are installed (the machine that "
            "built the prefix's other data steps, then pack them), or leave `installed` to its default here (in "
            "the Delphi suite: unset SCHOONER_DELPHI_INSTALLED)"
        )


@dataclass(frozen=True)
class SitePackagesConfig:
    """Config of the `site_packages_records` step."""

    extensions: tuple[str, ...] = (".py", ".pyi", ".md", ".rst", ".txt")
    """File endings collected (source, stubs and prose)."""
    max_file_bytes: int = 200_000
    """Larger files are skipped (generated tables, vendored bundles)."""
    max_bytes: int = 80_000_000
    """Stop after this much text (UTF-8 bytes)."""
    python: str = sys.version.split()[0]
    """The interpreter whose site-packages is read (part of the identity: another one holds other files)."""
    num_shards: int = 8
    installed: str = field(default_factory=current_installed)
    """Digest of the installed distributions the text comes from (`installed_distributions`): part of the
    identity, so a changed dependency is a new step rather than other text under the same key."""

    def __post_init__(self) -> None:
        if self.max_file_bytes < 1 or self.max_bytes < 1 or self.num_shards < 1 or not self.extensions:
            raise ValueError(
                "SitePackagesConfig needs max_file_bytes, max_bytes, num_shards >= 1 and some extensions; got "
                f"{self.max_file_bytes=}, {self.max_bytes=}, {self.num_shards=}, {self.extensions=}"
            )


def collect_site_packages(
    config: SitePackagesConfig, root: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records (in the order described in the module docstring) and a report of what was read and
    skipped. `root`: the folder to read (default: this interpreter's purelib, the venv's site-packages)."""
    root = root or sysconfig.get_paths()["purelib"]
    paths = []
    metadata_files = 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if folder != root and os.path.basename(folder).endswith(METADATA_FOLDERS):
            metadata_files += sum(f.endswith(config.extensions) for f in files)
            continue
        for f in sorted(files):
            if f.endswith(config.extensions):
                paths.append(os.path.relpath(os.path.join(folder, f), root))
    paths.sort()
    skipped = {
        "installer_metadata": metadata_files,
        "too_large": 0,
        "not_utf8": 0,
        "empty": 0,
        "duplicate": 0,
    }
    seen: set[str] = set()
    kept: list[tuple[str, str, str]] = []  # (order key, relpath, text)
    for rel in paths:
        full = os.path.join(root, rel)
        if os.path.getsize(full) > config.max_file_bytes:
            skipped["too_large"] += 1
            continue
        with open(full, "rb") as fh:
            raw = fh.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped["not_utf8"] += 1
            continue
        if not text.strip():
            skipped["empty"] += 1
            continue
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(digest)
        kept.append((hashlib.sha256(rel.encode("utf-8")).hexdigest(), rel, text))
    kept.sort()
    records, total = [], 0
    for _, rel, text in kept:
        size = len(text.encode("utf-8"))
        if total + size > config.max_bytes:
            break
        total += size
        records.append(_record(rel, text))
    report = {
        "root": root,
        "python": config.python,
        "distributions": installed_distributions(root),
        "files_matched": len(paths),
        "skipped": skipped,
        "distinct_files": len(kept),
        "records": len(records),
        "bytes": total,
        "beyond_max_bytes": len(kept) - len(records),
    }
    return records, report


def _record(rel: str, text: str) -> dict[str, Any]:
    return {
        "id": rel,
        "text": text,
        "source": "site-packages",
        "metadata": {"package": rel.split(os.sep, 1)[0]},
    }


def held_out_files(config: SitePackagesConfig, root: str | None = None) -> list[dict[str, Any]]:
    """The distinct files that `collect_site_packages` leaves out past `max_bytes` (in its order): text no
    run trained on, for evaluation tasks."""
    every, _ = collect_site_packages(SitePackagesConfig(**{**config.__dict__, "max_bytes": 10**12}), root)
    total = 0
    for i, r in enumerate(every):
        total += len(r["text"].encode("utf-8"))
        if total > config.max_bytes:  # the first file collect_site_packages did not take
            return every[i:]
    return []


def _write(config: SitePackagesConfig, output_path: str) -> dict[str, Any]:
    from schooner.data import write_records

    check_installed(config.installed, "data/site-packages")
    records, report = collect_site_packages(config)
    write_records(records, output_path, num_shards=config.num_shards, extra_manifest={"build": report})
    return report


def site_packages_records(name: str = "data/site-packages", **config: Any) -> StepHandle:
    """A step writing the installed packages' source and docs as a record folder (see the module docs)."""
    return step(
        name, _write, SitePackagesConfig(**config), version=VERSION,
        description="installed packages' Python source and docs, deduplicated",
    )  # fmt: skip
