"""A run folder given as a step's starting checkpoint is resolved once, when the step is declared: `train_lm`,
`sft`, `dpo` (`initialize_from`) and `rl_train` (`checkpoint`) take the model config and the pinned weights from
the same `step-NNNNNN/`, even while the run is still writing checkpoints, and `pass_at_k_eval`
names in its key the checkpoint it scores."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

# rl_train's rewards and pass_at_k_eval come from schooner-eval, a test-time extra of this package (the exact
# guard runs train's tests without it): those cases skip there, the others run.
needs_eval = pytest.mark.skipif(
    importlib.util.find_spec("schooner.eval") is None, reason="schooner-eval is not installed"
)
KINDS = ["train_lm", "sft", "dpo", pytest.param("rl_train", marks=needs_eval)]


def _declare(kind: str, source, data_dir: str, tmp_path, reference: str, **kw):
    """A `kind` step starting from `source` (model=None: the source's config), declared, not run; `dpo`'s
    reference is `reference`, `rl_train`'s prompts `tmp_path/train.jsonl`."""
    from schooner.train.steps import dpo, rl_train, sft, train_lm

    common = dict(batch_size=4, seq_len=32, num_train_steps=1, resources=None, **kw)
    if kind == "train_lm":
        return train_lm("ft", initialize_from=source, datasets={f"{data_dir}/train": 1.0}, **common)
    if kind == "sft":
        return sft("sft", initialize_from=source, datasets={f"{data_dir}/train": 1.0}, **common)
    if kind == "dpo":
        return dpo("dpo", initialize_from=source, reference=reference, preferences=str(tmp_path), **common)
    from schooner.eval.rewards import exact_answer

    checkpoint_step = kw.pop("initialize_from_step", None)
    return rl_train(
        "rl", checkpoint=source, checkpoint_step=checkpoint_step, prompts=str(tmp_path), reward=exact_answer(),
        tokenizer=f"{data_dir}/tokenizer.json", num_train_steps=1, max_prompt_tokens=32, max_new_tokens=8,
        resources=None, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_written_while_the_step_is_declared_does_not_split_config_and_weights(
    kind, nano, data_dir, start, write_checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run folder gains step 2 (written with another compute dtype, as a run resumed with other runtime
    settings writes it) right after the step reads the source's model config. Resolving the folder twice took
    the model config from step 1 and pinned the weights of step 2: the key named one checkpoint and the config
    another's. Resolved once, both are step 1's."""
    import schooner.model
    from schooner.model import read_config

    run = str(tmp_path / "source-run")
    first = nano(compute_dtype="float32")
    write_checkpoint(run, 1, first)
    written = []

    def read_config_while_the_run_writes(folder):
        config = read_config(folder)
        if not written:  # the run's next checkpoint lands now, between the experiment's reads of the folder
            written.append(2)
            write_checkpoint(run, 2, dataclasses.replace(first, compute_dtype="bfloat16"))
        return config

    monkeypatch.setattr(schooner.model, "read_config", read_config_while_the_run_writes)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    handle = _declare(kind, run, data_dir, tmp_path, start)
    assert written == [2]  # the checkpoint did land while the step was declared
    pinned = handle.config.initialize_from
    assert read_config(pinned.path) == handle.config.model, (pinned.path, handle.config.model.compute_dtype)
    assert pinned.path == f"{run}/step-000001" and handle.config.model.compute_dtype == "float32"


@pytest.mark.parametrize("kind", KINDS)
def test_the_key_of_a_run_folder_is_the_checkpoint_s_given_or_read_and_moves_with_a_new_checkpoint(
    kind, nano, data_dir, start, write_checkpoint, tmp_path
) -> None:
    """On a folder that does not change, model=None (the config read from the checkpoint) gives the key that
    the checkpoint's own config given as model= gives (one resolution either way: the key kept its form), the
    run folder the key of its checkpoint folder and of its step; a new checkpoint gives a new key."""
    from schooner.model import read_config

    run = str(tmp_path / "source-run")
    write_checkpoint(run, 1, nano())
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    step_1 = f"{run}/step-000001"
    key = _declare(kind, run, data_dir, tmp_path, start).key
    assert _declare(kind, run, data_dir, tmp_path, start, model=read_config(step_1)).key == key
    assert _declare(kind, step_1, data_dir, tmp_path, start).key == key
    assert _declare(kind, run, data_dir, tmp_path, start, initialize_from_step=1).key == key
    write_checkpoint(run, 2, nano())
    assert _declare(kind, run, data_dir, tmp_path, start).key != key
    assert _declare(kind, run, data_dir, tmp_path, start, initialize_from_step=1).key == key


@needs_eval
def test_pass_at_k_eval_pins_the_checkpoint_it_scores(
    nano, data_dir, task, write_checkpoint, tmp_path
) -> None:
    """`pass_at_k_eval` on a run folder checked the path but kept it: the step resolved it when it ran, so its
    key did not change when the run gained a checkpoint (a cached evaluation of step 1 was taken for step 2's)
    and the checkpoint it scored was whichever was latest then. Pinned like `rl_train`'s checkpoint, the key
    names the checkpoint (a run folder, its checkpoint folder and its step give one key) and the run scores
    that checkpoint even after the run gains another."""
    from schooner.cluster import StepRunner, lower
    from schooner.eval.rewards import exact_answer
    from schooner.train import PassAtK
    from schooner.train.steps import pass_at_k_eval

    run = str(tmp_path / "policy-run")
    write_checkpoint(run, 1, nano())
    spec = PassAtK(f"{task}/heldout.jsonl", samples=2, ks=(1, 2), max_prompts=2, prompts_per_batch=2,
                   max_new_tokens=4)  # fmt: skip

    def declare(checkpoint, step=None):
        return pass_at_k_eval("eval/pinned", checkpoint=checkpoint, checkpoint_step=step, task=spec,
                              reward=exact_answer(), tokenizer=f"{data_dir}/tokenizer.json", resources=None)  # fmt: skip

    first = declare(run)
    assert declare(f"{run}/step-000001").key == first.key == declare(run, 1).key
    write_checkpoint(run, 2, nano())
    assert declare(run).key != first.key
    assert declare(run, 1).key == first.key
    done = StepRunner(prefix=str(tmp_path / "prefix")).run([lower(first)])  # after step 2 landed
    (outcome,) = done.steps
    assert outcome.state == "succeeded", outcome.error
    with open(f"{outcome.output_path}/results.json") as f:
        assert json.load(f)["checkpoint"] == f"{run}/step-000001"


@needs_eval
def test_a_path_inside_a_step_is_kept_for_the_run_to_resolve(nano, data_dir, start, tmp_path) -> None:
    """A checkpoint given as `handle / "step-000001"` (an `InputPath`) passes `check_checkpoint` but was then
    pinned as a path (`os.fspath` of an `InputPath`: a TypeError) by `train_lm`, `dpo` and `rl_train`; it is
    kept, keyed by its step's key, as `pass_at_k_eval` kept it (and still keeps it)."""
    from schooner.eval.rewards import exact_answer
    from schooner.train.steps import pass_at_k_eval, train_lm

    upstream = train_lm("up", model=nano(), datasets={f"{data_dir}/train": 1.0}, batch_size=4, seq_len=32,
                        num_train_steps=1, resources=None)  # fmt: skip
    inside = upstream / "step-000001"
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    for kind in ("train_lm", "dpo", "rl_train"):
        handle = _declare(kind, inside, data_dir, tmp_path, start, model=nano())
        assert handle.config.initialize_from is inside, kind
    evaluation = pass_at_k_eval("eval/inside", checkpoint=inside, task=str(tmp_path / "train.jsonl"), reward=exact_answer(),
                                tokenizer=f"{data_dir}/tokenizer.json", resources=None)  # fmt: skip
    assert evaluation.config.checkpoint is inside
