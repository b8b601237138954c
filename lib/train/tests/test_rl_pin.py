"""rl_train resolves a run folder given as its `checkpoint` once: the policy's model config and the pinned
checkpoint come from the same `step-NNNNNN/`, even while the run is still writing checkpoints."""

from __future__ import annotations

import dataclasses

import pytest


def test_a_checkpoint_written_while_rl_train_is_declared_does_not_split_config_and_weights(
    nano, data_dir, task, write_checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run folder gains step 2 (written with another compute dtype, as a run resumed with other runtime
    settings writes it) right after rl_train reads the policy's config. Resolving the folder twice took the
    model config from step 1 and pinned the weights of step 2: the step's key named one checkpoint and its
    config another's (declared again later, the same checkpoint gives another key). Resolved once, both are
    step 1's."""
    import schooner.model
    from schooner.eval.rewards import exact_answer
    from schooner.model import read_config
    from schooner.train.steps import rl_train

    run = str(tmp_path / "policy-run")
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
    handle = rl_train(
        "rl/pinned",
        checkpoint=run,
        prompts=task,
        reward=exact_answer(),
        tokenizer=f"{data_dir}/tokenizer.json",
        num_train_steps=1,
        max_prompt_tokens=32,
        max_new_tokens=8,
        resources=None,
    )
    assert written == [2]  # the checkpoint did land while the step was declared
    pinned = handle.config.initialize_from
    assert read_config(pinned.path) == handle.config.model, (pinned.path, handle.config.model.compute_dtype)
    assert pinned.path == f"{run}/step-000001" and handle.config.model.compute_dtype == "float32"
