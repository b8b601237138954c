"""A `consolidate` step whose filters or removals read an attribute that none of its attribute steps
computes is refused when the experiment is built, naming the filter, the attribute and the step that
computes it (it failed only in the worker, at run time)."""

from __future__ import annotations

import pytest

from schooner.data.curation import lang_is, not_dup, passes, score_at_least
from schooner.data.curation.steps import consolidate, exact_dedup, language_id, quality_rules


@pytest.fixture()
def records(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "1", "text": "x", "source": "t"}\n')
    return str(tmp_path / "a.jsonl")


def test_a_filter_without_its_attribute_step_is_refused_at_build_time(records):
    langs = language_id("a/lang", records)
    with pytest.raises(ValueError, match=r"passes\('gopher_quality'\).*'gopher_quality'.*quality_rules"):
        consolidate("c", records, [langs], keep=[lang_is("en"), passes("gopher_quality")])
    c4_only = quality_rules("a/rules", records, rules=("c4",))
    with pytest.raises(ValueError, match=r"'gopher_quality'.*computes c4"):
        consolidate("c", records, [langs, c4_only], keep=[passes("gopher_quality")])
    with pytest.raises(ValueError, match=r"not_dup\('exact'\).*'exact_dup'.*exact_dedup"):
        consolidate("c", records, [langs], keep=[not_dup("exact")])
    with pytest.raises(ValueError, match=r"remove=\['paragraph_dups'\].*paragraph_dedup"):
        consolidate("c", records, [langs], remove=["paragraph_dups"])
    with pytest.raises(ValueError, match=r"score_at_least\('quality'.*quality_scores"):
        consolidate("c", records, [langs], keep=[score_at_least("quality", 0.5)])


def test_filters_with_their_attribute_steps_build(records):
    langs = language_id("a/lang", records)
    rules = quality_rules("a/rules", records, rules=("gopher_quality", "c4"))
    exact = exact_dedup("a/exact", records)
    keep = [lang_is("en"), passes("gopher_quality"), not_dup("exact")]
    consolidate("c", records, [langs, rules, exact], keep=keep, remove=["c4_lines"])
    # an attribute folder given by path is not known before it is read: not refused here
    consolidate("c", records, [records], keep=[passes("gopher_quality")])
