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

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec

from schooner.cluster import InputFiles, InputPath, ResourceConfig, StepHandle, step

from ._bpb import evaluate_lm
from ._bundled import BundledTasks
from ._checkpoint import load_checkpoint
from ._generate import generate
from ._kv_generate import SamplingConfig, generate_texts
from ._taskspec import Suite, Task, missing_file_message

TaskLike = Any
"""A `Task`, a `Suite`, "bundled" or a `BundledTasks` (the tasks built from the embedded corpus,
`bundled_suite`)."""

logger = logging.getLogger(__name__)


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
        fs, root = fsspec.core.url_to_fs(folder)
        if fs.exists(f"{root}/{CHECKPOINT_MARKER}"):
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
    config = dataclasses.replace(config, checkpoint=checkpoint_input(checkpoint))  # after the checks above
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


def resolve_cache_path(path: str, split: str) -> str:
    """`path/split` when `path` is a tokenized step's output holding that split, else `path` itself."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    if fs.isdir(f"{root}/{split}"):
        return f"{path.rstrip('/')}/{split}"
    return path


def _write_json(path: str, value: Any) -> None:
    """`value` as JSON at `path`, its paths as they read once the step's attempt folder is published."""
    from schooner.cluster import published_paths

    with fsspec.open(path, "w") as f:
        json.dump(published_paths(value), f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def _progress_to_stderr() -> Iterator[None]:
    """`schooner.eval`'s INFO lines (each dataset, each task with its time) on stderr while a step runs, which
    the step runner streams, unless logging is configured already."""
    package = logging.getLogger("schooner.eval")
    if logging.getLogger().handlers or package.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    old_level = package.level
    package.addHandler(handler)
    package.setLevel(min(old_level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(old_level)


def _run_evaluate(config: EvaluateConfig, output_path: str) -> dict[str, Any]:
    with _progress_to_stderr():
        return _evaluate_one(config, output_path)


def _evaluate_one(config: EvaluateConfig, output_path: str) -> dict[str, Any]:
    from schooner.tokenize import load_tokenizer

    tokenizer = load_tokenizer(str(config.tokenizer))
    model, model_config, checkpoint = load_checkpoint(str(config.checkpoint), tokenizer=tokenizer)
    max_seq_len = getattr(model_config, "max_seq_len", None)
    if max_seq_len is not None and config.seq_len > max_seq_len:
        raise ValueError(
            f"evaluate: seq_len={config.seq_len} exceeds the model's max_seq_len={max_seq_len} "
            f"(checkpoint {checkpoint}); use seq_len <= {max_seq_len}"
        )
    caches = {name: resolve_cache_path(str(path), config.split) for name, path in config.datasets.items()}
    logger.info("evaluating %s on %s", checkpoint, ", ".join(f"{k}={v}" for k, v in caches.items()))
    results: dict[str, Any] = {"datasets": {}, "average": {}}
    if caches:
        results = evaluate_lm(
            model,
            caches,
            tokenizer=tokenizer,
            seq_len=config.seq_len,
            batch_size=config.batch_size,
            max_tokens=config.max_tokens,
            respect_documents=config.respect_documents,
        )
    task_results, suite_results = _run_tasks(config, model, tokenizer, output_path)
    samples: list[dict[str, Any]] = [
        {
            "prompt": prompt,
            "completion": generate(
                model, tokenizer, prompt, config.max_new_tokens, max_seq_len=max_seq_len or config.seq_len
            ),
        }
        for prompt in config.prompts
    ]
    if config.sampling is not None and samples:
        texts = generate_texts(
            model, tokenizer, [s["prompt"] for s in samples], config.max_new_tokens, sampling=config.sampling
        )
        settings = dataclasses.asdict(config.sampling)
        for sample, text in zip(samples, texts, strict=True):
            sample.update(sampled=text, sampling=settings)
    results.update(checkpoint=checkpoint, caches=caches, tokenizer_fingerprint=tokenizer.fingerprint)
    results["parameters"] = _parameters(model_config)
    results.update(tasks=task_results, suites=suite_results, samples=samples)
    fs, root = fsspec.core.url_to_fs(output_path)
    fs.makedirs(root, exist_ok=True)
    _write_json(f"{output_path.rstrip('/')}/samples.json", samples)
    _write_json(f"{output_path.rstrip('/')}/results.json", results)
    summary = {
        name: {k: d[k] for k in ("loss", "bpb", "tokens") if k in d}
        for name, d in results["datasets"].items()
    }
    task_summary = {
        name: {k: r[k] for k in _SUMMARY_KEYS if k in r} | {"reference": r["reference"]}
        for name, r in task_results.items()
    }
    return {
        "datasets": summary,
        "average": results["average"],
        "tasks": task_summary,
        "suites": suite_results,
        "checkpoint": checkpoint,
        "parameters": results["parameters"],
        "samples": samples,
        "tables": [
            scores_table(f"Scores of {os.path.basename(checkpoint.rstrip('/'))}", summary, task_summary)
        ],
    }


_TABLE_COLUMNS = ["task or dataset", "metric", "value", "± s.e.", "chance", "unigram"]


def scores_table(title: str, datasets: dict[str, Any], tasks: dict[str, Any]) -> dict[str, Any]:
    """One checkpoint's scores as a table the report draws (a step result's `"tables"`, see `schooner
    report`): each dataset's loss and bits-per-byte, each task's acc (and acc_norm) with its standard error,
    chance and the unigram reference."""
    rows: list[list[Any]] = []
    for name, d in sorted(datasets.items()):
        rows += [[name, "loss (nats/token)", d.get("loss"), None, None, None]]
        rows += [[name, "bits/byte", d.get("bpb"), None, None, None]]
    for name, t in sorted(tasks.items()):
        reference = t.get("reference") or {}
        for metric in ("acc", "acc_norm"):
            if metric in t:
                unigram = reference.get(f"unigram_{metric}")
                rows.append([name, metric, t[metric], t.get(f"{metric}_stderr"), t.get("chance"), unigram])
    return {"title": title, "columns": list(_TABLE_COLUMNS), "rows": rows}


def _parameters(model_config: Any) -> int | None:
    from schooner.model import LlamaConfig, num_parameters

    return int(num_parameters(model_config)) if isinstance(model_config, LlamaConfig) else None


_SUMMARY_KEYS = (
    "acc",
    "acc_stderr",
    "acc_norm",
    "acc_norm_stderr",
    "acc_norm_bytes",
    "logprob",
    "perplexity",
    "chance",
    "documents",
)


def _suites(tasks: tuple[Any, ...], output_path: str) -> list[Suite]:
    from ._bundled import bundled_suite

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


def _run_tasks(
    config: EvaluateConfig, model: Any, tokenizer: Any, output_path: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    from ._taskspec import evaluate_suite

    tasks: dict[str, Any] = {}
    suites: dict[str, Any] = {}
    for suite in _suites(config.tasks, output_path):
        clash = sorted(set(tasks) & {t.name for t in suite.tasks})
        if clash:
            raise ValueError(f"evaluate: task names {clash} appear twice in tasks=; rename one (Task.name)")
        out = evaluate_suite(model, tokenizer, suite, batch_size=config.task_batch_size, keep_documents=True)
        for name, r in out["tasks"].items():
            r["documents_file"] = _write_documents(output_path, name, r.pop("per_document"))
        tasks.update(out["tasks"])
        if len(suite.tasks) > 1:
            suites[suite.name] = out["average"]
    return tasks, suites


def _write_documents(output_path: str, task: str, documents: list[dict[str, Any]]) -> str:
    """Write a task's per-document scores to `tasks/<task>.jsonl` under the step folder; its relative path."""
    relative = f"tasks/{task}.jsonl"
    fs, root = fsspec.core.url_to_fs(f"{output_path.rstrip('/')}/tasks")
    fs.makedirs(root, exist_ok=True)
    with fsspec.open(f"{output_path.rstrip('/')}/{relative}", "w") as f:
        for i, doc in enumerate(documents):
            f.write(json.dumps({"index": i, **doc}, sort_keys=True) + "\n")
    return relative


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


def _document_text(example: Any) -> str:
    parts = list(dict.fromkeys(example.contexts)) + list(dict.fromkeys(example.continuations))
    return "\n".join(p for p in parts if p.strip())


def _run_task_texts(config: TaskTextsConfig, output_path: str) -> dict[str, Any]:
    from schooner.data import write_records

    from ._taskspec import load_examples

    records: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for suite in _suites(config.tasks, output_path):
        for task in suite.tasks:
            files = [("eval", task.path)]
            if config.include_fewshot and task.fewshot_path and task.fewshot_path != task.path:
                files.append(("fewshot", task.fewshot_path))
            for split, path in files:
                examples = load_examples(
                    path, task.layout, task=task.name, kind=task.kind, check_choices=split == "eval"
                )
                for i, ex in enumerate(examples):
                    key = f"{task.name}/{i}" if split == "eval" else f"{task.name}/fewshot/{i}"
                    records.append(
                        {
                            "id": key,
                            "text": _document_text(ex),
                            "source": task.name,
                            "metadata": {"task": task.name, "index": i, "split": split, "path": path},
                        }
                    )
                    counts[f"{task.name}/{split}"] = counts.get(f"{task.name}/{split}", 0) + 1
    write_records(records, output_path, counters=counts)  # the step's folder is the record folder
    return {"records": len(records), "per_task": counts}


@dataclasses.dataclass(frozen=True)
class EvaluateCheckpointsConfig:
    """`evaluate` settings applied to every complete checkpoint of a run (`settings.checkpoint` is the run)."""

    settings: EvaluateConfig


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
        from schooner.model import find_checkpoint, list_checkpoints

        found = list_checkpoints(os.fspath(run))
        if not found:  # why not: nothing there, or only incomplete step folders (raises), or one checkpoint
            folder = find_checkpoint(os.fspath(run), who="evaluate_checkpoints: ")
            raise ValueError(
                f"evaluate_checkpoints: {os.fspath(run)!r} is one checkpoint ({folder}/config.json), not a "
                "training run folder of step-* checkpoints: pass its run folder, or evaluate(...) it alone"
            )
        run = tuple(CheckpointInput.of(path) for _, path in found)
    config = EvaluateCheckpointsConfig(EvaluateConfig(checkpoint=run, **settings))
    return step(
        name,
        _run_evaluate_checkpoints,
        config,
        version="evaluate-checkpoints-v5",
        resources=resources,
        description="scores of every checkpoint of a run",
    )


def _run_evaluate_checkpoints(config: EvaluateCheckpointsConfig, output_path: str) -> dict[str, Any]:
    with _progress_to_stderr():
        return _evaluate_every_checkpoint(config, output_path)


def _evaluate_every_checkpoint(config: EvaluateCheckpointsConfig, output_path: str) -> dict[str, Any]:
    from schooner.model import checkpoint_folder_name, checkpoint_step, list_checkpoints

    given = config.settings.checkpoint
    if isinstance(given, tuple):  # resolved when the step was built: each a step-NNNNNN folder
        checkpoints = []
        for c in given:
            number = checkpoint_step(c.path)
            if number is None:
                raise ValueError(f"evaluate_checkpoints: {c.path!r} is not a step-NNNNNN checkpoint folder")
            checkpoints.append((number, c.path))
    else:
        checkpoints = list_checkpoints(str(given))
    if not checkpoints:
        raise FileNotFoundError(
            f"evaluate_checkpoints: no complete step-* checkpoint in {config.settings.checkpoint}"
        )
    rows: list[dict[str, Any]] = []
    tables: list[dict[str, Any]] = []
    for number, path in checkpoints:
        logger.info("evaluating checkpoint %d of %d: %s", len(rows) + 1, len(checkpoints), path)
        one = dataclasses.replace(config.settings, checkpoint=path)
        summary = _evaluate_one(one, f"{output_path.rstrip('/')}/{checkpoint_folder_name(number)}")
        row: dict[str, Any] = {"step": number, "checkpoint": path}
        for dataset, d in summary["datasets"].items():
            row.update({f"{dataset}/{k}": v for k, v in d.items() if k in ("loss", "bpb")})
        for task, t in summary["tasks"].items():
            row[f"{task}/acc"] = t["acc"]
            row[f"{task}/chance"] = t["chance"]
        rows.append(row)
        tables.append(scores_table(f"Scores at step {number}", summary["datasets"], summary["tasks"]))
    _write_json(f"{output_path.rstrip('/')}/scores.json", rows)
    _plot_scores(rows, f"{output_path.rstrip('/')}/scores.png")
    return {"steps": [r["step"] for r in rows], "scores": rows, "tables": tables}


def _plot_scores(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    accs = sorted(k for k in rows[0] if k.endswith("/acc"))
    losses = sorted(k for k in rows[0] if k.endswith("/loss"))
    panels = [p for p in (("accuracy", accs), ("loss (nats/token)", losses)) if p[1]]
    fig, axes = plt.subplots(
        1, max(len(panels), 1), figsize=(6 * max(len(panels), 1), 4), dpi=100, squeeze=False
    )
    for ax, (label, keys) in zip(axes[0], panels, strict=False):
        for key in keys:
            ax.plot(steps, [r[key] for r in rows], marker="o", markersize=3, label=key)
            chance = key[: -len("/acc")] + "/chance"
            if label == "accuracy" and chance in rows[0]:
                ax.axhline(rows[0][chance], linestyle=":", linewidth=1, color=ax.lines[-1].get_color())
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with fsspec.open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
