"""Small-file storage for status, lease and record files: the local filesystem directly, else fsspec.

Local paths use `os` calls (the no-op rerun reads one small file per step, so this path must be cheap);
any other URL (`memory://`, `gs://`, `s3://`, ...) goes through fsspec. `file://` URLs are local paths.

Atomicity: local writes go to a temporary file and are renamed into place; exclusive creation is a hard
link of a complete temporary file (fails if the target exists), so a reader never sees a half-written
lease. Through fsspec, whole-object writes are atomic on object stores, and exclusive creation is
`pipe_file(mode="create")`: a conditional write where the backend implements it natively (`If-None-Match`
on S3, `ifGenerationMatch=0` on GCS; a lock for `memory://`). Where it does not, fsspec falls back to
check-then-write; a read-back afterwards narrows that race but cannot close it (see the README).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from typing import Any


def normalize_prefix(prefix: str) -> str:
    """An absolute local path for local prefixes (also `file://...`), else the URL without trailing '/'."""
    if prefix.startswith("file://"):
        prefix = prefix[len("file://") :]
    if "://" in prefix:
        return prefix.rstrip("/")
    return os.path.abspath(os.path.expanduser(prefix))


def is_local(path: str) -> bool:
    return "://" not in path


class LocalStorage:
    """Status/lease/record files on a local (or NFS-like POSIX) filesystem."""

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_text(self, path: str, text: str) -> None:
        tmp = self._write_tmp(path, text)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise

    def create_exclusive(self, path: str, text: str) -> bool:
        tmp = self._write_tmp(path, text)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some FUSE mounts): O_EXCL, content follows immediately
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            return True
        finally:
            _unlink(tmp)

    def remove(self, path: str) -> None:
        _unlink(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        if not os.path.isdir(path):  # a stat is much cheaper than a failing mkdir
            os.makedirs(path, exist_ok=True)

    def glob(self, pattern: str) -> list[str]:
        import glob

        return sorted(glob.glob(pattern, recursive=True))

    def _write_tmp(self, path: str, text: str) -> str:
        """A complete temporary file next to `path` (creating the folder on first use)."""
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f".tmp-{uuid.uuid4().hex[:16]}-{os.path.basename(path)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(parent, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except BaseException:
            _unlink(tmp)
            raise
        return tmp


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class FsspecStorage:
    """Status/lease/record files through an fsspec filesystem (object stores, `memory://`)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def read_text(self, path: str) -> str | None:
        try:
            return self.fs.cat_file(path).decode("utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_text(self, path: str, text: str) -> None:
        self.fs.pipe_file(path, text.encode("utf-8"))

    def create_exclusive(self, path: str, text: str) -> bool:
        data = text.encode("utf-8")
        if _protocol(self.fs) == "memory":  # in-process store: a lock makes check-then-write exclusive
            with _MEMORY_LOCK:
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, data)
                return True
        try:
            # fsspec's conditional create: atomic where the backend implements it natively (S3
            # If-None-Match, GCS ifGenerationMatch=0); fsspec's generic fallback is check-then-write.
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except TypeError:  # an older backend without `mode`: check-then-write
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
        # Read back: with a non-atomic backend, a racing writer that overwrote us is seen here.
        return self.read_text(path) == text

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def glob(self, pattern: str) -> list[str]:
        protocol = pattern.split("://", 1)[0]
        return sorted(p if "://" in p else f"{protocol}://{p.lstrip('/')}" for p in self.fs.glob(pattern))


_MEMORY_LOCK = threading.Lock()


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


Storage = LocalStorage | FsspecStorage
_LOCAL = LocalStorage()


def storage_for(path: str) -> Storage:
    """The storage to use for files under `path` (a normalised prefix or output path)."""
    if is_local(path):
        return _LOCAL
    import fsspec

    fs, _ = fsspec.core.url_to_fs(path)
    return FsspecStorage(fs)
