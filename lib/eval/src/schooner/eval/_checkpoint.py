"""Find and load the checkpoint to evaluate, without importing `schooner.train`.

A training run's output folder holds checkpoints `step-000123/`, each with a `config.json` that
`schooner.model.load_model` reads and, written last, a `checkpoint.json` marking it complete (the train loop
writes into `step-000123.tmp-<pid>/` and renames, but on object stores without atomic rename only the marker
tells a finished checkpoint from one being written). Evaluation takes either one checkpoint folder (anything
with a `config.json`, e.g. a `save_model` folder) or a run folder, in which case the latest complete checkpoint
(highest step with both files) is used. The marker name is the train package's layout contract; eval does not
import `schooner.train` to learn it.
"""

from __future__ import annotations

import re
from typing import Any

import fsspec

_STEP_DIR = re.compile(r"^step-(\d+)$")
_COMPLETE_MARKER = "checkpoint.json"


def _fs(path: str) -> tuple[Any, str]:
    fs, root = fsspec.core.url_to_fs(path)
    return fs, root.rstrip("/")


def list_checkpoints(run_path: str) -> list[tuple[int, str]]:
    """The complete checkpoints of a training run folder as `(step, path)` pairs, by increasing step."""
    fs, root = _fs(run_path)
    if not fs.isdir(root):
        raise FileNotFoundError(f"no training output folder at {run_path!r}")
    found = []
    for entry in fs.ls(root, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        match = _STEP_DIR.match(name)
        folder = entry.rstrip("/")
        if match and fs.exists(f"{folder}/config.json") and fs.exists(f"{folder}/{_COMPLETE_MARKER}"):
            found.append((int(match.group(1)), f"{run_path.rstrip('/')}/{name}"))
    return sorted(found)


def latest_checkpoint(path: str) -> str:
    """`path` itself if it is a checkpoint (has `config.json`), else its highest-step complete `step-*` folder.

    Raises:
        FileNotFoundError: no checkpoint there, naming the folder and what was looked for.
    """
    fs, root = _fs(path)
    if fs.exists(f"{root}/config.json"):
        return path.rstrip("/")
    checkpoints = list_checkpoints(path)
    if not checkpoints:
        raise FileNotFoundError(
            f"no checkpoint in {path!r}: expected a folder with config.json, or complete step-NNNNNN/ "
            "subfolders (config.json and checkpoint.json; a train_lm step's output); did training finish and "
            "save a checkpoint?"
        )
    return checkpoints[-1][1]


def load_checkpoint(path: str) -> tuple[Any, Any, str]:
    """Load the model of `latest_checkpoint(path)`; returns `(model, config, checkpoint_path)`."""
    from schooner.model import load_model

    folder = latest_checkpoint(path)
    model, config = load_model(folder)
    return model, config, folder
