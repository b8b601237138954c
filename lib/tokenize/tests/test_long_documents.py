"""Very long documents: encoded in pieces with bounded memory, to exactly the tokens of the whole document."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from schooner.cluster import LocalClient
from schooner.data import make_record, write_records
from schooner.data.sources import iter_source
from schooner.tokenize import TokenCache, Tokenizer, build_cache, train_bpe

GiB = 2**30


def _corpus_texts() -> list[str]:
    return [r["text"] for name in ("python-docs", "python-code") for r in iter_source(name)]


def long_document(n_chars: int) -> tuple[str, list[str]]:
    """One document of about `n_chars` characters of real text: corpus records joined by blank lines
    (repeated as often as needed); also returns the records it joins."""
    texts = _corpus_texts()
    parts, size, k = [], 0, 0
    while size < n_chars:
        t = texts[k % len(texts)]
        parts.append(t)
        size += len(t) + 2
        k += 1
    return "\n\n".join(parts), parts


def joined_reference(tok: Tokenizer, parts: list[str], dtype: str) -> np.ndarray:
    """The tokens of `"\\n\\n".join(parts)`, computed record by record: "A\\n" and "\\nB" split at the blank
    line between records, a boundary of this tokenizer's pre-tokenizer (checked against encoding the
    whole document in `test_long_document_equals_whole_encoding`)."""
    out = []
    for i, p in enumerate(parts):
        piece = ("\n" if i else "") + p + ("\n" if i < len(parts) - 1 else "")
        out.append(np.asarray(tok.encode(piece), dtype=dtype))
    return np.concatenate(out)


@pytest.fixture(scope="module")
def code_tokenizer() -> Tokenizer:
    return train_bpe(_corpus_texts()[:400], vocab_size=2048)


def test_long_document_equals_whole_encoding(code_tokenizer: Tokenizer, tmp_path) -> None:
    doc, parts = long_document(2_500_000)
    whole = code_tokenizer.encode(doc)
    assert np.array_equal(joined_reference(code_tokenizer, parts, "int64"), whole)  # validates the reference
    write_records([make_record(doc, source="long", id="long")], str(tmp_path / "recs"))
    with LocalClient(max_workers=1) as client:  # 2.5 MB in pieces of 16 Ki characters: ~150 cuts
        summary = build_cache(str(tmp_path / "recs"), str(tmp_path / "cache"), code_tokenizer, client=client,
                              piece_chars=1 << 14)  # fmt: skip
    cache = TokenCache.open(str(tmp_path / "cache"))
    assert (
        cache.num_documents == 1 and summary["long_documents"] == 1 and summary["long_documents_uncut"] == 0
    )
    assert cache.document(0).tolist() == whole + [code_tokenizer.eos_id]


def _stripping_tokenizer() -> Tokenizer:
    """A byte-level BPE that strips whitespace at both ends of what it encodes: no cut at whitespace is
    exact for it (a piece starting with a space would lose it)."""
    hf = tokenizers.Tokenizer(models.BPE())
    hf.normalizer = normalizers.Strip()
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    hf.train_from_iterator(_corpus_texts()[:200], trainer)
    return Tokenizer(hf, eos_token="<eos>")


def test_a_tokenizer_without_exact_cuts_encodes_long_documents_whole(tmp_path) -> None:
    tok = _stripping_tokenizer()
    doc, _ = long_document(200_000)
    write_records([make_record(doc, source="long", id="long")], str(tmp_path / "recs"))
    with LocalClient(max_workers=1) as client:
        summary = build_cache(str(tmp_path / "recs"), str(tmp_path / "cache"), tok, client=client,
                              piece_chars=1 << 14)  # fmt: skip
    assert summary["long_documents_uncut"] == 1  # detected and counted, never cut wrongly
    assert TokenCache.open(str(tmp_path / "cache")).document(0).tolist() == tok.encode(doc) + [tok.eos_id]


def _with_added(name: str, token: tokenizers.AddedToken) -> Tokenizer:
    base = train_bpe(_corpus_texts()[:100], vocab_size=600)
    hf = tokenizers.Tokenizer.from_str(base.to_json())
    hf.add_tokens([token])
    return Tokenizer(
        hf, bos_token=base.bos_token, eos_token=base.eos_token, pad_token=base.pad_token, source=name
    )


@pytest.mark.parametrize("encoder", ["hf", "tiktoken"])
@pytest.mark.parametrize(
    "case",
    [
        # an added token with rstrip takes the whole white-space run after it, hundreds of characters long
        ("rstrip", tokenizers.AddedToken("<tok>", rstrip=True, normalized=False), "<tok>" + " " * 600),
        # an added double space pairs the spaces of a run from its start: an even run (600, with the
        # space after "word") ends on a pair
        ("double space", tokenizers.AddedToken("  ", normalized=False), " " * 599),
    ],
    ids=lambda c: c[0] if isinstance(c, tuple) else c,
)
def test_a_cut_after_a_run_of_white_space_longer_than_the_check_window(case, encoder: str, tmp_path) -> None:
    """The cut before the last space of a long run passes a check that sees only the run's last 256
    characters, but the tokens at the cut depend on where the run starts."""
    name, token, run = case
    tok = _with_added(name, token)
    # the only cut candidate in the first piece's second half is the end of the run
    doc = "word " * 50 + run + "x" * 200 + " more words" * 400
    assert 512 < doc.index("x") < 1024 < doc.index("x") + 200
    write_records([make_record(doc, source="long", id="long")], str(tmp_path / "recs"))
    build_cache(str(tmp_path / "recs"), str(tmp_path / "cache"), tok, piece_chars=1024, encoder=encoder)
    reference = tokenizers.Tokenizer.from_str(tok.to_json())  # HF, the whole document at once
    reference.encode_special_tokens = True
    want = reference.encode(doc, add_special_tokens=False).ids + [tok.eos_id]
    got = TokenCache.open(str(tmp_path / "cache")).document(0).tolist()
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, (
        f"{len(got)} tokens, HF {len(want)}; first difference at {first}: {got[first - 2 : first + 3]} vs {want[first - 2 : first + 3]}"
    )


def test_cuts_around_white_space_runs_and_added_tokens_match_hf_on_generated_text() -> None:
    """Random text of words, added tokens (rstrip, lstrip, white-space ones, one with a space inside) and
    white-space runs of up to 1200 characters: the pieces' tokens are HF's for the whole text."""
    import random

    from schooner.tokenize._split_text import split_for_encoding

    base = train_bpe(_corpus_texts()[:100], vocab_size=600)
    hf = tokenizers.Tokenizer.from_str(base.to_json())
    hf.add_tokens([
        tokenizers.AddedToken("<a>", rstrip=True, normalized=False),
        tokenizers.AddedToken("<b>", lstrip=True, normalized=False),
        tokenizers.AddedToken("  ", normalized=False),
        tokenizers.AddedToken("\n\n", normalized=False),
        tokenizers.AddedToken("x y", normalized=False),
    ])  # fmt: skip
    tok = Tokenizer(hf, eos_token=base.eos_token)
    reference = tokenizers.Tokenizer.from_str(tok.to_json())
    reference.encode_special_tokens = True
    rng = random.Random(7)
    for _ in range(20):
        parts: list[str] = []
        while sum(map(len, parts)) < 6000:
            k = rng.random()
            if k < 0.4:
                parts.append(rng.choice(["word", "x", "y", "<a>", "<b>", "é", "日本"]))
            elif k < 0.8:
                parts.append(rng.choice([" ", "\n", "\t", "  "]) * rng.choice([1, 2, 3, 50, 301, 600, 1200]))
            else:
                parts.append(" ".join(rng.choice(["x", "y", "x y"]) for _ in range(rng.randint(1, 400))))
        text = "".join(parts)
        pieces, _ = split_for_encoding(tok.encode, text, 1024)
        assert [i for p in pieces for i in tok.encode(p)] == reference.encode(
            text, add_special_tokens=False
        ).ids


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith(field + ":")).split()[1]) * 1024


def _reset_peak(_: int) -> int:
    """Reset this worker's peak RSS (VmHWM; ru_maxrss would keep the peak of the process it was forked
    from), so the next `_worker_peak` measures only what follows."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return os.getpid()


def _worker_peak(_: int) -> tuple[int, int]:
    return os.getpid(), _status("VmHWM")


@pytest.mark.slow
def test_a_53_megabyte_document_in_under_a_gibibyte(code_tokenizer: Tokenizer, tmp_path) -> None:
    doc, parts = long_document(53_000_000)
    write_records([make_record(doc, source="long", id="long")], str(tmp_path / "recs"))
    del doc
    with LocalClient(max_workers=1) as client:
        pid = next(client.map(_reset_peak, [0]))
        summary = build_cache(str(tmp_path / "recs"), str(tmp_path / "cache"), code_tokenizer, client=client)
        pid2, peak = next(client.map(_worker_peak, [0]))
    assert pid2 == pid, "the measurement must come from the worker that tokenized"
    assert peak < GiB, f"the worker peaked at {peak / GiB:.2f} GiB"
    cache = TokenCache.open(str(tmp_path / "cache"))
    expect = joined_reference(code_tokenizer, parts, cache.manifest["dtype"])
    assert summary["train_tokens"] == expect.size + 1 > 10_000_000
    got = cache.tokens(0, cache.num_tokens)
    assert np.array_equal(got[:-1], expect) and got[-1] == code_tokenizer.eos_id
