"""Training with its output on an object store: a real S3 API server (moto in its own process) as the prefix.

Checkpoints go through tensorstore's S3 driver (at the endpoint in `AWS_ENDPOINT_URL`, as the token cache's
arrays do), markers, metrics and `run.json` through fsspec/s3fs. A run on `s3://` writes the same arrays as
the same run on local disk, a run cut back to an earlier checkpoint resumes from it exactly, and so does a
run killed with SIGKILL in the middle of writing a checkpoint (its metrics up to then survive the kill).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import fsspec
import pytest

from schooner.cluster.pytest_fixtures import s3_prefix as s3_prefix  # noqa: F401
from schooner.cluster.pytest_fixtures import s3_server as s3_server  # noqa: F401
from schooner.train import (
    CheckpointConfig,
    MuonConfig,
    TrackerConfig,
    TrainerConfig,
    complete_checkpoints,
    read_metrics,
    train,
)

from .test_multihost import arrays, assert_same_arrays


def losses(run: str) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_metrics(f"{run}/metrics.jsonl") if "train/loss" in r}


@pytest.mark.slow  # three short training runs, two against the S3 server: 212 s on 2 cores at load ~20
def test_a_run_on_s3_equals_local_and_resumes_exactly(
    s3_prefix: str,  # noqa: F811
    nano,
    data_dir,
    tmp_path,
) -> None:
    remote = f"{s3_prefix}/checkpoints/nano"
    cfg = TrainerConfig(
        model=nano(),
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        validation={},
        output_path=remote,
        batch_size=8,
        num_train_steps=8,
        seed=11,
        optimizer=MuonConfig(learning_rate=3e-3, warmup=2, weight_decay=0.1),
        checkpoint=CheckpointConfig(every=4, keep_last=5),
        trackers=TrackerConfig(loss_plot=False, log_every=1),
    )
    local = str(tmp_path / "local")
    train(dataclasses.replace(cfg, output_path=local))
    summary = train(cfg)
    assert summary["checkpoint"] == f"{remote}/step-000008"
    assert [s for s, _ in complete_checkpoints(remote)] == [4, 8]
    assert losses(remote) == losses(local) and sorted(losses(remote)) == list(range(1, 9))
    for step in ("step-000004", "step-000008"):
        assert_same_arrays(arrays(f"{remote}/{step}"), arrays(f"{local}/{step}"))
    # The tensorstore arrays really are objects in the bucket (not a local folder named "s3:").
    fs, path = fsspec.core.url_to_fs(remote)
    assert fs.find(f"{path}/step-000008/train_state")
    # Cut the run back to step 4 (as if it had died after that checkpoint) and run it again: it resumes
    # there and ends with the same losses and the same final state.
    final = arrays(f"{remote}/step-000008")
    fs.rm(f"{path}/step-000008", recursive=True)
    fs.invalidate_cache()
    resumed = train(cfg)
    assert resumed["resumed_from"] == f"{remote}/step-000004" and resumed["start_step"] == 4
    assert losses(remote) == losses(local)
    assert_same_arrays(arrays(f"{remote}/step-000008"), final)


KILLED_RUN = textwrap.dedent(
    """
    import dataclasses, sys
    from schooner.model import presets
    from schooner.train import CheckpointConfig, MuonConfig, TrackerConfig, TrainerConfig, train

    def config(data_dir, out):
        model = dataclasses.replace(presets.llama_nano, vocab_size=320, hidden_dim=64, intermediate_dim=128,
                                    num_layers=2, max_seq_len=128)
        return TrainerConfig(
            model=model, datasets={data_dir + "/train": 1.0}, seq_len=32, validation={},
            output_path=out, batch_size=8, num_train_steps=12, seed=7,
            optimizer=MuonConfig(learning_rate=3e-3, warmup=2, weight_decay=0.1),
            checkpoint=CheckpointConfig(every=4, keep_last=5),
            trackers=TrackerConfig(loss_plot=False, log_every=1),
        )

    if __name__ == "__main__":
        train(config(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.slow  # a local run, a run killed mid-checkpoint on S3 and its resume
def test_a_run_on_s3_killed_while_writing_a_checkpoint_resumes_exactly(
    s3_prefix: str,  # noqa: F811
    data_dir,
    tmp_path,
) -> None:
    ns: dict = {}
    exec(compile(KILLED_RUN, "<killed-run>", "exec"), ns)
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    remote, local = f"{s3_prefix}/killed", str(tmp_path / "local")
    fs, path = fsspec.core.url_to_fs(remote)
    env = {**os.environ, "SCHOONER_TRAIN_PAUSE_CHECKPOINT_WRITE": "2", "SCHOONER_COMPILATION_CACHE": "off"}
    log = tmp_path / "killed.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(script), data_dir, remote], env=env, stderr=err)
    try:
        train(ns["config"](data_dir, local))  # meanwhile, in this process
        deadline = time.time() + 900
        while not fs.exists(f"{path}/step-000008/.paused"):  # arrays of the 2nd checkpoint written, no marker
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "the second checkpoint write never started"
            time.sleep(0.2)
            fs.invalidate_cache()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fs.invalidate_cache()
    assert [s for s, _ in complete_checkpoints(remote)] == [4]  # step 8 has no checkpoint.json
    assert set(range(1, 9)) <= set(losses(remote))  # metrics were uploaded with each checkpoint
    resumed = train(ns["config"](data_dir, remote))
    assert resumed["resumed_from"] == f"{remote}/step-000004"
    assert losses(remote) == losses(local) and sorted(losses(remote)) == list(range(1, 13))
    assert_same_arrays(arrays(f"{remote}/step-000012"), arrays(f"{local}/step-000012"))
    assert_same_arrays(arrays(f"{remote}/step-000008"), arrays(f"{local}/step-000008"))
