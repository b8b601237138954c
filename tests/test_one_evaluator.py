"""Train-time evaluation and `schooner.eval` give the same numbers for the same checkpoint and settings.

Both use `schooner.model.StreamScorer`; this checks it end to end across the packages: a `train_lm` step's
final `eval/<name>/loss` and `bpb` against the `evaluate` step on the checkpoint the run wrote, with the same
validation cache, `seq_len` and token budget, but different batch sizes and a data-parallel batch sharding
on one side.
"""

from __future__ import annotations

import json
import os

import pytest

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. Unicode costs more bytes: \u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9 \u2713",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "Python is a programming language that lets you work quickly and integrate systems effectively.",
] * 12


def test_train_time_eval_equals_the_evaluate_step(tmp_path) -> None:
    import dataclasses

    from schooner.cluster import StepRunner, lower
    from schooner.eval.steps import evaluate
    from schooner.model import presets
    from schooner.tokenize import train_bpe, write_cache
    from schooner.train import AdamConfig
    from schooner.train.steps import train_lm

    tok = train_bpe(TEXTS, vocab_size=300)
    data = tmp_path / "data"
    tok.save(str(data))
    docs = [tok.encode(t) for t in TEXTS]
    write_cache(str(data / "train"), docs[8:], tok)
    write_cache(str(data / "validation"), docs[:8], tok)
    model = dataclasses.replace(
        presets.llama_nano, hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=1
    )
    run = train_lm(
        "checkpoints/one-evaluator",
        model=model,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        datasets={str(data): 1.0},
        batch_size=8,  # eval batches of 8 windows, split over the 8 fake devices
        seq_len=24,
        num_train_steps=3,
        eval_max_tokens=500,
        resources=None,
    )
    scores = evaluate(
        "eval/one-evaluator",
        checkpoint=run,
        datasets={"v": str(data / "validation")},
        tokenizer=str(data),
        seq_len=24,
        batch_size=3,
        max_tokens=500,
        max_new_tokens=0,
    )
    result = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([lower(scores)])
    with open(os.path.join(result[run].output_path, "metrics.jsonl")) as f:
        final = [json.loads(line) for line in f if "eval/loss" in line][-1]
    got = result[scores].result["datasets"]["v"]
    assert final["eval/data/loss"] == pytest.approx(got["loss"], rel=1e-6, abs=0)
    assert final["eval/data/bpb"] == pytest.approx(got["bpb"], rel=1e-6, abs=0)
