"""Record folders as readers find them: listing shards (manifest, `-of-N` sets, Hugging Face `save_to_disk`
folders, globs), and the housekeeping writers do once a folder is finished."""

from __future__ import annotations

import logging
import os
import re

import fsspec

from . import storage
from ._errors import DataError

_logger = logging.getLogger("schooner.data")

MANIFEST = "manifest.json"
"""The file a record folder's writer writes last; its presence means the folder is complete."""

STATS_DIR = ".shard-stats"
"""Per-shard statistics written just after each shard, so a resumed write knows finished shards."""

READABLE_SUFFIXES: tuple[str, ...] = (
    ".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd", ".ndjson", ".ndjson.gz", ".ndjson.zst",
    ".json", ".json.gz", ".json.zst", ".parquet", ".arrow", ".txt", ".txt.gz", ".txt.zst", ".text", ".md",
)  # fmt: skip
"""File names `list_shards` picks up in a folder without a manifest."""

SHARD_RE = re.compile(r"^part-(\d{5,})-of-(\d{5,})\.(jsonl|jsonl\.gz|jsonl\.zst|parquet)$")
"""Names of shards schooner writes (`part-00003-of-00016.jsonl.zst`)."""

_PART_OF_N = re.compile(r"^part-(\d+)-of-(\d+)(\..+)$")
_HF_STATE = "state.json"
_HF_INFO = "dataset_info.json"
_HF_DICT = "dataset_dict.json"


def expand_paths(paths: str | list[str] | tuple[str, ...]) -> list[str]:
    """Expand globs and record folders into a list of files (each group in its own order).

    Raises:
        FileNotFoundError: a path or glob that matches nothing, naming it.
        DataError: an unfinished or incomplete record folder (see `list_shards`).
    """
    if isinstance(paths, str):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        out.extend(list_shards(p))
    return out


def list_shards(path_or_glob: str) -> list[str]:
    """The shard files of a record folder, or the files matching a glob.

    - A folder with a `manifest.json` lists the manifest's shards in order (each must exist).
    - A folder written by Hugging Face `Dataset.save_to_disk` lists its Arrow files (read as rows).
    - A folder without a manifest that holds `part-i-of-N` files lists them when the set is complete (and
      logs that there is no manifest); a gap in the set, or a schooner write that never finished (per-shard
      stats but no manifest), is an error naming what is missing.
    - Other folders list their readable files (extensions in any case) and, in turn, their subfolders' shards
      by these same rules, in name order; hidden files and folders (names starting with ".", such as a
      step's `.schooner/`) are never listed. A glob lists matching files sorted; a file is returned as itself.

    Raises:
        FileNotFoundError: nothing there, or a glob/folder with no data files, naming the path.
        DataError: an unfinished record folder, a gap in a `-of-N` set, a manifest naming a missing shard,
            or a Hugging Face `DatasetDict` folder (name one of its splits).
    """
    fs, p = storage.url_to_fs(path_or_glob)
    if storage.has_glob(path_or_glob):
        found = sorted(x for x in fs.glob(p) if fs.isfile(x))
        if not found:
            raise FileNotFoundError(f"no files match {path_or_glob!r}; check the pattern and the folder")
        return [_rejoin(fs, path_or_glob, x) for x in found]
    if fs.isfile(p):
        return [path_or_glob]
    if not fs.isdir(p):
        raise FileNotFoundError(f"{path_or_glob!r} does not exist (neither a file, a folder nor a glob)")
    entries = storage.list_dir(path_or_glob)
    names = set(entries)
    if MANIFEST in names:
        return _from_manifest(path_or_glob, names)
    if _HF_DICT in names:
        splits = storage.read_json(storage.join(path_or_glob, _HF_DICT)).get("splits", [])
        raise DataError(
            path_or_glob,
            f"is a Hugging Face DatasetDict saved with save_to_disk (splits: {splits})",
            fix=f"read one split, e.g. {storage.join(path_or_glob, str(splits[0]) if splits else 'train')!r}",
        )
    if _HF_STATE in names and _HF_INFO in names:
        return _hf_arrow_files(path_or_glob)
    visible = sorted(n for n in entries if not n.startswith("."))
    folders = {n for n in visible if storage.isdir(storage.join(path_or_glob, n))}
    files = [n for n in visible if n not in folders]
    parts = [n for n in files if n.startswith("part-") and _readable(n)]
    if parts:
        return [
            storage.join(path_or_glob, n) for n in _check_part_set(path_or_glob, parts, STATS_DIR in names)
        ]
    chosen: list[str] = []
    for n in visible:  # files and subfolders in name order; hidden ones (`.schooner/`, `.work-*`) stay out
        full = storage.join(path_or_glob, n)
        if n not in folders:
            if _readable(n):
                chosen.append(full)
            continue
        try:
            chosen.extend(list_shards(full))
        except FileNotFoundError:  # a subfolder without data files (logs, figures)
            continue
    if not chosen:
        raise FileNotFoundError(
            f"folder {path_or_glob!r} holds no data files (looked for {', '.join(READABLE_SUFFIXES)}, names "
            "in any case, in it and its subfolders; hidden files and folders are not read); pass a glob such "
            "as 'folder/*.jsonl' or name the files"
        )
    return chosen


def _readable(name: str) -> bool:
    """Whether a file name ends in a readable suffix, in any case (`B.JSONL`, `x.Parquet`)."""
    return name.lower().endswith(READABLE_SUFFIXES)


def _from_manifest(folder: str, names: set[str]) -> list[str]:
    m = storage.read_json(storage.join(folder, MANIFEST))
    listed = [s["path"] for s in m["shards"]]
    missing = [n for n in listed if n not in names]
    if missing:
        raise DataError(
            folder,
            f"its manifest lists {len(listed)} shards but {len(missing)} are missing ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''})",
            fix="the folder was partly deleted or copied; rewrite it or copy it again",
        )
    return [storage.join(folder, n) for n in listed]


def _check_part_set(folder: str, parts: list[str], has_stats: bool) -> list[str]:
    """The `part-i-of-N` files of a folder without a manifest, when they form complete sets."""
    sets: dict[tuple[int, str], dict[int, str]] = {}
    other = []
    for name in parts:
        m = _PART_OF_N.match(name)
        if m is None:
            other.append(name)
        else:
            sets.setdefault((int(m.group(2)), m.group(3)), {})[int(m.group(1))] = name
    if has_stats and sets:
        raise DataError(
            folder,
            f"has no {MANIFEST}: a write that never finished ({sum(map(len, sets.values()))} part files and "
            f"per-shard stats, but the manifest is written last)",
            fix="rerun the write (skip_existing=True resumes it), or read chosen files with a glob",
        )
    if len(sets) > 1:
        kinds = ", ".join(f"-of-{n:05d}{suffix}" for n, suffix in sorted(sets))
        raise DataError(
            folder,
            f"has no {MANIFEST} and mixes part sets ({kinds})",
            fix="delete the stale set or use a glob",
        )
    for (n, suffix), found in sets.items():
        missing = [i for i in range(n) if i not in found]
        if missing or max(found) >= n:
            shown = ", ".join(f"part-{i:05d}-of-{n:05d}{suffix}" for i in missing[:5])
            raise DataError(
                folder,
                f"has no {MANIFEST} and only {len(found)} of the {n} parts of its -of-{n:05d} set: missing "
                f"{len(missing)} ({shown}{', ...' if len(missing) > 5 else ''})",
                fix="the write or copy is unfinished; finish it, or read the parts present with a glob",
            )
        _logger.info("%s: no %s; reading the complete set of %d part files", folder, MANIFEST, n)
        return [found[i] for i in range(n)] + sorted(other)
    return sorted(other)


def _hf_arrow_files(folder: str) -> list[str]:
    state = storage.read_json(storage.join(folder, _HF_STATE))
    files = [d["filename"] for d in state.get("_data_files", [])]
    if not files:
        raise DataError(
            folder, f"is a Hugging Face save_to_disk folder whose {_HF_STATE} lists no data files",
            fix="save the dataset again with Dataset.save_to_disk",
        )  # fmt: skip
    return [storage.join(folder, f) for f in files]


def hf_fingerprint(folder: str) -> str | None:
    """The `_fingerprint` a Hugging Face `save_to_disk` folder records for its content, if any."""
    try:
        return str(storage.read_json(storage.join(folder, _HF_STATE)).get("_fingerprint"))
    except (OSError, ValueError):
        return None


def _rejoin(fs: fsspec.AbstractFileSystem, template: str, path: str) -> str:
    """A path from `fs.glob`/`fs.ls` as the user would write it (no protocol for local paths)."""
    if storage.is_local(template):
        return path
    # Keep the user's spelling of the prefix ('memory://x' rather than fsspec's 'memory:///x').
    cut = min((template.find(c) for c in "*?[" if c in template), default=len(template))
    base = template[: template.rfind("/", 0, cut) + 1]
    stripped = fs._strip_protocol(base).rstrip("/")
    if stripped and path.startswith(stripped + "/"):
        return base.rstrip("/") + path[len(stripped) :]
    return fs.unstrip_protocol(path)


# ------------------------------------------------------------------------------------------ housekeeping


def finish_folder(folder: str, shards: list[str]) -> int:
    """After a manifest is written: delete shards (and their stats) the manifest does not list, temp files
    of interrupted writers, and pipeline work folders (`.work-*`). Returns how many entries were removed.

    Only names schooner writes are touched (`part-i-of-N.<format>`, hidden temp names, `.work-*`), never
    other files a user keeps in the folder.
    """
    keep = set(shards)
    n = 0
    for name in storage.list_dir(folder):
        path = storage.join(folder, name)
        if (SHARD_RE.match(name) and name not in keep) or storage.is_temp_name(name):
            storage.remove(path)
            n += 1
        elif name.startswith(".work-"):
            storage.remove_tree(path)
            n += 1
    stats = storage.join(folder, STATS_DIR)
    for name in storage.list_dir(stats):
        shard = name.removesuffix(".json")
        if storage.is_temp_name(name) or (SHARD_RE.match(shard) and shard not in keep):
            storage.remove(storage.join(stats, name))
            n += 1
    return n


def local_isdir(path: str) -> bool:
    return storage.is_local(path) and os.path.isdir(storage.local_path(path))
