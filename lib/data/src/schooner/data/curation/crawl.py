"""Deprecated: the offline crawl moved to `schooner.data.fixtures` (made-up inputs live apart from the real
extractors). The names below keep working for one release, with a `DeprecationWarning`."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = (
    "CrawlConfig",
    "FOREIGN",
    "MODULES",
    "build_crawl",
    "page_html",
    "pydoc_fragment",
    "read_truth",
    "visible_text",
    "warc_paths",
)


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"schooner.data.curation.crawl.{name} moved: use `from schooner.data.fixtures import {name}`; "
        "the old module goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    from schooner.data import fixtures

    return getattr(fixtures, name)


def __dir__() -> list[str]:
    return sorted(_MOVED)
