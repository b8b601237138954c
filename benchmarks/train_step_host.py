"""The trainer's host cost per step for a tiny model: the step's dispatch and its metrics' fetch, old and new.

The Delphi scaling suite trains models of 20k-600k parameters (batch 16-64 x seq 64), for which the device's
step is shorter than the host's work around it. This measures that work for a 24k-parameter Llama (vocab
1024, hidden 16, 2 layers, batch 16 x seq 64, AdamH; a random token cache written here) on the train step
`Trainer` compiles, two ways, interleaved in the same process on the same state and batches:

- old (re-created here as `Trainer` dispatched before 2026-12-07): the step jitted on the `TrainState`
  pytree, compiled ahead of time (`CompiledStep`) and called with the state, its outputs rebuilt as a
  pytree of haliax `NamedArray`s; its 8 scalar metrics fetched with `jax.device_get` of the dict, one
  transfer each.
- new (`Trainer._compile_step`, `on_leaves`): the same step on the state's flat leaves, dispatched from a
  list of arrays by jax's C++ path; its metrics one float32 vector, one transfer.

Per step: the main thread's CPU time (`time.thread_time`) in the dispatch and in the fetch of the finished
step's metrics (the device's own time and the wait for it left out), and the wall time of the same. The
ratio new/old of the medians is the figure; both paths' metrics are compared, value for value.

2026-12-07, the shared 2-core CPU (load average 2-5 from other jobs), `--steps 200 --rounds 5`: main thread
CPU ms/step old 1.809, new 0.800, new/old 0.44 (rounds: old 1.64-1.96, new 0.66-0.90); wall old 2.832, new
0.853, new/old 0.30; the same metrics over 1001 steps. The whole loop (`Trainer.run`, 1000 steps of this
model on the Delphi cache): main thread CPU 2.19 -> 0.53 ms/step (from 200- and 1000-step runs); the
device's step (about 15-20 ms on this CPU) sets the wall time there. Not measured on a TPU.

Usage:
    uv run python benchmarks/train_step_host.py [--steps 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

VOCAB = 1024


def make_data(folder: str) -> str:
    """A WordLevel tokenizer of VOCAB ids and a token cache of 200 random documents (train_throughput's maker)."""
    from train_throughput import make_data as make

    return make(folder, vocab_size=VOCAB, lengths=(50, 500), docs=200)


def tiny_trainer(data: str, out: str):
    """A `Trainer` for the suite's smallest shape, set up and its step compiled (nothing run)."""
    from schooner.model import LlamaConfig
    from schooner.train import (
        AdamHConfig,
        CheckpointConfig,
        LanguageModeling,
        TrackerConfig,
        Trainer,
        TrainerConfig,
    )

    model = LlamaConfig(
        vocab_size=VOCAB,
        hidden_dim=16,
        intermediate_dim=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
        max_seq_len=64,
        tie_embeddings=True,
        qk_norm=True,
        initializer_range=0.25,
    )
    cfg = TrainerConfig(
        name="host",
        model=model,
        batch_size=16,
        seq_len=64,
        num_train_steps=1000,
        datasets=[(f"{data}/train", 1.0)],
        validation={},
        fit_vocab=False,
        optimizer=AdamHConfig(
            learning_rate=0.018, adam_learning_rate=0.018, beta2=0.99, max_grad_norm=0.1, schedule="wsd"
        ),
        checkpoint=CheckpointConfig(every=None, save_final=False),
        trackers=TrackerConfig(loss_plot=False),
    )
    setup = LanguageModeling().setup(cfg, out)
    trainer = Trainer(
        cfg, output_path=out, model_config=setup.model_config, objective=setup.objective, data=setup.data
    )
    trainer._setup_state()
    trainer._compile_step()
    return trainer, setup.data


def old_step(trainer):
    """The step as `Trainer` dispatched it before: jitted on the state's pytree, the metrics a dict."""
    import haliax as hax
    import jax

    from schooner.train import CompiledStep, make_train_step

    cfg, bs = trainer.config, trainer.batch_sharding
    step_fn = make_train_step(
        trainer.tx,
        z_loss_weight=float(cfg.z_loss_weight),
        microbatches=cfg.microbatches,
        lr_schedule=trainer.lr_schedule,
        constrain_batch=lambda b: jax.lax.with_sharding_constraint(b, {k: bs for k in b}),
        loss=trainer.objective.loss,
        shards=1,
    )

    def wrapped(state, batch):
        with hax.axis_mapping(trainer.compute_map):
            return step_fn(state, batch)

    shardings = (trainer.state_sharding, bs)
    out = (trainer.state_sharding, jax.sharding.NamedSharding(trainer.mesh, jax.sharding.PartitionSpec()))
    jitted = jax.jit(wrapped, in_shardings=shardings, out_shardings=out, donate_argnums=(0,))
    return CompiledStep(jitted, "")


def run_old(step, state, batches, n):
    import jax

    cpu, wall, rows = [], [], []
    for i in range(n):
        t0, w0 = time.thread_time(), time.perf_counter()
        state, metrics = step(state, batches[i % len(batches)])
        t1, w1 = time.thread_time(), time.perf_counter()
        jax.block_until_ready(metrics)
        t2, w2 = time.thread_time(), time.perf_counter()
        row = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
        cpu.append(t1 - t0 + time.thread_time() - t2)
        wall.append(w1 - w0 + time.perf_counter() - w2)
        rows.append(row)
    return state, cpu, wall, rows


def run_new(trainer, leaves, batches, n):
    import jax

    cpu, wall, rows = [], [], []
    for i in range(n):
        t0, w0 = time.thread_time(), time.perf_counter()
        leaves, metrics = trainer.step_fn(leaves, batches[i % len(batches)])
        t1, w1 = time.thread_time(), time.perf_counter()
        jax.block_until_ready(metrics)
        t2, w2 = time.thread_time(), time.perf_counter()
        values = np.asarray(metrics).tolist()
        row = {f"train/{k}": v for k, v in zip(trainer.metric_names, values, strict=True)}
        cpu.append(t1 - t0 + time.thread_time() - t2)
        wall.append(w1 - w0 + time.perf_counter() - w2)
        rows.append(row)
    return leaves, cpu, wall, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="steps per path per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (old, then new)")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp

    from schooner.tokenize import DataLoader

    print(f"devices: {jax.devices()}  cpus: {os.cpu_count()}  load average: {os.getloadavg()}")
    work = tempfile.mkdtemp(prefix="schooner-host-")
    try:
        trainer, data = tiny_trainer(make_data(os.path.join(work, "data")), os.path.join(work, "run"))
        with DataLoader(data, 16, sharding=trainer.batch_sharding, stop_step=8) as loader:
            batches = [b for _, b in loader]
        old = old_step(trainer)
        start = trainer.state
        old_state = jax.tree.map(jnp.copy, start)  # each path donates its own copy
        leaves = [jnp.copy(x) for x in jax.tree.leaves(start)]
        # the first call of each compiles; then both paths run the same batches from the same state
        old_state, *_, old_rows = run_old(old, old_state, batches, 1)
        leaves, *_, new_rows = run_new(trainer, leaves, batches, 1)
        cpu = {"old": [], "new": []}
        wall = {"old": [], "new": []}
        for r in range(args.rounds):
            old_state, c, w, rows = run_old(old, old_state, batches[1:] + batches[:1], args.steps)
            cpu["old"] += c
            wall["old"] += w
            old_rows += rows
            leaves, c, w, rows = run_new(trainer, leaves, batches[1:] + batches[:1], args.steps)
            cpu["new"] += c
            wall["new"] += w
            new_rows += rows
            print(
                f"round {r + 1}/{args.rounds}: host CPU ms/step old {1e3 * np.median(cpu['old'][-args.steps :]):.3f}"
                f" new {1e3 * np.median(cpu['new'][-args.steps :]):.3f}",
                flush=True,
            )
        same = old_rows == new_rows
        print(f"the same metrics, value for value, over {len(old_rows)} steps: {same}")
        for what, d in (("main thread CPU", cpu), ("wall", wall)):
            o, n = 1e3 * np.median(d["old"]), 1e3 * np.median(d["new"])
            print(
                f"{what:15s} ms/step (dispatch + metrics fetch): old {o:.3f}, new {n:.3f}, new/old {n / o:.2f}"
            )
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
