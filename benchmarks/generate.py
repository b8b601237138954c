"""Generation speed: new tokens/s with the KV cache against recomputing the whole prefix, same model, same run.

Generates `--new` tokens (default 256) greedily after a 16-token prompt with `schooner.eval.generate_tokens`
(prefill, then one-token steps over a KV cache) and with `schooner.eval.greedy_tokens` (every token re-runs
the model over the fixed-shape context buffer), on the same randomly initialised `llama_nano`-shaped model
with `max_seq_len` = prompt + new tokens. Each is compiled by a warm-up run first, then timed as the best of
`--repeats`. Checks the two outputs are the same tokens. Prints tokens/s of each and the ratio (goal >= 10x at
256 new tokens). `--batch B` also times the cache with B prompts at once (tokens/s over all rows).

    uv run python benchmarks/generate.py [--new 256] [--batch 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from schooner.eval import generate_tokens, greedy_tokens
from schooner.model import init, presets

PROMPT = 16


def _best(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = dataclasses.replace(presets.llama_nano, max_seq_len=PROMPT + args.new)
    model = init(config, key=jax.random.key(0))
    prompt = np.random.default_rng(0).integers(1, config.vocab_size, PROMPT).tolist()
    cached_s, cached = _best(lambda: generate_tokens(model, [prompt], args.new)[0], args.repeats)
    full_s, full = _best(lambda: greedy_tokens(model, prompt, args.new), args.repeats)
    print(
        f"model llama_nano ({config.num_layers} layers, width {config.hidden_dim}), prompt {PROMPT}, new {args.new}"
    )
    print(f"  KV cache        {args.new / cached_s:10.1f} new tokens/s")
    print(f"  recompute       {args.new / full_s:10.1f} new tokens/s")
    print(f"  ratio           {full_s / cached_s:10.1f}x   (goal >= 10x)   same tokens: {cached == full}")
    if args.batch > 1:
        prompts = [prompt] * args.batch
        batch_s, _ = _best(lambda: generate_tokens(model, prompts, args.new), args.repeats)
        print(
            f"  KV cache x{args.batch:<3}   {args.batch * args.new / batch_s:10.1f} new tokens/s over the batch"
        )


if __name__ == "__main__":
    main()
