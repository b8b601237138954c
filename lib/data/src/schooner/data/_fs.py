"""Paths on any fsspec filesystem: globbing, listing record folders, and atomic (temp + rename) writes."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import IO, Any

import fsspec
import orjson

MANIFEST = "manifest.json"
"""The file a record folder's writer writes last; its presence means the folder is complete."""

STATS_DIR = ".shard-stats"
"""Per-shard statistics written just before each shard, so a resumed write knows finished shards."""

READABLE_SUFFIXES: tuple[str, ...] = (
    ".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd", ".ndjson", ".ndjson.gz", ".ndjson.zst",
    ".json", ".json.gz", ".json.zst", ".parquet", ".txt", ".txt.gz", ".txt.zst", ".text", ".md",
)  # fmt: skip
"""File names `list_shards` picks up in a folder without a manifest."""

_GLOB_CHARS = ("*", "?", "[")


def url_to_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path inside it for a local path or an fsspec URL."""
    return fsspec.core.url_to_fs(url)


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _rejoin(fs: fsspec.AbstractFileSystem, template: str, path: str) -> str:
    """A path from `fs.glob`/`fs.ls` as the user would write it (no protocol for local paths)."""
    if is_local(template):
        return path
    # Keep the user's spelling of the prefix ('memory://x' rather than fsspec's 'memory:///x').
    cut = min((template.find(c) for c in _GLOB_CHARS if c in template), default=len(template))
    base = template[: template.rfind("/", 0, cut) + 1]
    stripped = fs._strip_protocol(base).rstrip("/")
    if stripped and path.startswith(stripped + "/"):
        return base.rstrip("/") + path[len(stripped) :]
    return fs.unstrip_protocol(path)


def join(base: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and URLs alike."""
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.lstrip('/')}"
    return out


def exists(url: str) -> bool:
    fs, p = url_to_fs(url)
    return fs.exists(p)


def open_file(url: str, mode: str = "rb") -> IO[Any]:
    """Open a local path (plain `open`, the fast path) or an fsspec URL."""
    if is_local(url):
        return open(url.removeprefix("file://"), mode)
    fs, p = url_to_fs(url)
    return fs.open(p, mode)


def file_size(url: str) -> int:
    if is_local(url):
        return os.path.getsize(url.removeprefix("file://"))
    fs, p = url_to_fs(url)
    return int(fs.size(p))


def read_json(url: str) -> Any:
    with open_file(url, "rb") as f:
        return orjson.loads(f.read())


def makedirs(url: str) -> None:
    fs, p = url_to_fs(url)
    fs.makedirs(p, exist_ok=True)


def has_glob(path: str) -> bool:
    return any(c in path for c in _GLOB_CHARS)


def expand_paths(paths: str | list[str] | tuple[str, ...]) -> list[str]:
    """Expand globs and record folders into a sorted list of files (each group in its own order).

    Raises:
        FileNotFoundError: a path or glob that matches nothing, naming it.
    """
    if isinstance(paths, str):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        out.extend(list_shards(p))
    return out


def list_shards(path_or_glob: str) -> list[str]:
    """The shard files of a record folder, or the files matching a glob.

    A folder with a `manifest.json` lists the manifest's shards in order; a folder without one lists its
    `part-*` files (or else every readable file) sorted by name; a glob lists matching files sorted; a
    file is returned as itself.

    Raises:
        FileNotFoundError: nothing there, or a glob/folder with no data files, naming the path.
    """
    fs, p = url_to_fs(path_or_glob)
    if has_glob(path_or_glob):
        found = sorted(x for x in fs.glob(p) if fs.isfile(x))
        if not found:
            raise FileNotFoundError(f"no files match {path_or_glob!r}; check the pattern and the folder")
        return [_rejoin(fs, path_or_glob, x) for x in found]
    if fs.isfile(p):
        return [path_or_glob]
    if not fs.isdir(p):
        raise FileNotFoundError(f"{path_or_glob!r} does not exist (neither a file, a folder nor a glob)")
    manifest = join(path_or_glob, MANIFEST)
    if fs.exists(join(p, MANIFEST)):
        m = read_json(manifest)
        return [join(path_or_glob, s["path"]) for s in m["shards"]]
    names = sorted(os.path.basename(x.rstrip("/")) for x in fs.ls(p, detail=False) if fs.isfile(x))
    names = [n for n in names if not n.startswith(".")]
    parts = [n for n in names if n.startswith("part-") and n.endswith(READABLE_SUFFIXES)]
    chosen = parts or [n for n in names if n.endswith(READABLE_SUFFIXES)]
    if not chosen:
        raise FileNotFoundError(
            f"folder {path_or_glob!r} holds no data files (looked for {', '.join(READABLE_SUFFIXES)}); "
            "pass a glob such as 'folder/*.jsonl' or name the files"
        )
    return [join(path_or_glob, n) for n in chosen]


def temp_name(final: str) -> str:
    """A hidden temporary name beside `final`, unique per writer."""
    head, _, name = final.rpartition("/")
    tmp = f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return f"{head}/{tmp}" if head else tmp


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


@contextlib.contextmanager
def atomic_open(final: str) -> Iterator[IO[bytes]]:
    """Write to a temporary name beside `final` and rename it into place only when the block succeeds.

    A crash (even SIGKILL) leaves at most a hidden temp file, never a partial file under the final name.
    """
    tmp = temp_name(final)
    if is_local(final):
        final_local = final.removeprefix("file://")
        tmp_local = tmp.removeprefix("file://")
        os.makedirs(os.path.dirname(final_local) or ".", exist_ok=True)
        f = open(tmp_local, "wb")  # noqa: SIM115 (closed before the rename)
        try:
            yield f
            f.close()
            os.replace(tmp_local, final_local)
        except BaseException:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_local)
            raise
        return
    fs, tp = url_to_fs(tmp)
    _, fp = url_to_fs(final)
    fs.makedirs(fs._parent(fp), exist_ok=True)
    f = fs.open(tp, "wb")
    try:
        yield f
        f.close()
        fs.mv(tp, fp)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(tp)
        raise


def write_bytes_atomic(final: str, data: bytes) -> None:
    with atomic_open(final) as f:
        f.write(data)


def remove_temp_files(folder: str) -> int:
    """Delete what interrupted writers left in `folder`: temp files (also in the stats folder) and
    pipeline work folders (`.work-*`). Called when a write has finished, so none of them is in use."""
    fs, p = url_to_fs(folder)
    n = 0
    for sub in (p, join(p, STATS_DIR)):
        if not fs.isdir(sub):
            continue
        for x in fs.ls(sub, detail=False):
            name = os.path.basename(x.rstrip("/"))
            if is_temp_name(name) or (sub == p and name.startswith(".work-")):
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(x, recursive=True)
                    n += 1
    return n


def remove_tree(url: str) -> None:
    fs, p = url_to_fs(url)
    if fs.exists(p):
        fs.rm(p, recursive=True)
