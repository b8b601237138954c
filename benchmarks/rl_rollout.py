"""Rollout throughput on CPU: `schooner.model.sample` (the sampler under RL rollouts) against Hugging Face
`generate` with its KV cache, on the same exported model, prompts and lengths.

A randomly initialised `llama_nano`-shaped model is exported with `export_hf` (float32); `--prompts` prompts
of random lengths (8 to `--prompt-max` tokens) are each sampled `--group` times for exactly `--new` tokens
(no stop ids, no EOS in the exported config, so every row makes `--new` tokens in both), temperature 1 and
top-p 0.95, as a GRPO rollout does. Schooner: `sample(model, prompts, SamplingConfig(n=group, ...))`, which
also returns each token's log-prob. HF: `model.generate(left-padded prompts, attention_mask, do_sample=True,
top_p=0.95, top_k=0, num_return_sequences=group, max_new_tokens=new)` under `torch.inference_mode()`, which
returns tokens only (asking it for scores as well would slow it), timed with 1 torch thread and with torch's
default (the faster counts: on a loaded machine one thread can win). Each side runs once to warm up (JAX
compiles), then the best of `--repeats` timed runs counts. As a check that the two run the same model, both
also decode greedily and the share of equal tokens is printed.

HF runs in another Python that has torch and transformers (they are not Schooner dependencies):

    python3 -m venv /tmp/hfbench && /tmp/hfbench/bin/pip install torch transformers
    uv run python benchmarks/rl_rollout.py --hf-python /tmp/hfbench/bin/python [--prompts 8 --group 4 --new 128]
        [--vocab 32000] [--hf-threads 1]

Prints new tokens/s of each and the ratio (goal: Schooner >= HF).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TEMPERATURE, TOP_P = 1.0, 0.95


def _best(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up (compiles)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def hf_worker(folder: str) -> None:
    """Runs in the HF Python: times `generate` on the exported model and prints a JSON line."""
    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(folder, "spec.json")) as f:
        spec = json.load(f)
    prompts, group, new, repeats = spec["prompts"], spec["group"], spec["new"], spec["repeats"]
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate wants for a decoder-only batch
        ids[i, width - len(p) :] = torch.tensor(p)
        attention[i, width - len(p) :] = 1
    common = dict(attention_mask=attention, max_new_tokens=new, pad_token_id=0, eos_token_id=None)

    def sampled():
        with torch.inference_mode():
            torch.manual_seed(0)
            return model.generate(
                ids, do_sample=True, temperature=TEMPERATURE, top_p=TOP_P, top_k=0,
                num_return_sequences=group, **common,
            )  # fmt: skip

    timings = {}
    # with other load on the cores, 1 thread can win
    for threads in spec["threads"] or sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        timings[threads], out = _best(sampled, repeats)
    threads = min(timings, key=timings.get)
    torch.set_num_threads(threads)
    seconds = timings[threads]
    assert out.shape == (len(prompts) * group, width + new), out.shape
    with torch.inference_mode():
        greedy = model.generate(ids, do_sample=False, **common)[:, width:].tolist()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "greedy": greedy,
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "threads": threads,
                "timings": timings,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-python", help="a Python with torch and transformers (see the module docstring)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (GRPO's G)")
    parser.add_argument("--new", type=int, default=128, help="new tokens per sample")
    parser.add_argument("--prompt-max", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=512, help="vocabulary size (llama_nano's is 512)")
    parser.add_argument(
        "--hf-threads", default="", help="torch thread counts to try, e.g. '1' (default: 1 and torch's)"
    )
    parser.add_argument("--hf-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_worker:
        hf_worker(args.hf_worker)
        return
    if not args.hf_python:
        parser.error(
            "--hf-python is required: a Python with torch and transformers (see the module docstring)"
        )

    import dataclasses

    import jax
    import numpy as np

    from schooner.model import SamplingConfig, export_hf, init, presets, sample

    config = dataclasses.replace(
        presets.llama_nano,
        vocab_size=args.vocab,
        max_seq_len=args.prompt_max + args.new,
        compute_dtype="float32",
    )
    model = init(config, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = [
        rng.integers(1, config.vocab_size, rng.integers(8, args.prompt_max + 1)).tolist()
        for _ in range(args.prompts)
    ]
    sampling = SamplingConfig(temperature=TEMPERATURE, top_p=TOP_P, n=args.group, max_new_tokens=args.new)
    seconds, out = _best(lambda: sample(model, prompts, sampling, key=jax.random.key(0)), args.repeats)
    assert out.mask.all(), "every row should make --new tokens"
    greedy = sample(
        model, prompts, dataclasses.replace(sampling, temperature=0.0, n=1), key=jax.random.key(0)
    )

    with tempfile.TemporaryDirectory() as folder:
        export_hf(model, config, folder)
        spec = {"prompts": prompts, "group": args.group, "new": args.new, "repeats": args.repeats}
        spec["threads"] = [int(t) for t in args.hf_threads.split(",") if t]
        with open(os.path.join(folder, "spec.json"), "w") as f:
            json.dump(spec, f)
        done = subprocess.run(
            [args.hf_python, os.path.abspath(__file__), "--hf-worker", folder],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            sys.exit(f"the HF worker failed:\n{done.stderr[-3000:]}")
        hf = json.loads(done.stdout.strip().splitlines()[-1])

    tokens = len(prompts) * args.group * args.new
    ours_tps, hf_tps = tokens / seconds, tokens / hf["seconds"]
    same = np.mean(
        [a == b for x, y in zip(greedy.completions(), hf["greedy"], strict=True) for a, b in zip(x, y)]
    )
    print(
        f"model llama_nano ({config.num_layers} layers, width {config.hidden_dim}, vocab {config.vocab_size}), "
        f"{args.prompts} prompts of 8-{args.prompt_max} tokens x {args.group} samples x {args.new} new tokens, "
        f"temperature {TEMPERATURE}, top-p {TOP_P}; jax {jax.__version__}, torch {hf['torch']}, "
        f"transformers {hf['transformers']}, {os.cpu_count()} CPUs"
    )
    print(f"  schooner.model.sample   {ours_tps:10.1f} new tokens/s  ({seconds:.2f} s, with log-probs)")
    each = ", ".join(f"{t} thread(s) {s:.2f} s" for t, s in hf["timings"].items())
    print(f"  HF generate (KV cache)  {hf_tps:10.1f} new tokens/s  (best of: {each})")
    print(
        f"  ratio                   {ours_tps / hf_tps:10.2f}x  (goal >= 1)   greedy tokens equal: {same:.1%}"
    )


if __name__ == "__main__":
    main()
