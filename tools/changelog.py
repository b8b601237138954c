"""A package's CHANGELOG.md as the release sees it.

The file is a title, then `## ` sections, newest first. Changes not yet released sit under `## Unreleased`
at the top; a release renames that section `## A.B.C — YYYY-MM-DD` and opens a new, empty `## Unreleased`
above it. Older files name the coming version in the heading (`## 0.2.0 — unreleased`): such sections count
as unreleased too, and a release folds every unreleased section at the top into the new one (a section that
named another version keeps that under a `### ` line, so nothing is lost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SECTION = re.compile(r"^## +(?P<title>.*?) *$", re.M)
_UNRELEASED = re.compile(r"^(?:(?P<version>\d+\.\d+\.\d+\S*) +[—–-]+ +)?unreleased\b", re.I)
_RELEASED = re.compile(r"^(?P<version>\d+\.\d+\.\d+\S*) +[—–-]+ +(?P<date>\d{4}-\d{2}-\d{2})\b")
UNRELEASED_HEADING = "## Unreleased"


@dataclass(frozen=True)
class Section:
    title: str
    """The heading without `## `."""
    body: str
    """Everything after the heading line up to the next `## ` heading."""

    @property
    def unreleased(self) -> re.Match | None:
        return _UNRELEASED.match(self.title)

    @property
    def released_version(self) -> str | None:
        m = _RELEASED.match(self.title)
        return m["version"] if m else None


def split(text: str) -> tuple[str, list[Section]]:
    """(the text before the first `## ` heading, the sections in order)."""
    heads = list(_SECTION.finditer(text))
    if not heads:
        return text, []
    sections = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        sections.append(Section(m["title"], text[m.end() : end]))
    return text[: heads[0].start()], sections


def join(preamble: str, sections: list[Section]) -> str:
    out = preamble
    for s in sections:
        out += f"## {s.title}{s.body}"
    return out


def _leading_unreleased(sections: list[Section]) -> list[Section]:
    out = []
    for s in sections:
        if not s.unreleased:
            break
        out.append(s)
    return out


def unreleased_text(text: str) -> str:
    """What the unreleased sections at the top say (stripped; empty when there is nothing)."""
    return "\n".join(s.body.strip() for s in _leading_unreleased(split(text)[1]) if s.body.strip()).strip()


def released_versions(text: str) -> set[str]:
    """The versions with a dated section (released)."""
    return {v for s in split(text)[1] if (v := s.released_version)}


def release(text: str, version: str, date: str) -> str:
    """The changelog with its unreleased sections moved under `## {version} — {date}` and a new, empty
    `## Unreleased` above. Raises ValueError when there is nothing unreleased."""
    preamble, sections = split(text)
    pending = _leading_unreleased(sections)
    if not unreleased_text(text):
        raise ValueError("the changelog has nothing under 'Unreleased'")
    parts = []
    for s in pending:
        body = s.body.strip("\n")
        if not body.strip():
            continue
        named = s.unreleased["version"] if s.unreleased else None
        if named and named != version:
            body = f"### Listed as {named} before this release\n\n{body}"
        parts.append(body)
    merged = "\n\n".join(parts)
    released = Section(f"{version} — {date}", f"\n\n{merged}\n\n")
    fresh = Section(UNRELEASED_HEADING.removeprefix("## "), "\n\n")
    return join(preamble, [fresh, released, *sections[len(pending) :]])


def add_line(text: str, line: str) -> str:
    """The changelog with `- {line}` appended to its top unreleased section (one is opened if none)."""
    preamble, sections = split(text)
    entry = f"- {line}\n"
    if sections and sections[0].unreleased:
        top = sections[0]
        body = top.body.rstrip("\n")
        body = (body + "\n" if body.strip() else "\n\n") + entry + "\n"
        return join(preamble, [Section(top.title, body), *sections[1:]])
    if not preamble.endswith("\n\n"):
        preamble = preamble.rstrip("\n") + "\n\n"
    return join(preamble, [Section("Unreleased", f"\n\n{entry}\n"), *sections])
