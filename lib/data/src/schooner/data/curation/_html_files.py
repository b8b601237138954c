"""HTML files (a saved site, a mirror, a folder of pages): read into page records, as WARC responses are.

`html_dataset(paths)` reads `.html`/`.htm`/`.xhtml` files (plain, `.gz` or `.zst`; paths, globs, folders
searched recursively), `files_per_task` files per task. Each page becomes a record `{"id", "text", "source",
"metadata": {"url", "title", "file", "charset", "content_type"}}`; the id is a hash of the file's path (its
URL when `base_url` is given), so it does not change when the folder is read again. Decoding is the WARC
reader's (a byte-order mark, else the `<meta>` charset, else detection), and so is extraction.

Bad input (an empty or binary page, a page over `max_bytes` read or decompressed, a compressed file that
does not decompress, an extractor failure) is a `DataError` naming the file: raised with `on_error="raise"`,
counted and skipped with `on_error="skip"`. A page is never decompressed past `max_bytes`.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from schooner.data import storage
from schooner.data._compression import INCOMPLETE, zero_bytes
from schooner.data._errors import DataError, SkipLog, handle
from schooner.data._splits import Split

from ._html import BadPage, ExtractConfig, decode_html, extract_page

__all__ = ["html_dataset"]

_HTML_NAME = re.compile(r"\.(html?|xhtml)(\.gz|\.zst)?$", re.IGNORECASE)


def _read_bounded(path: str, limit: int) -> bytes:
    """At most `limit + 1` bytes of the file's (decompressed) content: enough to tell that a page is over
    `limit` without reading, or inflating, the rest."""
    lower = path.lower()
    with storage.open_file(path, "rb") as f:
        if lower.endswith(".gz"):
            try:
                with gzip.GzipFile(fileobj=f) as g:
                    data = g.read(limit + 1)
            except EOFError as e:  # cut short: the fix is a whole copy, as a WARC file's message says
                raise BadPage(
                    f"truncated gzip stream (the file ends inside a compressed member: {e}); {INCOMPLETE}",
                    "damaged_stream",
                ) from e
            except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
                if isinstance(e, gzip.BadGzipFile) and str(e).startswith("Not a gzipped file"):
                    raise BadPage(
                        f"not gzip data ({e}): rename it without .gz if it is plain HTML, or re-create it",
                        "damaged_stream",
                    ) from e
                raise BadPage(
                    f"corrupt gzip data ({e}); re-create or re-download it", "damaged_stream"
                ) from e
            if not data and f.tell() == 0:  # gzip reads 0 bytes as no members, without an error of its own
                raise BadPage(f"{zero_bytes('gzip')}; {INCOMPLETE}", "damaged_stream")
            return data
        if lower.endswith(".zst"):
            import zstandard

            try:
                # across frames (a file of several, as `zstd -d` reads it), never past limit + 1 bytes out
                with zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as z:
                    parts: list[bytes] = []
                    got = 0
                    while got <= limit and (part := z.read(limit + 1 - got)):
                        parts.append(part)
                        got += len(part)
            except zstandard.ZstdError as e:
                raise BadPage(
                    f"corrupt zstd data ({e}); re-create or re-download it", "damaged_stream"
                ) from e
            if got > limit:
                return b"".join(parts)
        else:
            return f.read(limit + 1)
    # zstandard's reader ends a cut-short stream without an error: decompress it again (no more than the
    # `got` <= limit bytes just read come out) with the readers' decoder, which notices a truncated frame
    from schooner.data._compression import StreamError, iter_decompressed

    with storage.open_file(path, "rb") as f:
        try:
            return b"".join(iter_decompressed(f, "zstd"))
        except StreamError as e:  # truncated (or 0 bytes): a whole copy is the fix; corrupt: a good one
            fix = "re-create or re-download it" if str(e).startswith("corrupt") else INCOMPLETE
            raise BadPage(f"{e}; {fix}", "damaged_stream") from None


def _page_record(path: str, url: str, config: ExtractConfig, source: str) -> dict | None:
    """The record of one HTML file, None when its text is shorter than `min_chars`."""
    body = _read_bounded(path, config.max_bytes)
    if len(body) > config.max_bytes:
        raise BadPage(f"page over max_bytes={config.max_bytes:,} (read or decompressed)", "over_max_bytes")
    if not body or body.isspace():
        raise BadPage("empty page", "empty_body")
    html, charset, _ = decode_html(body, None)
    text, title = extract_page(html, config)
    if len(text) < config.min_chars:
        return None
    return {
        "id": hashlib.sha1(url.encode()).hexdigest(),
        "text": text,
        "source": source,
        "metadata": {
            "url": url,
            "title": title,
            "file": path,
            "charset": charset,
            "content_type": "text/html",
        },
    }


@dataclass(frozen=True)
class HtmlFilesSplit(Split):
    """A group of HTML files, extracted to page records."""

    files: tuple[tuple[str, str], ...]
    """(path, url) of each file."""
    config: ExtractConfig
    on_error: str = "skip"
    source: str = "html"

    @property
    def label(self) -> str:
        first = self.files[0][0]
        return first if len(self.files) == 1 else f"{first} (+{len(self.files) - 1} more HTML files)"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        for path, url in self.files:
            counters["html.files"] = counters.get("html.files", 0) + 1
            try:
                record = _page_record(path, url, self.config, self.source)
            except (BadPage, OSError) as e:
                kind = e.kind if isinstance(e, BadPage) else "unreadable_file"
                handle(DataError(path, f"HTML file: {e}", fix="pass on_error='skip' to skip bad pages (they "
                                 "are counted)", kind=kind), self.on_error, skips)  # fmt: skip
                continue
            if record is None:
                counters["dropped.empty_text"] = counters.get("dropped.empty_text", 0) + 1
                continue
            yield record

    def token(self) -> Any:
        c = self.config
        return ["html-files", [[p, u, storage.file_identity(p)] for p, u in self.files], c.extractor,
                c.main_content, c.max_bytes, c.min_chars, self.on_error, self.source]  # fmt: skip


def _html_files(path: str) -> list[tuple[str, str]]:
    """(file, path relative to `path`) of the HTML files under a folder (recursively), sorted."""
    return files_under(path, _HTML_NAME)


def files_under(path: str, name: re.Pattern[str]) -> list[tuple[str, str]]:
    """(file, path relative to `path`) of the files under a folder (recursively) whose name `name` finds,
    sorted; local folders and fsspec URLs alike."""
    if storage.is_local(path):
        root = storage.local_path(path)
        found = []
        for d, dirs, names in os.walk(root):
            dirs.sort()
            found += [os.path.join(d, n) for n in sorted(names) if name.search(n)]
        return [(f, os.path.relpath(f, root).replace(os.sep, "/")) for f in found]
    fs, p = storage.url_to_fs(path)
    protocol = path.split("://", 1)[0]
    found = sorted(f for f in fs.find(p) if name.search(f))
    return [(f"{protocol}://{f}", f[len(p.rstrip("/")) + 1 :]) for f in found]


def html_dataset(
    paths: str | Sequence[str], config: ExtractConfig | None = None, *, on_error: str = "skip",
    source: str | None = None, base_url: str | None = None, files_per_task: int = 64,
) -> Any:  # fmt: skip
    """A `Dataset` of the page records of HTML files (paths, globs, folders searched recursively).

    Args:
        base_url: the URL a folder was saved from: a page's url is `base_url` + its path under the folder
            (a file given directly: + its name). None: the file's own path or URL (`file://` for local files).
        files_per_task: files read by one task.
        on_error: "skip" (count and name bad pages) or "raise".
    """
    from schooner.data._dataset import Dataset
    from schooner.data._errors import check_on_error
    from schooner.data._folders import expand_paths

    check_on_error(on_error)
    if isinstance(files_per_task, bool) or not isinstance(files_per_task, int) or files_per_task < 1:
        raise ValueError(f"html_dataset: files_per_task must be an integer >= 1, got {files_per_task!r}")
    config = config or ExtractConfig()
    plist = [paths] if isinstance(paths, str) else list(paths)

    def url_of(file: str, relative: str) -> str:
        if base_url is not None:  # the page as it was served: without the compression a mirror added
            return base_url.rstrip("/") + "/" + re.sub(r"\.(gz|zst)$", "", relative, flags=re.IGNORECASE)
        return "file://" + os.path.abspath(storage.local_path(file)) if storage.is_local(file) else file

    def splits() -> list[Split]:
        files: list[tuple[str, str]] = []
        for p in plist:
            if storage.isdir(p):
                found = _html_files(p)
                if not found:
                    raise FileNotFoundError(
                        f"folder {p} holds no HTML files (*.html, *.htm, *.xhtml, .gz/.zst)"
                    )
                files += [(f, url_of(f, rel)) for f, rel in found]
            else:
                files += [(f, url_of(f, os.path.basename(f))) for f in expand_paths(p)]
        groups = [tuple(files[i : i + files_per_task]) for i in range(0, len(files), files_per_task)]
        return [HtmlFilesSplit(g, config, on_error, source or "html") for g in groups]

    return Dataset(splits, describe=f"html({plist!r}, extractor={config.extractor!r})")
