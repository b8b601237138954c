"""Exact resume: 20 steps straight versus 10 steps, `kill -9` during the second checkpoint write, resume.

Identical losses at every step and identical final parameters and optimizer state (bitwise, on CPU).
The kill test is marked slow; the default run resumes a run stopped mid-way (its last checkpoint removed).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from schooner.train import latest_checkpoint, train

RUN = textwrap.dedent(
    """
    import dataclasses, sys
    from schooner.model import presets
    from schooner.train import (AdamConfig, CheckpointConfig, MuonConfig, TrackerConfig,
                                TrainerConfig, train)

    def config(data_dir, out):
        model = dataclasses.replace(presets.llama_nano, vocab_size=320, hidden_dim=64, intermediate_dim=128,
                                    num_layers=2, max_seq_len=128)
        return TrainerConfig(
            model=model,
            datasets={data_dir + "/train": 1.0}, seq_len=32, validation={},
            output_path=out, batch_size=8, num_train_steps=20, seed=3,
            optimizer=MuonConfig(learning_rate=3e-3, warmup=3, weight_decay=0.1),
            checkpoint=CheckpointConfig(every=5, keep_last=10),
            trackers=TrackerConfig(loss_plot=False, log_every=1),
        )

    if __name__ == "__main__":
        train(config(sys.argv[1], sys.argv[2]))
    """
)


def _load(script: str):
    ns: dict = {}
    exec(compile(script, "<resume-run>", "exec"), ns)
    return ns["config"]


@pytest.mark.slow  # three compilations and a subprocess: ~40 s of CPU; run with -m slow
def test_kill_during_checkpoint_write_then_resume_is_exact(data_dir, tmp_path, read_losses) -> None:
    from schooner.model import load_model, load_pytree

    script = tmp_path / "run.py"
    script.write_text(RUN)
    config = _load(RUN)
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    env = {**os.environ, "SCHOONER_TRAIN_PAUSE_CHECKPOINT_WRITE": "2", "SCHOONER_COMPILATION_CACHE": "off"}
    proc = subprocess.Popen(
        [sys.executable, str(script), data_dir, killed],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        train(config(data_dir, straight))  # meanwhile, in this process
        deadline = time.time() + 600
        while not glob.glob(f"{killed}/step-000010.tmp-*/.paused"):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "the second checkpoint write never started"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # mid-write: arrays written, checkpoint.json not yet
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert latest_checkpoint(killed)[0] == 5
    assert glob.glob(f"{killed}/step-000010.tmp-*")  # the torn write is there, and is not a checkpoint

    summary = train(config(data_dir, killed))
    assert summary["resumed_from"].endswith("step-000005") and summary["start_step"] == 5
    assert not glob.glob(f"{killed}/step-000010.tmp-*")

    a, b = read_losses(straight), read_losses(killed)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert a == b  # bitwise: same data per step, same RNG, same state

    ma, _ = load_model(f"{straight}/step-000020")
    mb, _ = load_model(f"{killed}/step-000020")
    import jax

    for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    sa = load_pytree(f"{straight}/step-000020/train_state")
    sb = load_pytree(f"{killed}/step-000020/train_state")
    assert sa.keys() == sb.keys() and len(sa) > 3
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


@pytest.mark.parametrize("kind", ["dense", pytest.param("moe", marks=pytest.mark.slow)])
def test_resume_mid_run_is_exact(data_dir, tmp_path, read_losses, kind) -> None:
    """Stopped after step 3's checkpoint (its later checkpoint gone, as after a crash) and resumed: the same
    losses at every step and the same final parameters and optimizer state as a run straight through. "moe":
    a quantile-balanced MoE with two microbatches, its router bias re-solved after every step (the default):
    the bias is a model leaf, so the checkpoint holds it and the resumed run sets the same biases."""
    import dataclasses
    import shutil

    import jax

    from schooner.model import LlamaConfig, MoEConfig, load_model, load_pytree

    config = _load(RUN)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")

    def cfg(out: str):
        c = config(data_dir, out)
        if kind == "moe":
            dense = {
                f.name: getattr(c.model, f.name) for f in dataclasses.fields(LlamaConfig) if f.name != "type"
            }
            moe = MoEConfig(**dense, num_experts=4, num_experts_per_token=2)
            assert moe.resolves_router_bias
            c = dataclasses.replace(c, model=moe, microbatches=2, batch_size=16)  # 8 devices x 2
        return dataclasses.replace(
            c, num_train_steps=6, checkpoint=dataclasses.replace(c.checkpoint, every=3, keep_last=5)
        )

    train(cfg(straight))
    train(cfg(resumed))
    shutil.rmtree(f"{resumed}/step-000006")  # the run "died" after writing step 3's checkpoint
    summary = train(cfg(resumed))
    assert summary["start_step"] == 3 and summary["resumed_from"].endswith("step-000003")
    a, b = read_losses(straight), read_losses(resumed)
    assert sorted(a) == sorted(b) == list(range(1, 7)) and a == b
    ma, _ = load_model(f"{straight}/step-000006")
    mb, _ = load_model(f"{resumed}/step-000006")
    if kind == "moe":  # the biases were set (not the zeros of init) and are among the leaves compared
        assert np.abs(np.asarray(ma.layers.stacked.mlp.router_bias.array)).max() > 0
    for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    sa = load_pytree(f"{straight}/step-000006/train_state")
    sb = load_pytree(f"{resumed}/step-000006/train_state")
    assert sa.keys() == sb.keys() and len(sa) > 3
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    # A finished run resumes to nothing.
    again = train(cfg(resumed))
    assert again["start_step"] == 6 and again["resumed_from"].endswith("step-000006")
