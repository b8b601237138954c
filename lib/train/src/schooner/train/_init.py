"""Initialising a run from trained weights: a `train_lm` run folder (its last or a named checkpoint), a
checkpoint folder, or a Hugging Face folder (through `schooner.model.import_hf`).

Only the weights are taken: the optimizer state, the step and the learning-rate schedule start fresh. The
source's architecture must equal the run's, field by field, except for the fields that do not change the
parameters (`RUNTIME_FIELDS`: precision, kernels, the layer loop, loss chunking, rematerialisation,
attention backend, context length, init scale, the MoE losses' weights, balancing rate and re-solve,
grouped-matmul kernel and capacity) and `vocab_size`, which may grow: the new rows of the embedding (and of the
output head) start at the mean of the source's rows, as `transformers`' `resize_token_embeddings(...,
mean_resizing=True)` does, so a new special token starts as an average token instead of a random one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import numpy as np

from schooner.model import CHECKPOINT_MARKER, find_checkpoint, list_checkpoints
from schooner.model import RUNTIME_FIELDS as MODEL_RUNTIME_FIELDS

logger = logging.getLogger("schooner.train")

RUNTIME_FIELDS = MODEL_RUNTIME_FIELDS
"""Model config fields that may differ between the source and the run: ``schooner.model.RUNTIME_FIELDS``
(they change no parameter)."""
_RESOLVED = {"head_dim": "resolved_head_dim", "shared_intermediate_dim": "resolved_shared_dim"}
"""Fields compared by their resolved value (None means "derived from the other fields")."""


def _exists(path: str) -> bool:
    from schooner.cluster import storage

    return storage.exists(path)


def resolve_source(path: str, step: int | None = None, *, field: str = "initialize_from") -> tuple[str, str]:
    """`(kind, folder)` of an `initialize_from` path: kind `"schooner"` (a checkpoint folder) or `"hf"`.

    A run folder resolves to its latest complete checkpoint, or to `step-NNNNNN` when `step` is given
    (`schooner.model.find_checkpoint`). Errors name the argument `field` (and `{field}_step`): a step builder
    whose argument is `checkpoint` passes `field="checkpoint"`.

    Raises:
        FileNotFoundError: `path` does not exist, nothing loadable is there, or the run has no checkpoint of
            that step.
    """
    path = os.fspath(path).rstrip("/")
    if _exists(f"{path}/config.json"):
        if _exists(f"{path}/model"):
            if step is not None:
                raise ValueError(
                    f"{field}={path!r} is one checkpoint; {field}_step={step} names a step of a run folder: pass "
                    "the run folder, or leave the step out"
                )
            return "schooner", path
        if _exists(f"{path}/model.safetensors") or _exists(f"{path}/model.safetensors.index.json"):
            if step is not None:
                raise ValueError(f"{field}={path!r} is a Hugging Face folder: it has no steps")
            return "hf", path
    elif list_checkpoints(path):
        return "schooner", find_checkpoint(path, step, who=f"{field}=")
    if not _exists(path):
        raise FileNotFoundError(
            f"{field}={path!r} does not exist; give a training run folder, a checkpoint folder (config.json + "
            "model/) or a Hugging Face folder (config.json + model.safetensors), or the step that trains it"
        )
    raise FileNotFoundError(
        f"{field}={path!r} is not a training run (no complete step-*/{CHECKPOINT_MARKER}), a checkpoint "
        "folder (config.json + model/) or a Hugging Face folder (config.json + model.safetensors)"
    )


@dataclasses.dataclass(frozen=True)
class InitialCheckpoint:
    """An `initialize_from` path pinned when the step is built: the checkpoint it resolves to, and that folder's
    metadata by content, so the step key names the checkpoint actually used.

    A run folder resolves to its latest complete checkpoint (or `initialize_from_step`'s), so a run that gains
    a checkpoint gives a new step instead of a cached one trained from the old latest. The key holds the
    checkpoint folder's name and a content hash of its `config.json` and `checkpoint.json` (the train loop
    writes it last, with the step, metrics and time); a Hugging Face folder's key holds its path, `config.json`
    and its weights' index (or, for one file, the size and head and tail of `model.safetensors`: see
    `InputFiles`). The weights themselves are not hashed (gigabytes): rewriting them in place without a new
    `checkpoint.json` (or, for an HF folder, without changing the file's size, head or tail) is not seen;
    write a new folder instead. A step handle is not pinned: it stays keyed by the upstream step's key.

    Attributes:
        path: the checkpoint (or Hugging Face) folder.
        metadata: the `InputFiles` of its metadata files.
    """

    path: str
    metadata: Any

    @staticmethod
    def of(path: str, step: int | None = None) -> InitialCheckpoint:
        """The checkpoint `path` (with `step`: see `resolve_source`) resolves to now.

        Raises:
            FileNotFoundError: `path` does not exist, nothing loadable is there, or the run has no checkpoint of
            that step.
        """
        return InitialCheckpoint.at(*resolve_source(os.fspath(path), step))

    @staticmethod
    def at(kind: str, folder: str) -> InitialCheckpoint:
        """The `folder` of `kind` that `resolve_source` resolved a path to, pinned without resolving it again
        (a caller that checked the path with `resolve_source` pins what it checked)."""
        from schooner.cluster import InputFiles

        names = [f"{folder}/config.json"]
        if kind == "schooner":
            names += [f"{folder}/{CHECKPOINT_MARKER}"] if _exists(f"{folder}/{CHECKPOINT_MARKER}") else []
        elif _exists(f"{folder}/model.safetensors.index.json"):
            names.append(f"{folder}/model.safetensors.index.json")
        else:
            names.append(f"{folder}/model.safetensors")
        return InitialCheckpoint(folder, InputFiles(names))

    def __str__(self) -> str:
        return self.path

    def __fspath__(self) -> str:
        return self.path

    def __schooner_canonical__(self) -> dict[str, Any]:
        marked = any(e.name == CHECKPOINT_MARKER for e in self.metadata.entries)
        where = os.path.basename(self.path.rstrip("/")) if marked else self.path
        return {"__class__": "InitialCheckpoint", "checkpoint": where, "metadata": self.metadata}


def pin_initialize_from(source: Any, step: int | None) -> tuple[Any, int | None]:
    """`(initialize_from, initialize_from_step)` for a step config: a path becomes an `InitialCheckpoint`
    (resolved now, the step folded into it); a step handle or a path inside one (`InputPath`, resolved when
    the step runs, keyed by that step's key), or None, is kept as it is."""
    from schooner.cluster import InputPath, StepHandle

    if source is None or isinstance(source, StepHandle | InputPath | InitialCheckpoint):
        return source, step
    return InitialCheckpoint.of(os.fspath(source), step), None


def source_config(path: str, step: int | None = None) -> Any:
    """The model config stored at an `initialize_from` path (see `resolve_source`)."""
    from schooner.cluster import storage
    from schooner.model import config_from_hf, read_config

    kind, folder = resolve_source(path, step)
    if kind == "schooner":
        return read_config(folder)
    # A Hugging Face file, read as `transformers` (and `import_hf`) read it: Python's json, which takes the
    # NaN and Infinity that `transformers` writes for such attributes (`storage.read_json` refuses them).
    return config_from_hf(json.loads(storage.read_text(storage.join(folder, "config.json"))))


def check_compatible(run: Any, source: Any, *, where: str) -> None:
    """Raise ValueError naming every field (with both values) where `source`'s architecture differs from `run`'s.

    `vocab_size` may grow (the run's >= the source's); the `RUNTIME_FIELDS` may differ.
    """
    if type(run) is not type(source):
        raise ValueError(
            f"initialize_from {where}: the source is a {type(source).__name__}, the run a {type(run).__name__}; "
            "use the source's model config (train_lm(model=None) takes it from the source)"
        )
    differ = []
    for f in dataclasses.fields(run):
        if f.name in RUNTIME_FIELDS or f.name == "vocab_size":
            continue
        name = _RESOLVED.get(f.name, f.name)
        a, b = getattr(run, name), getattr(source, name)
        if a != b:
            differ.append(f"  {f.name!r} differs: the source has {f.name}={b!r}, this run {f.name}={a!r}")
    if differ:
        raise ValueError(
            f"initialize_from {where}: {len(differ)} model config field{'s' if len(differ) > 1 else ''} "
            f"differ{'' if len(differ) > 1 else 's'} from the source's:\n" + "\n".join(differ) + "\nuse the "
            "source's values (or model=None to take the source's config)"
        )
    if run.vocab_size < source.vocab_size:
        raise ValueError(
            f"initialize_from {where}: the run's vocab_size={run.vocab_size} is smaller than the source's "
            f"{source.vocab_size}; the vocabulary can grow (new special tokens), not shrink"
        )


def grow_vocab(model: Any, config: Any) -> Any:
    """`model` rebuilt for `config`, whose `vocab_size` may exceed the model's: every parameter with a vocab
    axis gets new rows equal to the mean of its old rows (float32); everything else is kept as is."""
    import jax

    from schooner.model import model_shapes

    old_v, new_v = model.config.vocab_size, config.vocab_size
    target = model_shapes(config)
    leaves, _ = jax.tree.flatten(model)
    shapes, treedef = jax.tree.flatten(target)
    if len(leaves) != len(shapes):
        raise ValueError(f"cannot map the source's {len(leaves)} arrays onto the run's {len(shapes)}")
    out = []
    for x, s in zip(leaves, shapes):
        if tuple(x.shape) == tuple(s.shape):
            out.append(x)
            continue
        diff = [i for i, (a, b) in enumerate(zip(x.shape, s.shape)) if a != b]
        if (
            len(x.shape) != len(s.shape)
            or len(diff) != 1
            or (x.shape[diff[0]], s.shape[diff[0]]) != (old_v, new_v)
        ):
            raise ValueError(f"source array of shape {x.shape} does not fit the run's {s.shape}")
        axis = diff[0]
        arr = np.asarray(jax.device_get(x))
        mean = arr.mean(axis=axis, keepdims=True)
        extra = np.repeat(mean, new_v - old_v, axis=axis)
        out.append(np.concatenate([arr, extra], axis=axis).astype(s.dtype))
    if new_v > old_v:
        logger.info(f"vocab_size {old_v} -> {new_v}: {new_v - old_v} new rows start at the mean row")
    return jax.tree.unflatten(treedef, out)


def load_initial_model(path: str, run_config: Any, step: int | None = None) -> tuple[Any, str]:
    """The run's initial model from an `initialize_from` path, and the folder its weights came from.

    The source's arrays are read into the run's architecture (with the source's vocab), checked with
    `check_compatible`, then grown to the run's `vocab_size` (`grow_vocab`).
    """
    from schooner.model import import_hf, load_pytree, model_shapes

    kind, folder = resolve_source(path, step)
    src = source_config(folder)
    check_compatible(run_config, src, where=f"{folder!r}")
    as_source = dataclasses.replace(run_config, vocab_size=src.vocab_size)
    if kind == "schooner":
        model = load_pytree(f"{folder}/model", model_shapes(as_source))
    else:
        model, _ = import_hf(folder, config=as_source)
    logger.info(
        f"initialised from {folder} ({'Hugging Face' if kind == 'hf' else 'checkpoint'}; fresh optimizer)"
    )
    return grow_vocab(model, run_config), folder
