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
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import IO, Any


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
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes, *, durable: bool = False) -> None:
        """Replace `path` atomically; `durable` also fsyncs the file and its folder."""
        tmp = self._write_tmp(path, data, durable=durable)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
        if durable:
            _fsync_dir(os.path.dirname(path) or ".")

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

    def _write_tmp(self, path: str, data: str | bytes, *, durable: bool = False) -> str:
        """A complete temporary file next to `path` (creating the folder on first use)."""
        parent = os.path.dirname(path) or "."
        tmp = temp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(parent, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            _unlink(tmp)
            raise
        return tmp


def atomic_write(path: str, data: bytes | str) -> None:
    """Write a whole file so that readers see the old content or the new, never a part; durable on return.

    Local paths: a uniquely named temporary file beside `path` (host, pid and a random part, so writers on
    several hosts of a shared filesystem never collide), fsync'd, renamed over `path`, and the folder
    fsync'd so the rename survives a power loss. The folder is created if needed. URLs (`gs://`, `s3://`,
    `memory://`, ...): one fsspec `pipe_file`, which object stores apply as a single atomic put.

    This is the one atomic write of Schooner's packages: the data and tokenize packages use it too.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if not is_local(path):
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        fs.pipe_file(root, blob)
        return
    _LOCAL.write_bytes(path, blob, durable=True)


def clear_folder(path: str, keep: str) -> list[str]:
    """Delete everything in the folder `path` except its entry named `keep`; the names deleted.

    Local folders are emptied with `os`/`shutil`; URLs through fsspec (recursive `rm` per entry).
    A missing folder is empty.
    """
    removed = []
    if is_local(path):
        import shutil

        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return []
        for e in entries:
            if e.name == keep:
                continue
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                _unlink(e.path)
            removed.append(e.name)
        return sorted(removed)
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name == keep:
            continue
        fs.rm(entry, recursive=True)
        removed.append(name)
    return sorted(removed)


def list_folder(path: str) -> list[str]:
    """The names of the entries of folder `path` (empty when it does not exist)."""
    if is_local(path):
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    try:
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=False))
    except FileNotFoundError:
        return []


_HOST_TAG = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:24]


def unique_tag() -> str:
    """`host-pid-random`: unique across the hosts of a shared filesystem, processes and attempts (the pid is
    read now, so a forked child gets its own; the random part separates processes that report one pid)."""
    return f"{_HOST_TAG}-{os.getpid()}-{uuid.uuid4().hex[:10]}"


def temp_name(final: str) -> str:
    """The hidden temporary name beside `final` that atomic writes go through: `.{name}.tmp-{unique_tag}`."""
    head, _, name = final.rpartition("/")
    tmp = f".{name}.tmp-{unique_tag()}"
    return f"{head}/{tmp}" if head else tmp


def is_temp_name(name: str) -> bool:
    """Whether a file name is an atomic write's temporary file (left behind only by a killed writer)."""
    return name.startswith(".") and ".tmp-" in name


@contextlib.contextmanager
def atomic_open(path: str) -> Iterator[IO[bytes]]:
    """A binary file to write `path` through, streamed: it appears under its final name, complete and
    durable, only when the block succeeds; a crash (even SIGKILL) leaves at most a hidden temporary file
    beside it (`is_temp_name`). The streamed form of `atomic_write`, with the same protocol.

    On object stores the stream goes to a local temporary file uploaded with one `put_file` when the block
    succeeds: the store's own atomic put.
    """
    if not is_local(path):
        yield from _remote_atomic_open(path)
        return
    folder = os.path.dirname(path) or "."
    tmp = temp_name(path)
    try:
        f = open(tmp, "wb")  # noqa: SIM115 - closed before the rename
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        f = open(tmp, "wb")  # noqa: SIM115
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        _unlink(tmp)
        raise
    _fsync_dir(folder)


def _remote_atomic_open(path: str) -> Iterator[IO[bytes]]:
    import tempfile

    import fsspec

    fs, fp = fsspec.core.url_to_fs(path)
    with tempfile.NamedTemporaryFile(prefix="schooner-upload-") as f:
        yield f
        f.flush()
        with contextlib.suppress(Exception):  # stores without folders
            fs.makedirs(fs._parent(fp), exist_ok=True)
        fs.put_file(f.name, fp)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not open folders; the file itself is synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
