"""Training throughput of schooner.train on this machine, against matmul ceilings measured in the same run.

Model: a tiny Llama (vocab 32000, hidden 256, intermediate 1024, 4 layers, 4 heads), seq 512, batch 8,
and a MoE of equal active parameters (8 experts of width 512, top-2). Each configuration runs in its own
process through the real `schooner.train.train` path (token cache, loader, jitted donated step, async
checkpoints), `--steps` timed steps after `--warmup` steps. Reported per configuration: tokens/s, step time,
compile time, peak RSS, time from process start to the first finished step, and MFU against the jitted
2048x2048 matmul ceiling (fp32; bf16 inputs with fp32 accumulation for bf16 compute).

Targets (2-core CPU): fp32 >= 0.55 of the fp32 ceiling; bf16 compute >= 0.4 of the bf16 ceiling; first step
done within 10 s of process start on a repeat run (persistent compilation cache); checkpointing every 10
steps costs < 5% of throughput.

Each child starts the way `train_lm`'s jobs start (`schooner.train.malloc_env()`: glibc huge
pages for large allocations); `--configs dense-fp32-4k-pages,dense-bf16-4k-pages` adds the same runs with
glibc's defaults and prints the ratio.

`--configs gpu-1b` (on a GPU machine) trains a Llama-3.2-1B-shaped model, bf16 compute, seq 2048, batch 16,
and reports MFU against the GPU's datasheet bf16 peak (goal: 0.5).

`--configs h200` (on one NVIDIA H200; benchmarks/gpu_check.py runs it) trains the per-GPU presets
(`GPU_SETTINGS`: 134M, 374M, the Llama-3.2-1B shape and the 8x top-2 MoE at seq 2048), each in its own
process, reporting as `--configs tpu` does. `--size-gpu` (any machine) re-derives their batch and remat
from schooner.train.estimate_step_memory and the H200's memory (`size_gpu`).

Issue 15 before/after (2026-12-01, shared 2-core CPU at load average 15-24 from other jobs, so each step's
process CPU time is compared; wall time only for reference): the `--child dense-fp32` run (this file's
`child()`, steps 1+3, GLIBC_TUNABLES=glibc.malloc.hugetlb=1, SCHOONER_COMPILATION_CACHE=off; the CPU time of
each step recorded by a wrapper around `child()` that patches
`JsonlTracker.log` to note `time.process_time()`) of the code before the issue (86a9ed2) and after (the working tree
of 19:15 UTC: HEAD b356138 with schooner.model's typing-only edits, committed as d547710), runs old (alone), then new and old side by side. CPU-s per
timed step: old 6.57, 6.79, 5.76 and 5.47, 5.41, 5.17; new 7.62, 5.16, 5.54. Medians old 5.62, new 5.54:
new/old tokens per CPU-second 1.01 (per-run 0.88 against the old run beside it, 1.04 against the first);
wall tokens/s new 52.9, old 43.6 and 56.6. Peak RSS old 2695/2708 MiB, new 2721 MiB. The same final loss
(10.416126) both ways. Within this machine's noise (about +-15%) the figures did not fall; a quiet machine is
needed for a tighter bound. bf16, MoE and checkpoint configs were not rerun.

Usage:
    uv run python benchmarks/train_throughput.py                 # everything
    uv run python benchmarks/train_throughput.py --steps 10 --configs dense-fp32,dense-ckpt10
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

CONFIGS = ("dense-fp32", "dense-bf16", "moe-fp32", "dense-ckpt10", "first-step-cold", "first-step-warm")
GPU_CONFIGS = ("gpu-1b",)  # not in the default list: `--configs gpu-1b` on a machine with a GPU
# `--configs h200` (on one NVIDIA H200; what benchmarks/gpu_check.py runs): each in its own process.
H200_CONFIGS = ("h200-1b", "h200-moe", "h200-134m", "h200-374m")
# `--configs tpu` (on a TPU machine): these, each in its own process (one program holds the chip at a time).
TPU_CONFIGS = ("tpu-134m", "tpu-374m", "tpu-moe", "tpu-1b")
EXTRA_CONFIGS = ("dense-fp32-4k-pages", "dense-bf16-4k-pages")  # on request: glibc malloc defaults
VOCAB, SEQ, BATCH = 32000, 512, 8
GPU_SEQ, GPU_BATCH = 2048, 16
SMOKE = os.environ.get("SCHOONER_TPU_BENCH_SMOKE") == "1"  # the TPU configs shrunk to run on a CPU (a check)
if SMOKE:
    GPU_SEQ = 128


def tpu_models() -> dict:
    """The TPU benchmark's models at seq 2048, vocab 32000, bf16 compute, fp32 parameters and Adam state:
    the 134M and 374M dense Llamas, a MoE of the 134M's width with 8 experts of half its MLP width, top-2
    (equal active parameters, 304M in all), and a 0.88B dense model (the largest of this shape whose fp32
    parameters, gradients and Adam moments, 16 bytes a parameter, leave room for activations on a 15.7 GiB
    v5e chip: 14 layers, 0.95B, needs 15.78 GiB at batch 1)."""
    from schooner.model import LlamaConfig, MoEConfig

    common = dict(vocab_size=VOCAB, max_seq_len=GPU_SEQ, compute_dtype="bfloat16")
    d134 = dict(hidden_dim=768, num_layers=12, num_heads=12, num_kv_heads=12)
    if SMOKE:
        tiny = LlamaConfig(
            hidden_dim=128, intermediate_dim=256, num_layers=2, num_heads=4, num_kv_heads=2, **common
        )
        moe = MoEConfig(
            hidden_dim=128, intermediate_dim=128, num_layers=2, num_heads=4, num_kv_heads=2, **common
        )
        return {"tpu-134m": tiny, "tpu-374m": tiny, "tpu-moe": moe, "tpu-1b": tiny}
    return {
        "tpu-134m": LlamaConfig(intermediate_dim=2048, **d134, **common),
        "tpu-374m": LlamaConfig(
            hidden_dim=1024, intermediate_dim=2816, num_layers=24, num_heads=16, num_kv_heads=16, **common
        ),
        # The re-solve of quantile balancing on 16k of the batch's 32k tokens (the whole batch: 11% fewer tokens/s).
        "tpu-moe": MoEConfig(
            intermediate_dim=1024,
            num_experts=8,
            num_experts_per_token=2,
            router_bias_resolve_tokens=16384,
            **d134,
            **common,
        ),
        "tpu-1b": LlamaConfig(
            hidden_dim=2048,
            intermediate_dim=8192,
            num_layers=13,
            num_heads=16,
            num_kv_heads=8,
            tie_embeddings=True,
            **common,
        ),
    }


def gpu_models() -> dict:
    """The per-GPU benchmark's models at seq 2048, bf16 compute, fp32 parameters and Adam state: the TPU
    benchmark's 134M, 374M and 8x top-2 MoE (vocab 32000), and the Llama-3.2-1B shape (1.24B parameters,
    vocab 128256) for ~1B dense, which a GPU's memory holds where a v5e chip's does not."""
    from schooner.model import presets

    tpu = tpu_models()
    one_b = dataclasses.replace(presets.llama_1b, max_seq_len=GPU_SEQ, compute_dtype="bfloat16")
    if SMOKE:
        one_b = tpu["tpu-1b"]
    return {
        "h200-134m": tpu["tpu-134m"],
        "h200-374m": tpu["tpu-374m"],
        "h200-moe": tpu["tpu-moe"],
        "h200-1b": one_b,
    }


# One NVIDIA H200 (141 GB, about 139 GiB usable): XLA's GPU client takes 0.75 of it by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION), the budget each preset's step must fit.
H200_BYTES = 139 * 2**30
GPU_BUDGET = int(0.75 * H200_BYTES)
# Per H200 config: (batch, microbatches, remat policy, scan the layers), sized by `--size-gpu` (`size_gpu`)
# with schooner.train.estimate_step_memory: the real train step compiled on a CPU on shapes alone, the model
# on the GPU's paths, memory taken as bilinear in (layers, batch) from 1-2 layers at batch 1-2, then
# `choose_gpu_settings` within GPU_BUDGET. GPU_ESTIMATES: (fixed, per 2048-token row) GiB as `--size-gpu`
# printed on 2026-12-06. The CPU compile's figure is an upper bound (the 134M at batch 16: 77 GiB here, 11.8
# GiB compiled on a v5e) and the same for every remat policy, so remat stays "none": train() checks the real
# figure on the GPU before the first step and the child halves the batch if it does not fit.
GPU_SETTINGS = {
    "h200-134m": (16, 1, "none", False),
    "h200-374m": (16, 4, "none", False),
    "h200-moe": (16, 2, "none", False),
    "h200-1b": (16, 8, "none", False),
}
GPU_ESTIMATES: dict[str, tuple[float, float]] = {
    "h200-134m": (2.48, 4.661),
    "h200-374m": (-0.05, 18.822),
    "h200-moe": (5.55, 7.469),
    "h200-1b": (21.99, 18.614),
}

# Per TPU config: (batch, microbatches, remat policy, scan the layers): the documented settings
# (docs/accelerators.md). Unrolled layers keep each layer's saved activations in buffers of their own; a scan
# copies them into and out of stacked buffers (14% of the 134M's step on a v5e).
TPU_SETTINGS = {
    "tpu-134m": (16, 1, "none", False),
    "tpu-374m": (16, 4, "none", False),
    "tpu-moe": (16, 4, "none", False),
    "tpu-1b": (2, 1, "save_carries", False),
}
SETTINGS = TPU_SETTINGS | GPU_SETTINGS
ACCELERATED = ("tpu", "h200")  # configs with settings, sized for a chip: settings, HBM and ceiling reported


def model_config(kind: str):
    from schooner.model import LlamaConfig, MoEConfig, presets

    if kind.startswith("tpu-"):
        _, _, remat, scan = TPU_SETTINGS[kind]
        model = tpu_models()[kind]
        return dataclasses.replace(model, gradient_checkpointing=remat, scan_layers=scan)
    if kind.startswith("h200-"):
        _, _, remat, scan = GPU_SETTINGS[kind]
        return dataclasses.replace(gpu_models()[kind], gradient_checkpointing=remat, scan_layers=scan)
    if kind == "gpu-1b":
        # Llama-3.2-1B shape, bf16 compute, fp32 parameters and optimizer state.
        return dataclasses.replace(presets.llama_1b, max_seq_len=GPU_SEQ, compute_dtype="bfloat16")
    common = dict(
        vocab_size=VOCAB,
        hidden_dim=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=4,
        max_seq_len=SEQ,
        tie_embeddings=False,
        compute_dtype="float32",
    )
    if kind.startswith("moe"):
        # 8 experts of width 512, 2 per token: the same active MLP parameters as one width-1024 MLP.
        return MoEConfig(intermediate_dim=512, num_experts=8, num_experts_per_token=2, **common)
    return LlamaConfig(intermediate_dim=1024, **common)


def make_data(
    folder: str, *, vocab_size: int = VOCAB, lengths: tuple[int, int] = (200, 3000), docs: int = 400
) -> str:
    """A real WordLevel tokenizer with `vocab_size` ids and a token cache of `docs` random documents of
    `lengths` tokens (also benchmarks/train_step_host.py's data)."""
    import numpy as np
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from schooner.tokenize import load_tokenizer, write_cache

    vocab = {f"w{i}": i for i in range(vocab_size - 1)}
    vocab["<eos>"] = vocab_size - 1
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="w0"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    os.makedirs(folder, exist_ok=True)
    hf.save(os.path.join(folder, "tokenizer.json"))
    tok = load_tokenizer(os.path.join(folder, "tokenizer.json"), eos_token="<eos>")
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, vocab_size - 1, size=int(n)) for n in rng.integers(*lengths, size=docs)]
    write_cache(os.path.join(folder, "train"), ids, tok)
    return folder


def child(kind: str, data: str, out: str, steps: int, warmup: int, result_path: str) -> None:
    """One configuration, in its own process; writes a JSON result."""
    import psutil

    start = psutil.Process().create_time()  # the process start, before any import
    from schooner.model import flops_per_token
    from schooner.train import (
        AdamConfig,
        CheckpointConfig,
        TrackerConfig,
        TrainerConfig,
        read_metrics,
        train,
    )

    total = warmup + steps
    seq, batch = (GPU_SEQ, GPU_BATCH) if kind.startswith(("gpu", *ACCELERATED)) else (SEQ, BATCH)
    microbatches = SETTINGS[kind][1] if kind.startswith(ACCELERATED) else 1
    if kind.startswith(ACCELERATED):
        batch = SETTINGS[kind][0]
    cfg = TrainerConfig(
        model=model_config(kind),
        datasets=[(f"{data}/train", 1.0)],
        seq_len=seq,
        validation={},
        fit_vocab=False,
        output_path=out,
        batch_size=batch,
        microbatches=microbatches,
        num_train_steps=total,
        optimizer=AdamConfig(learning_rate=1e-3, warmup=1),
        compute_dtype="bfloat16" if "bf16" in kind else None,
        checkpoint=CheckpointConfig(every=10, keep_last=2, save_final=False)
        if "ckpt" in kind
        else CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False, log_every=10),
        name=kind,
    )
    if kind.startswith(ACCELERATED):
        from schooner.train import StepMemoryError

        while True:  # the largest batch of the settings' that fits (halved until it does)
            try:
                summary = train(cfg)
                break
            except StepMemoryError as e:
                if batch // 2 < microbatches:
                    raise
                print(f"{kind}: batch {batch} does not fit ({e}); trying {batch // 2}", flush=True)
                batch //= 2
                del e
                gc.collect()  # the failed attempt's arrays, before the next allocates its own
                shutil.rmtree(out, ignore_errors=True)
                cfg = dataclasses.replace(cfg, batch_size=batch)
    else:
        summary = train(cfg)
    rows = [r for r in read_metrics(f"{out}/metrics.jsonl") if "train/loss" in r]
    times = {r["step"]: r["time"] for r in rows}
    # Metrics of step s are read back right after step s+1 is dispatched, so consecutive timestamps are
    # one step apart in steady state.
    timed = (times[total] - times[warmup]) / steps if steps > 0 else float("nan")
    tokens = batch * seq
    result = {
        "peak_flops": summary["peak_flops"],
        "peak_source": summary["peak_source"],
        "kind": kind,
        "step_seconds": timed,
        "tokens_per_second": tokens / timed,
        "compile_seconds": summary.get("compile_seconds"),
        "seconds_to_first_step": summary["first_step_time"] - start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "flops_per_token": flops_per_token(cfg.model, seq),
        "checkpoint_write_seconds": summary.get("checkpoint_write_seconds"),
        "final_loss": summary.get("final_loss"),
        # Interval s -> s+1 for each timed step, to see what a checkpoint costs within this one run.
        "intervals": {s: times[s + 1] - times[s] for s in range(warmup, total)},
        "checkpoint_every": cfg.checkpoint.every,
    }
    if kind.startswith(ACCELERATED):
        import jax

        from schooner.train import matmul_ceiling

        stats = jax.devices()[0].memory_stats() or {}
        result["peak_hbm_gib"] = stats.get("peak_bytes_in_use", 0) / 2**30
        result["hbm_limit_gib"] = stats.get("bytes_limit", 0) / 2**30
        result["matmul_ceiling"] = matmul_ceiling(8192, "bfloat16", repeats=5)  # this chip, this run
        names = ("batch", "microbatches", "remat", "scan_layers")
        result["settings"] = dict(zip(names, SETTINGS[kind], strict=True)) | {"batch": batch}
        result["parameters"] = summary["parameters"]
        result["step_memory_gib"] = summary.get("step_memory_bytes", 0) / 2**30
    with open(result_path, "w") as f:
        json.dump(result, f)


def run_child(kind: str, data: str, steps: int, warmup: int, work: str, env: dict) -> dict:
    out = os.path.join(work, f"run-{kind}")
    shutil.rmtree(out, ignore_errors=True)
    res = os.path.join(work, f"{kind}.json")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--data",
        data,
        "--out",
        out,
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--result",
        res,
    ]
    subprocess.run(cmd, check=True, env=env)
    with open(res) as f:
        return json.load(f)


def _run_kind(kind: str, data: str, args: argparse.Namespace, work: str, base_env: dict, first: bool) -> dict:
    env = dict(base_env)
    if kind.endswith("-4k-pages"):  # the same run with glibc's default malloc settings, for the ratio
        env.pop("GLIBC_TUNABLES", None)
        kind = kind.removesuffix("-4k-pages")
        env["SCHOONER_COMPILATION_CACHE"] = "off"
        return {**run_child(kind, data, args.steps, args.warmup, work, env), "kind": kind + "-4k-pages"}
    if kind.startswith("first-step"):
        # Cold: an empty persistent compilation cache; warm: the same cache again (a repeat run).
        cache = os.path.join(work, "jax-cache")
        env["SCHOONER_COMPILATION_CACHE"] = cache
        if kind.endswith("cold"):
            shutil.rmtree(cache, ignore_errors=True)
        elif not os.path.exists(cache):
            run_child("dense-fp32", data, 0, 1, work, env)  # fill the cache first
        r = run_child("dense-fp32", data, 0, 1, work, env)
        r["kind"] = kind
        return r
    env["SCHOONER_COMPILATION_CACHE"] = "off"
    return run_child(kind, data, args.steps, args.warmup, work, env)


def _line(kind: str, r: dict, ceiling: float) -> str:
    line = (
        f"{kind:16s} first step {r['seconds_to_first_step']:6.1f}s after process start | compile "
        f"{(r['compile_seconds'] or 0):5.1f}s | peak RSS {r['peak_rss_mib']:7.0f} MiB"
    )
    if kind.startswith("first-step"):
        return line
    which = ("bf16" if "bf16" in kind else "fp32") + " ceiling"
    if kind.startswith(ACCELERATED):
        fpt_tps = r["flops_per_token"] * r["tokens_per_second"]
        return line.replace("peak RSS", "host peak RSS") + (
            f" | {r['tokens_per_second']:8.0f} tok/s | step {r['step_seconds']:6.3f}s | MFU "
            f"{fpt_tps / r['peak_flops']:.3f} of the datasheet peak ({r['peak_flops'] / 1e12:.0f} TFLOP/s), "
            f"{fpt_tps / r['matmul_ceiling']:.3f} of the 8192^3 bf16 matmul ceiling "
            f"({r['matmul_ceiling'] / 1e12:.0f} TFLOP/s) | compiled step {r['step_memory_gib']:.2f} GiB, peak HBM "
            f"in use {r['peak_hbm_gib']:.2f} of {r['hbm_limit_gib']:.2f} GiB | {r['settings']} | {r['parameters']['total'] / 1e6:.0f}M parameters"
        )
    if kind.startswith("gpu"):
        ceiling, which = r["peak_flops"], r["peak_source"]  # the accelerator's datasheet bf16 peak
    mfu = r["flops_per_token"] * r["tokens_per_second"] / ceiling
    return line + (
        f" | {r['tokens_per_second']:8.0f} tok/s | step {r['step_seconds']:6.3f}s | MFU {mfu:.3f} of the {which}"
    )


def preset_config(
    kind: str, batch: int | None = None, remat: str | None = None, *, as_gpu: bool = False
) -> object:
    """The TrainerConfig `child` runs for accelerator config `kind` (data not read), at `batch` and with the
    remat policy `remat` when given: what `size_gpu` and the tests hand to `estimate_step_memory`.

    `as_gpu`: the model on the paths a GPU resolves `kernels="auto"` to (the XLA kernel path, its loss
    chunks, cuDNN attention), so that a CPU compile sizes the GPU's step: on a CPU the cuDNN attention
    falls back to the blocked attention with each block rematerialised (the GPU's own fallback), which like
    cuDNN keeps no [heads, T, T] scores for the backward; the CPU's own path keeps the blocks' softmax
    (5.4 GiB a 2048-token row for the 134M, nearly all of its step)."""
    from schooner.train import AdamConfig, TrainerConfig

    b, micro, policy, _ = SETTINGS[kind]
    model = model_config(kind)
    if remat is not None:
        model = dataclasses.replace(model, gradient_checkpointing=remat)
    if as_gpu:
        model = dataclasses.replace(model, kernels="xla", attention_implementation="cudnn")
    return TrainerConfig(
        model=model,
        datasets=[("<not read>/train", 1.0)],
        seq_len=GPU_SEQ,
        validation={},
        fit_vocab=False,
        output_path="<estimate>",
        batch_size=batch or b,
        microbatches=micro,
        num_train_steps=10,
        optimizer=AdamConfig(learning_rate=1e-3, warmup=1),
    )


def choose_gpu_settings(fixed: float, per_row: float, budget: float = GPU_BUDGET, cap: int = 64) -> tuple:
    """(batch, microbatches) for a step of `fixed + per_row x rows` bytes (rows: the batch over the
    microbatches): the largest multiple of 8 from 16 to `cap` that fits whole, else batch 16 in the fewest
    microbatches (2, 4, 8, 16) that fit with a row to spare: a microbatched step also holds a float32
    gradient accumulator, and the 1B's whole compile at 4 rows a microbatch came to 107.2 GiB where the
    fit said 96.4. Batch 16 x 2048 is the TPU presets' and gpu-1b's step."""
    fits = int((budget - fixed) // max(per_row, 1))
    if fits >= 16:
        return min(cap, fits // 8 * 8), 1
    for micro in (2, 4, 8, 16):
        if 16 // micro <= fits - 1:
            return 16, micro
    raise ValueError(
        f"one 2048-token row needs {per_row / 2**30:.1f} GiB: it does not fit {budget / 2**30:.0f} GiB"
    )


def size_gpu(kinds: list[str], budget: int = GPU_BUDGET) -> dict:
    """For each H200 config: (batch, microbatches) by `choose_gpu_settings` from the step memory of
    `estimate_step_memory` (the real step compiled on this machine's backend, shapes only, the model on the
    GPU's paths: `preset_config(as_gpu=True)`) of the model cut to 1 and 2 layers at batch 1 and 2, taken
    as bilinear in (layers, batch) and read at the model's layers (a full-size compile of a 1B model takes
    many minutes on a small CPU machine; tests/test_train_throughput_presets.py's slow test compiles the
    presets whole). Remat "none": on a CPU the estimate is the same for every policy (the 374M: 18.82 GiB a
    row under "none", "dots" and "save_carries" alike), so it cannot choose one; the GPU session can."""
    from schooner.train import estimate_step_memory

    out = {}
    for kind in kinds:
        layers = model_config(kind).num_layers
        m = {}
        for n in (1, 2):
            for b in (1, 2):
                cfg = preset_config(kind, b, "none", as_gpu=True)
                cfg = dataclasses.replace(
                    cfg, microbatches=1, model=dataclasses.replace(cfg.model, num_layers=n)
                )
                m[n, b] = estimate_step_memory(cfg).total
        # m(n, b) = a + p n + r b + q n b
        q = m[2, 2] - m[2, 1] - m[1, 2] + m[1, 1]
        p = m[2, 1] - m[1, 1] - q
        r = m[1, 2] - m[1, 1] - q
        a = m[1, 1] - p - r - q
        fixed, per_row = a + p * layers, r + q * layers
        batch, micro = choose_gpu_settings(fixed, per_row, budget)
        out[kind] = {"batch": batch, "microbatches": micro, "remat": "none"}
        out[kind] |= {"fixed_gib": round(fixed / 2**30, 2), "per_row_gib": round(per_row / 2**30, 3)}
        out[kind]["estimate_gib"] = round((fixed + per_row * batch / micro) / 2**30, 2)
        print(json.dumps({"kind": kind, **out[kind], "budget_gib": budget / 2**30}), flush=True)
    return out


def run_tpu(kinds: list[str], args: argparse.Namespace) -> None:
    """The TPU or H200 configurations, each in its own process: this one never opens the chip (one program holds it
    at a time); each child measures its own matmul ceiling and peak HBM."""
    env = dict(os.environ)
    os.environ["JAX_PLATFORMS"] = "cpu"  # this process only writes the token cache
    print(f"{args.steps} timed steps after {args.warmup} warm-up steps per run, seq {GPU_SEQ}")
    work = tempfile.mkdtemp(prefix="schooner-bench-")
    data = make_data(os.path.join(work, "data"))
    env["SCHOONER_COMPILATION_CACHE"] = "off"
    for kind in kinds:
        try:
            r = run_child(kind, data, args.steps, args.warmup, work, env)
        except subprocess.CalledProcessError as e:
            print(f"{kind:16s} failed (exit {e.returncode}); its output is above", flush=True)
            continue
        print(f"{kind.split('-')[0]:5s} " + _line(kind, r, r["matmul_ceiling"]), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"kind": kind, **r}) + "\n")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--repeats", type=int, default=2, help="interleaved repetitions; the best of each is kept")
    p.add_argument("--child")
    p.add_argument("--data")
    p.add_argument("--out")
    p.add_argument("--result")
    p.add_argument("--json", help="append each TPU or H200 result as a JSON line to this file")
    p.add_argument(
        "--size-gpu",
        action="store_true",
        help="size the H200 presets with schooner.train.estimate_step_memory on this machine (minutes)",
    )
    args = p.parse_args()
    if args.child:
        child(args.child, args.data, args.out, args.steps, args.warmup, args.result)
        return

    kinds = [k for k in args.configs.split(",") if k]
    groups = {"tpu": TPU_CONFIGS, "h200": H200_CONFIGS}
    kinds = [x for k in kinds for x in groups.get(k, (k,))]
    known = CONFIGS + GPU_CONFIGS + TPU_CONFIGS + H200_CONFIGS + EXTRA_CONFIGS
    unknown = sorted(set(kinds) - set(known))
    if unknown:
        sys.exit(f"unknown configs {unknown}; choose from {known}, 'tpu' or 'h200'")
    if args.size_gpu:
        size_gpu([k for k in kinds if k in H200_CONFIGS] or list(H200_CONFIGS))
        return
    if any(k.startswith(ACCELERATED) for k in kinds):
        run_tpu(kinds, args)
        return
    import jax

    from schooner.train import malloc_env, matmul_ceiling

    print(f"devices: {jax.devices()}  cpus: {os.cpu_count()}  load average: {os.getloadavg()}")
    print(f"{args.steps} timed steps after {args.warmup} warm-up steps per run")
    work = tempfile.mkdtemp(prefix="schooner-bench-")
    data = make_data(os.path.join(work, "data"))
    # Children start the way train_lm's jobs do (glibc huge pages; see schooner.train.malloc_env).
    base_env = {**os.environ, **malloc_env()}
    print(f"children start with GLIBC_TUNABLES={base_env.get('GLIBC_TUNABLES', '')!r}")
    # Other processes share this machine: repeat the configurations interleaved (with fresh ceiling
    # measurements) and keep the best of each, the least disturbed figure.
    ceil32 = ceil16 = 0.0
    best: dict[str, dict] = {}
    for rep in range(args.repeats):
        ceil32 = max(ceil32, matmul_ceiling.__wrapped__(2048, "float32", repeats=5))
        ceil16 = max(ceil16, matmul_ceiling.__wrapped__(2048, "bfloat16", repeats=5))
        for kind in kinds:
            r = _run_kind(kind, data, args, work, base_env, first=rep == 0)
            key = "seconds_to_first_step" if kind.startswith("first-step") else "step_seconds"
            if kind not in best or r[key] < best[kind][key]:
                best[kind] = r
            print(
                f"[{rep + 1}/{args.repeats}] " + _line(kind, r, ceil16 if "bf16" in kind else ceil32),
                flush=True,
            )
    print(
        f"ceiling fp32 2048x2048 matmul:               {ceil32 / 1e9:8.2f} GFLOP/s (best of {args.repeats})"
    )
    print(
        f"ceiling bf16 in / fp32 acc 2048x2048 matmul: {ceil16 / 1e9:8.2f} GFLOP/s (best of {args.repeats})"
    )
    for kind, r in best.items():
        print("best  " + _line(kind, r, ceil16 if "bf16" in kind else ceil32))
    for dt in ("fp32", "bf16"):
        a, b = best.get(f"dense-{dt}"), best.get(f"dense-{dt}-4k-pages")
        if a and b:
            print(
                f"huge pages, dense {dt}: {a['tokens_per_second'] / b['tokens_per_second']:.2f}x the tokens/s of 4 KiB pages"
            )
    if "dense-ckpt10" in best:
        # Within the one checkpointing run: a checkpoint after step c (snapshot copy, drained pipeline, the
        # write in the background) lands in intervals c -> c+1 and c+1 -> c+2; the others are the baseline.
        r = best["dense-ckpt10"]
        iv = {int(k): v for k, v in r["intervals"].items()}
        hit = {c + d for c in iv if c % r["checkpoint_every"] == 0 for d in (0, 1)}
        clean = [v for s, v in iv.items() if s not in hit]
        if clean:
            extra = sum(iv.values()) / (len(iv) * sum(clean) / len(clean)) - 1
            print(
                f"checkpoint every 10 steps, within one run: +{100 * extra:.1f}% time over its own "
                f"checkpoint-free intervals ({len(iv) - len(clean)} of {len(iv)} intervals hold a checkpoint)"
            )
    if "dense-fp32" in best and "dense-ckpt10" in best:
        ratio = best["dense-ckpt10"]["tokens_per_second"] / best["dense-fp32"]["tokens_per_second"]
        print(
            f"checkpoint every 10 steps vs the dense-fp32 run: throughput ratio {ratio:.3f} "
            f"(overhead {100 * (1 - ratio):.1f}%, includes run-to-run noise; "
            f"writes {best['dense-ckpt10']['checkpoint_write_seconds']})"
        )
    print(f"load average at the end: {os.getloadavg()}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    t_main = time.perf_counter()
    main()
