"""What the `evaluate` and `evaluate_checkpoints` steps do when they run: load the checkpoint and tokenizer,
score the token caches and the tasks, draw samples, and write `results.json`, `samples.json`,
`tasks/<task>.jsonl` (and, for a run, `scores.json` and `scores.png`) into the step's folder; the scores table the report draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

from schooner.cluster import storage

from ._bpb import evaluate_lm
from ._checkpoint import load_checkpoint
from ._generate import generate
from ._kv_generate import generate_texts
from ._step_config import EvaluateCheckpointsConfig, EvaluateConfig, resolved_suites

logger = logging.getLogger(__name__)


def resolve_cache_path(path: str, split: str) -> str:
    """`path/split` when `path` is a tokenized step's output holding that split, else `path` itself."""
    if storage.isdir(storage.join(path, split)):
        return f"{path.rstrip('/')}/{split}"
    return path


def _write_result_json(path: str, value: Any) -> None:
    """`value` as JSON at `path`, its paths as they read once the step's attempt folder is published."""
    from schooner.cluster import published_paths

    storage.write_json(path, _finite(published_paths(value), path), indent=2)


def _finite(value: Any, path: str, where: str = "") -> Any:
    """`value` with each NaN or infinity (a diverged checkpoint's loss) replaced by None, which JSON can hold,
    and a warning naming the file and the field."""
    if isinstance(value, float) and not math.isfinite(value):
        logger.warning(
            "%s: %s is %r, not a finite number: written as null", path, where or "the value", value
        )
        return None
    if isinstance(value, dict):
        return {k: _finite(v, path, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, path, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


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
    logger.info("evaluating %s on %s", checkpoint, _scored(caches, config.tasks))
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
    _write_result_json(f"{output_path.rstrip('/')}/samples.json", samples)
    _write_result_json(f"{output_path.rstrip('/')}/results.json", results)
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


def _scored(caches: dict[str, str], tasks: tuple[Any, ...]) -> str:
    """What an evaluation scores, for its first log line: `val=<cache>, task mc, suite core` (or `task mc (no
    validation data)`: it said `on ` with nothing after it)."""
    from ._step_config import SuiteInput, TaskInput

    parts = [f"{k}={v}" for k, v in caches.items()]
    for t in tasks:
        if isinstance(t, TaskInput):
            parts.append(f"task {t.task.name}")
        elif isinstance(t, SuiteInput):
            parts.append(f"suite {t.name} ({len(t.tasks)} tasks)")
        else:
            parts.append("the bundled tasks")
    return ", ".join(parts) + ("" if caches else " (no validation data)")


def _run_tasks(
    config: EvaluateConfig, model: Any, tokenizer: Any, output_path: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    from ._taskspec import evaluate_suite

    tasks: dict[str, Any] = {}
    suites: dict[str, Any] = {}
    for suite in resolved_suites(config.tasks, output_path):
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
    path = f"{output_path.rstrip('/')}/{relative}"
    with storage.atomic_open(path, "w") as f:
        for i, doc in enumerate(documents):
            row = _finite({"index": i, **doc}, path, f"line {i + 1}")
            f.write(storage.dumps_json(row, indent=None, where=f"{path}:{i + 1}") + "\n")
    return relative


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
    _write_result_json(f"{output_path.rstrip('/')}/scores.json", rows)
    plot_scores(rows, f"{output_path.rstrip('/')}/scores.png")
    return {"steps": [r["step"] for r in rows], "scores": rows, "tables": tables}


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


def plot_scores(rows: list[dict[str, Any]], path: str) -> None:
    """`scores.png` at `path`: each task's accuracy (chance dotted) and each dataset's loss against the step."""
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
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
