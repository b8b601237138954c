"""Names that moved keep working for one release, with a DeprecationWarning naming the new place."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("old", "module", "new"),
    [
        ("exact_dedup", "schooner.data.pipelines", "drop_exact_duplicates"),
        ("length_filter", "schooner.data.pipelines", "length_filter"),
        ("function_path", "schooner.data.step_inputs", "function_path"),
        ("resolve_function", "schooner.data.step_inputs", "resolve_function"),
    ],
)
def test_data_steps_moved_names_warn_and_resolve(old: str, module: str, new: str) -> None:
    import importlib

    import schooner.data.steps as steps

    with pytest.warns(
        DeprecationWarning, match=rf"schooner\.data\.steps\.{old} moved: use `from {module} import {new}`"
    ):
        got = getattr(steps, old)
    assert got is getattr(importlib.import_module(module), new)


def test_an_old_pipeline_name_in_a_stored_config_still_resolves() -> None:
    from schooner.data.pipelines import length_filter
    from schooner.data.step_inputs import resolve_function

    with pytest.warns(DeprecationWarning, match="length_filter moved"):
        assert resolve_function("schooner.data.steps:length_filter") is length_filter


def test_data_steps_has_no_unknown_attribute() -> None:
    import schooner.data.steps as steps

    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = steps.nope  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name", ["CrawlConfig", "build_crawl", "read_truth", "warc_paths", "visible_text", "MODULES"]
)
def test_curation_crawl_names_moved_to_fixtures(name: str) -> None:
    import schooner.data.curation.crawl as crawl
    from schooner.data import fixtures

    with pytest.warns(
        DeprecationWarning, match=rf"crawl\.{name} moved: use `from schooner\.data\.fixtures import {name}`"
    ):
        got = getattr(crawl, name)
    assert got is getattr(fixtures, name)


def test_the_old_crawl_module_lists_what_it_still_offers() -> None:
    import schooner.data.curation.crawl as crawl

    assert "build_crawl" in dir(crawl)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = crawl.nope  # type: ignore[attr-defined]
