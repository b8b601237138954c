"""evaluate_lm: hand-computed loss and bits-per-byte, batch invariance, segmentation, errors."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.eval import evaluate_lm
from schooner.model import TokenStream, iter_window_batches, num_windows

from .sentencepiece import JAPANESE, sentencepiece_style_tokenizer


class Bigram(eqx.Module):
    """logits[b, t] = table[tokens[b, t]]: the loss of each target depends only on its predecessor."""

    table: jax.Array

    def __call__(self, tokens, *, segment_ids=None):
        return self.table[tokens]


class PrefixMean(eqx.Module):
    """A context model: logits at t are a projection of the mean embedding of the same-segment prefix <= t.

    Its losses depend on the whole causal context and on the segment ids, so a wrong window, a leak from
    padding, or a mask across documents changes the numbers.
    """

    embed: jax.Array
    out: jax.Array

    def __call__(self, tokens, *, segment_ids=None):
        x = self.embed[tokens]  # [B, T, D]
        t = tokens.shape[1]
        allowed = jnp.tril(jnp.ones((t, t), dtype=bool))[None]
        if segment_ids is not None:
            allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
        weights = allowed.astype(jnp.float32)
        weights = weights / weights.sum(-1, keepdims=True)
        return jnp.einsum("bts,bsd,dv->btv", weights, x, self.out)


def _prefix_mean(vocab=23, dim=8, seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return PrefixMean(jax.random.normal(k1, (vocab, dim)), jax.random.normal(k2, (dim, vocab)))


def _docs(rng, vocab, lengths):
    return [rng.integers(0, vocab, size=n).astype(np.int32) for n in lengths]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_bpb_matches_hand_computation():
    rng = np.random.default_rng(1)
    vocab = 11
    table = rng.normal(size=(vocab, vocab)).astype(np.float32)
    byte_lengths = rng.integers(0, 5, size=vocab).astype(np.int32)
    byte_lengths[3] = 7
    docs = _docs(rng, vocab, [9, 1, 30, 4, 17])
    # by hand: every target except each document's first token, predicted from its predecessor
    logp = _log_softmax(table.astype(np.float64))
    nats = sum(-logp[d[i - 1], d[i]] for d in docs for i in range(1, len(d)))
    count = sum(len(d) - 1 for d in docs)
    nbytes = sum(int(byte_lengths[d[i]]) for d in docs for i in range(1, len(d)))
    result = evaluate_lm(
        Bigram(jnp.asarray(table)), {"x": docs}, tokenizer=byte_lengths, seq_len=8, batch_size=2
    )["datasets"]["x"]
    assert result["tokens"] == count
    assert result["bytes"] == nbytes
    assert result["documents"] == 5
    assert result["nats"] == pytest.approx(nats, rel=1e-6)
    assert result["loss"] == pytest.approx(nats / count, rel=1e-6)
    assert result["bpb"] == pytest.approx(nats / math.log(2) / nbytes, rel=1e-6)
    assert result["bytes_per_token"] == pytest.approx(nbytes / count)


class _TableTokenizer:
    def __init__(self, table):
        self.table = table

    def token_byte_lengths(self):
        return self.table


def test_averages_and_pooled_and_tokenizer_object():
    rng = np.random.default_rng(2)
    vocab = 9
    model = Bigram(jnp.asarray(rng.normal(size=(vocab, vocab)).astype(np.float32)))
    table = rng.integers(1, 4, size=vocab).astype(np.int32)
    caches = {"a": _docs(rng, vocab, [20, 5]), "b": _docs(rng, vocab, [40])}
    out = evaluate_lm(model, caches, tokenizer=_TableTokenizer(table), seq_len=6)
    a, b = out["datasets"]["a"], out["datasets"]["b"]
    assert out["average"]["loss"] == pytest.approx((a["loss"] + b["loss"]) / 2)
    assert out["average"]["bpb"] == pytest.approx((a["bpb"] + b["bpb"]) / 2)
    assert out["pooled"]["loss"] == pytest.approx((a["nats"] + b["nats"]) / (a["tokens"] + b["tokens"]))
    assert out["pooled"]["bpb"] == pytest.approx(
        (a["nats"] + b["nats"]) / math.log(2) / (a["bytes"] + b["bytes"])
    )


def test_no_tokenizer_means_no_bpb():
    rng = np.random.default_rng(3)
    model = Bigram(jnp.asarray(rng.normal(size=(5, 5)).astype(np.float32)))
    out = evaluate_lm(model, {"x": _docs(rng, 5, [10])}, seq_len=4)
    assert "bpb" not in out["datasets"]["x"] and "bpb" not in out["average"]
    assert out["datasets"]["x"]["tokens"] == 9


def _numbers(out):
    return {name: {k: v for k, v in d.items() if k != "seconds"} for name, d in out["datasets"].items()}


def test_results_do_not_depend_on_batch_size():
    rng = np.random.default_rng(4)
    vocab = 23
    model = _prefix_mean(vocab)
    table = rng.integers(0, 6, size=vocab).astype(np.int32)
    caches = {"prose": _docs(rng, vocab, [50, 3, 77, 12, 1, 40]), "code": _docs(rng, vocab, [130])}
    runs = [evaluate_lm(model, caches, tokenizer=table, seq_len=16, batch_size=bs) for bs in (1, 3, 8)]
    base = _numbers(runs[0])
    assert base["prose"]["windows"] == num_windows(sum([50, 3, 77, 12, 1, 40]), 16)
    for other in runs[1:]:
        got = _numbers(other)
        for name in base:
            for key in ("tokens", "bytes", "documents", "windows"):
                assert got[name][key] == base[name][key]
            for key in ("nats", "loss", "bpb"):
                assert got[name][key] == pytest.approx(base[name][key], rel=1e-6, abs=0)


def test_context_model_by_hand_one_window_per_doc():
    """With seq_len larger than every document, each window sees its documents from their start."""
    rng = np.random.default_rng(5)
    vocab = 7
    model = _prefix_mean(vocab, seed=3)
    docs = _docs(rng, vocab, [6, 9, 4])
    expected = 0.0
    for d in docs:
        logits = np.asarray(model(jnp.asarray(d[None])))[0].astype(np.float64)
        logp = _log_softmax(logits)
        expected += sum(-logp[i - 1, d[i]] for i in range(1, len(d)))
    out = evaluate_lm(model, {"x": docs}, seq_len=64, batch_size=1)["datasets"]["x"]
    assert out["nats"] == pytest.approx(expected, rel=1e-5)
    assert out["windows"] == 1


def test_respect_documents_false_scores_the_whole_stream():
    rng = np.random.default_rng(6)
    vocab = 8
    table = rng.normal(size=(vocab, vocab)).astype(np.float32)
    docs = _docs(rng, vocab, [5, 7, 3])
    stream = np.concatenate(docs)
    logp = _log_softmax(table.astype(np.float64))
    expected = sum(-logp[stream[i - 1], stream[i]] for i in range(1, len(stream)))
    out = evaluate_lm(Bigram(jnp.asarray(table)), {"x": docs}, seq_len=4, respect_documents=False)
    assert out["datasets"]["x"]["tokens"] == len(stream) - 1
    assert out["datasets"]["x"]["nats"] == pytest.approx(expected, rel=1e-6)


def test_max_tokens_scores_a_prefix():
    rng = np.random.default_rng(7)
    vocab = 8
    model = Bigram(jnp.asarray(rng.normal(size=(vocab, vocab)).astype(np.float32)))
    docs = _docs(rng, vocab, [10, 10, 10])
    capped = evaluate_lm(model, {"x": docs}, seq_len=5, max_tokens=15)["datasets"]["x"]
    by_hand = evaluate_lm(model, {"x": [docs[0], docs[1][:5]]}, seq_len=5)["datasets"]["x"]
    assert capped["tokens"] == 9 + 4 == by_hand["tokens"]
    assert capped["nats"] == pytest.approx(by_hand["nats"], rel=1e-7)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    seq_len=st.integers(2, 17),
    batch_size=st.integers(1, 5),
)
def test_windows_score_every_token_but_document_starts_exactly_once(lengths, seq_len, batch_size):
    docs = [np.arange(n, dtype=np.int32) + 100 * i for i, n in enumerate(lengths)]
    stream = TokenStream.from_documents(docs)
    scored: list[int] = []
    windows = 0
    for batch in iter_window_batches(stream, seq_len=seq_len, batch_size=batch_size):
        assert batch.tokens.shape == (batch_size, seq_len)
        windows += batch.num_real
        assert not batch.target_mask[batch.num_real :].any()
        for r in range(batch.num_real):
            scored.extend(batch.tokens[r, 1:][batch.target_mask[r]].tolist())
    expected = [int(t) for d in docs for t in d[1:]]
    assert sorted(scored) == sorted(expected)
    assert len(scored) == len(set(scored))  # token values are unique by construction
    assert windows == num_windows(stream.num_tokens, seq_len)


def test_errors_name_the_problem():
    rng = np.random.default_rng(8)
    model = Bigram(jnp.asarray(rng.normal(size=(5, 5)).astype(np.float32)))
    with pytest.raises(ValueError, match="token id 9 but the model's vocabulary has 5"):
        evaluate_lm(model, {"x": [np.array([1, 9, 2])]}, seq_len=4)
    with pytest.raises(ValueError, match="byte table has only 3"):
        evaluate_lm(model, {"x": [np.array([1, 4, 2])]}, tokenizer=np.ones(3, np.int32), seq_len=4)
    with pytest.raises(ValueError, match="no token to score"):
        evaluate_lm(model, {"x": [np.array([1]), np.array([2])]}, seq_len=4)
    with pytest.raises(ValueError, match="seq_len must be >= 2"):
        evaluate_lm(model, {"x": [np.array([1, 2])]}, seq_len=1)
    with pytest.raises(ValueError, match="non-negative integer byte lengths"):
        evaluate_lm(model, {"x": [np.array([1, 2])]}, tokenizer=np.ones(5) * 0.5, seq_len=4)
    with pytest.raises(FileNotFoundError, match="no token cache"):
        evaluate_lm(model, {"x": "/nonexistent/cache"}, seq_len=4)
    with pytest.raises(TypeError, match="expected a token cache path"):
        evaluate_lm(model, {"x": 3}, seq_len=4)


def test_llama_nano_is_batch_invariant_and_matches_token_losses():
    """A real schooner.model transformer: batch sizes 1, 3, 8 agree, and agree with the model's own losses."""
    import dataclasses

    from schooner.model import init, presets, token_losses

    config = dataclasses.replace(presets.llama_nano, vocab_size=64, num_layers=2, max_seq_len=32)
    model = init(config, key=jax.random.key(0))
    rng = np.random.default_rng(9)
    docs = _docs(rng, 64, [40, 7, 25, 3, 60])
    table = rng.integers(1, 4, size=64).astype(np.int32)
    runs = [
        _numbers(evaluate_lm(model, {"x": docs}, tokenizer=table, seq_len=16, batch_size=bs))
        for bs in (1, 3, 8)
    ]
    for other in runs[1:]:
        assert other["x"]["tokens"] == runs[0]["x"]["tokens"]
        assert other["x"]["nats"] == pytest.approx(runs[0]["x"]["nats"], rel=1e-6, abs=0)
        assert other["x"]["bpb"] == pytest.approx(runs[0]["x"]["bpb"], rel=1e-6, abs=0)
    # all documents packed in one window: segment masking makes each document's losses those of the model
    # run on that document alone
    short = _docs(rng, 64, [10, 7, 5, 3, 6])
    # each document alone, right-padded into one batch (causal attention: padding after a token cannot
    # change its prediction), so one compilation serves all five
    width = max(len(d) for d in short)
    batch = np.zeros((len(short), width), np.int32)
    for i, d in enumerate(short):
        batch[i, : len(d)] = d
    losses = np.asarray(token_losses(model, jnp.asarray(batch))).astype(np.float64)
    expected = sum(losses[i, : len(d) - 1].sum() for i, d in enumerate(short))
    whole = evaluate_lm(model, {"x": short}, seq_len=32, batch_size=2)["datasets"]["x"]
    assert whole["nats"] == pytest.approx(expected, rel=1e-5)


def test_bits_per_byte_divides_by_the_texts_bytes_not_the_tokens(tmp_path, caplog):
    """A SentencePiece-style tokenizer's `<unk>` stands for 0 bytes in its per-token byte table, so the
    33-byte Japanese sentence counted 1 byte (its `▁`) and bits per byte came out 33 times too high. The
    bytes now come from the cache's per-document byte counts of the text, as lm-eval's `bits_per_byte`
    counts `len(text.encode("utf-8"))`; a cache without them is scored as before, with a warning."""
    from schooner.data import make_record, write_records
    from schooner.tokenize import build_cache, write_cache

    tok = sentencepiece_style_tokenizer()
    texts = [JAPANESE, "The lazy fox sleeps.", "A dog in the 日本 sun."]
    assert tok.encode(JAPANESE) == [tok.hf.token_to_id("▁"), tok.hf.token_to_id("<unk>")]
    assert int(tok.token_byte_lengths()[tok.encode(JAPANESE)].sum()) == 1  # the defect's count
    assert len(JAPANESE.encode("utf-8")) == 33
    records = str(tmp_path / "records")
    write_records([make_record(t, source="s") for t in texts], records, format="jsonl")
    rng = np.random.default_rng(0)
    model = Bigram(jnp.asarray(rng.normal(size=(tok.vocab_size, tok.vocab_size)).astype(np.float32)))
    for bos in (False, True):
        out = str(tmp_path / f"cache-bos-{bos}")
        build_cache(records, out, tok, prepend_bos=bos)
        got = evaluate_lm(model, {"x": f"{out}/train"}, tokenizer=tok, seq_len=8)["datasets"]["x"]
        # lm-eval's byte count of the texts; without BOS each document's first token (here `▁`, which
        # stands for no byte of the text) is not scored
        first = [0 if bos else len(tok.decode(tok.encode(t)[:1]).encode("utf-8")) for t in texts]
        want = sum(len(t.encode("utf-8")) for t in texts) - sum(first)
        assert got["bytes"] == want and got["bytes_from"] == "text", (bos, got)
        assert got["bpb"] == pytest.approx(got["nats"] / math.log(2) / want)
    # the Japanese sentence alone: 33 bytes, where the token table said 1
    alone = str(tmp_path / "alone")
    write_records([make_record(JAPANESE, source="s")], alone, format="jsonl")
    build_cache(alone, str(tmp_path / "alone-cache"), tok, prepend_bos=True)
    got = evaluate_lm(model, {"ja": str(tmp_path / "alone-cache" / "train")}, tokenizer=tok, seq_len=8)
    assert got["datasets"]["ja"]["bytes"] == 33
    # a cache without byte counts (built before they were recorded): the token table, and a warning
    old = write_cache(str(tmp_path / "old"), [tok.encode(t) for t in texts], tok)
    with caplog.at_level("WARNING", logger="schooner.eval"):
        got = evaluate_lm(model, {"old": old.path}, tokenizer=tok, seq_len=8)["datasets"]["old"]
    table = tok.token_byte_lengths()
    assert got["bytes"] == sum(int(table[tok.encode(t)[1:]].sum()) for t in texts)
    assert got["bytes_from"] == "tokens"
    assert "no per-document byte counts" in caplog.text and old.path in caplog.text, caplog.text
    assert "rebuild" in caplog.text


def test_bits_per_byte_of_a_document_cut_by_max_tokens(tmp_path):
    """`max_tokens` cutting a document: its scored tokens' table bytes plus its share (by tokens) of the
    bytes the table misses in it; every whole document counts its text's bytes."""
    from schooner.tokenize import write_cache

    tok = sentencepiece_style_tokenizer()
    texts = ["The lazy fox sleeps.", JAPANESE + " The dog " + JAPANESE]
    docs = [tok.encode(t) + [tok.eos_id] for t in texts]
    cache = write_cache(
        str(tmp_path / "c"), [d[:-1] for d in docs], tok, document_bytes=[len(t.encode()) for t in texts]
    )
    rng = np.random.default_rng(1)
    model = Bigram(jnp.asarray(rng.normal(size=(tok.vocab_size, tok.vocab_size)).astype(np.float32)))
    keep = len(docs[0]) + 4  # the first document and 4 tokens of the second
    got = evaluate_lm(model, {"x": cache.path}, tokenizer=tok, seq_len=8, max_tokens=keep)["datasets"]["x"]
    table = tok.token_byte_lengths()
    whole = len(texts[0].encode()) - len(tok.decode(docs[0][:1]).encode())  # its first token is not scored
    missing = len(texts[1].encode()) - int(table[docs[1]].sum())
    want = whole + int(table[docs[1][1:4]].sum()) + round(missing * 4 / len(docs[1]))
    assert got["bytes"] == want, got
