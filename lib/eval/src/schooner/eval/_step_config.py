"""What the eval steps are configured and keyed by: `EvaluateConfig`, `EvaluateCheckpointsConfig`,
`TaskTextsConfig`, and the keyed inputs they hold (`TaskInput`, `SuiteInput`, `CheckpointInput`).

A `Task` or `Suite` enters a step key by its settings and its files' content (`InputFiles`), not their paths; a
checkpoint given as a path is resolved when the step is built and keyed by its folder's name and a content hash
of its `config.json` and `checkpoint.json` (see `schooner.eval.steps`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from schooner.cluster import InputFiles, InputPath, StepHandle, storage

from ._bundled import BundledTasks, bundled_suite
from ._kv_generate import SamplingConfig
from ._taskspec import Suite, Task, missing_file_message

TaskLike = Any
"""A `Task`, a `Suite`, "bundled" or a `BundledTasks` (the tasks built from the embedded corpus,
`bundled_suite`)."""


@dataclasses.dataclass(frozen=True)
class TaskInput:
    """A `Task` in a step config: keyed by its settings and its files' content (`InputFiles`), not their paths.

    Attributes:
        task: the task as given (its paths are where the files sat when the step was built).
        files: the evaluated file.
        fewshot_files: the few-shot file, when the task names one.
    """

    task: Task
    files: InputFiles
    fewshot_files: InputFiles | None = None

    @staticmethod
    def of(task: Task) -> TaskInput:
        """Fingerprint `task`'s files now.

        Raises:
            FileNotFoundError: a task file is missing, naming the task, the file and how to get it.
        """
        missing = [p for p in (task.path, task.fewshot_path) if p and not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(missing_file_message(task.name, missing))
        shots = InputFiles(task.fewshot_path) if task.fewshot_path else None
        return TaskInput(task, InputFiles(task.path), shots)

    def resolved(self) -> Task:
        """The task reading the files where they sat when the step was built."""
        return dataclasses.replace(
            self.task,
            path=self.files.paths[0],
            fewshot_path=self.fewshot_files.paths[0] if self.fewshot_files else None,
        )

    def __schooner_canonical__(self) -> dict[str, Any]:
        settings = {
            f.name: getattr(self.task, f.name)
            for f in dataclasses.fields(Task)
            if f.name not in ("path", "fewshot_path")
        }
        return {"__class__": "Task", **settings, "path": self.files, "fewshot_path": self.fewshot_files}


@dataclasses.dataclass(frozen=True)
class SuiteInput:
    """A `Suite` in a step config: its tasks as `TaskInput`s."""

    name: str
    tasks: tuple[TaskInput, ...]

    @staticmethod
    def of(suite: Suite) -> SuiteInput:
        suite.check_files()
        return SuiteInput(suite.name, tuple(TaskInput.of(t) for t in suite.tasks))

    def resolved(self) -> Suite:
        return Suite(self.name, tuple(t.resolved() for t in self.tasks))


def task_inputs(tasks: tuple[Any, ...]) -> tuple[Any, ...]:
    """`tasks` with every `Task`/`Suite` fingerprinted (`TaskInput`/`SuiteInput`); "bundled" and
    `BundledTasks` stay."""
    out: list[Any] = []
    for t in tasks:
        if isinstance(t, TaskInput | SuiteInput | BundledTasks) or t == "bundled":
            out.append(t)
        elif isinstance(t, Task):
            out.append(TaskInput.of(t))
        elif isinstance(t, Suite):
            out.append(SuiteInput.of(t))
        else:
            raise ValueError(
                f"tasks holds {t!r}; each entry is a Task, a Suite, a BundledTasks or the string 'bundled'"
            )
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class CheckpointInput:
    """A checkpoint folder in a step config, keyed by its name and metadata's content (see the module docstring).

    Attributes:
        path: the checkpoint folder (runtime only: not in the key when the folder has `checkpoint.json`).
        metadata: `config.json` and, when present, `checkpoint.json`.
    """

    path: str
    metadata: InputFiles

    @staticmethod
    def of(path: str) -> CheckpointInput:
        """The checkpoint of `path` now: itself if it is one, else a run folder's highest complete step.

        Raises:
            FileNotFoundError: no checkpoint there, naming the folder and what was looked for.
        """
        from schooner.model import CHECKPOINT_MARKER, find_checkpoint

        folder = find_checkpoint(os.fspath(path))
        names = [f"{folder}/config.json"]
        if storage.exists(storage.join(folder, CHECKPOINT_MARKER)):
            names.append(f"{folder}/{CHECKPOINT_MARKER}")
        return CheckpointInput(folder, InputFiles(names))

    def __str__(self) -> str:
        return self.path

    def __schooner_canonical__(self) -> dict[str, Any]:
        from schooner.model import CHECKPOINT_MARKER

        marked = any(e.name == CHECKPOINT_MARKER for e in self.metadata.entries)
        where = os.path.basename(self.path.rstrip("/")) if marked else self.path
        return {"__class__": "Checkpoint", "checkpoint": where, "metadata": self.metadata}


def checkpoint_input(checkpoint: Any) -> Any:
    """A path becomes a `CheckpointInput` (resolved now); a step handle stays (keyed by its own key)."""
    if isinstance(checkpoint, str | os.PathLike) and not isinstance(checkpoint, StepHandle | InputPath):
        return CheckpointInput.of(os.fspath(checkpoint))
    return checkpoint


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
        tasks: log-likelihood tasks and suites (`Task`, `Suite`, "bundled" or `BundledTasks(size=...)`).
        task_batch_size: requests per device call for the tasks (speed only).
        sampling: when given, each prompt also gets a sampled completion ("sampled") with these settings
            (temperature, top-k, top-p, seed), generated over the KV cache.
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
    tasks: tuple[Any, ...] = ()
    task_batch_size: int = 16
    sampling: SamplingConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.datasets, Mapping) or not (self.datasets or self.tasks):
            raise ValueError(
                f"datasets must be a non-empty dict of name -> dataset (or give tasks=), got {self.datasets!r}"
            )
        object.__setattr__(self, "tasks", task_inputs(tuple(self.tasks)))
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


@dataclasses.dataclass(frozen=True)
class EvaluateCheckpointsConfig:
    """`evaluate` settings applied to every complete checkpoint of a run (`settings.checkpoint` is the run)."""

    settings: EvaluateConfig


@dataclasses.dataclass(frozen=True)
class TaskTextsConfig:
    """Which tasks' evaluation texts `task_texts` writes.

    Attributes:
        tasks: `Task`s, `Suite`s or "bundled", as for `evaluate`.
        include_fewshot: also write the few-shot pools' texts (documents of `fewshot_path` files).
    """

    tasks: tuple[Any, ...]
    include_fewshot: bool = True

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("task_texts needs at least one task (a Task, a Suite or 'bundled')")
        object.__setattr__(self, "tasks", task_inputs(tuple(self.tasks)))


def run_checkpoints(run: str | os.PathLike[str]) -> tuple[CheckpointInput, ...]:
    """A training run folder's complete checkpoints now, each keyed as `evaluate` keys one (so a new one reruns).

    Raises:
        FileNotFoundError: nothing there, or only incomplete step folders.
        ValueError: `run` is one checkpoint, not a run folder of `step-*` checkpoints.
    """
    from schooner.model import find_checkpoint, list_checkpoints

    found = list_checkpoints(os.fspath(run))
    if not found:  # why not: nothing there, or only incomplete step folders (raises), or one checkpoint
        folder = find_checkpoint(os.fspath(run), who="evaluate_checkpoints: ")
        raise ValueError(
            f"evaluate_checkpoints: {os.fspath(run)!r} is one checkpoint ({folder}/config.json), not a "
            "training run folder of step-* checkpoints: pass its run folder, or evaluate(...) it alone"
        )
    return tuple(CheckpointInput.of(path) for _, path in found)


def resolved_suites(tasks: tuple[Any, ...], output_path: str) -> list[Suite]:
    """A step config's `tasks` as suites reading the files where they sat when the step was built; the bundled
    tasks are built under `output_path/bundled-tasks`."""
    out = []
    for t in tasks:
        if t == "bundled" or isinstance(t, BundledTasks):
            b = t if isinstance(t, BundledTasks) else BundledTasks()
            out.append(bundled_suite(f"{output_path.rstrip('/')}/bundled-tasks", size=b.size, seed=b.seed))
        elif isinstance(t, TaskInput):
            task = t.resolved()
            out.append(Suite(task.name, (task,)))
        else:
            out.append(t.resolved())
    return out
