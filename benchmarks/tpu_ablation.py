"""The train step on one accelerator, variant by variant: memory, step time and MFU of attention, loss,
remat and MoE dispatch choices, side by side in one process.

Each variant builds the real train step (`schooner.train.make_train_step`, AdamW with fp32 moments,
jitted with the state donated, the preflight `CompiledStep`), compiles it ahead of time, prints what XLA
says it needs (`compiled.memory_analysis()`) and, when it fits, times `--steps` steps on random tokens
with document boundaries (segment ids), after `--warmup` steps. MFU is against the datasheet bf16 peak and
against a bf16 matmul ceiling measured at the start of the same run. `benchmarks/train_throughput.py
--configs tpu` measures the chosen settings through the whole `train()` path.

Usage (on a TPU machine):
    python benchmarks/tpu_ablation.py --variants d134-splash-none,d134-xla-carries --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from typing import Any

SEQ = 2048


def model_configs() -> dict[str, Any]:
    """`train_throughput.py`'s TPU models (d134, d374, m304, d880), the 0.95B dense one of 14 layers (d950) and two tiny
    models for a CPU smoke run."""
    from train_throughput import tpu_models

    from schooner.model import LlamaConfig, MoEConfig

    tpu = tpu_models()
    tiny = dict(
        vocab_size=512,
        hidden_dim=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=SEQ,
        compute_dtype="float32",
    )
    return {
        "d134": tpu["tpu-134m"],
        "d374": tpu["tpu-374m"],
        "m304": tpu["tpu-moe"],
        "d880": tpu["tpu-1b"],
        "d950": dataclasses.replace(tpu["tpu-1b"], num_layers=14),
        "tiny": LlamaConfig(intermediate_dim=256, **tiny),
        "tinymoe": MoEConfig(intermediate_dim=128, num_experts=4, **tiny),
    }


def parse_variant(name: str) -> dict[str, Any]:
    """`model-attention-remat[-bB][-mbK][-opt...]`, e.g. `d134-splash-none-b16`, `m304-splash-none-mb4-unroll-megablox`.

    attention: splash | xla (jax.nn.dot_product_attention) | blocked; remat: none | dots | carries | full;
    options: bN batch, mbK microbatches, megablox (MoE: the Pallas gmm kernel instead of ragged_dot), nores
    (MoE: no re-solve), rtN (MoE: the re-solve reads at most N tokens; rtall: the whole batch), aux (MoE: aux loss instead of quantile), lcN (loss_chunk_tokens N), unroll (scan_layers=False),
    onlymem (compile only).
    """
    parts = name.split("-")
    spec: dict[str, Any] = {
        "model": parts[0],
        "attention": parts[1],
        "remat": parts[2],
        "batch": 16,
        "microbatches": 1,
        "options": set(),
    }
    for p in parts[3:]:
        if p.startswith("mb"):
            spec["microbatches"] = int(p[2:])
        elif p.startswith("b") and p[1:].isdigit():
            spec["batch"] = int(p[1:])
        elif p.startswith("rt"):
            spec["resolve_tokens"] = None if p == "rtall" else int(p[2:])
        elif p.startswith("lc"):
            spec["loss_chunk"] = int(p[2:])
        else:
            spec["options"].add(p)
    return spec


def build(spec: dict[str, Any]) -> Any:
    from schooner.model import MoEConfig

    cfg = model_configs()[spec["model"]]
    remat = {"carries": "save_carries"}.get(spec["remat"], spec["remat"])
    kernels = "tpu" if spec["attention"] == "splash" else "xla"
    attn = {"splash": "splash", "xla": "xla", "blocked": "blocked"}[spec["attention"]]
    cfg = dataclasses.replace(
        cfg,
        gradient_checkpointing=remat,
        attention_implementation=attn,
        kernels=kernels,
        loss_chunk_tokens=spec.get("loss_chunk", 0),
    )
    if "unroll" in spec["options"]:
        cfg = dataclasses.replace(cfg, scan_layers=False)
    if isinstance(cfg, MoEConfig):
        if "nores" in spec["options"]:
            cfg = dataclasses.replace(cfg, router_bias_resolve=False)
        if "aux" in spec["options"]:
            cfg = dataclasses.replace(cfg, load_balancing="aux_loss")
        if "megablox" in spec["options"]:
            cfg = dataclasses.replace(cfg, grouped_matmul="megablox")
        if "resolve_tokens" in spec:
            cfg = dataclasses.replace(cfg, router_bias_resolve_tokens=spec["resolve_tokens"])
    return cfg


def batches(batch: int, seq: int, vocab: int, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Random tokens in documents of random lengths (segment ids restart per row), on the device."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(0, vocab, size=(batch, seq), dtype=np.int32)
        seg = np.zeros((batch, seq), np.int32)
        for r in range(batch):
            cuts = np.sort(rng.choice(np.arange(1, seq), size=rng.integers(1, 6), replace=False))
            seg[r] = np.searchsorted(cuts, np.arange(seq), side="right")
        out.append(jax.device_put({"tokens": tokens, "segment_ids": seg}))
    return out


def run_variant(
    name: str,
    steps: int,
    warmup: int,
    ceiling: float,
    profile: str | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import equinox as eqx
    import jax

    from schooner.model import flops_per_token, init, num_parameters
    from schooner.train import (
        AdamConfig,
        CompiledStep,
        StepMemoryError,
        datasheet_peak,
        init_state,
        make_train_step,
    )

    spec = spec or parse_variant(name)
    cfg = build(spec)
    b, mb = spec["batch"], spec["microbatches"]
    result: dict[str, Any] = {
        "variant": name,
        "parameters": num_parameters(cfg),
        "batch": b,
        "seq": SEQ,
        "microbatches": mb,
    }
    tx = AdamConfig(learning_rate=3e-4, warmup=2).build(
        eqx.filter_eval_shape(init, cfg, key=jax.random.PRNGKey(0)), 1000
    )
    model = jax.jit(lambda k: init(cfg, key=k))(jax.random.PRNGKey(0))  # two programs, as train() does
    state = jax.jit(lambda m, k: init_state(m, tx, k), donate_argnums=(0,))(model, jax.random.PRNGKey(0))
    step = make_train_step(tx, z_loss_weight=0.0, microbatches=mb, lr_schedule=lambda s: 3e-4)
    hint = f"a smaller batch (now {b}) or more microbatches (now {mb})"  # what this ablation varies
    fn = CompiledStep(jax.jit(step, donate_argnums=(0,)), hint, log=print)
    data = batches(b, SEQ, cfg.vocab_size, 2)
    t0 = time.perf_counter()
    try:
        if "onlymem" in spec["options"]:
            import os

            os.environ["SCHOONER_MEMORY_CHECK"] = "0"
        state, metrics = fn(state, data[0])
    except StepMemoryError as e:
        result.update(status="does not fit", error=str(e)[:600], compile_seconds=time.perf_counter() - t0)
        mem = next(iter(fn.memory.values()), None)
        if mem is not None:
            result["memory_gib"] = mem.total / 2**30
        return result
    finally:
        import os

        os.environ.pop("SCHOONER_MEMORY_CHECK", None)
    jax.block_until_ready(metrics)
    result["compile_seconds"] = time.perf_counter() - t0
    mem = next(iter(fn.memory.values()))
    if mem is not None:
        result.update(
            memory_gib=mem.total / 2**30,
            temporaries_gib=mem.temporaries / 2**30,
            arguments_gib=mem.arguments / 2**30,
        )
    if "onlymem" in spec["options"]:
        result["status"] = "compiled"
        return result
    for i in range(warmup):
        state, metrics = fn(state, data[i % 2])
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for i in range(steps):
        state, metrics = fn(state, data[i % 2])
    jax.block_until_ready(metrics)
    dt = (time.perf_counter() - t0) / steps
    m = {k: float(v) for k, v in jax.device_get(metrics).items()}
    tps = b * SEQ / dt
    fpt = flops_per_token(cfg, SEQ)
    peak = datasheet_peak(jax.devices()[0]) or ceiling
    result.update(
        status="ok",
        step_seconds=dt,
        tokens_per_second=tps,
        mfu_datasheet=fpt * tps / peak,
        mfu_ceiling=fpt * tps / ceiling,
        loss=m.get("loss"),
        finite=m.get("finite"),
        moe_max_load=m.get("moe/max_load_ratio"),
    )
    stats = jax.devices()[0].memory_stats() or {}
    result["peak_hbm_gib_so_far"] = stats.get("peak_bytes_in_use", 0) / 2**30
    if profile:
        jax.profiler.start_trace(profile)
        for i in range(3):
            state, metrics = fn(state, data[i % 2])
        jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
    del state, metrics, data, fn
    return result


def main() -> None:
    global SEQ
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--seq", type=int, default=2048, help="sequence length (2048; smaller for a CPU smoke run)"
    )
    p.add_argument("--profile", default=None, help="VARIANT=DIR: trace 3 more steps of VARIANT into DIR")
    p.add_argument("--budget", type=float, default=1e9, help="stop starting variants after this many seconds")
    args = p.parse_args()
    SEQ = args.seq
    import jax

    from schooner.train import matmul_ceiling

    start = time.perf_counter()
    ceiling = matmul_ceiling(8192 if jax.default_backend() == "tpu" else 1024, "bfloat16", repeats=5)
    print(
        json.dumps(
            {"device": str(jax.devices()[0].device_kind), "bf16_matmul_ceiling_tflops": ceiling / 1e12}
        ),
        flush=True,
    )
    for name in args.variants.split(","):
        if time.perf_counter() - start > args.budget:
            print(json.dumps({"variant": name, "status": "skipped: budget"}), flush=True)
            continue
        try:
            prof = None
            if args.profile and args.profile.split("=")[0] == name:
                prof = args.profile.split("=", 1)[1]
            res = run_variant(name, args.steps, args.warmup, ceiling, prof)
        except Exception as e:  # one variant's failure must not cost the others' figures
            res = {"variant": name, "status": "error", "error": f"{type(e).__name__}: {str(e)[:800]}"}
        res["elapsed"] = time.perf_counter() - start
        print(json.dumps(res), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(res) + "\n")
        gc.collect()
        jax.clear_caches()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
