"""Find and load the checkpoint to evaluate, without importing `schooner.train`.

Evaluation takes either one checkpoint folder (anything with a `config.json`, e.g. a `save_model` folder) or a
training run folder, in which case its latest complete `step-NNNNNN/` checkpoint is used. Finding it is
`schooner.model.find_checkpoint`, where the checkpoint layout contract (folder names, the `checkpoint.json`
marker the train loop writes last) lives; `schooner.eval` exports it and `list_checkpoints` under the same
names.
"""

from __future__ import annotations

from typing import Any

from schooner.model import find_checkpoint, list_checkpoints

__all__ = ["find_checkpoint", "list_checkpoints", "load_checkpoint"]


def check_tokenizer(folder: str, tokenizer: Any) -> None:
    """A ValueError when `folder`'s `checkpoint.json` records a tokenizer fingerprint other than `tokenizer`'s, or
    BOS/EOS ids (`tokenizer_special_ids`) other than its.

    The train loop records the run's tokenizer there. Another tokenizer of the same vocabulary size gives valid
    ids and wrong scores (every task, sample and harness request), so it is refused; a checkpoint without the
    record (a `save_model` folder) or a tokenizer without a fingerprint is not checked.
    """
    from schooner.cluster import storage
    from schooner.model import CHECKPOINT_MARKER

    theirs = getattr(tokenizer, "fingerprint", None)
    marker = storage.join(folder, CHECKPOINT_MARKER)
    if theirs is None or not storage.exists(marker):
        return
    try:
        meta = storage.read_json(marker)
        recorded = meta.get("tokenizer_fingerprint")
    except (ValueError, AttributeError):
        return
    if recorded and recorded != theirs:
        raise ValueError(
            f"checkpoint {folder} was trained with the tokenizer of fingerprint {recorded} (its "
            f"{CHECKPOINT_MARKER}) but the tokenizer given has fingerprint {theirs} "
            f"({getattr(tokenizer, 'source', 'unnamed')}); its ids mean other text to this model: pass the "
            "tokenizer the run was trained with"
        )
    # The same tokenizer.json with other special tokens (its tokenizer_config.json): the model learnt to end
    # documents with the recorded EOS. Checkpoints written before the ids were recorded are not checked.
    ids = meta.get("tokenizer_special_ids")
    for key, built in ids.items() if isinstance(ids, dict) else ():
        given = getattr(tokenizer, key, None)
        if key in ("bos_id", "eos_id") and given != built:
            raise ValueError(
                f"checkpoint {folder} was trained with {key}={built} (its {CHECKPOINT_MARKER}) but the tokenizer "
                f"given ({getattr(tokenizer, 'source', 'unnamed')}, the same tokenizer.json) has {key}={given}: "
                "its tokenizer_config.json names other special tokens; load the tokenizer with the ones the run "
                "was trained with"
            )


def load_checkpoint(path: str, *, tokenizer: Any = None) -> tuple[Any, Any, str]:
    """Load the model of `find_checkpoint(path)`; returns `(model, config, checkpoint_path)`.

    With `tokenizer`, the checkpoint must have been trained with it (`check_tokenizer`).
    """
    from schooner.model import load_model

    folder = find_checkpoint(path)
    if tokenizer is not None:
        check_tokenizer(folder, tokenizer)
    model, config = load_model(folder)
    return model, config, folder
