"""One unattended GPU check (issue 37): run it on an H200 from a copy of the working tree, in about 8 minutes.

Sections, each timed and guarded (a failure is recorded, the check goes on):

1. environment: jax, jaxlib, the CUDA plugin, cuDNN, the devices, XLA_FLAGS; the measured bf16 matmul ceiling
   (8192^3, bf16 in, fp32 accumulation);
2. attention (B 8, T 2048, 16 query and 8 key heads of 128, bf16, four documents a row): forward + backward time
   of ``xla`` (jax's XLA path: float32 [B, N, T, T] scores), ``cudnn_bias`` (cuDNN, documents as a dense mask
   bias), ``cudnn`` (cuDNN, documents in the packed layout), ``cudnn`` on one document a row, and the blocked
   fallback; each checked against ``reference_attention`` (output and gradients, float32) on two rows;
3. grouped matmul (the 8x top-2 MoE's gate projection: 65536 assignments x 768 -> 1024, 8 experts): forward +
   backward of ``jax.lax.ragged_dot`` (jax's default), the Pallas Triton kernel (``grouped_matmul="triton"``)
   and the capacity-factor einsum (capacity 1.25), effective TFLOP/s of the real FLOPs, the kernel checked
   against ragged_dot; forward only, jax's Mosaic GPU ragged_dot kernel beside them; then (own process) the
   same with ``XLA_FLAGS=--xla_gpu_experimental_use_ragged_dot_fusion=true`` (XLA's cuDNN lowering);
4. training through the real ``train()`` path (``benchmarks/train_throughput.py --configs h200``: Llama-3.2-1B
   shape, the 8x top-2 MoE, 134M and 374M dense at seq 2048, bf16 compute, fp32 parameters and Adam, each at
   its H200 preset: ``GPU_SETTINGS`` there), each in its own process: tokens/s, MFU against the datasheet and
   the measured ceiling, compiled and peak memory.

Writes ``--out`` (default ``gpu_check.json``) and prints the ratios (cudnn packed / xla, triton / ragged_dot...).
``--dry-run`` runs sections 1-3 on the CPU with tiny shapes (the cuDNN and Triton paths then take their CPU
forms: the blocked fallback, the Pallas interpreter) and lists section 4's commands without running them:
``tests/test_gpu_check.py`` runs it, so the check imports and runs before anyone carries it to a GPU.

On a bare H200 (no network, python3 3.12 with jax 0.11.2 and its CUDA 13 plugin, nothing of the project
installed), carry the wheel folder that ``benchmarks/gather_gpu_wheels.py`` gathered beforehand and pass it:
``--wheels .whl-gpu`` installs them with pip, offline and without a resolver, under a temporary folder,
appends it to PYTHONPATH after the checkout's ``lib/*/src`` (the image's jax stays first; the code that
runs is this working tree's), and starts the check again in a fresh interpreter, which first checks that
every module it needs imports (``environment.imports``).

Usage:
    python3 benchmarks/gpu_check.py --wheels .whl-gpu            # on a bare H200, wheels carried
    uv run python benchmarks/gpu_check.py                       # on a GPU machine with the project installed
    uv run python benchmarks/gpu_check.py --skip-train          # the micro-benchmarks only (about 2 minutes)
    uv run python benchmarks/gpu_check.py --dry-run             # here, on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# What the check imports (sections 1-4, a train_throughput.py child included), checked before it starts.
NEEDED = ("jax", "equinox", "haliax", "jaxtyping", "optax", "tensorstore", "tokenizers", "psutil")
NEEDED += ("schooner.model", "schooner.train", "schooner.tokenize")
SECTIONS = ("environment", "attention", "grouped_matmul", "ragged_dot_fusion", "training")
# train_throughput.py's per-GPU presets (`--configs h200`: batch, remat and microbatches sized for the H200's
# memory with schooner.train.estimate_step_memory), the headline first (what a cut-short run still measures).
TRAIN_CONFIGS = ("h200-1b", "h200-moe", "h200-134m", "h200-374m")
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "B200": 2250e12, "A100": 312e12}


def _time(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall seconds of ``fn`` (already compiled by a first call) over ``repeats`` runs."""
    import jax

    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def install_wheels(folder: str) -> dict[str, str]:
    """Install every wheel in ``folder`` offline under a temporary site folder; returns the environment that
    puts it and the checkout's ``lib/*/src`` on PYTHONPATH, after what is there (the image's jax stays
    first), for the check to start again in."""
    import glob

    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if not wheels:
        sys.exit(
            f"--wheels {folder}: no .whl file there; gather them beforehand on a machine with registry access: "
            "uv run python benchmarks/gather_gpu_wheels.py (then carry the folder)"
        )
    site = os.path.join(tempfile.gettempdir(), "schooner-gpu-site")
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", site, *wheels]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    src = sorted(glob.glob(os.path.join(ROOT, "lib", "*", "src")))
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, *src, site])}
    env["SCHOONER_GPU_CHECK_WHEELS"] = (
        f"{len(wheels)} wheels from {folder} in {time.perf_counter() - t0:.0f}s"
    )
    print(
        f"installed {len(wheels)} wheels from {folder} into {site}; PYTHONPATH={env['PYTHONPATH']}",
        flush=True,
    )
    return env


def imports() -> dict:
    """Which of the modules the check needs import here, and from where (None: it does not)."""
    import importlib

    out: dict[str, Any] = {}
    for name in NEEDED:
        try:
            module = importlib.import_module(name)
            out[name] = getattr(module, "__version__", None) or os.path.dirname(module.__file__ or "?")
        except Exception as e:  # noqa: BLE001 - recorded: the sections that need it fail on their own
            out[name] = None
            print(f"cannot import {name}: {type(e).__name__}: {e}", flush=True)
    return out


def environment(dry: bool) -> dict:
    import jax
    import jax.numpy as jnp

    out: dict[str, Any] = {
        "imports": imports(),
        "wheels": os.environ.get("SCHOONER_GPU_CHECK_WHEELS"),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "xla_python_client_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
    }
    try:
        import jaxlib

        out["jaxlib"] = jaxlib.__version__
    except Exception as e:  # noqa: BLE001 - recorded
        out["jaxlib"] = repr(e)
    try:
        from jax._src.lib import cuda_versions

        out["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception as e:  # noqa: BLE001 - recorded
        out["cudnn"] = repr(e)
    out["compute_capability"] = getattr(jax.devices()[0], "compute_capability", None)
    size = 256 if dry else 8192
    a = jnp.ones((size, size), jnp.bfloat16)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    seconds = _time(lambda: f(a, a), 2 if dry else 10)
    out["matmul_ceiling_flops"] = 2 * size**3 / seconds
    kind = out["device_kind"]
    out["datasheet_bf16_flops"] = next((v for k, v in DATASHEET_BF16.items() if k in kind), None)
    return out


def attention_bench(dry: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from schooner.model import attention, reference_attention

    b, t, n, kv, h = (2, 64, 4, 2, 16) if dry else (8, 2048, 16, 8, 128)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (b, t, n, h), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, t, kv, h), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, kv, h), jnp.float32).astype(jnp.bfloat16)
    bounds = np.sort(np.random.default_rng(0).integers(1, t, size=(b, 3)), axis=1)
    segs = jnp.asarray((np.arange(t)[None, :, None] >= bounds[:, None, :]).sum(-1), jnp.int32)  # 4 docs a row
    weight = jnp.cos(jnp.arange(h, dtype=jnp.float32))[None, None, None, :]

    def loss(impl: str | None, seg: Any) -> Callable:
        def f(q: Any, k: Any, v: Any) -> Any:
            if impl == "reference":
                out = reference_attention(q, k, v, seg)
            else:
                out = attention(q, k, v, seg, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * weight)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))

    causal_flops = 4 * b * t * t * n * h / 2 * 3.5  # QK^T and PV forward, 2.5x that backward, half causal
    rows = slice(0, 2)
    want = loss("reference", segs[rows])(q[rows], k[rows], v[rows])
    want_one = loss("reference", None)(q[rows], k[rows], v[rows])
    results: dict[str, Any] = {"shape": {"batch": b, "seq": t, "heads": n, "kv_heads": kv, "head_dim": h}}
    for name, impl, seg in (
        ("xla", "xla", segs),
        ("cudnn_bias", "cudnn_bias", segs),
        ("cudnn_packed", "cudnn", segs),
        ("cudnn_one_document", "cudnn", None),
        ("blocked", "blocked", segs),
    ):
        try:
            fn = loss(impl, seg)
            seconds = _time(lambda fn=fn: fn(q, k, v), 2 if dry else 10)
            small = loss(impl, None if seg is None else seg[rows])(q[rows], k[rows], v[rows])
            ref = want if seg is not None else want_one
            errs = [
                float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))) / jnp.max(jnp.abs(r)))
                for a, r in zip(jax.tree_util.tree_leaves(small), jax.tree_util.tree_leaves(ref))
            ]
            results[name] = {
                "seconds": seconds,
                "tflops": causal_flops / seconds / 1e12,
                "max_rel_error": max(errs),
                "correct": max(errs) < 3e-2,
            }
        except Exception as e:  # noqa: BLE001 - recorded, the check goes on
            results[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    return results


def grouped_bench(dry: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from schooner.model import grouped_matmul

    m, d, f, e = (256, 32, 48, 4) if dry else (16 * 2048 * 2, 768, 1024, 8)
    rng = np.random.default_rng(0)
    sizes = rng.multinomial(m, rng.dirichlet(np.full(e, 4.0))).astype(np.int32)  # uneven, like real routing
    gs = jnp.asarray(sizes)
    x = jnp.asarray(rng.normal(size=(m, d)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(e, d, f)) / d**0.5, jnp.bfloat16)
    flops = 3 * 2 * m * d * f  # forward, and the two products of the backward
    capacity = int(np.ceil(1.25 * m / e))
    expert = jnp.asarray(np.repeat(np.arange(e), sizes), jnp.int32)
    slot = jnp.arange(m, dtype=jnp.int32) - (jnp.cumsum(gs) - gs)[expert]

    def capacity_einsum(x: Any, w: Any) -> Any:  # the capacity-factor dispatch's product (MoEConfig)
        kept = slot < capacity
        buf = (
            jnp.zeros((e, capacity, d), x.dtype)
            .at[expert, jnp.where(kept, slot, capacity)]
            .set(x, mode="drop")
        )
        out = jnp.einsum("ecd,edf->ecf", buf, w)
        return out[expert, jnp.minimum(slot, capacity - 1)] * kept[:, None].astype(x.dtype)

    def grad_of(fn: Callable) -> Callable:
        return jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(fn(x, w).astype(jnp.float32)), argnums=(0, 1)))

    paths = {
        "ragged_dot": lambda x, w: grouped_matmul(x, w, gs, kernels="xla", implementation="ragged_dot"),
        "triton": lambda x, w: grouped_matmul(x, w, gs, kernels="xla", implementation="triton"),
        "capacity_1.25": capacity_einsum,
    }
    results: dict[str, Any] = {"shape": {"rows": m, "in": d, "out": f, "experts": e, "sizes": sizes.tolist()}}
    want = None
    for name, fn in paths.items():
        try:
            g = grad_of(fn)
            seconds = _time(lambda g=g: g(x, w), 2 if dry else 10)
            results[name] = {"seconds": seconds, "effective_tflops": flops / seconds / 1e12}
            if name == "ragged_dot":
                want = jax.jit(fn)(x, w)
            elif name == "triton" and want is not None:
                got = jax.jit(fn)(x, w).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(got - want.astype(jnp.float32))) / jnp.max(jnp.abs(want)))
                results[name] |= {"max_rel_error_vs_ragged_dot": err, "correct": err < 2e-2}
        except Exception as e:  # noqa: BLE001 - recorded
            results[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    if (
        jax.default_backend() == "gpu"
    ):  # forward only: jax's Mosaic GPU (Hopper) kernel, a candidate to compare
        try:
            from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

            def mosaic(x: Any, w: Any) -> Any:
                return ragged_dot_mgpu.ragged_dot(
                    x,
                    w,
                    group_sizes=gs,
                    block_m=128,
                    block_n=128,
                    block_k=64,
                    max_concurrent_steps=4,
                    grid_block_n=2,
                )

            candidates = (
                ("mosaic", mosaic),
                ("ragged_dot", paths["ragged_dot"]),
                ("triton", paths["triton"]),
            )
        except Exception as e:  # noqa: BLE001 - recorded (e.g. the Mosaic module's imports)
            results["forward_only_import"] = f"{type(e).__name__}: {e}"[:2000]
            candidates = (("ragged_dot", paths["ragged_dot"]), ("triton", paths["triton"]))
        forward: dict[str, Any] = {}
        for n, fn in candidates:  # each on its own: one failing kernel leaves the others' figures
            try:
                f = jax.jit(fn)
                t = _time(lambda f=f: f(x, w), 10)
                forward[n] = {"seconds": t, "effective_tflops": flops / 3 / t / 1e12}
                if want is not None:
                    diff = jnp.abs(f(x, w).astype(jnp.float32) - want.astype(jnp.float32))
                    forward[n]["max_abs_error_vs_ragged_dot"] = float(jnp.max(diff))
            except Exception as e:  # noqa: BLE001 - recorded
                forward[n] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        results["forward_only"] = forward
    return results


def _run_group(cmd: list[str], env: dict, timeout: float) -> str:
    """Run ``cmd`` in its own process group; past ``timeout`` the whole group is killed (train_throughput's
    children too: an orphan would hold the GPU). Returns the output's tail."""
    import signal

    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1))
        return out[-6000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return f"(killed after {timeout:.0f}s)\n" + (out or "")[-6000:]


def ragged_dot_fusion(timeout: float) -> dict:
    """The grouped-matmul section again in a process with XLA's cuDNN ragged-dot fusion asked for (the flag
    must be set before jax starts): does XLA's own lowering beat the padded dense one here?"""
    out = os.path.join(tempfile.mkdtemp(prefix="gpu-check-"), "fusion.json")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_gpu_experimental_use_ragged_dot_fusion=true"
    ).strip()
    cmd = [sys.executable, os.path.abspath(__file__), "--sections", "grouped_matmul", "--out", out]
    log = _run_group(cmd, env, timeout)
    if not os.path.exists(out):
        return {"error": log[-3000:], "xla_flags": env["XLA_FLAGS"]}
    with open(out) as f:
        return {"xla_flags": env["XLA_FLAGS"], **json.load(f).get("grouped_matmul", {})}


def training(dry: bool, steps: int, timeout: float) -> dict:
    """train_throughput.py's seq-2048 configs through train(), each in its own process (JSON lines back)."""
    out = os.path.join(tempfile.mkdtemp(prefix="gpu-check-"), "train.jsonl")
    cmd = [
        sys.executable,
        os.path.join(HERE, "train_throughput.py"),
        "--configs",
        ",".join(TRAIN_CONFIGS),
        "--steps",
        str(steps),
        "--warmup",
        "3",
        "--json",
        out,
    ]
    if dry:
        return {"command": cmd, "ran": False}
    log = _run_group(cmd, dict(os.environ), timeout)
    rows = []
    if os.path.exists(out):
        with open(out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        r.pop("intervals", None)
        fpt, tps = r.get("flops_per_token", 0), r.get("tokens_per_second", 0)
        r["mfu_datasheet"] = fpt * tps / r["peak_flops"] if r.get("peak_flops") else None
        r["mfu_ceiling"] = fpt * tps / r["matmul_ceiling"] if r.get("matmul_ceiling") else None
    return {"command": cmd, "ran": True, "results": rows, "log_tail": log}


def _ratio(results: dict, a: str, b: str) -> str:
    try:
        return f"{results[b]['seconds'] / results[a]['seconds']:.2f}x faster"
    except (KeyError, TypeError, ZeroDivisionError):
        return "n/a"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU; training listed, not run")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per config")
    p.add_argument(
        "--budget", type=float, default=470, help="seconds for the whole check (training gets the rest)"
    )
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument("--sections", help="comma-separated subset of: " + ",".join(SECTIONS))
    p.add_argument(
        "--wheels",
        help="a folder of wheels (benchmarks/gather_gpu_wheels.py) to install offline first, on a bare machine",
    )
    args = p.parse_args()
    if args.wheels:
        argv = sys.argv[1:]
        i = argv.index("--wheels") if "--wheels" in argv else None
        argv = (
            argv[:i] + argv[i + 2 :] if i is not None else [a for a in argv if not a.startswith("--wheels=")]
        )
        env = install_wheels(args.wheels)  # then the check again, in an interpreter that sees them
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)
    if args.dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()

    def left() -> float:
        return args.budget - (time.perf_counter() - start)

    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": args.dry_run,
    }
    every = {
        "environment": lambda: environment(args.dry_run),
        "attention": lambda: attention_bench(args.dry_run),
        "grouped_matmul": lambda: grouped_bench(args.dry_run),
        "ragged_dot_fusion": lambda: ragged_dot_fusion(min(120, left() / 3)),
        "training": lambda: training(args.dry_run, args.steps, left()),
    }
    chosen = args.sections.split(",") if args.sections else list(SECTIONS)
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        sys.exit(f"unknown sections {unknown}; choose from {SECTIONS}")
    if args.skip_train:
        chosen = [c for c in chosen if c != "training"]
    if args.dry_run:  # the flag is a GPU compiler's; a CPU run has nothing to compare
        chosen = [c for c in chosen if c != "ragged_dot_fusion"]
    sections = [(name, every[name]) for name in chosen]
    for name, run in sections:
        t0 = time.perf_counter()
        try:
            report[name] = run()
        except Exception:  # noqa: BLE001 - recorded, the check goes on
            report[name] = {"error": traceback.format_exc()[-3000:]}
        report[name + "_seconds"] = time.perf_counter() - t0
        with open(args.out, "w") as f:  # after every section: a killed run still leaves what it measured
            json.dump(report, f, indent=1, default=str)
        print(
            f"== {name} ({report[name + '_seconds']:.0f}s)\n{json.dumps(report[name], default=str)[:3000]}",
            flush=True,
        )
    att, gmm = report.get("attention", {}), report.get("grouped_matmul", {})
    print("\n== ratios (forward + backward time)")
    print(f"attention cudnn packed vs xla:        {_ratio(att, 'cudnn_packed', 'xla')}")
    print(f"attention cudnn packed vs cudnn bias: {_ratio(att, 'cudnn_packed', 'cudnn_bias')}")
    print(f"grouped matmul triton vs ragged_dot:  {_ratio(gmm, 'triton', 'ragged_dot')}")
    print(f"grouped matmul triton vs capacity:    {_ratio(gmm, 'triton', 'capacity_1.25')}")
    fusion = report.get("ragged_dot_fusion", {})
    print(
        f"grouped matmul triton vs ragged_dot with XLA's cuDNN fusion: {_ratio({**fusion, **{'triton': gmm.get('triton')}}, 'triton', 'ragged_dot')}"
    )
    env = report.get("environment", {})
    for r in report.get("training", {}).get("results", []):
        print(
            f"train {r.get('kind'):10s} {r.get('tokens_per_second', 0):9.0f} tok/s  MFU {r.get('mfu_datasheet') or 0:.3f} "
            f"of the datasheet, {r.get('mfu_ceiling') or 0:.3f} of the measured ceiling "
            f"({(env.get('matmul_ceiling_flops') or 0) / 1e12:.0f} TFLOP/s)  compiled {r.get('step_memory_gib', 0):.1f} "
            f"GiB, peak {r.get('peak_hbm_gib', 0):.1f} GiB"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
