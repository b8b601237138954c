"""Shared fixtures: a real byte-level BPE tokenizer trained on Python stdlib source, and token caches."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest


def stdlib_texts() -> list[str]:
    """Real text: the source of a few stdlib modules, split into function-sized documents."""
    import argparse
    import dataclasses as dc
    import json as js
    import textwrap

    docs: list[str] = []
    for mod in (argparse, dc, js.decoder, textwrap):
        src = inspect.getsource(mod)
        docs.extend(chunk for chunk in src.split("\n\n\n") if chunk.strip())
    return docs


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`<dir>/train`, `<dir>/validation` token caches and `<dir>/tokenizer.json` (vocab 320)."""
    from schooner.tokenize import train_bpe, write_cache

    root = tmp_path_factory.mktemp("data")
    texts = stdlib_texts()
    tok = train_bpe(texts, vocab_size=320)
    tok.save(str(root))
    docs = [tok.encode(t) for t in texts]
    n_val = max(4, len(docs) // 10)
    write_cache(str(root / "train"), docs[n_val:], tok)
    write_cache(str(root / "validation"), docs[:n_val], tok)
    return str(root)


def _nano(vocab_size: int = 320, **overrides):
    """The llama_nano preset, smaller still (2 layers, 64 wide), for fast tests."""
    from schooner.model import presets

    cfg = dataclasses.replace(
        presets.llama_nano,
        vocab_size=vocab_size,
        hidden_dim=64,
        intermediate_dim=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=128,
    )
    return dataclasses.replace(cfg, **overrides)


@pytest.fixture(scope="session")
def nano():
    """A factory: the llama_nano preset shrunk to 2 layers x 64 wide, with overrides."""
    return _nano


def _read_losses(run_dir: str) -> dict[int, float]:
    """step -> train loss from a run's metrics.jsonl."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "train/loss" in row:
                out[row["step"]] = row["train/loss"]
    return out


@pytest.fixture(scope="session")
def read_losses():
    """A function: step -> train loss from a run folder's metrics.jsonl."""
    return _read_losses


@pytest.fixture(autouse=True)
def _no_persistent_compilation_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not write into the user's ~/.cache; train() honours this switch.
    monkeypatch.setenv("SCHOONER_COMPILATION_CACHE", "off")


@pytest.fixture(scope="session")
def write_checkpoint():
    """A function: checkpoint `step` of the run folder `run` from `config` initialised with PRNGKey(step),
    written as a training run writes one (`CheckpointManager`: temporary folder, marker, rename)."""

    def write(run: str, step: int, config) -> None:
        import jax

        from schooner.model import init, save_model
        from schooner.train import CheckpointConfig
        from schooner.train._checkpoint import CheckpointManager

        manager = CheckpointManager(run, CheckpointConfig(every=1, keep_last=10, asynchronous=False))
        model = init(config, key=jax.random.PRNGKey(step))
        manager.save(step, model, lambda folder, m: save_model(folder, m, config), {"metrics": {}})
        manager.wait()

    return write


# -- RL fixtures (test_rl_train, test_rl_workers, test_rl_eval, test_rl_learns, test_rl_bad_input) --------------


@pytest.fixture(scope="session")
def arithmetic_folder(tmp_path_factory: pytest.TempPathFactory):
    """A factory: `ArithmeticTask(**settings)` written to a fresh folder (train.jsonl, heldout.jsonl)."""

    def make(**settings) -> str:
        from schooner.eval.arithmetic import ArithmeticTask, arithmetic_task

        folder = str(tmp_path_factory.mktemp("arith"))
        arithmetic_task(folder, ArithmeticTask(**settings))
        return folder

    return make


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory: pytest.TempPathFactory):
    """A factory: `config` initialised from the PRNG `key`, saved as a model folder (an RL run's start)."""

    def make(config, key, name: str = "rl-start") -> str:
        from schooner.model import init, save_model

        folder = str(tmp_path_factory.mktemp(name) / "ckpt")
        save_model(folder, init(config, key=key), config)
        return folder

    return make


@pytest.fixture(scope="session")
def task(arithmetic_folder) -> str:
    """The RL tests' arithmetic task (48 train / 8 held-out problems of 1-2 steps); test_rl_eval has its own."""
    return arithmetic_folder(train_size=48, heldout_size=8, min_steps=1, max_steps=2, max_value=20)


@pytest.fixture(scope="session")
def start(nano, saved_model) -> str:
    """The RL tests' starting weights: the nano model from PRNGKey(5); test_rl_eval and test_rl_bad_input have
    their own."""
    import jax

    return saved_model(nano(), jax.random.PRNGKey(5))


def _grpo_config(
    data_dir: str,
    prompts: str,
    start: str,
    out: str,
    objective,
    *,
    steps: int,
    seq_len: int = 128,
    batch_size: int = 8,
    learning_rate: float = 3e-3,
    checkpoint=None,
    model=None,
):
    """The TrainerConfig of a small GRPO test run: `objective` on `prompts` from the model folder `start`
    (its config unless `model`), constant-rate Adam, seed 3, a metric row every step, no loss plot."""
    from schooner.model import read_config
    from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig

    return TrainerConfig(
        model=model if model is not None else read_config(start),
        datasets={prompts: 1.0},
        seq_len=seq_len,
        objective=objective,
        batch_size=batch_size,
        num_train_steps=steps,
        validation={},
        seed=3,
        optimizer=AdamConfig(learning_rate=learning_rate, weight_decay=0.0, warmup=0, schedule="constant"),
        tokenizer=f"{data_dir}/tokenizer.json",
        initialize_from=start,
        output_path=out,
        checkpoint=checkpoint if checkpoint is not None else CheckpointConfig(),
        trackers=TrackerConfig(loss_plot=False, log_every=1),
    )


@pytest.fixture(scope="session")
def grpo_config():
    """A function: the TrainerConfig of a small GRPO test run (`_grpo_config`)."""
    return _grpo_config


def _metric_rows(out: str) -> dict[int, dict]:
    """step -> every metric a run logged at it (the trainer's row and the rollout hook's)."""
    from schooner.train import read_metrics

    rows: dict[int, dict] = {}
    for r in read_metrics(out):
        rows.setdefault(r["step"], {}).update(r)
    return rows


@pytest.fixture(scope="session")
def metric_rows():
    """A function: step -> every metric a run folder's metrics.jsonl holds at it."""
    return _metric_rows
