"""`schooner export-hf` on the command line: input errors are one-line CLI errors (exit 2, no traceback, nothing
written), and a checkpoint without a tokenizer is refused unless `--no-tokenizer` asks for the weights alone."""

from __future__ import annotations

import json

import jax
import pytest

from schooner.cluster.cli import main
from schooner.model import init, save_model


@pytest.fixture(scope="module")
def run_folder(nano, tmp_path_factory) -> str:
    """A run folder whose only complete checkpoint is step 5 (a saved model and its checkpoint.json)."""
    root = tmp_path_factory.mktemp("run")
    save_model(str(root / "step-000005"), init(nano(), key=jax.random.PRNGKey(0)), nano())
    (root / "step-000005" / "checkpoint.json").write_text(json.dumps({"step": 5}))
    return str(root)


def test_a_missing_step_is_a_one_line_error(run_folder, tmp_path, capsys) -> None:
    out = tmp_path / "hf"
    assert main(["export-hf", run_folder, str(out), "--step", "3"]) == 2
    printed = capsys.readouterr()
    text = " ".join((printed.out + printed.err).split())  # the console may wrap the line
    assert "has no complete checkpoint step-000003" in text and "[5]" in text
    assert "Traceback" not in text
    assert not out.exists()


def test_a_checkpoint_without_a_tokenizer_is_refused_before_anything_is_written(
    run_folder, tmp_path, capsys
) -> None:
    out = tmp_path / "hf"
    assert main(["export-hf", f"{run_folder}/step-000005", str(out)]) == 2
    text = capsys.readouterr().out
    assert "--tokenizer" in text and "--no-tokenizer" in text
    assert not out.exists()


def test_no_tokenizer_exports_the_weights_without_null_token_ids(run_folder, tmp_path, capsys) -> None:
    out = tmp_path / "hf"
    assert main(["export-hf", f"{run_folder}/step-000005", str(out), "--no-tokenizer"]) == 0
    assert "without a tokenizer" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert not [k for k in config if k.endswith("_token_id")]  # no "bos_token_id": null
    generation = json.loads((out / "generation_config.json").read_text())
    assert None not in generation.values()
    assert not (out / "tokenizer.json").exists()
    assert json.loads((out / "export.json").read_text())["tokenizer"] is None
