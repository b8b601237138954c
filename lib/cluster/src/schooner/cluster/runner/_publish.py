"""Attempt folders and publication: a step's output folder only ever holds a complete, published attempt.

Every attempt writes into its own folder beside the output, `{parent}/.{name}-{key8}.attempt-{owner}`
(hidden, so `schooner status` and the report never list it), never into the output folder itself. When the
function returns and this runner still holds the lease, the attempt is published:

1. the output's `.schooner/` (status, record, history, lease) is copied into the attempt folder and the
   attempt's end (record, history line, SUCCESS) is written there;
2. the lease is checked once more (the epoch check: a runner that was stopped past its lease and lost it
   to another publishes nothing);
3. the attempt folder and the output folder are swapped in one `renameat2(RENAME_EXCHANGE)` (Linux): a
   reader opening `{out}/file` gets the old complete version or the new one, never a mix, and the status
   turns SUCCESS in the same instant. Where that call is missing (not Linux, or a filesystem without it),
   the old folder is renamed aside and the attempt renamed in (a reader can then miss the folder for that
   moment, but never sees a partial one);
4. the old version (now in the attempt's place) is deleted.

On object stores (no folder renames) the files are moved into the output after the epoch check, and the
status is written last: a reader of a SUCCESS output still never sees a partial attempt, but a reader that
read the old version's files while `--force` replaces them can see some of each.

Resumable steps: an attempt folder left by an attempt that died (or failed, or was interrupted) is adopted
by the next attempt that holds the lease, by renaming it to that attempt's name, so checkpoints and ledgers
of finished shards carry over. Folders of other dead attempts are deleted. A runner that lost its lease
writes into a folder that no longer exists (or into an orphaned one), never into the new holder's.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
from collections.abc import Callable
from typing import Any

from schooner.cluster.records import META_DIR
from schooner.cluster.storage import is_plain_path, list_folder, storage_for

_ATTEMPT = ".attempt-"


def _split(out: str) -> tuple[str, str]:
    out = out.rstrip("/")
    parent, _, base = out.rpartition("/")
    return parent, base


def attempt_path(out: str, owner: str) -> str:
    """The folder that the attempt of lease owner `owner` writes into."""
    parent, base = _split(out)
    return f"{parent}/.{base}{_ATTEMPT}{owner}"


def published_path(path: str) -> str:
    """The path that `path` will have once its attempt is published: an attempt folder's name (and any path
    inside one) is mapped to the step's output folder; other paths are returned unchanged.

    A step that needs an identity stable across attempts (a tracker's run id, a cache key) derives it from
    this, never from its `output_path`, which names the attempt's own folder."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        base, sep, owner = part.partition(_ATTEMPT)
        if sep and owner and base.startswith(".") and len(base) > 1:
            parts[i] = base[1:]
    return "/".join(parts)


def published_paths(value: Any) -> Any:
    """`value` (dicts, lists, tuples, strings) with :func:`published_path` applied to every string: for a
    step that records paths of its own output in its files (a run's config, a manifest of task files)."""
    if isinstance(value, str):
        return published_path(value) if _ATTEMPT in value else value
    if isinstance(value, dict):
        return {k: published_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(published_paths(v) for v in value)
    return value


def rebase_paths(value: Any, attempt: str, out: str) -> Any:
    """`value` (a step's result: dicts, lists, tuples, strings) with every path inside the attempt's folder
    rewritten to the same path inside the published output `out`: a result naming the files it wrote (a
    checkpoint, a manifest) stays valid once the attempt folder is gone."""
    attempt, out = attempt.rstrip("/"), out.rstrip("/")
    if attempt == out:
        return value
    if isinstance(value, str):
        if value == attempt or value.startswith(attempt + "/"):
            return out + value[len(attempt) :]
        return value
    if isinstance(value, dict):
        return {k: rebase_paths(v, attempt, out) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(rebase_paths(v, attempt, out) for v in value)
    return value


def attempt_paths(out: str) -> list[str]:
    """Every attempt folder of the step whose output is `out` (a published attempt leaves only a link to
    the output under its name, which is not one)."""
    parent, base = _split(out)
    prefix = f".{base}{_ATTEMPT}"
    found = [f"{parent}/{name}" for name in _fresh_list(parent) if name.startswith(prefix)]
    return [p for p in found if not (is_plain_path(p) and os.path.islink(p))]


def _fresh_list(folder: str) -> list[str]:
    """`list_folder`, not from a client's listing cache (s3fs keeps one per process)."""
    if not is_plain_path(folder):
        import fsspec

        fs, root = fsspec.core.url_to_fs(folder)
        fs.invalidate_cache(root)
    return list_folder(folder)


def prepare_attempt(out: str, owner: str, *, adopt: str | None, resume: bool) -> tuple[str, str | None]:
    """Make this attempt's folder; returns it and the folder it adopted (resumable steps), if any.

    Called with the lease held, so every other attempt folder belongs to a dead (or fenced-off) attempt.
    `adopt`: the folder the previous attempt recorded (preferred when several are left); `resume`: adopt
    one at all (resumable and not forced). The others are deleted.
    """
    mine = attempt_path(out, owner)
    left = [p for p in attempt_paths(out) if p != mine]
    adopted = None
    if resume and left:
        adopted = adopt if adopt in left else max(left, key=_mtime)
        _rename(adopted, mine)
        left.remove(adopted)
    for old in left:
        remove_tree(old)
    storage_for(mine).makedirs(mine)
    storage_for(mine).remove(f"{mine}/{META_DIR}/starts.jsonl")  # an adopted folder's: those are recorded
    return mine, adopted


FAILED_KEPT = 2
"""Failed attempts' folders kept per step (the newest), for debugging; older ones are deleted."""
_FAILED = ".failed-"


def failed_attempt_paths(out: str) -> list[str]:
    """The kept folders of failed attempts of the step whose output is `out`, oldest first."""
    parent, base = _split(out)
    prefix = f".{base}{_FAILED}"
    return sorted((f"{parent}/{name}" for name in _fresh_list(parent) if name.startswith(prefix)), key=_mtime)


def keep_failed_attempt(out: str, attempt: str, owner: str) -> str:
    """Move a failed attempt's folder to `{parent}/.{name}-{key8}.failed-{owner}` (kept for debugging; the
    next attempt starts from an empty folder) and delete all but the newest `FAILED_KEPT` such folders.
    Returns where it is kept."""
    parent, base = _split(out)
    kept = f"{parent}/.{base}{_FAILED}{owner}"
    _rename(attempt, kept)
    if is_plain_path(kept):
        os.utime(kept)
    for old in [p for p in failed_attempt_paths(out) if p != kept][: -(FAILED_KEPT - 1) or None]:
        remove_tree(old)
    return kept


def publish(out: str, attempt: str, write_end: Callable[[str], None], still_held: Callable[[], bool]) -> bool:
    """Make `attempt` the step's output (see the module docstring). `write_end(folder)` writes the attempt's
    end (record, history, status) into `folder`'s `.schooner/`. False, publishing nothing, when the lease was
    lost; the caller then discards the attempt."""
    if not is_plain_path(out):
        return _publish_remote(out, attempt, write_end, still_held)
    meta = os.path.join(attempt, META_DIR)
    if os.path.isdir(meta):  # gang readiness markers: nothing a reader needs
        shutil.rmtree(meta)
    # Gang markers, takeover files, the attempt's starts (recorded) and the disk reserve are not copied.
    skip = shutil.ignore_patterns("gang-*", "*.takeover-*", "disk-reserve", "starts.jsonl")
    try:
        shutil.copytree(os.path.join(out, META_DIR), meta, ignore=skip)
    except shutil.Error as e:  # one error per file: the first names the cause (a full disk...)
        first = e.args[0][0] if e.args and e.args[0] else ("?", "?", str(e))
        raise OSError(f"could not copy the records of {out} into the attempt {attempt}: {first[2]}") from None
    relative_links(attempt)
    named = _names_itself(attempt)
    write_end(attempt)
    if not still_held():
        return False
    mine = attempt
    try:
        exchange(attempt, out)
    except OSError:  # no RENAME_EXCHANGE here: the old version aside, then the new one in
        aside = attempt + ".old"
        os.rename(out, aside)
        try:
            os.rename(attempt, out)
        except OSError:  # someone made the folder meanwhile: put the old version back, fail the attempt
            with contextlib.suppress(OSError):
                os.rename(aside, out)
            raise
        attempt = aside
    remove_tree(attempt)  # the previous version now
    _leave_link(mine, out, named)
    return True


def relative_links(folder: str) -> int:
    """Rewrite every symbolic link under `folder` whose absolute target lies inside `folder` as a relative
    link, so it still resolves once the folder is renamed (published); returns how many."""
    root = os.path.abspath(folder).rstrip("/")
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = os.path.join(dirpath, name)
            if not os.path.islink(link):
                continue
            target = os.readlink(link)
            if not os.path.isabs(target) or not (target == root or target.startswith(root + "/")):
                continue
            tmp = f"{link}.relink-tmp"
            os.symlink(os.path.relpath(target, dirpath), tmp)
            os.replace(tmp, link)
            n += 1
    return n


NAMES_SCAN_BYTES = 8 * 1024 * 1024
"""Files up to this size are searched for the attempt's own path at publication (see `_names_itself`)."""
NAMES_SCAN_FILES = 2000


def _names_itself(attempt: str) -> bool:
    """Whether a file of the attempt (up to `NAMES_SCAN_FILES` files of at most `NAMES_SCAN_BYTES` each)
    holds the attempt folder's absolute path: the step wrote a path into its own attempt (a manifest, a
    config), which must keep resolving once published."""
    needle = os.fsencode(os.path.abspath(attempt).rstrip("/") + "/")
    seen = 0
    for dirpath, dirnames, filenames in os.walk(attempt):
        dirnames[:] = [d for d in dirnames if d != META_DIR]
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.path.islink(path) or os.path.getsize(path) > NAMES_SCAN_BYTES:
                    continue
                seen += 1
                if seen > NAMES_SCAN_FILES:
                    return False
                with open(path, "rb") as f:
                    if needle in f.read():
                        return True
    return False


def _leave_link(attempt: str, out: str, needed: bool) -> None:
    """The links of earlier attempts go (their output was replaced); when the published attempt's files name
    its own folder (`needed`), a link from that folder's name to the output is left (relative:
    `.{name}.attempt-{owner}` -> `{name}`), so those absolute paths still resolve."""
    parent, base = _split(out)
    with contextlib.suppress(OSError):
        for name in os.listdir(parent or "/"):
            path = os.path.join(parent, name)
            if name.startswith(f".{base}{_ATTEMPT}") and os.path.islink(path):
                os.unlink(path)
        if needed:
            os.symlink(base, attempt)


def _publish_remote(
    out: str, attempt: str, write_end: Callable[[str], None], still_held: Callable[[], bool]
) -> bool:
    import fsspec

    if not still_held():
        return False
    fs, root = fsspec.core.url_to_fs(out)
    for name in _fresh_list(out):
        if name != META_DIR:
            fs.rm(f"{root}/{name}", recursive=True)
    _move_files(attempt, out, skip=META_DIR)
    write_end(out)
    return True


def remove_tree(path: str) -> None:
    """Delete a folder and everything in it (missing is fine)."""
    if is_plain_path(path):
        if os.path.islink(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        shutil.rmtree(path, ignore_errors=True)
        return
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(root, recursive=True)


def _rename(src: str, dst: str) -> None:
    if is_plain_path(src):
        os.rename(src, dst)
        return
    _move_files(src, dst)


def _move_files(src: str, dst: str, skip: str | None = None) -> None:
    """Move every object under `src` to the same name under `dst` (object stores: copy, then delete), except
    those under its top-level entry `skip`; then delete `src`."""
    import fsspec

    fs, sroot = fsspec.core.url_to_fs(src)
    droot = fsspec.core.url_to_fs(dst)[1]
    sroot = sroot.rstrip("/")
    fs.invalidate_cache(sroot)
    for path in fs.find(sroot):
        rel = path[len(sroot) :].lstrip("/")
        if skip is None or rel.split("/", 1)[0] != skip:
            fs.cp_file(path, f"{droot}/{rel}")
    remove_tree(src)


def _mtime(path: str) -> float:
    if is_plain_path(path):
        try:
            return os.stat(path).st_mtime
        except OSError:
            return 0.0
    return 0.0


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str, b: str) -> None:
    """Swap two paths atomically (Linux `renameat2(RENAME_EXCHANGE)`); OSError where unsupported."""
    fn = _renameat2()
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2({a!r}, {b!r}, RENAME_EXCHANGE): {os.strerror(err)}")


_renameat2_fn: object = None


def _renameat2() -> Callable[..., int] | None:
    global _renameat2_fn
    if _renameat2_fn is None:
        fn = None
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2_fn = fn or False
    return _renameat2_fn or None  # type: ignore[return-value]
