"""The step builders: what is part of `train_lm`'s identity, the `export_hf` step, the job's environment."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

import jax
import numpy as np
import pytest

from schooner.cluster import ResourceConfig, StepRunner, lower
from schooner.train import AdamConfig, TrackerConfig
from schooner.train.steps import hf_export, train_lm

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables are Linux-only")


def _train(nano, data_dir, **kw):
    args = dict(
        model=nano(),
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        datasets={data_dir: 1.0},
        batch_size=8,
        seq_len=32,
        num_train_steps=4,
        checkpoint_every=2,
        resources=None,
    )
    args.update(kw)
    return train_lm("runs/steps-test", **args)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def test_runtime_fields_do_not_change_the_key(nano, data_dir) -> None:
    base = _train(nano, data_dir)
    same = [
        _train(nano, data_dir, checkpoint_every=1),
        _train(nano, data_dir, keep_checkpoints=7, keep_every=2),
        _train(nano, data_dir, trackers=TrackerConfig(log_every=1, loss_plot=False, tensorboard=True)),
        _train(nano, data_dir, resources=ResourceConfig.with_cpu(cpu=2)),
    ]
    assert {h.key for h in same} == {base.key}
    different = [
        _train(nano, data_dir, optimizer=AdamConfig(learning_rate=1e-3, warmup=1)),
        _train(nano, data_dir, num_train_steps=5),
        _train(nano, data_dir, seed=1),
        _train(nano, data_dir, eval_every=2),
    ]
    assert len({h.key for h in different} | {base.key}) == 5


def test_a_batch_schedule_becomes_the_runs_schedule_and_is_checked_when_the_step_is_built(
    nano, data_dir
) -> None:
    from schooner.train import BatchSchedule

    handle = _train(nano, data_dir, batch_size=[(0, 8), (2, 16)])
    tc = handle.config
    assert tc.batch_size == BatchSchedule(((0, 8), (2, 16)))
    assert [tc.batch_size_at(s) for s in range(4)] == [8, 8, 16, 16]
    with pytest.raises(ValueError, match="must start at step 0"):
        _train(nano, data_dir, batch_size=[(1, 8)])


def _report_result(prefix: str, key: str):
    """The rows of the Result table of step `key`'s card in the prefix's HTML report, as (name, text) items."""
    from schooner.cluster import write_report

    with open(write_report(prefix)) as f:
        page = f.read()
    card = re.search(rf'<section class="card step" id="step-{key[:16]}">(.*?)</section>', page, re.S)
    assert card, f"no card for step {key[:8]} in the report"
    result = re.search(r'<h4>Result</h4><table class="result">(.*?)</table>', card.group(1), re.S)
    return dict(re.findall(r'<tr><td>([^<]*)</td><td class="num">([^<]*)</td></tr>', result.group(1))).items()


def test_export_hf_is_a_step_added_to_a_finished_run(nano, data_dir, tmp_path) -> None:
    from schooner.model import import_hf, load_model
    from schooner.tokenize import load_tokenizer

    prefix = str(tmp_path / "prefix")
    model = _train(nano, data_dir)
    (first,) = StepRunner(prefix=prefix, quiet=True).run([lower(model)]).steps
    assert first.state == "succeeded", first.error
    hf = hf_export(model)
    assert hf.name == "hf/runs/steps-test"
    result = StepRunner(prefix=prefix, quiet=True).run([lower(hf)])
    states = {o.name: o.state for o in result.steps}
    assert states == {"runs/steps-test": "cached", "hf/runs/steps-test": "succeeded"}, result.steps
    out = result[hf].output_path
    record = _read_json(f"{out}/export.json")
    assert record["step"] == 4 and record["checkpoint"].endswith("step-000004")
    tok = load_tokenizer(data_dir)
    assert record["tokenizer_fingerprint"] == tok.fingerprint
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(
        os.listdir(out)
    )
    assert _read_json(f"{out}/generation_config.json")["eos_token_id"] == tok.eos_id
    exported, _ = import_hf(out)
    trained, config = load_model(record["checkpoint"])
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8) % 300
    np.testing.assert_array_equal(np.asarray(exported(tokens)), np.asarray(trained(tokens)))
    # `schooner report` shows the run's parameter count (its result's numbers), counted here from the arrays
    sizes = [(x.size, x.shape) for x in jax.tree.leaves(trained)]
    total = sum(n for n, _ in sizes)
    non_embedding = total - sum(n for n, shape in sizes if config.vocab_size in shape)
    assert (
        _report_result(prefix, model.key)
        >= {
            "summary.parameters.total": str(total),
            "summary.parameters.non_embedding": str(non_embedding),
        }.items()
    )
    # An earlier checkpoint, by its step number; a step that was not kept is refused, naming those that were.
    two = StepRunner(prefix=prefix, quiet=True).run([lower(hf_export(model, "hf/at-2", step=2))])
    assert _read_json(f"{two.steps[-1].output_path}/export.json")["step"] == 2
    runner = StepRunner(prefix=prefix, quiet=True)
    bad = runner.run([lower(hf_export(model, "hf/at-3", step=3))], raise_on_failure=False)
    assert bad.steps[-1].state == "failed" and "has steps [2, 4]" in bad.steps[-1].error


def test_export_hf_refuses_what_cannot_be_exported_when_built(nano, data_dir) -> None:
    from schooner.model import MoEConfig

    fields = {f.name: getattr(nano(), f.name) for f in dataclasses.fields(nano()) if f.name != "type"}
    quantile = _train(nano, data_dir, model=MoEConfig(**fields, num_experts=4, num_experts_per_token=2))
    with pytest.raises(ValueError, match=r"export_hf\('runs/steps-test'\).*load_balancing='quantile'"):
        hf_export(quantile)
    shared = MoEConfig(**fields, num_experts=4, load_balancing="aux_loss", num_shared_experts=1)
    with pytest.raises(ValueError, match="num_shared_experts=1"):
        hf_export(_train(nano, data_dir, model=shared))
    hf_export(_train(nano, data_dir, model=MoEConfig(**fields, num_experts=4, load_balancing="aux_loss")))
    with pytest.raises(ValueError, match="dtype must be one of"):
        hf_export(_train(nano, data_dir), dtype="float16")


@linux
def test_train_lm_jobs_start_with_glibc_huge_pages(nano, data_dir, monkeypatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SCHOONER_MALLOC_TUNING", raising=False)
    cpu = ResourceConfig.with_cpu()
    handle = _train(nano, data_dir, resources=cpu)
    assert handle.resources.env == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert cpu.env == {}  # the caller's config is not changed
    # The job's own tunables are kept; its explicit malloc setting wins.
    other = _train(
        nano, data_dir, resources=ResourceConfig(env={"GLIBC_TUNABLES": "glibc.rtld.nns=4", "A": "1"})
    )
    assert other.resources.env == {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.hugetlb=1", "A": "1"}
    mine = ResourceConfig(env={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert _train(nano, data_dir, resources=mine).resources.env == mine.env
    # The opt-out, in the environment of the process building the experiment.
    monkeypatch.setenv("SCHOONER_MALLOC_TUNING", "0")
    assert _train(nano, data_dir, resources=cpu).resources.env == {}
    assert _train(nano, data_dir, resources=None).resources is None


def test_the_worker_really_gets_the_tunable(nano, data_dir, tmp_path, monkeypatch) -> None:
    """Through a LocalClient worker process: glibc sees the variable when the process starts."""
    from schooner.cluster import LocalClient, step

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SCHOONER_MALLOC_TUNING", raising=False)
    env = _train(nano, data_dir, resources=ResourceConfig.with_cpu()).resources
    probe = step("probe/env", _read_tunables, {"n": 1}, resources=env)
    result = StepRunner(prefix=str(tmp_path / "p"), client=LocalClient(), quiet=True).run([probe])
    assert result[probe].result == ("glibc.malloc.hugetlb=1" if sys.platform.startswith("linux") else None)


def _read_tunables(config: dict, output_path: str) -> str | None:
    return os.environ.get("GLIBC_TUNABLES")


def test_an_input_path_that_does_not_exist_is_named_when_the_step_is_built(nano, data_dir, tmp_path) -> None:
    from schooner.train.steps import dpo, sft

    missing = str(tmp_path / "tokenized" / "typo")
    with pytest.raises(FileNotFoundError, match=rf"datasets\[1\] = '{re.escape(missing)}' does not exist"):
        _train(nano, data_dir, datasets={data_dir: 1.0, missing: 1.0})
    with pytest.raises(FileNotFoundError, match=r"validation\['held-out'\] = .* does not exist"):
        _train(nano, data_dir, validation={"held-out": missing})
    with pytest.raises(FileNotFoundError, match=r"evals\['x'\] = .* does not exist"):
        _train(nano, data_dir, evals={"x": missing})
    with pytest.raises(FileNotFoundError, match=r"sft\('s'\): datasets\[0\] = .* does not exist"):
        sft("s", model=nano(), initialize_from=None, datasets={missing: 1.0}, batch_size=8, seq_len=32,
            num_train_steps=1)  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"dpo\('d'\): preferences = .* does not exist"):
        dpo("d", model=nano(), initialize_from=None, reference=data_dir, preferences=missing, batch_size=8,
            seq_len=32, num_train_steps=1)  # fmt: skip


def test_the_run_names_the_field_of_a_folder_that_is_not_a_cache(nano, data_dir, tmp_path) -> None:
    from schooner.train import TrainerConfig, train

    empty = tmp_path / "not-a-cache"
    empty.mkdir()
    config = TrainerConfig(model=nano(), datasets=[(f"{data_dir}/train", 1.0), (str(empty), 1.0)], seq_len=32,
                           num_train_steps=1, validation={})  # fmt: skip
    with pytest.raises(ValueError, match=r"TrainerConfig\.datasets\[1\]: token cache .*no manifest\.json"):
        train(config, str(tmp_path / "run"))
