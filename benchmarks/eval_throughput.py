"""Scoring throughput: tokens scored/s on a multiple-choice task against the same model's plain forward pass.

Builds the bundled `docs_next_sentence` task (200 documents x 4 choices from the embedded corpus), tokenizes it
with a 2k BPE trained on the same corpus, and scores it with `schooner.eval.score_requests` (per-request
length buckets, fixed micro-batch, float64 host sums: the batch-invariant path). The peer is the same model's
jitted forward pass (logits + log-softmax) over full [batch, seq_len] rows of real tokens, with no padding,
bucketing or host work, in the same run. Both are warmed up (compiled) first, then timed as the best of
`--repeats`. Prints tokens/s of each and the ratio (goal >= 0.5: padding and bookkeeping waste little).

    uv run python benchmarks/eval_throughput.py [--batch 16] [--micro-batch 1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from schooner.data.sources import iter_source
from schooner.eval import bundled_suite, example_requests, load_examples, score_requests
from schooner.model import init, presets
from schooner.tokenize import train_bpe

SEQ_LEN = 256


@eqx.filter_jit
def _forward(model, tokens):
    return jax.nn.log_softmax(model(tokens).astype(jnp.float32), axis=-1)[:, :-1].max()


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    texts = [r["text"] for r in iter_source("python-docs")]
    tok = train_bpe(texts, vocab_size=2048)
    with tempfile.TemporaryDirectory() as folder:
        task = next(t for t in bundled_suite(folder).tasks if t.name == "docs_next_sentence")
        examples = load_examples(task.path, task.layout)
    requests = [r for ex in examples for r in example_requests(tok, ex, task.delimiter)]
    scored = sum(len(r.context) + len(r.continuation) - 1 for r in requests)  # tokens the model reads
    config = dataclasses.replace(presets.llama_nano, vocab_size=tok.vocab_size, max_seq_len=SEQ_LEN)
    model = init(config, key=jax.random.key(0))
    score_s = _best(
        lambda: score_requests(model, requests, batch_size=args.batch, micro_batch=args.micro_batch),
        args.repeats,
    )
    stream = np.concatenate([np.asarray(tok.encode(t), np.int32) for t in texts[:200]])
    rows = len(stream) // SEQ_LEN // args.batch * args.batch
    batches = stream[: rows * SEQ_LEN].reshape(-1, args.batch, SEQ_LEN)
    full_tokens = min(scored, batches.size)
    need = -(-full_tokens // (args.batch * SEQ_LEN))
    forward_s = _best(lambda: [float(_forward(model, jnp.asarray(b))) for b in batches[:need]], args.repeats)
    forward_rate = need * args.batch * SEQ_LEN / forward_s
    score_rate = scored / score_s
    print(
        f"{len(examples)} documents, {len(requests)} requests, {scored:,} tokens read; llama_nano, vocab 2048"
    )
    print(
        f"  task scoring   {score_rate:12,.0f} tokens/s   (batch {args.batch}, micro-batch {args.micro_batch})"
    )
    print(f"  full forward   {forward_rate:12,.0f} tokens/s   ([{args.batch}, {SEQ_LEN}] rows, no padding)")
    print(f"  ratio          {score_rate / forward_rate:12.2f}     (goal >= 0.5)")


if __name__ == "__main__":
    main()
