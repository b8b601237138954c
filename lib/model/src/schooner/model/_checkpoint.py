"""Model folders (``config.json`` plus the model's tensorstore pytree under ``model/``) and finding the
checkpoints of a training run.

The checkpoint layout contract, shared by the trainer (which writes it) and every reader (evaluation,
initialising a run, export), lives here once: a training run's output folder holds ``step-000123/`` folders
(``checkpoint_folder_name``), each a model folder plus training state, completed by ``checkpoint.json``
(``CHECKPOINT_MARKER``), written last. The trainer writes into ``step-000123.tmp-<pid>/`` and renames, but on
object stores without atomic rename only the marker tells a finished checkpoint from one being written, so a
``step-*`` folder without it is never used.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import equinox as eqx
import fsspec
import jax

from ._config import LlamaConfig, config_from_dict, config_to_dict
from ._io import _open_kv, load_pytree, save_pytree
from ._transformer import Transformer, init

CONFIG_FILE = "config.json"
MODEL_DIR = "model"
CHECKPOINT_MARKER = "checkpoint.json"
"""Written last into a training checkpoint folder (the step, metrics, data position): marks it complete."""
_STEP_FOLDER = re.compile(r"^step-([0-9]{6,})$")
_STEP_TEMP = re.compile(r"^step-[0-9]{6,}\.tmp-")


def _sub(folder: str | os.PathLike, name: str) -> str:
    folder = os.fspath(folder)
    return folder.rstrip("/") + "/" + name if "://" in folder else os.path.join(folder, name)


def save_model(
    folder: str | os.PathLike,
    model: Transformer,
    config: LlamaConfig | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Write ``folder/config.json`` (``config_to_dict``) and ``folder/model/`` (the model's pytree).

    The pytree's commit file is written last, so an interrupted save is never mistaken for a model.
    A training checkpoint can hold other state next to it (e.g. ``save_pytree(folder + "/opt_state", ...)``)
    and still be loaded with :func:`load_model`.
    """
    config = model.config if config is None else config
    if config != model.config:
        raise ValueError(
            f"config does not match the model's own config:\n  given {config}\n  model {model.config}"
        )
    kv = _open_kv(folder)
    kv.write(CONFIG_FILE, json.dumps(config_to_dict(config), indent=2).encode()).result()
    save_pytree(_sub(folder, MODEL_DIR), model, overwrite=overwrite)


def read_config(folder: str | os.PathLike) -> LlamaConfig:
    """The model config stored in ``folder/config.json``."""
    result = _open_kv(folder).read(CONFIG_FILE).result()
    if result.state != "value":
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {os.fspath(folder)!r}; is it a folder written by save_model?"
        )
    data = json.loads(bytes(result.value))
    if isinstance(data, dict) and "model_type" in data and "type" not in data:
        raise ValueError(
            f"{os.fspath(folder)!r} holds a Hugging Face config.json (model_type={data['model_type']!r}), not a "
            "Schooner model config: load the folder with schooner.model.import_hf."
        )
    return config_from_dict(data)


def model_shapes(config: LlamaConfig) -> Transformer:
    """The model's structure with ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    return eqx.filter_eval_shape(init, config, key=jax.random.PRNGKey(0))


def load_model(
    folder: str | os.PathLike, *, sharding: Any = None, pytree_dir: str = MODEL_DIR, prefix: str = ""
) -> tuple[Transformer, LlamaConfig]:
    """Load ``(model, config)`` from a folder written by :func:`save_model` (or a training checkpoint).

    Args:
        folder: holds ``config.json`` and the pytree folder.
        sharding: restore onto these shardings (one Sharding, or a pytree like the model, e.g. from
            :func:`schooner.model.model_shardings`); default: one device.
        pytree_dir: the pytree's subfolder (``"model"``); ``""`` when the pytree is the folder itself.
        prefix: key-path prefix of the model inside a larger saved pytree (e.g. ``".model"`` when the
            checkpoint saved a train state whose ``model`` field is the model).
    """
    config = read_config(folder)
    path = _sub(folder, pytree_dir) if pytree_dir else os.fspath(folder)
    model = load_pytree(path, model_shapes(config), sharding=sharding, prefix=prefix)
    return model, config


def checkpoint_folder_name(step: int) -> str:
    """The folder name of a run's checkpoint of ``step``: ``step-000123`` for 123 (six digits at least).

    Example:
        >>> checkpoint_folder_name(123), checkpoint_step("step-000123"), checkpoint_step("step-000123.tmp-9")
        ('step-000123', 123, None)
    """
    return f"step-{step:06d}"


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """The step of a checkpoint folder named by :func:`checkpoint_folder_name` (a path or a name), else None."""
    match = _STEP_FOLDER.match(os.fspath(folder).rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def _fs(path: str) -> tuple[Any, str]:
    fs, root = fsspec.core.url_to_fs(path)
    return fs, root.rstrip("/")


def _entries(fs: Any, root: str) -> list[str]:
    return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False))


def list_checkpoints(run: str | os.PathLike, *, require_config: bool = True) -> list[tuple[int, str]]:
    """The complete checkpoints of a training run folder as ``(step, path)`` pairs, by increasing step.

    Complete: a ``step-NNNNNN/`` folder holding ``checkpoint.json`` and (``require_config``) ``config.json``,
    so :func:`load_model` loads it. Anything else (a ``.tmp-`` folder of an interrupted write, a folder whose
    marker is not written yet) is left out. Works on any fsspec path (``s3://``, ``memory://``, local).

    Args:
        run: the run folder (a ``train_lm`` step's output). A folder that does not exist has no checkpoints.
        require_config: False also lists folders without ``config.json``: what a ``CheckpointManager`` wrote
            with a ``write_fn`` that stores no model (it needs the marker only).
    """
    run = os.fspath(run).rstrip("/")
    fs, root = _fs(run)
    if not fs.isdir(root):
        return []
    needed = (CHECKPOINT_MARKER, CONFIG_FILE) if require_config else (CHECKPOINT_MARKER,)
    found = []
    for name in _entries(fs, root):
        step = checkpoint_step(name)
        if step is not None and all(fs.exists(f"{root}/{name}/{file}") for file in needed):
            found.append((step, f"{run}/{name}"))
    return sorted(found)


def _incomplete(fs: Any, root: str) -> str:
    """What a run folder holds that looks like a checkpoint but is not a complete one, for an error message."""
    notes = []
    for name in _entries(fs, root):
        if name.startswith("step-") and ".tmp-" in name:
            notes.append(f"{name} (an interrupted write)")
        elif checkpoint_step(name) is not None:
            missing = [f for f in (CHECKPOINT_MARKER, CONFIG_FILE) if not fs.exists(f"{root}/{name}/{f}")]
            if missing:
                notes.append(f"{name} (no {' or '.join(missing)}: still being written, or the write was cut)")
    return f"; incomplete: {', '.join(notes)}" if notes else ""


def find_checkpoint(path: str | os.PathLike, step: int | None = None, *, who: str = "") -> str:
    """The checkpoint folder that ``path`` names: ``path`` itself when it is a checkpoint (it holds
    ``config.json``: a run's ``step-NNNNNN/`` folder or a :func:`save_model` folder), else the run folder's
    latest complete checkpoint (see :func:`list_checkpoints`), or its checkpoint of ``step`` when given.

    Args:
        path: a checkpoint folder or a training run folder; any fsspec path (``s3://``, ``memory://``, local).
        step: a step of the run (None: the latest).
        who: prefix of error messages, naming the caller's argument (e.g. ``"export_hf: "``).

    Raises:
        FileNotFoundError: nothing at ``path``, no complete checkpoint in it, or none of ``step``; the message
            names the folder, the steps it has (and the incomplete ones) and what to do.
        ValueError: ``step`` given with a checkpoint folder (it has no steps to choose from).

    Example:
        >>> find_checkpoint("runs/nano")  # doctest: +SKIP
        'runs/nano/step-000200'
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"{who}step={step!r}: a step is a whole number >= 0 (or None for the latest)")
    path = os.fspath(path).rstrip("/")
    fs, root = _fs(path)
    if fs.exists(f"{root}/{CONFIG_FILE}"):
        name = root.rsplit("/", 1)[-1]
        temporary = _STEP_TEMP.match(name) is not None
        if temporary or (checkpoint_step(name) is not None and not fs.exists(f"{root}/{CHECKPOINT_MARKER}")):
            what = "a temporary write" if temporary else f"a run's step folder without {CHECKPOINT_MARKER}"
            raise FileNotFoundError(
                f"{who}{path!r} is an incomplete checkpoint: {what} (the train loop writes the marker last and "
                "then renames: still being written, or the write was cut); pass the run folder for its latest "
                "complete checkpoint"
            )
        if step is not None:
            raise ValueError(
                f"{who}{path!r} is one checkpoint (it holds {CONFIG_FILE}); step={step} names a step of a "
                "training run folder: pass the run folder, or leave the step out"
            )
        return path
    if not fs.isdir(root):
        raise FileNotFoundError(
            f"{who}no training output folder at {path!r} (nothing there): expected a checkpoint folder "
            f"({CONFIG_FILE}) or a training run folder (step-NNNNNN/ checkpoints); check the path"
        )
    found = list_checkpoints(path)
    if not found:
        raise FileNotFoundError(
            f"{who}no checkpoint in {path!r}: expected a checkpoint folder ({CONFIG_FILE}, e.g. "
            f"save_model's), or complete step-NNNNNN/ subfolders ({CONFIG_FILE} and {CHECKPOINT_MARKER}, which "
            f"the train loop writes last; a train_lm step's output){_incomplete(fs, root)}; did training "
            "finish and save a checkpoint?"
        )
    if step is None:
        return found[-1][1]
    for s, folder in found:
        if s == step:
            return folder
    raise FileNotFoundError(
        f"{who}{path!r} has no complete checkpoint {checkpoint_folder_name(step)}/ (no complete checkpoint of "
        f"step {step}); it has steps {[s for s, _ in found]}{_incomplete(fs, root)} (older ones may have "
        "been removed: CheckpointConfig(keep_every=) keeps chosen steps for good)"
    )
