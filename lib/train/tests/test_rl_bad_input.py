"""Bad input to GRPO, each met by a message naming the file and row (or the field) and the fix: a prompts file
whose rows lack the field the reward reads (an error at setup, not a run of all-failed rewards), an empty
prompts file, a prompt over the length cap (a counted skip naming the row: a task file is data, and one
long row should not stop a run), a group of one sample. A reward that raises is counted and named, not fatal
(`test_rl_train.test_a_reward_that_raises_is_counted_and_named_not_fatal`)."""

from __future__ import annotations

import json
import logging

import jax
import pytest

from schooner.train import AdamConfig, Grpo, TrainerConfig
from schooner.train._rl_batches import read_prompts

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")


def no_field_reward(prompt: str, completion: str, fields) -> float:
    return 0.0


@pytest.fixture(scope="module")
def start(nano, saved_model) -> str:
    return saved_model(nano(), jax.random.key(0), name="bad-start")


def _setup(data_dir, start, prompts: str, tmp_path, *, seq_len: int = 40, **grpo):
    from schooner.eval.rewards import exact_answer
    from schooner.model import read_config

    objective = Grpo(**({"reward": exact_answer(), "num_generations": 2, "max_new_tokens": 8} | grpo))
    config = TrainerConfig(
        model=read_config(start),
        datasets={prompts: 1.0},
        seq_len=seq_len,
        objective=objective,
        batch_size=8,
        num_train_steps=1,
        validation={},
        optimizer=AdamConfig(learning_rate=1e-3),
        tokenizer=f"{data_dir}/tokenizer.json",
        initialize_from=start,
        output_path=str(tmp_path / "run"),
    )
    return objective.setup(config, str(tmp_path / "run"))


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_prompts_file_without_the_answers_the_reward_reads_is_an_error_naming_file_row_and_field(
    data_dir, start, tmp_path
) -> None:
    rows = [{"id": "q1", "prompt": "1+1?", "answer": 2}, {"id": "q2", "prompt": "2+2?", "solution": "4"}]
    path = _write(tmp_path / "task.jsonl", rows)
    with pytest.raises(ValueError) as err:
        _setup(data_dir, start, path, tmp_path)
    text = str(err.value)
    assert f"{path}:2 (row q2) has no 'answer' field" in text
    assert "exact_answer[answer]" in text and "['id', 'prompt', 'solution']" in text
    assert "exact_answer(field=" in text  # the fix: add the field, or point the reward at the right one
    # a reward that names no fields is not second-guessed; `required_fields` says what it needs
    _setup(data_dir, start, path, tmp_path, reward=no_field_reward)
    with pytest.raises(ValueError, match=r"task.jsonl:1 \(row q1\) has no 'tests' field"):
        _setup(data_dir, start, path, tmp_path, reward=no_field_reward, required_fields=("tests",))


def test_an_empty_prompts_file_is_an_error_naming_the_file_and_the_fix(tmp_path) -> None:
    for text in ("", "\n  \n"):
        (tmp_path / "empty.jsonl").write_text(text)
        with pytest.raises(ValueError, match=r"empty.jsonl holds no rows: give one JSON object per line"):
            read_prompts(str(tmp_path / "empty.jsonl"))


def test_a_prompt_over_the_cap_is_a_counted_skip_naming_the_row(data_dir, start, tmp_path, caplog) -> None:
    long = "one plus one plus " * 30
    rows = [{"id": "short", "prompt": "1+1?", "answer": 2}, {"id": "too-long", "prompt": long, "answer": 1}]
    path = _write(tmp_path / "task.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        setup = _setup(data_dir, start, path, tmp_path)
    assert "left out 1 of 2 prompts longer than the prompt cap 32" in caplog.text
    assert "too-long (" in caplog.text
    assert setup.metadata["rl"]["prompts"] == 1
    assert [r["row"] for r in setup.metadata["rl"]["skipped_prompts"]] == ["too-long"]
    assert setup.data.skipped == 1  # and every rollout step logs it as rollout/skipped_prompts
    # every prompt over the cap: nothing to train on, an error naming a row and the fix
    with pytest.raises(
        ValueError, match=r"every prompt is longer than the prompt cap 2 .* row short .* raise seq_len"
    ):
        _setup(data_dir, start, path, tmp_path, seq_len=10)


def test_a_group_of_one_sample_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"num_generations must be >= 2, got num_generations=1"):
        Grpo(reward=no_field_reward, num_generations=1)


# -- rl_train, declared: what can be checked before any step runs ----------------------------------------


def _declare(data_dir, start, **given):
    from schooner.eval.rewards import exact_answer
    from schooner.train.steps import rl_train

    settings = {"prompts": "", "tokenizer": f"{data_dir}/tokenizer.json"} | given
    return rl_train(
        "rl/bad",
        checkpoint=start,
        reward=exact_answer(),
        num_train_steps=1,
        max_prompt_tokens=32,
        max_new_tokens=8,
        resources=None,
        **settings,
    )


def test_rl_train_refuses_a_bad_prompts_or_heldout_path_when_declared(data_dir, start, tmp_path) -> None:
    """As `sft`/`dpo` check their model (and inputs given as paths) while the experiment is built: a prompts or
    held-out path that cannot be read is an error naming the field and the fix, not a failure inside the run
    after the model is loaded. The files' rows are read when the step runs (the run reads them all anyway)."""
    from schooner.train import PassAtK

    good = _write(tmp_path / "task.jsonl", [{"id": "q1", "prompt": "1+1?", "answer": 2}])
    missing, empty = str(tmp_path / "nowhere.jsonl"), tmp_path / "empty"
    empty.mkdir()
    cases = [
        ("prompts = ", {"prompts": missing}),
        ("heldout['arith'] = ", {"prompts": good, "heldout": {"arith": missing}}),
        ("heldout['arith'].prompts = ", {"prompts": good, "heldout": {"arith": PassAtK(str(empty))}}),
        ("tokenizer = ", {"prompts": good, "tokenizer": str(tmp_path / "tok.json")}),
        ("prompts = ", {"prompts": str(empty)}),
    ]
    messages = []
    for field, given in cases:
        with pytest.raises(FileNotFoundError) as info:
            _declare(data_dir, start, **given)
        message = str(info.value)
        messages.append(message)
        assert message.startswith(f"rl_train('rl/bad'): {field}"), message
        assert "token cache" not in message and "tokenized(" not in message, (
            message
        )  # train_lm's fix, not RL's
    assert missing in messages[0] and "does not exist" in messages[0] and "train.jsonl" in messages[0]
    assert "holds no train.jsonl" in messages[-1]
    assert (
        missing in messages[1] and "heldout.jsonl" in messages[1] and "holds no heldout.jsonl" in messages[2]
    )
    assert "tokenizer" in messages[3].split(" = ", 1)[1]
    _declare(data_dir, start, prompts=good, heldout={"arith": good})  # readable paths: declared


@pytest.mark.parametrize("prompts", [None, {"task.jsonl": 1.0}, 3])
def test_rl_train_refuses_prompts_that_are_no_file_folder_or_step(data_dir, start, prompts) -> None:
    with pytest.raises(TypeError) as info:
        _declare(data_dir, start, prompts=prompts)
    message = str(info.value)
    assert message.startswith(
        "rl_train('rl/bad'): prompts must be a prompts file, a folder holding train.jsonl"
    ), message
    assert f"got {prompts!r}" in message, message


def test_rl_train_names_its_checkpoint_field_when_the_path_holds_no_weights(
    data_dir, start, tmp_path
) -> None:
    """rl_train's argument is `checkpoint`: its error named `initialize_from=`, an argument rl_train has not."""
    good = _write(tmp_path / "task.jsonl", [{"id": "q1", "prompt": "1+1?", "answer": 2}])
    with pytest.raises(FileNotFoundError) as info:
        _declare(data_dir, str(tmp_path / "no-run"), prompts=good)
    message = str(info.value)
    assert message.startswith(f"rl_train('rl/bad'): checkpoint={str(tmp_path / 'no-run')!r} "), message
    assert "initialize_from" not in message, message


@pytest.mark.parametrize(
    ("given", "error", "said"),
    [
        ({"tokenizer": None}, TypeError, "tokenizer must be the tokenizer the policy was trained with"),
        ({"checkpoint": None}, TypeError, "checkpoint must be the policy: a run folder, a checkpoint folder"),
        (
            {"heldout": "task.jsonl"},
            TypeError,
            "heldout must be heldout={'name': path or PassAtK}, got 'task.jsonl'",
        ),
        (
            {"heldout": ["t.jsonl"]},
            TypeError,
            "heldout must be heldout={'name': path or PassAtK}, got ['t.jsonl']",
        ),
    ],
)
def test_rl_train_refuses_no_tokenizer_no_checkpoint_and_a_heldout_that_is_no_mapping(
    data_dir, start, tmp_path, given, error, said
) -> None:
    """rl_train(tokenizer=None) was accepted (pass_at_k_eval refused it), checkpoint=None said "give model= ...
    or initialize_from=" (rl_train has no initialize_from), a heldout string or list raised AttributeError."""
    good = _write(tmp_path / "task.jsonl", [{"id": "q1", "prompt": "1+1?", "answer": 2}])
    given = {"prompts": good} | given
    if "checkpoint" in given:
        start = given.pop("checkpoint")
    with pytest.raises(error) as info:
        _declare(data_dir, start, **given)
    message = str(info.value)
    assert message.startswith(f"rl_train('rl/bad'): {said}"), message
    assert "initialize_from" not in message, message


def test_rl_train_says_a_missing_checkpoint_does_not_exist(data_dir, start, tmp_path) -> None:
    good = _write(tmp_path / "task.jsonl", [{"id": "q1", "prompt": "1+1?", "answer": 2}])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"checkpoint='.*no-run' does not exist; give "):
        _declare(data_dir, str(tmp_path / "no-run"), prompts=good)
    with pytest.raises(FileNotFoundError, match=r"checkpoint='.*empty' is not a training run"):
        _declare(data_dir, str(tmp_path / "empty"), prompts=good)


# -- pass_at_k_eval, declared: the same checks as rl_train's ------------------------------------------------


def _declare_eval(data_dir, start, **given):
    from schooner.eval.rewards import exact_answer
    from schooner.train.steps import pass_at_k_eval

    settings = {"checkpoint": start, "tokenizer": f"{data_dir}/tokenizer.json"} | given
    return pass_at_k_eval("eval/bad", reward=exact_answer(), resources=None, **settings)


def test_pass_at_k_eval_refuses_a_bad_checkpoint_task_or_tokenizer_path_when_declared(
    data_dir, start, tmp_path
) -> None:
    """Its paths failed only inside the run (after the model was loaded, for the task): checked when the step
    is declared, by rl_train's checks, naming pass_at_k_eval's field and the fix."""
    from schooner.train import PassAtK

    good = _write(tmp_path / "heldout.jsonl", [{"id": "q1", "prompt": "1+1?", "answer": 2}])
    missing, empty = str(tmp_path / "nowhere.jsonl"), tmp_path / "empty"
    empty.mkdir()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    cases = [
        ("checkpoint=", {"task": good, "checkpoint": str(tmp_path / "no-run")}, FileNotFoundError),
        ("checkpoint=", {"task": good, "checkpoint": str(empty)}, FileNotFoundError),
        ("checkpoint=", {"task": good, "checkpoint_step": 3}, ValueError),
        ("checkpoint = ", {"task": good, "checkpoint": str(hf)}, ValueError),
        ("task = ", {"task": missing}, FileNotFoundError),
        ("task.prompts = ", {"task": PassAtK(str(empty))}, FileNotFoundError),
        ("tokenizer = ", {"task": good, "tokenizer": str(tmp_path / "tok.json")}, FileNotFoundError),
        ("checkpoint must be ", {"task": good, "checkpoint": None}, TypeError),
        ("task must be ", {"task": None}, TypeError),
        ("tokenizer must be ", {"task": good, "tokenizer": None}, TypeError),
    ]
    messages = []
    for field, given, error in cases:
        with pytest.raises(error) as info:
            _declare_eval(data_dir, start, **given)
        messages.append(str(info.value))
        assert messages[-1].startswith(f"pass_at_k_eval('eval/bad'): {field}"), messages[-1]
        assert "initialize_from" not in messages[-1] and "train.jsonl" not in messages[-1], messages[-1]
    assert "does not exist" in messages[0] and "is not a training run" not in messages[0], messages[0]
    assert "is not a training run" in messages[1]  # an empty folder: it exists, and holds no checkpoint
    assert "is one checkpoint; checkpoint_step=3 " in messages[2] and "Hugging Face" in messages[3]
    assert (
        missing in messages[4] and "heldout.jsonl" in messages[4] and "holds no heldout.jsonl" in messages[5]
    )
    assert "does not exist" in messages[6]
    declared = _declare_eval(data_dir, start, task=good)  # readable paths: declared
    assert declared.name == "eval/bad"
