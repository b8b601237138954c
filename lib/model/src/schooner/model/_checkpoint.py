"""Model folders: ``config.json`` plus the model's tensorstore pytree under ``model/``."""

from __future__ import annotations

import json
import os
from typing import Any

import equinox as eqx
import jax

from ._config import LlamaConfig, config_from_dict, config_to_dict
from ._io import _open_kv, load_pytree, save_pytree
from ._transformer import Transformer, init

CONFIG_FILE = "config.json"
MODEL_DIR = "model"


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
    return config_from_dict(json.loads(bytes(result.value)))


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
