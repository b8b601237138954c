"""Find and load the checkpoint to evaluate, without importing `schooner.train`.

Evaluation takes either one checkpoint folder (anything with a `config.json`, e.g. a `save_model` folder) or a
training run folder, in which case its latest complete `step-NNNNNN/` checkpoint is used. Finding it is
`schooner.model.find_checkpoint`, where the checkpoint layout contract (folder names, the `checkpoint.json`
marker the train loop writes last) lives; `latest_checkpoint` and `list_checkpoints` are kept here as names
of the eval API.
"""

from __future__ import annotations

from typing import Any

from schooner.model import find_checkpoint, list_checkpoints

__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint"]


def latest_checkpoint(path: str) -> str:
    """`path` itself if it is a checkpoint (has `config.json`), else its highest-step complete `step-*` folder.

    The same as `schooner.model.find_checkpoint(path)`.

    Raises:
        FileNotFoundError: no checkpoint there, naming the folder, what was looked for and what it holds.
    """
    return find_checkpoint(path)


def load_checkpoint(path: str) -> tuple[Any, Any, str]:
    """Load the model of `latest_checkpoint(path)`; returns `(model, config, checkpoint_path)`."""
    from schooner.model import load_model

    folder = find_checkpoint(path)
    model, config = load_model(folder)
    return model, config, folder
