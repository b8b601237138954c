"""Step builders for evaluation: `evaluate(...)` scores a training run's latest checkpoint on token caches.

Example:
    >>> from schooner.eval.steps import evaluate
    >>> ev = evaluate(
    ...     "eval/nano",
    ...     checkpoint=model,                       # a train_lm handle (or a checkpoint / run folder path)
    ...     datasets={"docs": docs, "code": code},  # tokenized handles (their validation split) or cache paths
    ...     tokenizer=tokenizer,                    # the tokenizer step handle (or a tokenizer folder)
    ...     seq_len=256,
    ... )

The step's output folder holds `results.json` (per-dataset loss, bits-per-byte, token and byte counts, the
averages, the checkpoint evaluated and greedy samples) and `samples.json`; the step's return value (kept in
its step record) is a small summary of the same.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

import fsspec

from schooner.cluster import ResourceConfig, step

from ._checkpoint import load_checkpoint
from ._generate import generate
from ._lm_eval import evaluate_lm

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """What the evaluate step scores. Handles are replaced by their output paths when the step runs.

    Attributes:
        checkpoint: a train_lm step handle or a path: a checkpoint folder or a run folder (latest checkpoint).
        datasets: evaluation set name -> tokenized step handle / cache folder. For a tokenized step's output
            (which holds `train/` and `validation/` caches) the `split` subfolder is used.
        tokenizer: the tokenizer (step handle or folder with tokenizer.json), for bits-per-byte and samples.
        seq_len: scoring window length in tokens; at most the model's `max_seq_len`.
        batch_size: windows per device call (speed only; the numbers do not depend on it).
        max_tokens: score only the first `max_tokens` tokens of each dataset (None: all of it).
        split: which split of a tokenized step's output to score.
        prompts: prompts for greedy samples written next to the scores.
        max_new_tokens: tokens per greedy sample.
        respect_documents: score documents separately, as training masks attention across them.
    """

    checkpoint: Any
    datasets: dict[str, Any]
    tokenizer: Any
    seq_len: int
    batch_size: int = 8
    max_tokens: int | None = None
    split: str = "validation"
    prompts: tuple[str, ...] = ("The",)
    max_new_tokens: int = 48
    respect_documents: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.datasets, Mapping) or not self.datasets:
            raise ValueError(f"datasets must be a non-empty dict of name -> dataset, got {self.datasets!r}")
        for name in self.datasets:
            if not isinstance(name, str) or not name:
                raise ValueError(f"dataset names must be non-empty strings, got {name!r} in datasets")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got seq_len={self.seq_len}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got batch_size={self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens must be None or >= 2, got max_tokens={self.max_tokens}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got max_new_tokens={self.max_new_tokens}")
        if isinstance(self.prompts, str):
            raise ValueError(
                f"prompts must be a tuple of strings, got the string {self.prompts!r}; wrap it: (p,)"
            )


def evaluate(
    name: str,
    *,
    checkpoint: Any,
    datasets: Mapping[str, Any],
    tokenizer: Any,
    seq_len: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
    split: str = "validation",
    prompts: tuple[str, ...] | list[str] = ("The",),
    max_new_tokens: int = 48,
    respect_documents: bool = True,
    resources: ResourceConfig | None = None,
    description: str = "",
) -> Any:
    """A step that evaluates a checkpoint's loss and bits-per-byte on token caches (see `EvaluateConfig`).

    Returns:
        The step handle; its output folder holds `results.json` and `samples.json`.
    """
    config = EvaluateConfig(
        checkpoint=checkpoint,
        datasets=dict(datasets),
        tokenizer=tokenizer,
        seq_len=seq_len,
        batch_size=batch_size,
        max_tokens=max_tokens,
        split=split,
        prompts=tuple(prompts),
        max_new_tokens=max_new_tokens,
        respect_documents=respect_documents,
    )
    return step(
        name,
        _run_evaluate,
        config,
        version="evaluate-v1",
        resources=resources,
        description=description or f"loss and bits-per-byte on {', '.join(sorted(config.datasets))}",
    )


def resolve_cache_path(path: str, split: str) -> str:
    """`path/split` when `path` is a tokenized step's output holding that split, else `path` itself."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    if fs.isdir(f"{root}/{split}"):
        return f"{path.rstrip('/')}/{split}"
    return path


def _write_json(path: str, value: Any) -> None:
    with fsspec.open(path, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


def _run_evaluate(config: EvaluateConfig, output_path: str) -> dict[str, Any]:
    from schooner.tokenize import load_tokenizer

    tokenizer = load_tokenizer(str(config.tokenizer))
    model, model_config, checkpoint = load_checkpoint(str(config.checkpoint))
    max_seq_len = getattr(model_config, "max_seq_len", None)
    if max_seq_len is not None and config.seq_len > max_seq_len:
        raise ValueError(
            f"evaluate: seq_len={config.seq_len} exceeds the model's max_seq_len={max_seq_len} "
            f"(checkpoint {checkpoint}); use seq_len <= {max_seq_len}"
        )
    caches = {name: resolve_cache_path(str(path), config.split) for name, path in config.datasets.items()}
    logger.info("evaluating %s on %s", checkpoint, ", ".join(f"{k}={v}" for k, v in caches.items()))
    results = evaluate_lm(
        model,
        caches,
        tokenizer=tokenizer,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        max_tokens=config.max_tokens,
        respect_documents=config.respect_documents,
    )
    samples = [
        {
            "prompt": prompt,
            "completion": generate(
                model, tokenizer, prompt, config.max_new_tokens, max_seq_len=max_seq_len or config.seq_len
            ),
        }
        for prompt in config.prompts
    ]
    results.update(checkpoint=checkpoint, caches=caches, tokenizer_fingerprint=tokenizer.fingerprint)
    results["samples"] = samples
    fs, root = fsspec.core.url_to_fs(output_path)
    fs.makedirs(root, exist_ok=True)
    _write_json(f"{output_path.rstrip('/')}/samples.json", samples)
    _write_json(f"{output_path.rstrip('/')}/results.json", results)
    summary = {
        name: {k: d[k] for k in ("loss", "bpb", "tokens") if k in d}
        for name, d in results["datasets"].items()
    }
    return {"datasets": summary, "average": results["average"], "checkpoint": checkpoint, "samples": samples}
