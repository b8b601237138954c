"""The evaluate step end to end: a real tokenizer, a real token cache, saved checkpoints, the step runner."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from schooner.cluster import StepRunner
from schooner.eval import evaluate_lm, load_checkpoint
from schooner.eval.steps import EvaluateConfig, evaluate
from schooner.model import init, load_model, presets, save_model
from schooner.tokenize import TokenCache, TokenizerMismatchError, load_tokenizer, train_bpe, write_cache

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. Ünïcödé costs more bytes — like this: ✓",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "Python is a programming language that lets you work quickly.",
] * 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalstep")
    tok = train_bpe(TEXTS, vocab_size=300)
    tok.save(str(root / "tok"))
    documents = [tok.encode(t) for t in TEXTS[:8]]
    write_cache(str(root / "tokenized" / "validation"), documents, tok)
    write_cache(str(root / "tokenized" / "train"), documents, tok)
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=64,
    )  # fmt: skip
    run = root / "run"
    for step, seed in ((2, 0), (5, 1)):
        save_model(str(run / f"step-{step:06d}"), init(config, key=jax.random.key(seed)), config)
        (run / f"step-{step:06d}" / "checkpoint.json").write_text(json.dumps({"step": step}))
    return root, load_tokenizer(str(root / "tok")), documents


@pytest.mark.slow  # one of the default suite's heaviest (20-70 s on 2 cores); covered in part by faster tests
def test_evaluate_step_scores_the_latest_checkpoint(setup, tmp_path):
    root, tok, _ = setup
    handle = evaluate(
        "eval/test",
        checkpoint=str(root / "run"),
        datasets={"val": str(root / "tokenized")},
        tokenizer=str(root / "tok"),
        seq_len=16,
        batch_size=3,
        prompts=("def",),
        max_new_tokens=6,
    )
    runner = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True)
    outcome = runner.run([handle])[handle]
    out = Path(outcome.output_path)
    results = json.loads((out / "results.json").read_text())
    samples = json.loads((out / "samples.json").read_text())
    assert results["checkpoint"] == str(root / "run" / "step-000005")
    assert results["caches"] == {"val": str(root / "tokenized" / "validation")}
    model, _ = load_model(str(root / "run" / "step-000005"))
    # Independently of the scorer: the model's logits, float64 log-softmax, windows of 16 tokens every 15
    # over the concatenated documents, targets within a document, bytes from the tokenizer's table.
    want = _by_hand(model, TokenCache.open(str(root / "tokenized" / "validation")), tok, seq_len=16)
    got = results["datasets"]["val"]
    assert got["tokens"] == want["tokens"] and got["bytes"] == want["bytes"]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["bpb"] == pytest.approx(want["bpb"], rel=1e-5)
    assert samples == [{"prompt": "def", "completion": _greedy_by_hand(model, tok, "def", 6)}]
    assert outcome.result["datasets"]["val"]["bpb"] == pytest.approx(results["datasets"]["val"]["bpb"])
    assert outcome.result["samples"] == samples


def _by_hand(model, cache, tokenizer, *, seq_len: int) -> dict:
    tokens = np.asarray(cache.tokens(0, cache.num_tokens))
    docs = np.searchsorted(np.asarray(cache.offsets()), np.arange(len(tokens)), side="right")
    table = tokenizer.token_byte_lengths()
    nats, count, nbytes = 0.0, 0, 0
    for start in range(0, len(tokens) - 1, seq_len - 1):
        window, wdocs = tokens[start : start + seq_len], docs[start : start + seq_len]
        logits = np.asarray(model(window[None].astype(np.int32), segment_ids=wdocs[None].astype(np.int32)))
        logp = logits[0].astype(np.float64)
        logp = logp - logp.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        same = wdocs[:-1] == wdocs[1:]
        targets = window[1:]
        nats -= float(logp[np.arange(len(targets)), targets][same].sum())
        count += int(same.sum())
        nbytes += int(table[targets[same]].sum())
    return {"loss": nats / count, "bpb": nats / math.log(2) / nbytes, "tokens": count, "bytes": nbytes}


def _greedy_by_hand(model, tokenizer, prompt: str, n: int) -> str:
    """Argmax of the full context's last logits, token by token, stopping at EOS (not kept)."""
    ids = list(tokenizer.encode(prompt))
    ids = ids[:-1] if ids[-1] == tokenizer.eos_id else ids
    out: list[int] = []
    for _ in range(n):
        nxt = int(np.argmax(np.asarray(model(np.asarray([ids], np.int32)))[0, -1]))
        if nxt == tokenizer.eos_id:
            break
        ids.append(nxt)
        out.append(nxt)
    return tokenizer.decode(out)


def test_bits_per_byte_counts_the_real_utf8_bytes(setup):
    """Every token but each document's first is scored, so the bytes are the text's minus its first token's."""
    root, tok, documents = setup
    model, _, _ = load_checkpoint(str(root / "run"))
    result = evaluate_lm(model, {"val": str(root / "tokenized" / "validation")}, tokenizer=tok, seq_len=64)
    scored = result["datasets"]["val"]
    expected_bytes = sum(
        len(text.encode("utf-8")) - len(tok.decode([doc[0]]).encode("utf-8"))
        for text, doc in zip(TEXTS[:8], documents)
    )
    assert scored["bytes"] == expected_bytes
    assert scored["tokens"] == sum(len(d) for d in documents)  # len(doc) - 1 targets + the appended EOS
    assert scored["bpb"] == pytest.approx(scored["nats"] / math.log(2) / expected_bytes)
    assert np.isfinite(scored["loss"])


def test_errors_point_at_the_fix(setup):
    root, tok, _ = setup
    model, _, _ = load_checkpoint(str(root / "run"))
    with pytest.raises(FileNotFoundError, match="tokenized step's output: pass .*tokenized/validation"):
        evaluate_lm(model, {"val": str(root / "tokenized")}, tokenizer=tok, seq_len=16)
    other = train_bpe(TEXTS[:2] * 4, vocab_size=280)
    with pytest.raises(TokenizerMismatchError):
        evaluate_lm(model, {"val": str(root / "tokenized" / "validation")}, tokenizer=other, seq_len=16)
    with pytest.raises(ValueError, match="seq_len must be >= 2"):
        EvaluateConfig(checkpoint="x", datasets={"a": "b"}, tokenizer="t", seq_len=1)
    with pytest.raises(ValueError, match="wrap it"):
        EvaluateConfig(checkpoint="x", datasets={"a": "b"}, tokenizer="t", seq_len=8, prompts="The")
    with pytest.raises(ValueError, match="non-empty dict"):
        EvaluateConfig(checkpoint="x", datasets={}, tokenizer="t", seq_len=8)


def _strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_diverged_checkpoints_scores_are_written_as_json_nulls(setup, tmp_path, caplog):
    """A NaN loss (a diverged checkpoint) was written as the bare token NaN, which JSON does not have (strict
    readers, `jq`, JavaScript refuse the file); results.json now holds null there and the step says so."""
    import equinox as eqx
    import jax.numpy as jnp

    root, _, _ = setup
    model, config = load_model(str(root / "run" / "step-000005"))
    diverged = eqx.tree_at(
        lambda m: m.final_norm.array, model, jnp.full_like(model.final_norm.array, jnp.nan)
    )
    save_model(str(tmp_path / "nan"), diverged, config)
    handle = evaluate(
        "eval/nan",
        checkpoint=str(tmp_path / "nan"),
        datasets={"val": str(root / "tokenized")},
        tokenizer=str(root / "tok"),
        seq_len=16,
        prompts=(),
    )
    from schooner.cluster import ResultWarning

    # the runner says so too: the step's returned scores hold NaN, stored as null in its record
    with caplog.at_level("WARNING", logger="schooner.eval"), pytest.warns(ResultWarning, match="non-finite"):
        outcome = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([handle])[handle]
    results = _strict_json((Path(outcome.output_path) / "results.json").read_text())
    assert results["datasets"]["val"]["loss"] is None and results["datasets"]["val"]["tokens"] > 0
    assert "datasets.val.loss" in caplog.text and "not a finite number" in caplog.text, caplog.text
