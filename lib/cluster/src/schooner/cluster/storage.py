"""The storage layer of every Schooner package: local paths through `os`, any other URL through fsspec.

Local paths (and `file://` URLs) use `os` calls: the no-op rerun reads one small file per step, so this
path must be cheap. Any other URL (`memory://`, `gs://`, `s3://`, ...) goes through fsspec.

Reading: `read_text`, `read_bytes` and `read_json` raise `FileNotFoundError` for a missing file (test
with `exists` first, or catch it); `read_json` (and `loads_json`, for text) reads strictly: NaN, Infinity and
-Infinity, which Python's `json` reads and other readers refuse, raise `NotStandardJSON` naming the file, line
and column; `open_file` streams a file; `read_json_lines` streams the rows of a
JSON-lines file (plain or `.gz`) with their line numbers, naming a bad line `path:line` with the fix;
`decode_utf8` decodes an input file's bytes, naming a non-UTF-8 byte by line, column and offset;
`json_kind` names a parsed JSON value's kind in JSON's words ("an array", "null") for such messages, and
`json_value` the kind with the value ("a number: 5");
`listdir`, `glob`, `exists`, `isdir`, `file_size`. (Paths live in `_paths`, reading in `_reading`; this
module is their public face.)

Writing is atomic: readers see the old file or the new one, never a part.

- whole files (`write_text`, `write_bytes`, `write_json`): locally a uniquely named temporary file
  beside the target (host, pid and a random part, so writers on several hosts of a shared filesystem
  never collide), fsync'd, renamed over the target and the folder fsync'd (`durable=False` skips the
  fsyncs); on object stores one put of the whole object;
- streamed files (`atomic_open`): the same protocol, writing the temporary file as they go; on object
  stores the object is uploaded with one put when the block succeeds. A killed writer leaves at most a
  hidden temporary file, which `is_temp_name` tells from data.

JSON is written deterministically: keys sorted (`sort_keys=False` keeps insertion order), text as
written (non-ASCII characters unescaped), and NaN or infinity refused with a `ValueError` naming the file and where
in the value it sits: JSON has no such numbers, and Python's `NaN` token is not JSON other readers
accept. Convert them first (`None`, or drop the field); `schooner.cluster.records` stores the metrics
of a diverged run that way.

Exclusive creation (leases) is a hard link of a complete temporary file locally, and
`pipe_file(mode="create")` through fsspec: a conditional write where the backend implements it natively
(`If-None-Match` on S3, `ifGenerationMatch=0` on GCS; a lock for `memory://`). Where it does not, fsspec
falls back to check-then-write; a read-back afterwards narrows that race but cannot close it.

Example:
    >>> from schooner.cluster import storage
    >>> storage.write_json("memory://demo/done.json", {"ok": True, "n": 3})
    >>> storage.read_json("memory://demo/done.json")
    {'n': 3, 'ok': True}
    >>> storage.read_text("memory://demo/done.json")
    '{\\n "n": 3,\\n "ok": true\\n}\\n'
    >>> with storage.atomic_open("memory://demo/big.txt", "w") as f:
    ...     _ = f.write("line 1\\n")
    >>> storage.listdir("memory://demo")
    ['big.txt', 'done.json']
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import IO, Any

from ._paths import is_local as is_local
from ._paths import is_plain_path as is_plain_path
from ._paths import join as join
from ._paths import local_path as local_path
from ._paths import normalize_prefix as normalize_prefix
from ._paths import url_to_fs as url_to_fs
from ._reading import NotStandardJSON as NotStandardJSON
from ._reading import decode_utf8 as decode_utf8
from ._reading import exists as exists
from ._reading import file_size as file_size
from ._reading import isdir as isdir
from ._reading import json_kind as json_kind
from ._reading import json_value as json_value
from ._reading import loads_json as loads_json
from ._reading import open_file as open_file
from ._reading import read_bytes as read_bytes
from ._reading import read_json as read_json
from ._reading import read_json_lines as read_json_lines
from ._reading import read_text as read_text

NotStandardJSON.__module__ = __name__  # tracebacks name it where the docs find it: schooner.cluster.storage


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
    write_bytes(path, data)


def clear_folder(path: str, keep: str) -> list[str]:
    """Delete everything in the folder `path` except its entry named `keep`; the names deleted.

    Local folders are emptied with `os`/`shutil`; URLs through fsspec (recursive `rm` per entry).
    A missing folder is empty.
    """
    removed = []
    if is_local(path):
        import shutil

        path = local_path(path)
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


def listdir(path: str) -> list[str]:
    """The names of the entries of folder `path`, sorted (empty when it does not exist)."""
    if is_local(path):
        try:
            return sorted(os.listdir(local_path(path)))
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


def _atomic_open_bytes(path: str) -> Generator[IO[bytes], None, None]:
    """A binary file to write `path` through, streamed: it appears under its final name, complete and
    durable, only when the block succeeds; a crash (even SIGKILL) leaves at most a hidden temporary file
    beside it (`is_temp_name`). The streamed form of `atomic_write`, with the same protocol.

    On object stores the stream goes to a local temporary file uploaded with one `put_file` when the block
    succeeds: the store's own atomic put.
    """
    if not is_local(path):
        yield from _remote_atomic_open(path)
        return
    path = local_path(path)
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


def _remote_atomic_open(path: str) -> Generator[IO[bytes], None, None]:
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
    if is_plain_path(path):
        return _LOCAL
    import fsspec

    fs, _ = fsspec.core.url_to_fs(path)
    return FsspecStorage(fs)


# ------------------------------------------------------------------------------------------ public API
# (reading: `exists`, `isdir`, `file_size`, `open_file`, `read_*`, `read_json_lines` in `_reading`)


def list_folder(path: str) -> list[str]:
    """The old name of `listdir`."""
    return listdir(path)


def glob(pattern: str) -> list[str]:
    """The paths matching `pattern` (`*`, `?`, `[...]`, `**` across folders), sorted; URLs keep their protocol."""
    if is_local(pattern):
        return _LOCAL.glob(local_path(pattern))
    fs, _ = url_to_fs(pattern)
    return FsspecStorage(fs).glob(pattern)


def makedirs(path: str) -> None:
    """Create the folder `path` and its parents (nothing when it exists; object stores need no folders)."""
    if is_local(path):
        _LOCAL.makedirs(local_path(path))
        return
    fs, p = url_to_fs(path)
    with contextlib.suppress(FileExistsError):
        fs.makedirs(p, exist_ok=True)


def remove(path: str) -> None:
    """Delete one file (nothing when it is already gone)."""
    if is_local(path):
        _unlink(local_path(path))
        return
    fs, p = url_to_fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(p)


def remove_tree(path: str) -> None:
    """Delete a folder and everything in it (nothing when it is already gone)."""
    if is_local(path):
        import shutil

        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    fs, p = url_to_fs(path)
    if fs.exists(p):
        fs.rm(p, recursive=True)


def write_bytes(path: str, data: bytes | str, *, durable: bool = True) -> None:
    """Replace the file at `path` atomically, creating its folder if needed.

    Locally: a temporary file beside `path`, renamed over it; `durable` (the default) fsyncs the file and
    its folder first, so the new content survives a power loss. Object stores: one put of the whole object.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if is_local(path):
        _LOCAL.write_bytes(local_path(path), blob, durable=durable)
        return
    fs, p = url_to_fs(path)
    fs.pipe_file(p, blob)


def write_text(path: str, text: str, *, durable: bool = True) -> None:
    """Replace the file at `path` with UTF-8 `text`, atomically (see `write_bytes`)."""
    write_bytes(path, text.encode("utf-8"), durable=durable)


def dumps_json(
    value: Any,
    *,
    indent: int | None = 1,
    sort_keys: bool = True,
    default: Callable[[Any], Any] | None = None,
    where: str = "value",
) -> str:
    """`value` as JSON text, deterministically (sorted keys), text unescaped, no trailing newline.

    Raises:
        ValueError: `value` holds NaN or an infinity (JSON has no such numbers); the message names where
            (`where` is the name of the whole value, a file path for `write_json`).
        TypeError: `value` holds something JSON cannot represent and `default` does not convert.
    """
    import json

    try:
        return json.dumps(
            value, indent=indent, sort_keys=sort_keys, default=default, ensure_ascii=False, allow_nan=False
        )
    except ValueError as e:
        spot = _non_finite(value, "$")
        if spot is None:
            raise
        raise ValueError(
            f"{where}: {spot[0]} is {spot[1]!r}, which JSON cannot hold; store None (null) or leave the "
            "field out instead"
        ) from e


def _non_finite(value: Any, at: str) -> tuple[str, float] | None:
    """Where the first NaN or infinity inside `value` is (`$.a[2].b`) and its value."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return at, value
    if isinstance(value, dict):
        for k, v in value.items():
            found = _non_finite(v, f"{at}.{k}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = _non_finite(v, f"{at}[{i}]")
            if found:
                return found
    return None


def write_json(
    path: str,
    value: Any,
    *,
    indent: int | None = 1,
    sort_keys: bool = True,
    default: Callable[[Any], Any] | None = None,
    durable: bool = True,
) -> None:
    """Write `value` as JSON (and a final newline) to `path`, atomically and deterministically.

    Keys are sorted (`sort_keys=False` keeps their order), `indent=None` writes one compact line, and
    `default` converts what JSON cannot hold (`default=str` for paths and the like).

    Raises:
        ValueError: `value` holds NaN or an infinity; the message names the file and where the number is.
            Nothing is written.
        TypeError: `value` holds something JSON cannot represent and `default` does not convert.
    """
    text = dumps_json(value, indent=indent, sort_keys=sort_keys, default=default, where=path)
    write_text(path, text + "\n", durable=durable)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """A file to write `path` through, streamed (`mode` `"wb"`, or `"w"` for UTF-8 text): it appears
    under its final name, complete and durable, only when the block succeeds; a crash (even SIGKILL)
    leaves at most a hidden temporary file beside it (`is_temp_name`). The streamed form of `write_bytes`.

    On object stores the stream goes to a local temporary file uploaded with one put when the block
    succeeds: the store's own atomic put.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'wb' or 'w', got mode={mode!r}")
    gen = _atomic_open_bytes(path)
    f = next(gen)
    try:
        if mode == "w":
            import io

            text = io.TextIOWrapper(f, encoding="utf-8", newline="")
            try:
                yield text
                text.flush()
            finally:
                text.detach()
        else:
            yield f
    except BaseException as e:
        with contextlib.suppress(StopIteration):
            gen.throw(e)
        raise
    with contextlib.suppress(StopIteration):
        next(gen)
