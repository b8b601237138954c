"""Step keys do not change when code moves between modules: a key is the step's name, its config (class
names, not modules), its version string and, for user code only, a code fingerprint. The expected keys were
computed on main before the data steps were split into builders and engine modules (December 2026); a
deliberate change of a step's identity (a new `version`) updates its line here, with a CHANGELOG line."""

from __future__ import annotations

EXPECTED = {
    "data/raw": "e1e465815daf2b11cbdf9f169daced04e5136a07acc2c165ff6648de1d5350df",
    "a/exact": "a49481229c396e97389dbce809ba04989f3bccd96202918a14d9691d72896a6e",
    "a/q": "21615fdee5067cff93fcff53fbbf1266d02f19aea91f4ff3725f912892dd5310",  # quality_rules-v4: datatrove's formulas
    "a/p": "ed22ea1811ded17f3f18dee40b9422ed7a83c37e333a7edaaf291cde445764b0",
    "a/f": "04516ee6fb2357199bdf02fa8bba00de5f52ead54aa6b13b4edc8ce8a51c9280",
    "a/l": "6f4632b878a115e20c652c229ebff3f8d1ae453da9519b0ec11f179d0393b0d6",
    "a/s": "ca81f547ee491b6d67c7341f9e89b089f8444b08b0b98929c5fb0bdeb12e8471",
    "c": "19e6d1b73956064826d361656ecc22f928c294f9eaa5f5a786ec8ee240bae50d",  # v5; its attributes now lang, scores (checked)
    "d": "4304b7c3d8af735f972353d192a04404646c4ca8c9a1e4c371e09511e2da43b0",  # decontam-v6
    "cr": "b1f68a2f08930135024ffa80246bb1e9bd4cd90225ced7b2c72318d4ffda8a0a",
    "j": "516726cc0fda3e537ceef59a2ae1309d800533ca3b8f411c6ac8ee073cd091bd",
    "w": "54a0a63d8c52d6a68755338b8aa4cfbbc20987086719c227d2b20706b5ab4ee7",  # extract-v3, max_shard_bytes
    "k": "f10be39c302ca1302a9b55ccd7189842aa7f24fb8c76a72cb4eed7d9b4f793ab",
}


def test_data_and_curation_step_keys_are_unchanged(tmp_path) -> None:
    from schooner.data.curation import lang_is, not_dup, passes, top_fraction
    from schooner.data.curation.steps import (
        consolidate,
        decontaminate,
        exact_dedup,
        extract_warc,
        fuzzy_dedup,
        language_id,
        offline_crawl,
        offline_junk,
        paragraph_dedup,
        quality_rules,
        quality_scores,
        train_quality_classifier,
    )
    from schooner.data.steps import import_files

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    raw = import_files("data/raw", str(tmp_path / "a.jsonl"))
    ex = exact_dedup("a/exact", raw)
    q = quality_rules("a/q", raw)
    crawl = offline_crawl("cr")
    junk = offline_junk("j")
    clf = train_quality_classifier("k", raw, junk)
    keep = [lang_is("en", 0.65), passes("gopher_quality"), not_dup("exact"), top_fraction("quality", 0.5)]
    item = {"text": "an eval item of some length", "source": "t", "id": "1"}
    langs, scores = language_id("a/l", raw), quality_scores("a/s", raw, clf)
    handles = [
        raw, ex, q, paragraph_dedup("a/p", raw, duplicates=[ex]), fuzzy_dedup("a/f", raw), langs,
        scores, consolidate("c", raw, [ex, q, langs, scores], keep=keep),
        decontaminate("d", raw, against=[item], remove="paragraphs"), crawl, junk, extract_warc("w", crawl), clf,
    ]  # fmt: skip
    assert {h.name: h.key for h in handles} == EXPECTED
