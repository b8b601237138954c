"""An RL experiment through `schooner run` (a real driver, the step in a worker process): `kill -9` of the
driver at a random point mid-training, then a rerun, ends with the weights and losses of an uninterrupted run,
bitwise; and `hf_export` of the `rl_train` run gives a folder whose logits in `transformers` (CPU torch, here or
in `$SCHOONER_HF_PYTHON`) equal the checkpoint's own forward's.

Both need whole RL runs in subprocesses (a compilation each): marked slow. The fast variant of the resume is
`test_rl_train.test_a_run_stopped_mid_group_and_resumed_ends_bitwise_equal` (in process, stopped mid group).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

STEPS = 6

EXPERIMENT = textwrap.dedent(
    f"""
    import os
    from schooner.cluster import ResourceConfig, StepRunner
    from schooner.eval.rewards import exact_answer
    from schooner.train import AdamConfig, PolicyLossConfig
    from schooner.train.steps import hf_export, rl_train


    def char_sum_reward(prompt, completion, fields):
        return float(sum(map(ord, completion)) % 7 == 0)  # groups with and without signal from the start


    # RL_DYNAMIC=1: dynamic sampling, whose extra rounds (prompts and RNG) a resumed run must sample again
    DYNAMIC = os.environ.get("RL_DYNAMIC") == "1"
    policy = rl_train(
        "rl/arith",
        checkpoint=os.environ["RL_START"],
        prompts=os.environ["RL_TASK"],
        reward=char_sum_reward if DYNAMIC else exact_answer(),
        tokenizer=os.environ["RL_TOKENIZER"],
        num_train_steps={STEPS},
        prompts_per_step=2,
        num_generations=4,
        max_prompt_tokens=112,
        max_new_tokens=16,
        num_iterations=2,  # a kill between a group's two updates resumes from its stored rollouts
        loss=PolicyLossConfig(beta=0.04),
        optimizer=AdamConfig(learning_rate=3e-3, weight_decay=0.0, warmup=0, schedule="constant"),
        seed=3,
        checkpoint_every=1,
        keep_checkpoints=2,
        resources=ResourceConfig.with_cpu(),
        **(dict(dynamic_sampling=True, max_sampling_rounds=3) if DYNAMIC else {{}}),
    )
    hf = hf_export(policy)

    if __name__ == "__main__":
        StepRunner().main([hf])
    """
)


@pytest.fixture(scope="module")
def experiment(data_dir, tmp_path_factory, nano) -> tuple[Path, dict[str, str]]:
    from schooner.eval.arithmetic import ArithmeticTask, arithmetic_task
    from schooner.model import init, save_model

    root = tmp_path_factory.mktemp("rl-run")
    task = str(root / "task")
    arithmetic_task(
        task, ArithmeticTask(train_size=48, heldout_size=8, min_steps=1, max_steps=2, max_value=20)
    )
    start = str(root / "start")
    save_model(start, init(nano(), key=jax.random.PRNGKey(5)), nano())
    script = root / "rl_experiment.py"
    script.write_text(EXPERIMENT)
    env = dict(os.environ)
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env.pop("SCHOONER_CLUSTER", None)
    env.update(RL_START=start, RL_TASK=task, RL_TOKENIZER=f"{data_dir}/tokenizer.json", COLUMNS="200")
    return script, env


def _run(script: Path, prefix: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "schooner.cluster.cli",
        "run",
        str(script),
        "--prefix",
        str(prefix),
        "--quiet",
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)


def _published(prefix: Path) -> tuple[Path, Path]:
    (run,) = prefix.glob("rl/arith-*")
    (hf,) = prefix.glob("hf/rl/arith-*")
    return run, hf


def _run_to_end(script: Path, prefix: Path, env: dict[str, str]) -> Path:
    """The experiment run uninterrupted into `prefix` (which it returns); a failed run fails with its output."""
    proc = _run(script, prefix, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return prefix


@pytest.fixture(scope="module")
def straight(experiment, tmp_path_factory) -> Path:
    script, env = experiment
    return _run_to_end(script, tmp_path_factory.mktemp("straight"), env)


@pytest.fixture(scope="module")
def dynamic(experiment) -> tuple[Path, dict[str, str]]:
    """The experiment with dynamic sampling on (`RL_DYNAMIC=1`)."""
    script, env = experiment
    return script, {**env, "RL_DYNAMIC": "1"}


@pytest.fixture(scope="module")
def straight_dynamic(dynamic, tmp_path_factory) -> Path:
    script, env = dynamic
    prefix = _run_to_end(script, tmp_path_factory.mktemp("straight-dynamic"), env)
    (run, _) = _published(prefix)
    rounds = [
        json.loads(x).get("rollout/dynamic/rounds") for x in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(r for r in rounds if r is not None) >= 2  # extra rounds were sampled
    return prefix


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _checkpointed(prefix: Path) -> bool:
    """Whether the running step has a complete checkpoint; a folder renamed while it is walked (a checkpoint's
    temp folder made final, the run published) is looked at again on the next poll."""
    try:
        return any(True for _ in prefix.rglob("step-*/checkpoint.json"))
    except FileNotFoundError:
        return False


def _steps_done(prefix: Path) -> int:
    """Train steps logged so far by the running step (wherever its run folder is)."""
    done = 0
    with contextlib.suppress(
        OSError
    ):  # a folder renamed while walked (a checkpoint made final, the run published)
        for path in prefix.rglob("metrics.jsonl"):
            with contextlib.suppress(OSError):
                done = max(done, sum('"train/loss"' in line for line in path.read_text().splitlines()))
    return done


@pytest.mark.slow  # three RL runs in subprocesses: minutes of CPU
def test_kill_9_mid_rl_then_rerun_ends_with_the_uninterrupted_weights(experiment, straight, tmp_path) -> None:
    _kill_9_then_rerun(experiment, straight, tmp_path)


@pytest.mark.slow  # three RL runs in subprocesses: minutes of CPU
def test_kill_9_mid_rl_with_dynamic_sampling_then_rerun_ends_with_the_uninterrupted_weights(
    dynamic, straight_dynamic, tmp_path
) -> None:
    _kill_9_then_rerun(dynamic, straight_dynamic, tmp_path)


def _kill_9_then_rerun(experiment: tuple[Path, dict[str, str]], straight: Path, tmp_path: Path) -> None:
    from schooner.model import load_model, load_pytree

    script, env = experiment
    seed = int(os.environ.get("SCHOONER_KILL_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    after, pause = rng.randint(1, STEPS - 1), rng.uniform(0.0, 1.5)
    where = f"(kill seed {seed}: after step {after} and a checkpoint, + {pause:.2f} s)"
    prefix = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "schooner.cluster.cli",
        "run",
        str(script),
        "--prefix",
        str(prefix),
        "--quiet",
    ]
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 1200
        while _steps_done(prefix) < after or not _checkpointed(prefix):
            assert driver.poll() is None, f"the run ended before the kill {where}"
            assert time.time() < deadline, f"the run never reached step {after} {where}"
            time.sleep(0.05)
        time.sleep(pause)
        assert driver.poll() is None, f"the run ended before the kill {where}"
        driver.send_signal(signal.SIGKILL)  # no cleanup; its worker kills its own process group on seeing it
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == -signal.SIGKILL
    assert not list(prefix.glob("hf/rl/arith-*")), f"the run was over before the kill {where}"
    time.sleep(2)  # the orphaned worker's watchdog (every 50 ms) has killed the trainer by now

    rerun = _run(script, prefix, env)
    assert rerun.returncode == 0, f"{where}\n" + rerun.stdout[-3000:] + rerun.stderr[-3000:]
    (a, _), (b, _) = _published(straight), _published(prefix)
    resumed = re.search(r"resuming from \S+ \(step (\d+)\)", (b / "train.log").read_text())
    assert resumed and 1 <= int(resumed.group(1)) < STEPS, (
        where
    )  # it went on from a checkpoint of the killed run
    assert _losses(a) == _losses(b) and sorted(_losses(b)) == list(range(1, STEPS + 1)), where
    last = f"step-{STEPS:06d}"
    ma, mb = load_model(a / last)[0], load_model(b / last)[0]
    for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=where)
    sa, sb = load_pytree(a / last / "train_state"), load_pytree(b / last / "train_state")
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=f"{k} {where}")


def _torch_python() -> str | None:
    """An interpreter with torch and transformers: this one, or $SCHOONER_HF_PYTHON."""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return sys.executable
    return os.environ.get("SCHOONER_HF_PYTHON") or None


TRANSFORMERS_LOGITS = textwrap.dedent(
    """
    import sys, numpy as np, torch, transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
    tokens = torch.from_numpy(np.load(sys.argv[2]))
    with torch.no_grad():
        np.save(sys.argv[3], model(tokens).logits.float().numpy())
    """
)


@pytest.mark.slow  # needs the RL run of the fixture
def test_hf_export_of_an_rl_run_gives_the_checkpoints_logits(straight, tmp_path) -> None:
    import equinox as eqx

    from schooner.model import import_hf, load_model

    run, hf = _published(straight)
    model, config = load_model(run / f"step-{STEPS:06d}")
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, 24)).astype(np.int32)
    forward = eqx.filter_jit(lambda m, t: m(t))
    want = np.asarray(forward(model, tokens))
    imported, _ = import_hf(hf)
    np.testing.assert_array_equal(np.asarray(forward(imported, tokens)), want)  # the same weights, exactly
    python = _torch_python()
    if python is None:
        pytest.skip("needs torch + transformers here or an interpreter with them in SCHOONER_HF_PYTHON")
    np.save(tmp_path / "tokens.npy", tokens.astype(np.int64))
    script = tmp_path / "logits.py"
    script.write_text(TRANSFORMERS_LOGITS)
    proc = subprocess.run(
        [python, str(script), str(hf), str(tmp_path / "tokens.npy"), str(tmp_path / "hf_logits.npy")],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "hf_logits.npy")
    assert float(np.abs(want).max()) > 1.0  # not a degenerate comparison
    # float32 on both sides, different summation orders: the model package's tolerance (test_hf_transformers)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)
