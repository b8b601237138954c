"""The embedded corpus: real text from the running Python installation, identical on every machine.

Two sources, both read from files (nothing is imported, so no module's side effects run):

* `"python-docs"`: English prose. The language reference topics of `pydoc_data.topics` (one record per
  topic) and, per standard library module, its module/class/function docstrings with signatures, laid out
  like `pydoc` text (one record per module).
* `"python-code"`: the standard library's Python source, one record per file.

Test suites, tool packages and site-packages are excluded (`EXCLUDED`). Modules are visited in sorted
order and ids are content hashes (`content_id(text, source, module)`), so the same Python version gives
the same records with the same ids. Files that cannot be read or parsed are skipped and counted in
`source_report(name)["skipped"]`. Built sources are cached on disk (see `CACHE_ENV`), keyed by the
Python build and every file's size and mtime, so worker processes do not rebuild them.

Example:
    >>> from schooner.data.sources import SOURCES, iter_source
    >>> sorted(SOURCES)
    ['python-code', 'python-docs']
    >>> next(iter_source("python-docs"))["source"]
    'python-docs'
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator

import orjson
import zstandard

from ._records import content_id

SOURCES: dict[str, str] = {
    "python-docs": "English prose: pydoc_data language-reference topics and standard library docstrings",
    "python-code": "Python source code of the standard library, one record per file",
}
"""The embedded sources, name -> description."""

EXCLUDED: frozenset[str] = frozenset(
    {"test", "tests", "idlelib", "tkinter", "lib2to3", "turtledemo", "ensurepip", "pydoc_data", "__pycache__"}
)
"""Package folders skipped at any depth (tests, GUI/tool packages; pydoc_data is read as topics)."""


def stdlib_dir() -> str:
    """The folder of the running interpreter's pure-Python standard library."""
    return sysconfig.get_path("stdlib")


def _is_identifier_dir(name: str) -> bool:
    # site-packages, lib-dynload and config-3.x-... are not identifiers, so they are never walked.
    return name.isidentifier() and name not in EXCLUDED


def stdlib_files() -> list[tuple[str, str]]:
    """(module name, absolute path) of every included stdlib `.py` file, sorted by module name."""
    root = stdlib_dir()
    out: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel != "." and not os.path.exists(os.path.join(dirpath, "__init__.py")):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if _is_identifier_dir(d))
        prefix = "" if rel == "." else rel.replace(os.sep, ".") + "."
        for fn in filenames:
            stem, ext = os.path.splitext(fn)
            if ext != ".py" or not stem.isidentifier():
                continue
            mod = prefix[:-1] if stem == "__init__" else prefix + stem
            out.append((mod, os.path.join(dirpath, fn)))
    out.sort()
    return out


def _call_signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    try:
        return f"{node.name}({ast.unparse(node.args)})"
    except (ValueError, RecursionError):  # very unusual defaults; the bare name still documents it
        return f"{node.name}(...)"


def _doc_sections(tree: ast.Module, module: str) -> list[str]:
    parts: list[str] = []
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        parts.append(doc)

    def visit(body: list[ast.stmt], prefix: str, depth: int) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                d = ast.get_docstring(node, clean=True)
                if d:
                    parts.append(f"class {prefix}{node.name}\n" + _indent(d))
                if depth == 0:
                    visit(node.body, f"{prefix}{node.name}.", depth + 1)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                d = ast.get_docstring(node, clean=True)
                if d:
                    parts.append(prefix + _call_signature(node) + "\n" + _indent(d))

    visit(tree.body, "", 0)
    return parts


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


CACHE_ENV = "SCHOONER_SOURCE_CACHE"
"""A folder for built sources (default `~/.cache/schooner/sources`); `0` turns the disk cache off."""


def _cache_path(name: str, files: list[tuple[str, str]]) -> str | None:
    where = os.environ.get(CACHE_ENV, "")
    if where == "0":
        return None
    folder = where or os.path.join(os.path.expanduser("~"), ".cache", "schooner", "sources")
    # The key covers everything the records depend on: this module, the Python build and every file read.
    h = hashlib.sha256()
    with open(__file__, "rb") as f:
        h.update(f.read())
    h.update(f"{sys.version}\0{stdlib_dir()}\0".encode())
    for mod, path in files:
        st = os.stat(path)
        h.update(f"{mod}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return os.path.join(folder, f"{name}-{h.hexdigest()[:24]}.json.zst")


def _load_cache(path: str | None) -> tuple[tuple[dict, ...], dict] | None:
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            data = orjson.loads(zstandard.ZstdDecompressor().decompressobj().decompress(f.read()))
        return tuple(data["records"]), data["report"]
    except (OSError, ValueError, KeyError, zstandard.ZstdError):
        return None  # a damaged cache entry is rebuilt


def _store_cache(path: str | None, records: list[dict], report: dict) -> None:
    if path is None:
        return
    from . import storage

    try:
        blob = zstandard.ZstdCompressor(level=3).compress(
            orjson.dumps({"records": records, "report": report})
        )
        storage.write_bytes(path, blob)
    except OSError:
        pass  # e.g. a read-only home folder: build each time instead


@functools.cache
def _build(name: str) -> tuple[tuple[dict, ...], dict]:
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; the embedded sources are {sorted(SOURCES)}")
    files = stdlib_files()
    cache = _cache_path(name, files)
    cached = _load_cache(cache)
    if cached is not None:
        return cached
    skipped: Counter[str] = Counter()
    records: list[dict] = []
    if name == "python-docs":
        from pydoc_data.topics import topics

        for topic in sorted(topics):
            text = topics[topic].strip()
            if text:
                meta: dict[str, object] = {"kind": "topic", "name": topic}
                records.append(_record(text, name, f"topic:{topic}", meta))
    for mod, path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
            src = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            skipped[f"unreadable ({type(e).__name__})"] += 1
            continue
        if name == "python-code":
            if not src.strip():
                skipped["empty file"] += 1
                continue
            rel = os.path.relpath(path, stdlib_dir()).replace(os.sep, "/")
            meta = {"kind": "module-source", "module": mod, "path": rel, "lines": src.count("\n") + 1}
            records.append(_record(src, name, f"code:{mod}", meta))
            continue
        try:
            tree = ast.parse(src, filename=path)
        except (SyntaxError, ValueError, RecursionError):
            skipped["does not parse"] += 1
            continue
        sections = _doc_sections(tree, mod)
        if not sections:
            skipped["no docstrings"] += 1
            continue
        text = f"{mod}\n\n" + "\n\n".join(sections)
        records.append(_record(text, name, f"module:{mod}", {"kind": "module-docs", "module": mod}))
    report = {
        "source": name,
        "python": sys.version.split()[0],
        "files": len(files),
        "records": len(records),
        "bytes": sum(len(r["text"].encode("utf-8")) for r in records),
        "skipped": dict(sorted(skipped.items())),
    }
    _store_cache(cache, records, report)
    return tuple(records), report


def _record(text: str, source: str, key: str, metadata: dict) -> dict:
    return {"id": content_id(text, source, key), "text": text, "source": source, "metadata": metadata}


def iter_source(name: str) -> Iterator[dict]:
    """Yield the records of embedded source `name` (one of `SOURCES`), in a fixed order.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    records, _ = _build(name)
    for r in records:
        yield {**r, "metadata": dict(r["metadata"])}  # callers may mutate; the cache must not change


def source_report(name: str) -> dict:
    """What building source `name` found: Python version, files seen, records, bytes, skips by reason."""
    return dict(_build(name)[1])
