"""Step builders for evaluation: `evaluate(...)` scores a checkpoint on token caches and tasks; `task_texts(...)`
writes tasks' evaluation texts as records (what `schooner.data.curation.decontaminate(against=...)` reads).

Example:
    >>> from schooner.eval.steps import evaluate
    >>> ev = evaluate(
    ...     "eval/nano",
    ...     checkpoint=model,                       # a train_lm handle (or a checkpoint / run folder path)
    ...     datasets={"docs": docs, "code": code},  # tokenized handles (their validation split) or cache paths
    ...     tokenizer=tokenizer,                    # the tokenizer step handle (or a tokenizer folder)
    ...     seq_len=256,
    ...     tasks=["bundled", core_suite("/data/core")],  # log-likelihood tasks and suites
    ... )

The step's output folder holds `results.json` (per-dataset loss, bits-per-byte, token and byte counts, the
averages, per-task metrics with standard errors, chance and reference scores, the checkpoint evaluated and
greedy samples), `samples.json` and `tasks/<task>.jsonl` (per document: the gold index, every choice's
log-probability and greedy flag, the per-document metrics: what re-derives the task's scores; each task's
`documents_file` in results.json names it); the step's return value (kept in its step record) is a summary.

What enters the step key (so what reruns it):

* a task's settings and its files' content: each `Task`'s file and few-shot file are `InputFiles` (name, size,
  content hash), not paths, so editing a task file reruns the step and moving the folder reruns nothing. A
  task read from YAML enters by its parsed settings (edit the YAML, the step reruns).
* a checkpoint given as a path is resolved when the step is built: a run folder to its highest complete
  `step-*` (so a run that gains a checkpoint gives a new step), and the key holds the checkpoint folder's name
  and a content hash of its `config.json` and `checkpoint.json` (the train loop writes it last, with the step,
  metrics and time). The weights are not hashed (gigabytes): rewriting them in place without a new
  `checkpoint.json` is not seen. A folder with no `checkpoint.json` (a `save_model` folder) is keyed by its
  path and its `config.json`. A train_lm handle stays keyed by the handle's own key.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

from schooner.cluster import InputPath, ResourceConfig, StepHandle, step

from ._evaluate_step import _run_evaluate, _run_evaluate_checkpoints
from ._kv_generate import SamplingConfig
from ._step_config import (
    EvaluateCheckpointsConfig,
    EvaluateConfig,
    TaskLike,
    TaskTextsConfig,
)
from ._step_config import checkpoint_input as _checkpoint_input
from ._step_config import run_checkpoints as _run_checkpoints
from ._task_texts import _run_task_texts

__all__ = [
    "EvaluateCheckpointsConfig",
    "EvaluateConfig",
    "TaskLike",
    "TaskTextsConfig",
    "evaluate",
    "evaluate_checkpoints",
    "task_texts",
]


def evaluate(
    name: str,
    *,
    checkpoint: Any,
    datasets: Mapping[str, Any] | None = None,
    tokenizer: Any,
    seq_len: int,
    tasks: list[TaskLike] | tuple[TaskLike, ...] = (),
    task_batch_size: int = 16,
    sampling: SamplingConfig | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    split: str = "validation",
    prompts: tuple[str, ...] | list[str] = ("The",),
    max_new_tokens: int = 48,
    respect_documents: bool = True,
    resources: ResourceConfig | None = None,
    description: str = "",
) -> Any:
    """A step that evaluates a checkpoint's loss and bits-per-byte on token caches and its scores on tasks
    (see `EvaluateConfig`).

    Returns:
        The step handle; its output folder holds `results.json` and `samples.json`.
    """
    config = EvaluateConfig(
        checkpoint=checkpoint,
        datasets=dict(datasets or {}),
        tokenizer=tokenizer,
        seq_len=seq_len,
        batch_size=batch_size,
        max_tokens=max_tokens,
        split=split,
        prompts=tuple(prompts),
        max_new_tokens=max_new_tokens,
        respect_documents=respect_documents,
        tasks=tuple(tasks),
        task_batch_size=task_batch_size,
        sampling=sampling,
    )
    config = dataclasses.replace(config, checkpoint=_checkpoint_input(checkpoint))  # after the checks above
    what = [f"loss and bits-per-byte on {', '.join(sorted(config.datasets))}"] if config.datasets else []
    what += [f"{len(config.tasks)} task(s)/suite(s)"] if config.tasks else []
    return step(
        name,
        _run_evaluate,
        config,
        version="evaluate-v6",
        resources=resources,
        description=description or "; ".join(what),
    )


def task_texts(
    name: str, *, tasks: list[TaskLike] | tuple[TaskLike, ...], include_fewshot: bool = True
) -> Any:
    """A step writing every task document's texts as records, for decontamination.

    One record per document: `{"id": "<task>/<index>", "text": <contexts and every choice, one per line>,
    "source": <task>, "metadata": {"task", "index", "split": "eval"|"fewshot", "path"}}`; the step's output
    folder is a `schooner.data` record folder (`part-*.jsonl.zst` + `manifest.json`; the bundled tasks' own
    jsonl files, when asked for, sit in its `bundled-tasks/` subfolder, outside the manifest). Pass the handle to
    `schooner.data.curation.steps.decontaminate(..., against=<handle>)`; nothing in `schooner.data` imports
    this package.

    Example:
        >>> texts = task_texts("eval/core-texts", tasks=[core_suite("/data/core"), "bundled"])
    """
    config = TaskTextsConfig(tasks=tuple(tasks), include_fewshot=include_fewshot)
    return step(
        name, _run_task_texts, config, version="task-texts-v2", description="evaluation texts as records"
    )


def evaluate_checkpoints(
    name: str, *, run: Any, resources: ResourceConfig | None = None, **settings: Any
) -> Any:
    """A step evaluating every complete `step-*` checkpoint of a training run, with `evaluate`'s settings.

    Its output folder holds one `step-NNNNNN/` folder per checkpoint (`results.json`, `samples.json`),
    `scores.json` (one row per step: each dataset's loss/bpb and each task's acc) and `scores.png` (the scores
    against the training step).

    Example:
        >>> curve = evaluate_checkpoints("eval/nano-curve", run=model, tokenizer=tok, seq_len=256, tasks=["bundled"])
    """
    settings.setdefault("datasets", {})
    if isinstance(run, str | os.PathLike) and not isinstance(run, StepHandle | InputPath):
        # a run folder: its complete checkpoints now, each keyed as `evaluate` keys one (a new one reruns)
        run = _run_checkpoints(run)
    config = EvaluateCheckpointsConfig(EvaluateConfig(checkpoint=run, **settings))
    return step(
        name,
        _run_evaluate_checkpoints,
        config,
        version="evaluate-checkpoints-v5",
        resources=resources,
        description="scores of every checkpoint of a run",
    )


# Names this module held before its helpers moved out (0.1): importable from here for one release, with a warning.
_MOVED = {
    "TaskInput": "schooner.eval._step_config",
    "SuiteInput": "schooner.eval._step_config",
    "task_inputs": "schooner.eval._step_config",
    "CheckpointInput": "schooner.eval._step_config",
    "checkpoint_input": "schooner.eval._step_config",
    "resolve_cache_path": "schooner.eval._evaluate_step",
    "scores_table": "schooner.eval._evaluate_step",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        warnings.warn(
            f"schooner.eval.steps.{name} is internal to the eval steps (moved to a private module) and will "
            "be removed from schooner.eval.steps in the next release; steps.py holds the step builders only",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
