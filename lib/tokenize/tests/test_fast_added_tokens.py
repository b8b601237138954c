"""The tiktoken fast path with added tokens: ids identical to HF `tokenizers` (the reference, called directly)
for tokenizers given ordinary added tokens (`add_tokens`), normalized and not, special tokens among them,
lstrip / rstrip flags, tokens overlapping one another; fallback to HF where the fast path cannot reproduce
them (single_word); the load-time probe of added tokens refuses an encoder that splits them otherwise.

HF splits the text in two passes: non-normalized added tokens on the raw text, then normalized ones on each
normalized stretch between, leftmost-longest each time; a rule applied in one pass over all of them (as the
fast path did) gives other ids, e.g. `<|user|>` with `<|` normalized and `|>` not."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from schooner.tokenize import Tokenizer
from schooner.tokenize._fast import FastEncoder, FastPathRefused

from .conftest import stdlib_texts
from .layouts import llama3_like, qwen2_like


def reference(tok: Tokenizer, texts: list[str], parse_special: bool) -> list[list[int]]:
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    hf.encode_special_tokens = not parse_special
    return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]


def _ordinary(hf: tokenizers.Tokenizer) -> None:  # the case: normalized (the default), not special
    hf.add_tokens(["<|", "|>"])


def _mixed_normalized(hf: tokenizers.Tokenizer) -> None:
    hf.add_tokens([AddedToken("<|", normalized=False), AddedToken("|>", normalized=True)])
    hf.add_tokens([AddedToken("|>>", normalized=False), AddedToken("<<", normalized=True)])


def _special_and_ordinary(hf: tokenizers.Tokenizer) -> None:
    hf.add_special_tokens(["|>", AddedToken("<|x|>", normalized=True, special=True)])
    hf.add_tokens(["<|", AddedToken("user", normalized=False), "ser|"])


def _strip_flags(hf: tokenizers.Tokenizer) -> None:
    hf.add_tokens([
        AddedToken("<mask>", lstrip=True, normalized=False),
        AddedToken("[SEP]", rstrip=True),
        AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
        AddedToken("\n\n", rstrip=True, normalized=False),  # its rstrip can swallow the next token's start
        AddedToken(" <t>", lstrip=True),
    ])  # fmt: skip
    hf.add_special_tokens([AddedToken("<cls>", lstrip=True, rstrip=True, special=True)])


def _unicode(hf: tokenizers.Tokenizer) -> None:  # NFC changes these where the tokenizer normalizes
    hf.add_tokens(
        ["cafe\u0301", AddedToken("\u212bx", normalized=True), AddedToken("e\u0301!", normalized=False)]
    )
    hf.add_tokens(["数字", AddedToken("🚀🎉", normalized=False)])


def _in_vocabulary(hf: tokenizers.Tokenizer) -> None:  # contents the model already has (ids from the model)
    hf.add_tokens(["def", AddedToken("self", normalized=False), "the"])


def _single_word(hf: tokenizers.Tokenizer) -> None:
    hf.add_tokens([AddedToken("<w>", single_word=True), "<|"])


CHANGES: dict[str, Callable[[tokenizers.Tokenizer], None]] = {
    "ordinary": _ordinary,
    "mixed_normalized": _mixed_normalized,
    "special_and_ordinary": _special_and_ordinary,
    "strip_flags": _strip_flags,
    "unicode": _unicode,
    "in_vocabulary": _in_vocabulary,
    "single_word": _single_word,
}
REPRODUCED = ("ordinary", "mixed_normalized", "special_and_ordinary", "strip_flags", "unicode")
"""Configurations the fast path must take (the others may fall back to HF)."""


@pytest.fixture(scope="module")
def bases(tokenizer: Tokenizer) -> dict[str, Tokenizer]:
    texts = stdlib_texts(30) + ["naïve café Ünïcödé 数字 123456 🚀🎉 e\u0301"] * 5
    return {"schooner": tokenizer, "llama3": llama3_like(texts, reserved=4), "qwen2": qwen2_like(texts)}


def _with(base: Tokenizer, change: str) -> Tokenizer:
    hf = tokenizers.Tokenizer.from_str(base.to_json())
    CHANGES[change](hf)
    return Tokenizer(tokenizers.Tokenizer.from_str(hf.to_str()), eos_token=base.eos_token, source=change)


def _contents(tok: Tokenizer) -> list[str]:
    return [t["content"] for t in json.loads(tok.to_json())["added_tokens"]]


def _fixed_texts(tok: Tokenizer) -> list[str]:
    """Each added token alone, doubled, inside words, between spaces and newlines, next to each other
    (overlapping ones too), cut in half, in NFD and NFC forms, and inside real text."""
    contents = _contents(tok)
    out = [
        "<|user|>",
        "<|>",
        "<|<||>|>",
        "x <| y |> z",
        "<|x|>>",
        "|>>>",
        "<<|",
        "ab|>",
        "  <mask>  [SEP]  x",
    ]
    for i, c in enumerate(contents):
        other = contents[(i + 1) % len(contents)]
        out += [
            c,
            c + c,
            f"a{c}b",
            f" {c} ",
            f"  {c}\n\n x",
            f"word{c}word",
            c + other,
            other + c,
            c[1:],
            c[:-1],
        ]
        out += [unicodedata.normalize("NFD", f"é{c}é"), unicodedata.normalize("NFC", f"\u212b {c}")]
    doc = stdlib_texts(1, start=50)[0][:3000]
    out.append("".join(f"{w}{contents[i % len(contents)]}" for i, w in enumerate(doc.split(" "))))
    return out


@pytest.mark.parametrize("base", ["schooner", "llama3", "qwen2"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_added_tokens_give_hf_ids(bases, base, change) -> None:
    tok = _with(bases[base], change)
    if change in REPRODUCED:
        assert tok.encoder_choice.encoder == "tiktoken", tok.encoder_choice
    texts = _fixed_texts(tok)
    for parse_special in (False, True):
        assert tok.encode_batch(texts, parse_special=parse_special) == reference(tok, texts, parse_special)
        for text, ids in zip(texts, reference(tok, texts, parse_special)):
            assert tok.encode(text, parse_special=parse_special) == ids, (text, parse_special)
    arrays = tok._encode_arrays(texts)
    assert [a.tolist() for a in arrays] == reference(tok, texts, False)


@pytest.mark.parametrize("base", ["schooner", "qwen2"])
@pytest.mark.parametrize("change", REPRODUCED)
def test_added_tokens_give_hf_ids_on_generated_text(bases, base, change) -> None:
    tok = _with(bases[base], change)
    assert tok.encoder_choice.encoder == "tiktoken", tok.encoder_choice
    contents = _contents(tok)
    fragments = sorted({c[i:j] for c in contents for i in range(len(c)) for j in range(i + 1, len(c) + 1)})
    piece = st.one_of(
        st.sampled_from(contents),
        st.sampled_from(fragments),
        st.text(st.sampled_from(" \t\n\r\u00a0\u3000\u2028\x1c\x85"), min_size=1, max_size=4),  # \x1c: not \s
        st.sampled_from(["e\u0301", "\u212b", "Å", "ﬁ", "_", "x", "数", "1", "don't", "def", "self"]),
        st.text(max_size=8),
    )
    texts = st.lists(piece, max_size=20).map("".join)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(texts, min_size=1, max_size=4), st.booleans())
    def check(batch: list[str], parse_special: bool) -> None:
        assert tok.encode_batch(batch, parse_special=parse_special) == reference(tok, batch, parse_special)

    check()


def test_single_word_tokens_fall_back_to_hf(bases) -> None:
    tok = _with(bases["schooner"], "single_word")
    assert tok.encoder_choice.encoder == "hf"
    assert "single_word" in tok.encoder_choice.reason


def test_ignore_merges_with_an_added_token_in_the_vocabulary_falls_back(bases) -> None:
    """With `ignore_merges` HF looks a whole word up in the model's vocabulary, where an added token the
    model also has (and no merge makes) is found even when special tokens are read as text; the fast path
    keeps added tokens out of tiktoken's ranks, so it must refuse."""
    spec = json.loads(bases["llama3"].to_json())
    new_id = max(t["id"] for t in spec["added_tokens"]) + 1
    spec["model"]["vocab"]["qqqq"] = new_id
    spec["added_tokens"].append({"id": new_id, "content": "qqqq", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})  # fmt: skip
    tok = Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)), eos_token="<|end_of_text|>")
    assert reference(tok, ["qqqq b"], False)[0][0] == new_id  # what HF does
    assert tok.encoder_choice.encoder == "hf", tok.encoder_choice
    assert "ignore_merges" in tok.encoder_choice.reason
    assert tok.encode("a qqqq b") == reference(tok, ["a qqqq b"], False)[0]


class _OnePassEncoder(FastEncoder):
    """The rule the fast path used to apply: every added token in one leftmost-longest pass on the raw
    text, whatever its `normalized` flag (what the probe must catch)."""

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        added = json.loads(self._hf_json)["added_tokens"]
        by_content = {t["content"]: t for t in added}
        pattern = re.compile("|".join(re.escape(c) for c in sorted(by_content, key=len, reverse=True)))
        out, pos = [], 0
        for m in pattern.finditer(text):
            t = by_content[m.group()]
            if t["special"] and not parse_special:
                continue
            out += self._core.encode_ordinary(text[pos : m.start()])
            out.append(t["id"])
            pos = m.end()
        return out + self._core.encode_ordinary(text[pos:])


def test_the_load_time_probe_catches_a_wrong_added_token_rule(bases) -> None:
    from schooner.tokenize._fast import probe_added_tokens

    tok = _with(bases["schooner"], "mixed_normalized")
    assert tok.encoder_choice.encoder == "tiktoken"
    probe_added_tokens(tok.hf, tok._fast)  # the real encoder passes
    wrong = object.__new__(_OnePassEncoder)
    wrong.__dict__.update(tok._fast.__dict__)
    wrong._hf_json = tok.to_json()
    with pytest.raises(FastPathRefused, match="added-token probe"):
        probe_added_tokens(tok.hf, wrong)


@pytest.mark.parametrize("base", ["schooner", "qwen2"])
def test_lone_surrogates_fail_as_in_hf_between_added_tokens(bases, base) -> None:
    tok = _with(bases[base], "unicode")  # normalized added tokens: the second pass normalizes each stretch
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    for text in ("a\ud800b", "\udfff<|", "cafe\u0301\ud83d", "数字\udc00数字"):
        for ours, theirs in ((tok.encode, hf.encode), (lambda t: tok.encode_batch([t]), hf.encode_batch)):
            arg = text if ours is tok.encode else [text]
            with pytest.raises(TypeError) as hf_error:
                theirs(arg)
            with pytest.raises(TypeError) as fast_error:
                ours(text)
            assert str(fast_error.value) == str(hf_error.value)


def _panicking(hf: tokenizers.Tokenizer) -> None:
    hf.add_tokens([AddedToken("<R>", rstrip=True), AddedToken("\n", lstrip=True)])


def test_a_tokenizer_on_which_hf_panics_loads_and_encodes_as_hf_does(bases, tmp_path) -> None:
    """HF `tokenizers` panics (pyo3's PanicException, a BaseException) on "<R>\\n\\n" with these two added
    tokens; the load-time probe hits that string. Loading must still work, the fast path must be refused (it
    cannot be compared with HF there), and every other text encodes as HF encodes it."""
    from schooner.tokenize import load_tokenizer

    hf = tokenizers.Tokenizer.from_str(bases["schooner"].to_json())
    _panicking(hf)
    with pytest.raises(BaseException, match="AddedVocabulary bad split") as panic:
        hf.encode("<R>\n\n", add_special_tokens=False)
    assert not isinstance(panic.value, Exception)  # why a plain `except Exception` let it through
    path = tmp_path / "tokenizer.json"
    path.write_text(hf.to_str(), encoding="utf-8")
    tok = load_tokenizer(path)
    texts = ["hello", "a <R> b\n c", "<R>x\n", "\n\n<R> y", "x\n\n"]
    assert [tok.encode(t) for t in texts] == reference(tok, texts, parse_special=False)
    assert tok.encode_batch(texts) == reference(tok, texts, parse_special=False)
    assert tok.encoder_choice.encoder == "hf"
    assert "panics" in tok.encoder_choice.reason and "<R>\\n\\n" in tok.encoder_choice.reason
    # on the string itself HF has no answer: a clear error naming it, not a BaseException
    with pytest.raises(ValueError, match=r"HF tokenizers panicked .*'<R>\\n\\n'"):
        tok.encode("<R>\n\n")
    with pytest.raises(ValueError, match=r"HF tokenizers panicked"):
        tok.encode_batch(["hello", "<R>\n\n"])
    assert tok.encode("hello") == reference(tok, ["hello"], parse_special=False)[0]  # still usable
