"""Before a run resumes from its folder: is this config the same run as the one recorded there?

The folder's `run.json` holds the config of the run that wrote it. A config that differs in any field other
than `CHANGEABLE_ON_RESUME` (and, inside a field, `CHANGEABLE_NESTED_ON_RESUME`) is another run, refused
with each differing field named; a longer or shorter run whose learning-rate schedule spans its length is
resumed with a warning giving the next step's rate before and after.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from schooner.cluster import published_paths, storage

from ._config import TrainerConfig
from ._run_info import config_to_json

logger = logging.getLogger("schooner.train")


def check_same_run(
    config: TrainerConfig, root: str, checkpoint: str, start_step: int
) -> dict[str, Any] | None:
    """Before resuming: refuse a config that is another run than the one in the folder (its `run.json`),
    naming each differing field; say when a longer run changes the learning rate of the next step. Returns the
    folder's `run.json` record (None without one)."""
    recorded = _read_run_json(root)
    old = (recorded or {}).get("config")
    if not isinstance(old, dict) or "datasets" not in old:
        return recorded  # no record, or one of schooner-train 0.x: nothing to compare
    new = config_record(config)
    differences = [
        d
        for key in sorted(set(old) & set(new))  # a field added or removed since: nothing to compare
        if key not in CHANGEABLE_ON_RESUME
        for d in _differences(old.get(key), new.get(key), key)
    ]
    if differences:
        raise ValueError(
            f"train: {root} holds a different run (its run.json, checkpoint {checkpoint}); this config "
            "differs in " + "; ".join(differences) + ". Resuming would continue that run under these "
            "settings and overwrite its record: give this run another output_path (or start from that "
            "checkpoint with initialize_from=), or the original values. Only "
            f"{', '.join(sorted(CHANGEABLE_ON_RESUME))} may change when a run is resumed."
        )
    _warn_schedule_change(config, root, start_step, old)
    return recorded


def _warn_schedule_change(config: TrainerConfig, root: str, start_step: int, old: dict[str, Any]) -> None:
    """A longer (or shorter) run whose schedule spans its length: the next step's rate is not the one
    the run was heading for. Said, with both values."""
    import dataclasses

    cfg, s = config, start_step
    if s >= cfg.steps or (old.get("num_train_steps"), old.get("train_tokens")) == (
        cfg.num_train_steps,
        cfg.train_tokens,
    ):
        return
    try:
        before = dataclasses.replace(
            cfg, num_train_steps=old.get("num_train_steps"), train_tokens=old.get("train_tokens")
        )
        lr_old = float(before.optimizer.lr_schedule(before.steps)(s))
    except (ValueError, TypeError):
        return
    lr_new = float(cfg.optimizer.lr_schedule(cfg.steps)(s))
    if abs(lr_new - lr_old) <= 1e-6 * max(abs(lr_old), 1e-30):
        return
    logger.warning(
        f"resuming {root} at step {s} with {before.steps} -> {cfg.steps} steps: the "
        f"{cfg.optimizer.schedule!r} schedule spans the run, so the learning rate of step {s + 1} jumps "
        f"from {lr_old:.3g} (where the {before.steps}-step run was) to {lr_new:.3g}. For a smooth "
        "continuation use schedule='constant' (or 'wsd' resumed before its decay); or start a new run from "
        "this checkpoint with initialize_from= and a schedule of its own"
    )


CHANGEABLE_ON_RESUME = frozenset(
    {
        "num_train_steps",  # a longer run continues the same one (see `_warn_schedule_change`)
        "train_tokens",
        "eval_every",
        "eval_max_tokens",
        "validation",
        "evals",
        "tokenizer",
        "mesh",  # other devices: the same run, sharded another way
        "microbatches",  # the same gradient, less memory
        "checkpoint",
        "trackers",
        "name",
        "output_path",
    }
)
"""`TrainerConfig` fields that may differ between a run folder's `run.json` and the config resuming it; any
other difference is another run, refused."""

CHANGEABLE_NESTED_ON_RESUME = frozenset({"objective.rollout_workers"})
"""Fields inside a config field that may differ on resume too: where the rollouts are sampled (the same
rollouts, bitwise, for any number of workers)."""


def config_record(config: TrainerConfig) -> Any:
    """The config as `run.json` records it: JSON values, paths as they read once published."""
    return json.loads(storage.dumps_json(published_paths(config_to_json(config)), default=str))


def _read_run_json(root: str) -> dict[str, Any] | None:
    path = storage.join(root, "run.json")
    if not storage.exists(path):
        return None
    try:
        record = storage.read_json(path)
    except ValueError:
        return None  # unreadable: nothing to compare
    return record if isinstance(record, dict) else None


def _differences(old: Any, new: Any, where: str) -> list[str]:
    """`where: old -> new` for each leaf that differs (dicts compared on the keys both hold: a field one
    version of the config lacks is not a difference of the run)."""
    if where in CHANGEABLE_NESTED_ON_RESUME:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) & set(new)) for d in _differences(old[k], new[k], f"{where}.{k}")]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]
