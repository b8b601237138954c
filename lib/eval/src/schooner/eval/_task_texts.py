"""What the `task_texts` step does when it runs: every task document's texts as records, for decontamination."""

from __future__ import annotations

from typing import Any

from ._step_config import TaskTextsConfig

# Named `_suites` as before the move: a cached step's record compares the step function's source text.
from ._step_config import resolved_suites as _suites


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
