"""The documentation cannot rot: every ```python block in docs/ runs, and every relative link resolves.

Each page's runnable blocks run in order, in one fresh interpreter per page (so a page may build on its
earlier blocks), with the working directory a temporary folder, `SCHOONER_PREFIX` inside it, jax on CPU and
one CPU device (what a user's laptop has). A block is compiled under the page's file name with its real line
numbers, so a failure's traceback points at the Markdown line.

Fence info strings:
- ```python         runs.
- ```python notest  shown, never run (needs a GPU/TPU, a remote cluster, or takes minutes); keep them few.
- anything else (bash, text, json) is not Python and is not run.

Page directives, as HTML comments anywhere in a page (invisible when rendered):
- `<!-- docs-test: slow -->`          the page's test is marked `slow` (skipped by default).
- `<!-- docs-test: ray -->`           the page starts Ray: marked `ray` and kept in the "ray" xdist group, so
                                      it never runs next to the other Ray tests.
- `<!-- docs-test: env NAME=VALUE -->` an extra environment variable for the page's interpreter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGE_TIMEOUT_S = 300

# CommonMark: a backtick fence's info string holds no backtick (so "```` ```x ```` text" is inline code).
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}(?=[^`]*$)|~{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<body>.*?)\s*-->")


@dataclass
class Block:
    line: int
    """1-based line of the block's first code line in the page."""
    info: str
    code: str


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    slow: bool = False
    ray: bool = False
    env: dict[str, str] = field(default_factory=dict)

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.info == "python"]

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def parse_page(path: Path) -> Page:
    """The fenced blocks and docs-test directives of one Markdown page."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            for d in _DIRECTIVE.finditer(lines[i]):
                body = d.group("body")
                if body == "slow":
                    page.slow = True
                elif body == "ray":
                    page.ray = True
                elif body.startswith("env ") and "=" in body:
                    name, value = body[4:].strip().split("=", 1)
                    page.env[name.strip()] = value.strip()
                else:
                    raise ValueError(
                        f"{path}:{i + 1}: unknown docs-test directive {body!r}; use 'slow', 'ray' or 'env N=V'"
                    )
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        start = i + 1
        j = start
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                break
            j += 1
        else:
            raise ValueError(f"{path}:{i + 1}: fenced block ({fence}{m.group('info')}) is never closed")
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[start:j]]
        page.blocks.append(Block(start + 1, " ".join(m.group("info").split()), "\n".join(body) + "\n"))
        i = j + 1
    return page


def all_pages() -> list[Page]:
    return [parse_page(p) for p in sorted(DOCS.rglob("*.md"))]


# The page's blocks run in a fresh interpreter: each block compiled with the page name and its real line
# numbers (padding with newlines), all sharing one namespace, like a reader pasting them into one session.
_DRIVER = """
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for b in blocks:
    code = compile("\\n" * (b["line"] - 1) + b["code"], b["page"], "exec")
    try:
        exec(code, namespace)
    except BaseException:
        traceback.print_exc()
        print(f"DOCS BLOCK FAILED: {b['page']}, block at line {b['line']}", file=sys.stderr)
        sys.exit(1)
"""


def page_env(page: Page, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SCHOONER_"))}
    # One CPU device, as on a laptop (conftest asks for 8 fake ones); the suite's XLA level (conftest) kept.
    level = re.findall(r"--xla_backend_optimization_level=\d+", env.pop("XLA_FLAGS", ""))
    if level:
        env["XLA_FLAGS"] = level[-1]
    env.update(
        JAX_PLATFORMS="cpu",
        SCHOONER_PREFIX=str(tmp_path / "schooner-output"),
        SCHOONER_NO_ARGV="1",
        PYTHONUNBUFFERED="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
    )
    env.update(page.env)
    return env


PAGES = all_pages()


def _page_param(page: Page) -> object:
    marks = [pytest.mark.slow] if page.slow else []
    if page.ray:
        marks += [pytest.mark.ray, pytest.mark.xdist_group("ray")]
    return pytest.param(page, id=page.path.relative_to(DOCS).as_posix(), marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if p.runnable])
def test_page_examples_run(page: Page, tmp_path: Path) -> None:
    blocks = [{"page": page.rel, "line": b.line, "code": b.code} for b in page.runnable]
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(blocks),
        cwd=tmp_path,
        env=page_env(page, tmp_path),
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"an example of {page.rel} failed (exit {proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-8000:]}",
            pytrace=False,
        )


def test_docs_exist_and_have_examples() -> None:
    names = {p.path.relative_to(DOCS).as_posix() for p in PAGES}
    expected = {
        "index.md",
        "installation.md",
        "tutorial.md",
        "concepts.md",
        "ray.md",
        "accelerators.md",
        "formats.md",
        *(f"packages/{p}.md" for p in ("cluster", "data", "tokenize", "model", "train", "eval")),
    }
    assert expected <= names, f"missing pages: {sorted(expected - names)}"
    for p in PAGES:
        if p.rel.startswith("docs/packages/"):
            assert p.runnable, f"{p.rel} has no runnable ```python example"
        for b in p.blocks:
            if b.info.startswith("python") and b.info not in ("python", "python notest"):
                raise AssertionError(
                    f"{p.rel}:{b.line}: fence info {b.info!r}; use 'python' or 'python notest'"
                )


_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug(heading: str) -> str:
    # GitHub's anchor rule: lowercase, drop punctuation except '-' and '_', spaces to '-'.
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def _links(path: Path) -> list[tuple[int, str]]:
    found, in_code = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # links inside inline code are not links
        found += [(n, m.group("target")) for m in _LINK.finditer(line)]
    return found


def test_relative_links_resolve() -> None:
    bad = []
    for md in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, target in _links(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md
            where = f"{md.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                bad.append(
                    f"{where} (no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})"
                )
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_parser_reports_unclosed_fence(tmp_path: Path) -> None:
    page = tmp_path / "bad.md"
    page.write_text("# Bad\n\n```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.md:3: fenced block \(```python\) is never closed"):
        parse_page(page)


def test_parser_keeps_line_numbers_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# P\n<!-- docs-test: slow --><!-- docs-test: ray -->\n```python\na = 1\n```\n\n```python notest\nb = 2\n```\n"
        "````python\nc = '```'\n````\n",
        encoding="utf-8",
    )
    parsed = parse_page(page)
    assert parsed.slow and parsed.ray
    assert [(b.line, b.info, b.code) for b in parsed.blocks] == [
        (4, "python", "a = 1\n"),
        (8, "python notest", "b = 2\n"),
        (11, "python", "c = '```'\n"),
    ]


def test_failing_block_names_page_and_line(tmp_path: Path) -> None:
    docs_page = Page(ROOT / "docs" / "x.md", [Block(7, "python", "x = 1\n"), Block(12, "python", "1 / 0\n")])
    blocks = [{"page": "docs/x.md", "line": b.line, "code": b.code} for b in docs_page.runnable]
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER], input=json.dumps(blocks), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert 'File "docs/x.md", line 12' in proc.stderr
    assert "DOCS BLOCK FAILED: docs/x.md, block at line 12" in proc.stderr
