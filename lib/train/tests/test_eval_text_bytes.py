"""The training run's own `eval/<name>/bpb` divides by the text's bytes (issue 36's leftover).

`schooner.eval.evaluate_lm` divides the scored bits by the UTF-8 bytes of the scored text, from the cache's
per-document byte counts (`TokenCache.document_bytes`); the trainer's `Evaluator` divided by the tokenizer's
per-token byte lengths, which count 0 bytes for a SentencePiece-style `<unk>`. Both now count the text, and
agree to the last bit on the same cache; a cache without the counts warns once, naming it.
"""

from __future__ import annotations

import logging
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

JAPANESE = "日本語のテキストです。"
TEXTS = [JAPANESE, "The lazy fox sleeps.", "A dog in the 日本 sun.", JAPANESE + " The dog. " + JAPANESE]


class Bigram(eqx.Module):
    """logits[b, t] = table[tokens[b, t]]."""

    table: jax.Array

    def __call__(self, tokens, *, segment_ids=None):
        return self.table[tokens]


def _sentencepiece_style_tokenizer():
    """A Unigram tokenizer with `▁` word prefixes and an `<unk>` for what it never saw (Llama 2 or T5
    without byte fallback): Japanese text encodes as `▁`, `<unk>` (as lib/eval's test_bpb builds it)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from schooner.tokenize import Tokenizer

    hf = tokenizers.Tokenizer(models.Unigram())
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    english = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps all day in the sun."]
    trainer = trainers.UnigramTrainer(
        vocab_size=120, unk_token="<unk>", special_tokens=["<unk>", "<s>", "</s>"]
    )
    hf.train_from_iterator(english * 20, trainer)
    return Tokenizer(hf, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from schooner.data import make_record, write_records
    from schooner.tokenize import build_cache, write_cache

    tmp = tmp_path_factory.mktemp("textbytes")
    tok = _sentencepiece_style_tokenizer()
    assert tok.encode(JAPANESE) == [tok.hf.token_to_id("▁"), tok.hf.token_to_id("<unk>")]
    records = str(tmp / "records")
    write_records([make_record(t, source="s") for t in TEXTS], records, format="jsonl")
    caches = {}
    for bos in (False, True):
        build_cache(records, str(tmp / f"bos-{bos}"), tok, prepend_bos=bos)
        caches[bos] = str(tmp / f"bos-{bos}" / "train")
    old = write_cache(str(tmp / "old"), [tok.encode(t) for t in TEXTS], tok).path  # no byte counts
    rng = np.random.default_rng(0)
    model = Bigram(jnp.asarray(rng.normal(size=(tok.vocab_size, tok.vocab_size)).astype(np.float32)))
    return tok, caches, old, model


def _evaluator(caches, tok, max_tokens=None, **kw):
    from schooner.train._evaluate import Evaluator

    return Evaluator(
        caches, seq_len=8, batch_size=2, max_tokens=max_tokens, byte_lengths=tok.token_byte_lengths(), **kw
    )


@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("max_tokens", [None, 9])
def test_training_bpb_counts_the_texts_bytes_and_equals_evaluate_lm(setup, bos, max_tokens):
    from schooner.eval import evaluate_lm

    tok, caches, _, model = setup
    got = _evaluator({"x": caches[bos]}, tok, max_tokens, tokenizer=tok)(model)
    want = evaluate_lm(
        model, {"x": caches[bos]}, tokenizer=tok, seq_len=8, batch_size=3, max_tokens=max_tokens
    )
    want = want["datasets"]["x"]
    assert want["bytes_from"] == "text"
    assert got["eval/x/loss"] == want["loss"]
    assert got["eval/x/bpb"] == want["bpb"], (got, want)  # the same bits over the same bytes
    if max_tokens is None:  # every document whole: lm-eval's count, less the unscored first tokens
        first = [0 if bos else len(tok.decode(tok.encode(t)[:1]).encode("utf-8")) for t in TEXTS]
        text_bytes = sum(len(t.encode("utf-8")) for t in TEXTS) - sum(first)
        assert got["eval/x/bpb"] == pytest.approx(want["nats"] / math.log(2) / text_bytes, rel=1e-12)
    # the token table's count (the old figure) differs: <unk> stood for 0 bytes
    table = _evaluator({"x": caches[bos]}, tok, max_tokens).scorer(model)["x"]
    assert table["bpb"] > 1.5 * got["eval/x/bpb"], (table, got)


def test_a_cache_without_byte_counts_warns_once_naming_it(setup, caplog):
    tok, _, old, model = setup
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        ev = _evaluator({"old": old}, tok, tokenizer=tok)
        first, second = ev(model), ev(model)
    warnings = [r for r in caplog.records if "per-document byte counts" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert old in warnings[0].getMessage() and "rebuild" in warnings[0].getMessage()
    table = tok.token_byte_lengths()
    nbytes = sum(int(table[tok.encode(t)[1:]].sum()) for t in TEXTS)  # the old way, kept for such caches
    assert first["eval/old/bpb"] == second["eval/old/bpb"]
    assert first["eval/old/bpb"] == pytest.approx(ev.scorer(model)["old"]["nats"] / math.log(2) / nbytes)


@pytest.mark.slow  # a short real run (about 20 s on the shared 2-core machine)
def test_a_runs_logged_bpb_equals_evaluate_lm_on_its_checkpoint(setup, tmp_path):
    """Through `train()`: the tokenizer found for the caches reaches the evaluator, and the logged
    `eval/<name>/bpb` is `evaluate_lm`'s on the saved checkpoint (text bytes, not the token table's)."""
    import dataclasses

    from schooner.eval import evaluate_lm
    from schooner.model import load_model, presets
    from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig, read_metrics, train

    tok, caches, _, _ = setup
    tok.save(str(tmp_path / "tok"))
    model = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, hidden_dim=32, intermediate_dim=64, num_layers=1,
        num_heads=2, num_kv_heads=2, max_seq_len=8,
    )  # fmt: skip
    out = str(tmp_path / "run")
    train(
        TrainerConfig(
            model=model,
            datasets=[(caches[True], 1.0)],
            validation={"ja": caches[True]},
            tokenizer=str(tmp_path / "tok"),
            seq_len=8,
            batch_size=8,  # the tests' 8 fake devices
            num_train_steps=2,
            eval_every=2,
            eval_max_tokens=None,
            optimizer=AdamConfig(learning_rate=1e-2, warmup=1),
            checkpoint=CheckpointConfig(every=None, save_final=True),
            trackers=TrackerConfig(loss_plot=False),
            output_path=out,
        )
    )
    logged = [r for r in read_metrics(f"{out}/metrics.jsonl") if "eval/ja/bpb" in r][-1]
    loaded, _ = load_model(f"{out}/step-000002")
    want = evaluate_lm(loaded, {"ja": caches[True]}, tokenizer=tok, seq_len=8)["datasets"]["ja"]
    assert want["bytes_from"] == "text"
    assert logged["eval/ja/loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert logged["eval/ja/bpb"] == pytest.approx(want["bpb"], rel=1e-6)
