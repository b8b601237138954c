"""The tiktoken fast path: ids identical to HF `tokenizers` (the reference, called directly) on the embedded
corpus and on generated text, for Schooner-trained, Llama-3-like and Qwen-2-like tokenizer files; fallback
for layouts it does not reproduce; caches built with either encoder byte-identical."""

import json
import os

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schooner.cluster import LocalClient
from schooner.data import write_records
from schooner.data.sources import iter_source
from schooner.tokenize import Tokenizer, build_cache, load_tokenizer, render_chat
from schooner.tokenize._fast import FastPathRefused

from .conftest import stdlib_texts
from .layouts import llama3_like, qwen2_like


def reference(tok: Tokenizer, texts: list[str], parse_special: bool = False) -> list[list[int]]:
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    hf.encode_special_tokens = not parse_special
    return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]


@pytest.fixture(scope="module")
def layouts(tokenizer: Tokenizer) -> dict[str, Tokenizer]:
    texts = stdlib_texts(60) + ["naïve café Ünïcödé 数字 123456 🚀🎉 e\u0301"] * 5
    toks = {"schooner": tokenizer, "llama3": llama3_like(texts), "qwen2": qwen2_like(texts)}
    for name, tok in toks.items():
        assert tok.encoder_choice.encoder == "tiktoken", (name, tok.encoder_choice)
    return toks


def test_layouts_are_recognised(layouts) -> None:
    assert "gpt2 layout" in layouts["schooner"].encoder_choice.reason
    assert "llama3 layout" in layouts["llama3"].encoder_choice.reason
    assert "qwen2+nfc layout" in layouts["qwen2"].encoder_choice.reason


@pytest.mark.parametrize("name", ["schooner", "llama3", "qwen2"])
def test_identical_ids_on_the_embedded_docs(layouts, name) -> None:
    tok = layouts[name]
    texts = [r["text"] for r in iter_source("python-docs")]
    assert tok.encode_batch(texts) == reference(tok, texts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["schooner", "llama3", "qwen2"])
def test_identical_ids_on_the_whole_embedded_corpus(layouts, name) -> None:
    tok = layouts[name]
    for source in ("python-docs", "python-code"):
        texts = [r["text"] for r in iter_source(source)]
        assert tok.encode_batch(texts) == reference(tok, texts)
        assert tok.encode_batch(texts, parse_special=True) == reference(tok, texts, parse_special=True)


LOOKALIKES = [
    "<|end_of_text|>", "<|end_of_text|", "<|user|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
    "<|begin_of_text|>", "<|reserved_special_token_3|>", "<|fim_prefix|>", "<|", "|>", "<tool_call", "<<|user|>>",
]  # fmt: skip
pieces = st.one_of(
    st.characters(
        codec="utf-8"
    ),  # every plane; lone surrogates (which st.characters() can draw) are tested below
    st.text(st.sampled_from(" \t\n\r\u00a0\u3000\u2028\x0b\x0c"), min_size=1, max_size=12),  # whitespace runs
    st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=8),  # digits of every script
    st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), min_size=1, max_size=4),  # emoji
    st.text(st.characters(categories=["Mn", "Mc", "Me"]), min_size=1, max_size=4),  # combining marks
    st.sampled_from(LOOKALIKES),
    st.sampled_from(
        ["'s", "'LL", "'Re", " don't", "e\u0301", "\u212b", "Å", "ﬁ", "x" * 40, "(\n\n", "()\n\n"]
    ),
    st.text(max_size=30),
)
texts = st.lists(pieces, max_size=25).map("".join)


@pytest.mark.parametrize("name", ["schooner", "llama3", "qwen2"])
def test_identical_ids_on_generated_text(layouts, name) -> None:
    tok = layouts[name]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(texts, min_size=1, max_size=4), st.booleans())
    def check(batch: list[str], parse_special: bool) -> None:
        assert tok.encode_batch(batch, parse_special=parse_special) == reference(tok, batch, parse_special)
        assert (
            tok.encode(batch[0], parse_special=parse_special) == reference(tok, batch[:1], parse_special)[0]
        )

    check()


@pytest.mark.parametrize("name", ["schooner", "llama3", "qwen2"])
def test_lone_surrogates_fail_as_in_hf(layouts, name) -> None:
    tok = layouts[name]
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    for text in ("a\ud800b", "\udfff", "ok \ud83d"):
        for ours, theirs in (
            (tok.encode, hf.encode),
            (lambda t: tok.encode_batch([t]), lambda t: hf.encode_batch([t])),
        ):
            with pytest.raises(TypeError) as hf_error:
                theirs(text)
            with pytest.raises(TypeError) as fast_error:
                ours(text)
            assert str(fast_error.value) == str(hf_error.value)


def _variant(tok: Tokenizer, change) -> Tokenizer:
    spec = json.loads(tok.to_json())
    change(spec)
    return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(spec)), eos_token=tok.eos_token)


def _lowercase(s: dict) -> None:
    s["normalizer"] = {"type": "Lowercase"}


def _prefix_space(s: dict) -> None:
    s["pre_tokenizer"]["add_prefix_space"] = True


def _single_word(s: dict) -> None:
    s["added_tokens"][3]["single_word"] = True


def _byte_fallback(s: dict) -> None:
    s["model"]["byte_fallback"] = True


def _other_regex(s: dict) -> None:
    s["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\w+|\s+|[^\w\s]+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}  # fmt: skip


def _reordered_merges(s: dict) -> None:
    m = s["model"]["merges"]
    m[10], m[200] = m[200], m[10]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_lowercase, "normalizer 'Lowercase'"),
        (_prefix_space, "add_prefix_space"),
        (_single_word, "has single_word"),
        (_byte_fallback, "byte_fallback"),
        (_other_regex, "not one of the known patterns"),
        (_reordered_merges, "not in rank order"),
    ],
)
def test_unsupported_tokenizers_fall_back_to_hf(tokenizer, change, reason) -> None:
    tok = _variant(tokenizer, change)
    assert tok.encoder_choice.encoder == "hf"
    assert reason in tok.encoder_choice.reason or __import__("re").search(reason, tok.encoder_choice.reason)
    sample = stdlib_texts(3)
    assert tok.encode_batch(sample) == reference(tok, sample)
    forced = _variant(tokenizer, change)
    forced._encoder_request = "tiktoken"
    with pytest.raises(FastPathRefused, match="encoder='tiktoken' was forced"):
        forced.encode("x")


def test_sentencepiece_style_tokenizer_falls_back() -> None:
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "▁")
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    hf.train_from_iterator(
        stdlib_texts(5), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"])
    )
    tok = Tokenizer(hf, eos_token="</s>")
    assert tok.encoder_choice.encoder == "hf" and "normalizer" in tok.encoder_choice.reason
    assert tok.encode("hello  world") == reference(tok, ["hello  world"])[0]


def test_forcing_the_encoder(tokenizer_path, monkeypatch) -> None:
    assert load_tokenizer(tokenizer_path).encoder_choice.encoder == "tiktoken"
    assert load_tokenizer(tokenizer_path, encoder="hf").encoder_choice.reason == "forced"
    monkeypatch.setenv("SCHOONER_TOKENIZER_ENCODER", "hf")
    assert load_tokenizer(tokenizer_path).encoder_choice.encoder == "hf"
    monkeypatch.setenv("SCHOONER_TOKENIZER_ENCODER", "fastest")
    with pytest.raises(ValueError, match="encoder must be one of"):
        load_tokenizer(tokenizer_path).encode("x")


def test_chat_renderer_is_the_same_with_either_encoder(layouts) -> None:
    conv = [
        {"role": "user", "content": "Ünïcödé <|im_end|> 🚀\n\n  x"},
        {"role": "assistant", "content": "数字 123 done."},
    ]
    for name in ("schooner", "qwen2"):
        fast = layouts[name]
        slow = Tokenizer(tokenizers.Tokenizer.from_str(fast.to_json()), bos_token=fast.bos_token,
                         eos_token=fast.eos_token, chat_template=fast.chat_template, encoder="hf")  # fmt: skip
        a, b = render_chat(fast, conv), render_chat(slow, conv)
        assert a.ids.tolist() == b.ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()


def _folder(out: str) -> dict[str, object]:
    """Every file of a build folder; JSON files parsed, without the encoder choice and the timing."""
    files: dict[str, object] = {}
    for root, _, names in os.walk(out):
        for n in names:
            path = os.path.join(root, n)
            with open(path, "rb") as f:
                data = f.read()
            if n.endswith(".json") and n != "tokenizer.json":
                d = json.loads(data)
                d.pop("encoder", None)
                if "plan" in d:
                    d["plan"].pop("encoder")
                    d["summary"].pop("seconds")
                data = d
            files[os.path.relpath(path, out)] = data
    return files


def test_caches_built_with_either_encoder_are_byte_identical(tokenizer_path, tmp_path) -> None:
    from schooner.data import make_record

    src = str(tmp_path / "recs")
    write_records([make_record(t, source="s") for t in stdlib_texts(24, start=30)], src, num_shards=3)
    client = LocalClient(max_workers=2)
    try:
        for enc in ("hf", "tiktoken"):
            build_cache(src, str(tmp_path / enc), tokenizer_path, validation_fraction=0.2, encoder=enc,
                        batch_chars=4096, piece_chars=2048, client=client)  # fmt: skip
            with open(tmp_path / enc / "train" / "manifest.json") as f:
                assert json.load(f)["encoder"]["encoder"] == enc
    finally:
        client.shutdown()
    hf, fast = _folder(str(tmp_path / "hf")), _folder(str(tmp_path / "tiktoken"))
    assert sorted(hf) == sorted(fast) and len(hf) > 10
    assert hf == fast
