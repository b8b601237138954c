"""User files as step inputs, keyed by what they hold, never by where they sit.

A step that reads files the user has (a crawl dump, a folder of jsonl) must rerun when a file is edited and
must not rerun when the folder is moved. `InputFiles(patterns)` expands the patterns once, when the handle
is built, and its part of the step key is a fingerprint: for every file, its name relative to its
pattern's root (the folder before the first wildcard), its size and a content hash. The absolute paths are
runtime-only: the step gets them from `.paths`.

The hash (BLAKE2b-128): of the whole file up to `full_hash_bytes` (64 MiB by default); of a larger file,
of its size, its first and its last 8 MiB. The trade-off, chosen for inputs of many GB: an edit inside a
large file that keeps its size and leaves both ends alone is not seen; pass `full_hash_bytes=None` to hash
every byte. Object stores give a content checksum without a download (S3 ETag, GCS md5/crc32c), used
when present. Hashes of local files are remembered per process by (path, size, mtime, inode).
"""

from __future__ import annotations

import glob
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DEFAULT_FULL_HASH_BYTES = 64 * 2**20
"""Files up to this size are hashed whole; larger ones by size, head and tail."""
_EDGE_BYTES = 8 * 2**20
_CHUNK = 2**20
_WILDCARDS = "*?["

_memo: dict[tuple[str, int, int, int, int | None], str] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class FileEntry:
    """One file of an `InputFiles`: its name under the pattern's root, size and content hash."""

    name: str
    size: int
    digest: str


class InputFiles:
    """Files (paths, globs or fsspec URLs) as a step input, fingerprinted by content when built.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.jsonl").write_text('{"text": "hi"}')
        >>> files = InputFiles([str(d / "*.jsonl")])
        >>> [e.name for e in files.entries], files.paths == [str(d / "a.jsonl")]
        (['a.jsonl'], True)

    Args:
        patterns: files, folders (every file below them), globs (`**` recurses) or URLs.
        full_hash_bytes: hash files up to this size whole, larger ones by head and tail (see the module
            docstring); None hashes every byte.
    """

    __slots__ = ("entries", "full_hash_bytes", "paths", "patterns")
    patterns: tuple[str, ...]
    """The patterns, made absolute."""
    full_hash_bytes: int | None
    entries: tuple[FileEntry, ...]
    """What the key holds: per file its relative name, size and hash."""
    paths: list[str]
    """The absolute paths (or URLs) of the files, in the order of `entries`: where they sit today."""

    def __init__(
        self, patterns: str | Iterable[str], *, full_hash_bytes: int | None = DEFAULT_FULL_HASH_BYTES
    ) -> None:
        if isinstance(patterns, str | os.PathLike):
            patterns = [patterns]
        pats = tuple(_absolute(os.fspath(p)) for p in patterns)
        if not pats:
            raise ValueError("InputFiles: no patterns given; pass files, folders, globs or URLs")
        if full_hash_bytes is not None and (isinstance(full_hash_bytes, bool) or full_hash_bytes < 0):
            raise ValueError(f"InputFiles: full_hash_bytes must be None or >= 0, got {full_hash_bytes!r}")
        entries, paths = [], []
        seen: set[str] = set()
        for pat in pats:
            found = list(_expand(pat))
            if not found and "://" not in pat and os.path.isdir(pat):
                raise FileNotFoundError(
                    f"InputFiles: {pat!r} is a folder with no files in it (hidden files, named with a leading "
                    "'.', are not taken from a folder); put the files there or name them"
                )
            if not found:
                raise FileNotFoundError(
                    f"InputFiles: {pat!r} matches no file; check the path (relative paths are taken from the "
                    f"working directory {os.getcwd()})"
                )
            root = _root(pat)
            for path, size in found:
                if path in seen:  # named by an earlier pattern too: one file is one input
                    continue
                seen.add(path)
                rel = path[len(root) :].lstrip("/") if path.startswith(root) else os.path.basename(path)
                entries.append(FileEntry(_name(rel), size, _digest(path, size, full_hash_bytes)))
                paths.append(path)
        object.__setattr__(self, "patterns", pats)
        object.__setattr__(self, "full_hash_bytes", full_hash_bytes)
        object.__setattr__(self, "entries", tuple(entries))
        object.__setattr__(self, "paths", paths)

    def __schooner_canonical__(self) -> dict[str, Any]:
        return {
            "__files__": [[e.name, e.size, e.digest] for e in self.entries],
            "full_hash_bytes": self.full_hash_bytes,
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InputFiles) and other.__schooner_canonical__() == self.__schooner_canonical__()
        )

    def __hash__(self) -> int:
        return hash(tuple(self.entries))

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"InputFiles({list(self.patterns)!r}, {len(self.entries)} files)"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("InputFiles is immutable: build a new one")

    def __reduce__(self) -> tuple:
        # Sent to workers as is (no re-hash): the fingerprint was taken when the experiment was built.
        return (_rebuild, (self.patterns, self.full_hash_bytes, self.entries, self.paths))


def _name(rel: str) -> str:
    """A name for the key: a local name's undecodable bytes (Linux names are bytes; Python holds them as
    lone surrogates, which no UTF-8 record can hold) written as `\\xNN`."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")
    return rel


def _rebuild(patterns: tuple, full: int | None, entries: tuple, paths: list) -> InputFiles:
    obj = object.__new__(InputFiles)
    for k, v in (("patterns", patterns), ("full_hash_bytes", full), ("entries", entries), ("paths", paths)):
        object.__setattr__(obj, k, v)
    return obj


def _absolute(path: str) -> str:
    if path.startswith("file://"):
        path = path[len("file://") :]
    if "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))


def _root(pattern: str) -> str:
    """The folder that names are taken relative to: the part before the first wildcard, or the pattern's
    own folder (for a folder: itself; for a file: its parent)."""
    cut = min((i for i in (pattern.find(c) for c in _WILDCARDS) if i >= 0), default=-1)
    if cut >= 0 and not _exists_literally(pattern):
        return pattern[: pattern.rfind("/", 0, cut) + 1]
    if _is_dir(pattern):
        return pattern.rstrip("/") + "/"
    return pattern[: pattern.rfind("/") + 1]


def _exists_literally(pattern: str) -> bool:
    """A local path that exists as written: 'shard[1].jsonl' is that file, not a character class."""
    return "://" not in pattern and os.path.lexists(pattern)


def _is_dir(path: str) -> bool:
    if "://" not in path:
        return os.path.isdir(path)
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    return bool(fs.isdir(root))


def _expand(pattern: str) -> Iterator[tuple[str, int]]:
    """(path, size) of every file the pattern names, sorted. Hidden files and folders met on the way (in a
    folder, or matched by a wildcard that does not start with a dot) are skipped; one named is not."""
    if "://" in pattern:
        yield from _expand_url(pattern)
        return
    if any(c in pattern for c in _WILDCARDS) and not _exists_literally(pattern):
        matches = glob.glob(pattern, recursive=True)  # no hidden names unless the pattern's part has a dot
    elif os.path.isdir(pattern):
        matches = glob.glob(os.path.join(glob.escape(pattern), "**", "*"), recursive=True)
    else:
        matches = [pattern] if os.path.exists(pattern) else []
    for p in sorted(matches):
        if os.path.isfile(p):
            yield p, os.path.getsize(p)


def _expand_url(pattern: str) -> Iterator[tuple[str, int]]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(pattern)
    proto = pattern.split("://", 1)[0]
    if any(c in pattern for c in _WILDCARDS):
        infos = fs.glob(root, detail=True)
    elif fs.isdir(root):
        infos = fs.find(root, detail=True)
    else:
        infos = {root: fs.info(root)} if fs.exists(root) else {}
    for path, info in sorted(infos.items()):
        if info.get("type") == "file":
            yield (path if "://" in path else f"{proto}://{path.lstrip('/')}"), int(info.get("size") or 0)


def _digest(path: str, size: int, full: int | None) -> str:
    if "://" in path:
        return _url_digest(path, size, full)
    st = os.stat(path)
    memo_key = (path, st.st_size, st.st_mtime_ns, st.st_ino, full)
    with _memo_lock:
        if memo_key in _memo:
            return _memo[memo_key]
    with open(path, "rb") as f:
        digest = _hash_stream(f, size, full)
    with _memo_lock:
        _memo[memo_key] = digest
    return digest


def _url_digest(path: str, size: int, full: int | None) -> str:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    info = fs.info(root)
    for key in ("md5Hash", "crc32c", "ETag", "etag", "checksum"):
        if info.get(key):  # the store's own content checksum: no download
            return f"{key}:{str(info[key]).strip(chr(34))}"
    with fs.open(root, "rb") as f:
        return _hash_stream(f, size, full)


def _hash_stream(f: Any, size: int, full: int | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    if full is None or size <= full:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
        return h.hexdigest()
    h.update(f"size={size};head+tail={_EDGE_BYTES}".encode())
    h.update(f.read(_EDGE_BYTES))
    f.seek(max(0, size - _EDGE_BYTES))
    h.update(f.read(_EDGE_BYTES))
    return "edges:" + h.hexdigest()
