"""Finding a training run's checkpoints: complete ones only (`checkpoint.json` and `config.json`), the latest or
a named step, a checkpoint folder itself, on local and fsspec paths, with errors that say what is there."""

from __future__ import annotations

import os
import re

import fsspec
import jax
import numpy as np
import pytest

from schooner.model import (
    CHECKPOINT_MARKER,
    checkpoint_folder_name,
    checkpoint_step,
    find_checkpoint,
    init,
    list_checkpoints,
    load_model,
    save_model,
)


def _touch(folder, *, config=True, marker=True) -> str:
    folder.mkdir(parents=True)
    if config:
        (folder / "config.json").write_text("{}")
    if marker:
        (folder / CHECKPOINT_MARKER).write_text('{"step": 0}')
    return str(folder)


@pytest.fixture
def run(tmp_path):
    """Steps 5 and 10 complete; 20 still being written (no marker); 30 a crashed temporary write; 40 holds a
    marker but no model config; other files beside them."""
    root = tmp_path / "run"
    _touch(root / "step-000005")
    _touch(root / "step-000010")
    _touch(root / "step-000020", marker=False)
    _touch(root / "step-000030.tmp-123")
    _touch(root / "step-000040", config=False)
    _touch(root / "not-a-step")
    (root / "metrics.jsonl").write_text("")
    return root


def test_folder_names_round_trip() -> None:
    assert checkpoint_folder_name(7) == "step-000007" and checkpoint_folder_name(1234567) == "step-1234567"
    for step in (0, 7, 999_999, 1_234_567):
        assert checkpoint_step(checkpoint_folder_name(step)) == step
        assert checkpoint_step(f"s3://bucket/run/{checkpoint_folder_name(step)}/") == step
    for name in ("step-7", "step-000007.tmp-99", "step-00000x", "steps-000007", "run"):
        assert checkpoint_step(name) is None


def test_only_complete_checkpoints_are_listed_and_the_latest_is_found(run) -> None:
    assert list_checkpoints(str(run)) == [(5, f"{run}/step-000005"), (10, f"{run}/step-000010")]
    assert find_checkpoint(str(run)) == f"{run}/step-000010"
    assert find_checkpoint(run) == f"{run}/step-000010"  # a PathLike
    assert find_checkpoint(f"{run}/") == f"{run}/step-000010"
    assert find_checkpoint(str(run), 5) == f"{run}/step-000005"
    # without the model config requirement (a checkpoint manager storing other state): the marker decides
    assert [s for s, _ in list_checkpoints(str(run), require_config=False)] == [5, 10, 40]


def test_a_checkpoint_folder_is_itself(run, tmp_path) -> None:
    assert find_checkpoint(f"{run}/step-000005") == f"{run}/step-000005"
    # a save_model folder has no marker and no step: still a checkpoint
    plain = _touch(tmp_path / "saved", marker=False)
    assert find_checkpoint(plain) == plain
    with pytest.raises(ValueError, match=r"is one checkpoint .*step=5 names a step .*pass the run folder"):
        find_checkpoint(plain, 5)


def test_an_incomplete_step_folder_named_directly_is_refused(run) -> None:
    for name in ("step-000020", "step-000030.tmp-123"):  # config.json but no marker
        with pytest.raises(FileNotFoundError, match=r"is an incomplete checkpoint: .*pass the run folder"):
            find_checkpoint(f"{run}/{name}")


@pytest.mark.parametrize("step", ["10", -1, 2.0, True])
def test_a_step_that_is_not_a_whole_number_is_refused(run, step) -> None:
    with pytest.raises(ValueError, match=r"step=.*a whole number >= 0"):
        find_checkpoint(str(run), step)


def test_only_ascii_digits_name_a_step() -> None:
    assert checkpoint_step("step-\uff10\uff10\uff10\uff10\uff11\uff10") is None


def test_a_missing_step_lists_the_steps_the_run_has(run) -> None:
    with pytest.raises(FileNotFoundError) as info:
        find_checkpoint(str(run), 20, who="export_hf: ")
    text = str(info.value)
    assert text.startswith(f"export_hf: {str(run)!r} has no complete checkpoint step-000020/")
    assert "no complete checkpoint of step 20" in text and "it has steps [5, 10]" in text
    assert "step-000020 (no checkpoint.json" in text  # why the one asked for is not there
    assert "step-000030.tmp-123 (an interrupted write)" in text and "step-000040 (no config.json" in text
    assert "keep_every=" in text  # the fix: keep chosen steps for good


def test_no_checkpoint_names_the_folder_what_it_holds_and_the_fix(tmp_path) -> None:
    root = tmp_path / "run"
    _touch(root / "step-000003", marker=False)
    with pytest.raises(FileNotFoundError) as info:
        find_checkpoint(str(root))
    text = str(info.value)
    assert f"no checkpoint in {str(root)!r}" in text
    assert "step-000003 (no checkpoint.json" in text and "did training finish" in text
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint in .*empty.*did training finish"):
        find_checkpoint(str(tmp_path / "empty"))
    assert list_checkpoints(str(tmp_path / "missing")) == []  # a run that has not started: nothing yet
    with pytest.raises(FileNotFoundError, match=r"no training output folder at '.*missing'.*check the path"):
        find_checkpoint(str(tmp_path / "missing"))


def test_fsspec_memory_and_file_urls(run) -> None:
    fs = fsspec.filesystem("memory")
    for step in ("000003", "000012"):
        fs.pipe(f"/h16-run/step-{step}/config.json", b"{}")
        fs.pipe(f"/h16-run/step-{step}/{CHECKPOINT_MARKER}", b"{}")
    fs.pipe("/h16-run/step-000015/config.json", b"{}")  # no marker: an object store write in progress
    try:
        assert list_checkpoints("memory://h16-run") == [
            (3, "memory://h16-run/step-000003"),
            (12, "memory://h16-run/step-000012"),
        ]
        assert find_checkpoint("memory://h16-run") == "memory://h16-run/step-000012"
        assert find_checkpoint("memory://h16-run/step-000003") == "memory://h16-run/step-000003"
        with pytest.raises(
            FileNotFoundError, match=re.escape("it has steps [3, 12]; incomplete: step-000015")
        ):
            find_checkpoint("memory://h16-run", 15)
    finally:
        fs.rm("/h16-run", recursive=True)
    assert find_checkpoint(f"file://{run}") == f"file://{run}/step-000010"


def test_the_found_checkpoint_loads_the_model_saved_there(tmp_path, tiny_dense) -> None:
    """The finder's answer is what `load_model` needs: the model saved at the latest complete step."""
    run = tmp_path / "run"
    models = {}
    for step, seed in ((2, 0), (4, 1), (6, 2)):
        folder = os.path.join(run, checkpoint_folder_name(step))
        models[step] = init(tiny_dense, key=jax.random.PRNGKey(seed))
        save_model(folder, models[step])
        if step != 6:  # step 6: the model is written, the marker not yet
            (run / checkpoint_folder_name(step) / CHECKPOINT_MARKER).write_text(f'{{"step": {step}}}')
    loaded, config = load_model(find_checkpoint(str(run)))
    assert config == tiny_dense
    expected = models[4].embed.array
    np.testing.assert_array_equal(np.asarray(loaded.embed.array), np.asarray(expected))
    assert not np.array_equal(np.asarray(expected), np.asarray(models[6].embed.array))
