"""An offline web crawl for tests, benchmarks and the tutorial: WARC files of HTML pages that look like the
web, with the truth about every page known.

Pages are the standard library's module documentation rendered by `pydoc.HTMLDoc`, wrapped in site chrome
(navigation, a sidebar, a cookie banner, ads, a footer) that varies from site to site. Planted on top:
exact duplicates (the same page at another URL), near duplicates (a few words edited, the boilerplate
reordered), spam and low-quality pages, pages in other languages, and bad input (a truncated record, a
binary body, an empty page, a page over 10 MB, undeclared and wrongly declared charsets, non-HTML
responses, a 404). `truth.jsonl` says for every URL what it is, what it duplicates and its main text (the
visible text of the main-content fragment, taken with the standard library's `html.parser`, independently of
any extractor), so extraction quality and deduplication recall are measurable.

Example:
    >>> from schooner.data.curation.crawl import CrawlConfig, build_crawl
    >>> info = build_crawl("/tmp/crawl", CrawlConfig(num_pages=20))  # doctest: +SKIP
    >>> info["warc_files"], info["kinds"]["near_dup"]  # doctest: +SKIP
"""

from __future__ import annotations

import html as htmllib
import importlib
import os
import pydoc
import random
import re
import warnings
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from typing import Any

from schooner.data import storage

from ._junk import chrome, low_quality_page, seo_spam_page, spam_page
from ._warc import WarcPage, warc_response, write_warc

MODULES = [
    "abc",
    "argparse",
    "ast",
    "base64",
    "bisect",
    "bz2",
    "calendar",
    "cmath",
    "codecs",
    "collections",
    "colorsys",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "imaplib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "math",
    "mimetypes",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "pprint",
    "profile",
    "pstats",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "smtplib",
    "socket",
    "sqlite3",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "symtable",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "types",
    "typing",
    "unicodedata",
    "urllib",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml",
    "zipapp",
    "zipfile",
    "zlib",
    "zoneinfo",
]
"""Standard-library modules documented by the crawl (importable everywhere, without side effects)."""

FOREIGN = {
    "fr": "La bibliothèque standard de Python contient de nombreux modules utiles. Chaque module est documenté "
    "avec soin, et les exemples montrent comment les utiliser dans des programmes réels. Nous espérons que "
    "cette page vous aidera à mieux comprendre le fonctionnement du langage et de ses outils.",
    "de": "Die Standardbibliothek von Python enthält viele nützliche Module. Jedes Modul ist sorgfältig "
    "dokumentiert, und die Beispiele zeigen, wie man sie in echten Programmen verwendet. Wir hoffen, dass "
    "diese Seite Ihnen hilft, die Sprache und ihre Werkzeuge besser zu verstehen.",
    "es": "La biblioteca estándar de Python contiene muchos módulos útiles. Cada módulo está documentado con "
    "cuidado, y los ejemplos muestran cómo usarlos en programas reales. Esperamos que esta página le ayude a "
    "comprender mejor el lenguaje y sus herramientas.",
    "it": "La libreria standard di Python contiene molti moduli utili. Ogni modulo è documentato con cura, e "
    "gli esempi mostrano come usarli in programmi reali. Speriamo che questa pagina vi aiuti a capire meglio "
    "il linguaggio e i suoi strumenti.",
    "pt": "A biblioteca padrão do Python contém muitos módulos úteis. Cada módulo é documentado com cuidado, e "
    "os exemplos mostram como usá-los em programas reais. Esperamos que esta página ajude você a entender "
    "melhor a linguagem e as suas ferramentas.",
}
"""A paragraph per language, written for the crawl (pages in other languages repeat and vary it)."""


@dataclass(frozen=True)
class CrawlConfig:
    """What `build_crawl` writes."""

    num_pages: int = 60
    """Original documentation pages (at most `len(MODULES)`)."""
    exact_dups: float = 0.1
    """Fraction of originals also served verbatim at a second URL."""
    near_dups: float = 0.2
    """Fraction of originals also served with small edits and reordered boilerplate."""
    spam_pages: int = 6
    """Keyword-stuffed pages."""
    seo_spam_pages: int = 0
    """Fluent spam: spam in grammatical sentences, which passes the heuristic rules (kind "seo_spam")."""
    low_quality_pages: int = 6
    """Short, bullet-only, lorem-ipsum and symbol pages."""
    foreign_pages: int = 5
    """Pages in other languages (French, German, Spanish, Italian, Portuguese)."""
    bad_input: bool = True
    """Add the bad records (truncated, binary, empty, oversized, charsets, non-HTML, 404)."""
    num_files: int = 4
    """WARC files to spread the pages over."""
    max_page_chars: int = 40_000
    """pydoc pages longer than this (HTML characters) are cut at a section boundary."""
    seed: int = 0
    """Seed of every random choice: same config, same bytes."""
    plant: tuple[str, ...] = ()
    """Texts (e.g. evaluation documents) copied into pages of a blog, one page each: contamination for
    decontamination to find (`truth.jsonl` kind "contaminated", `planted` = the text's index)."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_pages <= len(MODULES):
            raise ValueError(f"CrawlConfig.num_pages must be in 1..{len(MODULES)}, got {self.num_pages}")
        for f in ("exact_dups", "near_dups"):
            if not 0 <= getattr(self, f) <= 1:
                raise ValueError(f"CrawlConfig.{f} must be in [0, 1], got {getattr(self, f)}")
        if self.num_files < 1:
            raise ValueError(f"CrawlConfig.num_files must be >= 1, got {self.num_files}")


class _Visible(HTMLParser):
    """The visible text of an HTML fragment, block elements on their own lines (the independent truth)."""

    BLOCK = {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "dt", "dd", "pre", "table", "dl", "ul"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def visible_text(fragment: str) -> str:
    """Visible text of an HTML fragment (`html.parser`; whitespace collapsed within lines)."""
    p = _Visible()
    p.feed(fragment)
    p.close()
    lines = (" ".join(ln.split()) for ln in "".join(p.parts).split("\n"))
    return "\n".join(ln for ln in lines if ln)


def pydoc_fragment(module: str, max_chars: int) -> str:
    """The module's documentation as pydoc renders it, without the local file path, cut at a section
    boundary past `max_chars`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module(module)
        body = pydoc.HTMLDoc().document(mod)
    body = re.sub(r'<a href="file:[^"]*">[^<]*</a><br>', "", body)
    body = re.sub(r"(?: |&nbsp;)at(?: |&nbsp;)0x[0-9a-f]+", "", body)  # addresses differ from run to run
    if len(body) > max_chars:
        cut = body.find('<table class="section">', max_chars // 2)
        body = body[: cut if 0 < cut <= max_chars else max_chars]
        body = body[: body.rfind(">") + 1] if ">" in body else body
    return body


# ----------------------------------------------------------------------------------------------- chrome


def page_html(
    title: str, main: str, chrome: dict[str, str], order: tuple[str, ...], charset: str = "utf-8"
) -> str:
    """A full page: head, then the chrome parts in `order` around `<main>`."""
    parts = [
        chrome[k] if k != "main" else f'<main id="content"><article>{main}</article></main>' for k in order
    ]
    meta = f'<meta charset="{charset}">' if charset else ""
    return (
        f"<!DOCTYPE html><html><head>{meta}<title>{htmllib.escape(title)}</title>"
        "<script>window.dataLayer=[];function track(){}</script><style>.ad{color:red}</style></head>"
        f'<body>{"".join(parts)}<script>track("view")</script></body></html>'
    )


_ORDER = ("nav", "cookie", "sidebar", "main", "ad", "footer")
_ORDER_2 = ("cookie", "nav", "ad", "main", "sidebar", "footer")


def _edit(fragment: str, rng: random.Random) -> str:
    """A near duplicate: a handful of words in text nodes changed, one sentence added."""
    pieces = re.split(r"(<[^>]+>)", fragment)
    text_idx = [i for i, p in enumerate(pieces) if p and not p.startswith("<") and len(p.split()) > 3]
    for i in rng.sample(text_idx, min(3, len(text_idx))):
        ws = pieces[i].split(" ")
        j = rng.randrange(len(ws))
        ws[j] = rng.choice(["updated", "revised", "mirrored", "edited"])
        pieces[i] = " ".join(ws)
    return "".join(pieces) + "<p>This page was mirrored from the official documentation.</p>"


def _foreign(lang: str, rng: random.Random) -> str:
    sentences = FOREIGN[lang].split(". ")
    paras = []
    for _ in range(6):
        rng.shuffle(sentences)
        paras.append("<p>" + ". ".join(sentences).rstrip(".") + ".</p>")
    return "".join(paras)


# ------------------------------------------------------------------------------------------------ build


def build_crawl(folder: str, config: CrawlConfig = CrawlConfig()) -> dict[str, Any]:
    """Write `crawl-0000i.warc.gz` files and `truth.jsonl` into `folder`; returns a summary (files, page
    counts by kind). Deterministic: the same config gives the same bytes (on the same Python version)."""
    rng = random.Random(config.seed)
    storage.makedirs(folder)
    pages: list[tuple[WarcPage, dict]] = []

    def add(
        url: str, body: bytes, truth: dict, content_type: str = "text/html; charset=utf-8", status: int = 200
    ) -> None:
        pages.append((WarcPage(url, body, content_type, status), {"url": url, **truth}))

    modules = MODULES[: config.num_pages]
    originals = []
    for i, mod in enumerate(modules):
        site = i % 5
        site_chrome = chrome(rng, site, MODULES)
        main = f"<h1>Module {mod}</h1>" + pydoc_fragment(mod, config.max_page_chars)
        url = f"https://mirror{site}.example/library/{mod}.html"
        html = page_html(f"{mod} — Python documentation", main, site_chrome, _ORDER)
        add(
            url,
            html.encode(),
            {"kind": "original", "lang": "en", "dup_of": None, "main_text": visible_text(main)},
        )
        originals.append((url, main, site_chrome, mod))
    n_exact = round(config.exact_dups * len(originals))
    n_near = round(config.near_dups * len(originals))
    picks = rng.sample(range(len(originals)), min(len(originals), n_exact + n_near))
    for k, idx in enumerate(picks):
        url, main, site_chrome, mod = originals[idx]
        if k < n_exact:
            html = page_html(f"{mod} — Python documentation", main, site_chrome, _ORDER)
            add(f"https://copy{k}.example/{mod}.html", html.encode(),
                {"kind": "exact_dup", "lang": "en", "dup_of": url, "main_text": visible_text(main)})  # fmt: skip
        else:
            edited = _edit(main, rng)
            html = page_html(f"{mod} | docs mirror", edited, chrome(rng, 9, MODULES), _ORDER_2)
            add(f"https://near{k}.example/docs/{mod}", html.encode(),
                {"kind": "near_dup", "lang": "en", "dup_of": url, "main_text": visible_text(edited)})  # fmt: skip
    for i in range(config.spam_pages):
        main = spam_page(rng, i)
        add(f"https://deals{i}.example/", page_html("BEST DEALS", main, chrome(rng, 7, MODULES), _ORDER).encode(),
            {"kind": "spam", "lang": "en", "dup_of": None, "main_text": visible_text(main)})  # fmt: skip
    for i in range(config.seo_spam_pages):
        main = seo_spam_page(rng, i)
        add(f"https://offers{i}.example/blog", page_html("Offers", main, chrome(rng, 7, MODULES), _ORDER).encode(),
            {"kind": "seo_spam", "lang": "en", "dup_of": None, "main_text": visible_text(main)})  # fmt: skip
    for i in range(config.low_quality_pages):
        main = low_quality_page(rng, i)
        # the same thin template again is a near duplicate of its first page (all but the bullet lists)
        dup = f"https://thin{i % 4}.example/page" if i >= 4 and i % 4 != 1 else None
        add(f"https://thin{i}.example/page", page_html("Page", main, chrome(rng, 8, MODULES), _ORDER).encode(),
            {"kind": "low_quality", "lang": "en", "dup_of": dup, "main_text": visible_text(main)})  # fmt: skip
    for i in range(config.foreign_pages):
        lang = sorted(FOREIGN)[i % len(FOREIGN)]
        main = f"<h1>Python ({lang})</h1>" + _foreign(lang, rng)
        add(f"https://{lang}.example/python/{i}", page_html("Python", main, chrome(rng, 6, MODULES), _ORDER).encode(),
            {"kind": "foreign", "lang": lang, "dup_of": None, "main_text": visible_text(main)})  # fmt: skip
    for k, text in enumerate(config.plant):
        paras = "".join(f"<p>{htmllib.escape(p)}</p>" for p in text.split("\n") if p.strip())
        main = f"<h1>Study notes {k}</h1><p>I copied this from somewhere for my own notes.</p>{paras}"
        add(f"https://notes.example/{k}", page_html("Study notes", main, chrome(rng, 4, MODULES), _ORDER).encode(),
            {"kind": "contaminated", "lang": "en", "dup_of": None, "planted": k, "main_text": visible_text(main)})  # fmt: skip
    if config.bad_input:
        _add_bad(add, rng)
    rng.shuffle(pages)
    return _write(folder, pages, config)


def _add_bad(add: Any, rng: random.Random) -> None:
    accented = (
        "<h1>Café résumé</h1><p>" + "Une page écrite en français, à côté de la documentation. " * 8 + "</p>"
    )
    cp1252 = page_html("Café", accented, chrome(rng, 3, MODULES), _ORDER, charset="").encode("cp1252")
    add("https://charset.example/undeclared", cp1252, {"kind": "charset_undeclared", "lang": "fr", "dup_of": None,
        "main_text": visible_text(accented)}, content_type="text/html")  # fmt: skip
    add("https://charset.example/wrong", cp1252, {"kind": "charset_wrong", "lang": "fr",
        "dup_of": "https://charset.example/undeclared",
        "main_text": visible_text(accented)}, content_type="text/html; charset=utf-8")  # fmt: skip
    broken = (
        "<html><body><main><p>Unclosed paragraph about the <b>json module which encodes objects<div>and more"
    )
    add("https://broken.example/", broken.encode(), {"kind": "broken_html", "lang": "en", "dup_of": None,
        "main_text": visible_text(broken)})  # fmt: skip
    add("https://bin.example/x.html", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4,
        {"kind": "bad_binary", "lang": None, "dup_of": None, "main_text": ""})  # fmt: skip
    add("https://empty.example/", b"", {"kind": "bad_empty", "lang": None, "dup_of": None, "main_text": ""})
    huge = b"<html><body><p>" + b"x" * (10 * 2**20 + 10) + b"</p></body></html>"
    add(
        "https://huge.example/",
        huge,
        {"kind": "bad_too_large", "lang": None, "dup_of": None, "main_text": ""},
    )
    add("https://img.example/logo.png", b"\x89PNG\r\n\x1a\n", {"kind": "not_html", "lang": None, "dup_of": None,
        "main_text": ""}, content_type="image/png")  # fmt: skip
    add("https://gone.example/", b"<html><body>Not found</body></html>", {"kind": "status_404", "lang": None,
        "dup_of": None, "main_text": ""}, status=404)  # fmt: skip


def _write(folder: str, pages: list[tuple[WarcPage, dict]], config: CrawlConfig) -> dict[str, Any]:
    from schooner.data._json import dumps_json

    n = config.num_files
    files: list[str] = []
    kinds: dict[str, int] = {}
    for f in range(n):
        part = [p for i, p in enumerate(pages) if i % n == f]
        name = f"crawl-{f:05d}.warc.gz"
        write_warc(storage.join(folder, name), [w for w, _ in part])
        files.append(name)
        for _, t in part:
            t["warc_file"] = name
            kinds[t["kind"]] = kinds.get(t["kind"], 0) + 1
    # a truncated record at the end of the last file: its head is there, its body is cut short
    import gzip

    last = storage.join(folder, files[-1])
    cut = warc_response(WarcPage("https://truncated.example/", b"<html><body><p>" + b"cut " * 2000))
    with storage.open_file(last, "rb") as fh:
        data = fh.read()
    storage.write_bytes(
        last, data + gzip.compress(cut[: len(cut) // 2], mtime=0)[:-8] if config.bad_input else data
    )
    truth = [t for _, t in pages]
    if config.bad_input:
        truth.append({"url": "https://truncated.example/", "kind": "bad_truncated", "lang": None, "dup_of": None,
                      "main_text": "", "warc_file": files[-1]})  # fmt: skip
        kinds["bad_truncated"] = 1
    storage.write_bytes(storage.join(folder, "truth.jsonl"), b"".join(dumps_json(t) + b"\n" for t in truth))
    return {"folder": folder, "warc_files": [storage.join(folder, f) for f in files], "pages": len(truth),
            "kinds": dict(sorted(kinds.items())), "config": asdict(config)}  # fmt: skip


def read_truth(folder: str) -> list[dict]:
    """The `truth.jsonl` rows of a crawl folder."""
    import orjson

    with storage.open_file(storage.join(folder, "truth.jsonl"), "rb") as f:
        return [orjson.loads(line) for line in f.read().splitlines() if line.strip()]


def warc_paths(folder: str) -> list[str]:
    """The WARC files of a crawl folder, sorted."""
    return sorted(storage.join(folder, n) for n in os.listdir(folder) if ".warc" in n)
