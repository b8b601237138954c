"""Task definitions on disk, suites, and running a task on a model.

A `Task` names a local file (jsonl, jsonl.gz, json list or parquet) in one of the layouts of `_layouts`, the
number of few-shot demonstrations and where they come from. It is a frozen dataclass, and also a YAML file:

```yaml
name: arc_easy
path: /data/arc_easy/test.jsonl      # relative paths are resolved against the YAML file's folder
layout: arc
num_fewshot: 10
fewshot_path: /data/arc_easy/train.jsonl
```

A `Suite` is a named list of tasks (`core_suite(data_dir)` is Marin's CORE_TASKS-like set). Nothing is read
until a task runs; a missing file raises `FileNotFoundError` naming the task, the file and how to get it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

from schooner.cluster import storage

from ._layouts import LAYOUTS
from ._tasks import KINDS, Example, fewshot_prefix, score_examples
from ._taskyaml import (
    FieldError,
    at_line,
    check_type,
    closest,
    meant,
    read_task_mapping,
    yaml_kind,
    yaml_value,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Task:
    """A log-likelihood task read from a local file.

    Attributes:
        name: the task's name in results (e.g. "arc_easy").
        path: the evaluated documents: .jsonl, .jsonl.gz, .json (a list) or .parquet.
        layout: how rows become prompts, one of `schooner.eval.LAYOUTS` (e.g. "arc", "hellaswag", "examples").
        kind: "multiple_choice" or "continuation" (default: the layout's).
        num_fewshot: demonstrations in front of each document.
        fewshot_path: the file demonstrations are drawn from (None: `path` itself, never the document itself).
        seed: the few-shot sampler's seed.
        limit: evaluate only the first `limit` documents (None: all).
        delimiter: between a context and its continuation.
        separator: between demonstrations (and after the last one).
        description: text put before the demonstrations.
        chance: accuracy of a uniform random guess (filled in for multiple choice when None).
        reference: other reference scores of this task (e.g. {"unigram_acc": 0.31}), reported beside it.
    """

    name: str
    path: str
    layout: str
    kind: str = ""
    num_fewshot: int = 0
    fewshot_path: str | None = None
    seed: int = 1234
    limit: int | None = None
    delimiter: str = " "
    separator: str = "\n\n"
    description: str = ""
    chance: float | None = None
    reference: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            got = "an empty string" if self.name == "" else yaml_value(self.name)
            raise FieldError("name", f"Task field 'name' must be a non-empty string, got {got}")
        who = f"task {self.name!r}"
        check_type(who, "path", self.path, str)
        check_type(who, "layout", self.layout, str)
        if self.layout not in LAYOUTS:
            raise FieldError(
                "layout",
                f"{who}: unknown layout {self.layout!r}{meant(self.layout, LAYOUTS)}; one of {sorted(LAYOUTS)}",
            )
        check_type(who, "kind", self.kind, str)
        if not self.kind:
            object.__setattr__(self, "kind", LAYOUTS[self.layout][1])
        if self.kind not in KINDS:
            raise FieldError(
                "kind", f"{who}: kind must be one of {KINDS}, got {self.kind!r}{meant(self.kind, KINDS)}"
            )
        for field in ("num_fewshot", "seed"):
            check_type(who, field, getattr(self, field), int)
        check_type(who, "limit", self.limit, int, optional=True)
        check_type(who, "fewshot_path", self.fewshot_path, str, optional=True)
        for field in ("delimiter", "separator", "description"):
            check_type(who, field, getattr(self, field), str)
        check_type(who, "chance", self.chance, float, optional=True)
        if not isinstance(self.reference, dict):
            raise FieldError(
                "reference",
                f"{who}: field 'reference' must be a mapping of score name -> value, got "
                f"{yaml_value(self.reference)}",
            )
        for score, value in self.reference.items():
            if not isinstance(score, str):
                bad = f"score name {json.dumps(score, default=str)} is {yaml_kind(score)}, not a string"
            elif isinstance(value, bool) or not isinstance(value, int | float):
                bad = f"{score!r} is {yaml_value(value)}"
            else:
                continue
            raise FieldError(
                "reference",
                f"{who}: field 'reference' must map score names to numbers, e.g. "
                f"`reference: {{unigram_acc: 0.31}}`; {bad}",
            )
        if self.num_fewshot < 0:
            raise FieldError(
                "num_fewshot", f"{who}: field 'num_fewshot' must be >= 0, got {self.num_fewshot}"
            )
        if self.limit is not None and self.limit < 1:
            raise FieldError("limit", f"{who}: field 'limit' must be None or >= 1, got {self.limit}")

    @staticmethod
    def from_yaml(path: str) -> Task:
        """Read a task definition (the dataclass's fields as YAML keys); relative paths are taken from its folder.
        An error names the file, the field's line where it has one, and the fix (`_taskyaml`)."""
        data, lines = read_task_mapping(path, [f.name for f in dataclasses.fields(Task)])
        try:
            return Task(**data)
        except FieldError as e:
            raise ValueError(f"{at_line(path, lines, e.field)}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(where: str, value: Any, keys: tuple[str, ...] = (), items: str = "") -> None:
    """A ValueError naming `where`, the field and the fix when a string in a JSON row holds a lone surrogate.

    JSON's `"\\ud800"` escape is half of a UTF-16 pair; Python's json reads it as a lone surrogate, which is
    no Unicode character: it cannot be encoded as UTF-8 or tokenized (the tokenizer raised a bare TypeError).
    lm-eval's loader (`datasets` over pyarrow) refuses such a file too.
    """
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            code = f"\\u{ord(found.group()):04x}"
            around = value[max(found.start() - 20, 0) : found.start() + 20]
            raise ValueError(
                f"{where}: field {'.'.join(keys)!r}{items} holds an escaped lone surrogate {code} at character "
                f"{found.start()} ({around!r}): half of a UTF-16 pair, which is no Unicode character (it cannot "
                "be written as UTF-8 or tokenized); write the character itself (or its whole escaped pair, e.g. "
                "\\ud83d\\ude00), or remove it"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(where, key, (*keys, key), f"{items} (its name)")
            _refuse_lone_surrogates(where, item, (*keys, key), items)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_lone_surrogates(where, item, keys, f"{items}, item {i}")


def missing_file_message(task: str, paths: Sequence[str]) -> str:
    """What a missing task file's error says: the task, the files and how to get them."""
    who = f"task {task!r}: " if task else ""
    return (
        f"{who}no file at {', '.join(repr(p) for p in paths)}; put the dataset's rows there (jsonl or parquet, "
        "in the layout the task names: export it with `datasets.load_dataset(...).to_json(path)` on a machine "
        "with internet)"
    )


def load_rows(path: str, *, task: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """`(where, row)` for each row of a jsonl/jsonl.gz/json/parquet file; `where` is "file:line" for errors."""
    who = f"task {task!r}: " if task else ""
    if not os.path.exists(path):
        raise FileNotFoundError(missing_file_message(task, [path]))
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{who}{path}: not a readable parquet file ({e}); re-export it") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}:row {i}", row
        return
    if path.endswith(".json"):
        with open(path, "rb") as f:
            raw = f.read()
        text = storage.decode_utf8(raw, path, what=who.removesuffix(": "))  # past a byte-order mark
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{who}{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})"
            ) from None
        if not isinstance(data, list):
            raise ValueError(
                f"{who}{path}: a .json task file holds an array of rows, got {storage.json_kind(data)}; write "
                "[{...}, {...}] (or one JSON object per line in a .jsonl file)"
            )
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise ValueError(
                    f"{who}{path}:item {i} is {storage.json_kind(row)}, not a JSON object; each row of a .json "
                    "task file is one JSON object"
                )
            _refuse_lone_surrogates(f"{who}{path}:item {i}", row)
            yield f"{path}:item {i}", row
        return
    for n, row in storage.read_json_lines(path, what=who.removesuffix(": ")):
        _refuse_lone_surrogates(f"{who}{path}:{n}", row)
        yield f"{path}:{n}", row


def load_examples(
    path: str,
    layout: str,
    *,
    task: str = "",
    limit: int | None = None,
    kind: str = "",
    check_choices: bool = True,
) -> list[Example]:
    """The `Example`s of a file in `layout`; a bad row raises naming the task, document, file, line and field.

    With `kind="multiple_choice"` (the layout's default kind when not given) a row of one choice is an error:
    its accuracy would be 1 whatever the model does. With `check_choices` (the evaluated documents; a
    few-shot pool shows only its right answers) an empty choice or two identical choices are errors naming the
    document and the choices: an empty choice has nothing to score, and identical choices score the same, so
    `acc` would depend on which of them comes first (the harness scores both silently).
    """
    kind = kind or LAYOUTS[layout][1]
    convert = LAYOUTS[layout][0]
    out: list[Example] = []
    for where, row in load_rows(path, task=task):
        if limit is not None and len(out) >= limit:
            break
        doc = f"task {task!r}: document {len(out)} ({where})"
        try:
            example = convert(row)
        except KeyError as e:
            raise ValueError(
                f"{doc}: missing field {e.args[0]!r} for layout {layout!r}{_renamed(e.args[0], row)}; row keys: "
                f"{sorted(row, key=str)}"
            ) from None
        except (ValueError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"{doc}: bad row for layout {layout!r}: {e}") from None
        if kind == "multiple_choice" and example.num_choices < 2:
            raise ValueError(
                f"{doc}: field 'continuations' holds one choice but a multiple-choice row "
                "needs at least 2 choices (its accuracy would always be 1); add the wrong choices, or set "
                "`kind: continuation` for a single expected continuation"
            )
        if check_choices and kind == "multiple_choice":
            _check_choices(doc, layout, example)
        out.append(dataclasses.replace(example, source=where))
    if not out:
        raise ValueError(f"task {task!r}: {path} holds no rows")
    return out


def _renamed(missing: Any, row: dict[str, Any]) -> str:
    """`; the row has 'context': rename it to 'contexts'` when a key of `row` likely misspells the missing one."""
    close = closest(missing, [k for k in row if isinstance(k, str)], cutoff=0.75)
    return f"; the row has {close!r}: rename it to {missing!r}" if close else ""


def _check_choices(doc: str, layout: str, example: Example) -> None:
    """A ValueError naming the document and choice when a choice is empty or two choices are the same."""
    partial = len(example.continuations) == 1  # one context per choice (WinoGrande): the contexts differ
    texts = example.contexts if partial else example.continuations
    for i, text in enumerate(texts):
        # In Schooner's own layout whitespace is text (a blank next line is a real choice of a code task, as
        # lm-eval scores it); in the natural-language layouts a blank choice is a broken row.
        if not (text if layout == "examples" else text.strip()):
            raise ValueError(
                f"{doc}: choice {i} {text!r} is empty (layout {layout!r}): there is nothing to score; give it "
                "text, or remove the choice (or the row)"
            )
    seen: dict[tuple[str, str], int] = {}
    for i, pair in enumerate(example.pairs()):
        if pair in seen:
            raise ValueError(
                f"{doc}: choices {seen[pair]} and {i} are the same text {texts[i]!r} (layout {layout!r}): they "
                "score the same, so `acc` would depend on their order; remove the repeated choice (or the row)"
            )
        seen[pair] = i


def prepared_examples(task: Task) -> list[Example]:
    """The task's examples with their few-shot prefixes in the contexts."""
    examples = load_examples(task.path, task.layout, task=task.name, limit=task.limit, kind=task.kind)
    if task.num_fewshot == 0 and not task.description:
        return examples
    same = task.fewshot_path is None or os.path.abspath(task.fewshot_path) == os.path.abspath(task.path)
    # the whole file, whatever `limit` says (as lm-eval draws from the whole split): a document's prompt does not
    # depend on how many documents are evaluated
    pool = (
        examples
        if task.fewshot_path is None and task.limit is None
        else load_examples(
            task.fewshot_path or task.path, task.layout, task=task.name, kind=task.kind, check_choices=False
        )
    )
    available = len(pool) - (1 if same else 0)
    if available < task.num_fewshot:
        raise ValueError(
            f"task {task.name!r}: field 'num_fewshot' is {task.num_fewshot} but the few-shot pool "
            f"{task.fewshot_path or task.path} holds {len(pool)} document(s)"
            f"{' (less the evaluated one)' if same else ''}, {available} usable; lower num_fewshot to at most "
            f"{available} or set fewshot_path to a larger split"
        )
    out = []
    for i, ex in enumerate(examples):
        prefix = fewshot_prefix(
            i,
            pool,
            num_fewshot=task.num_fewshot,
            seed=task.seed,
            delimiter=task.delimiter,
            separator=task.separator,
            exclude_same_index=same,
        )
        out.append(ex.with_prefix(task.description + prefix))
    return out


def chance_level(examples: Sequence[Example], kind: str) -> float:
    """Expected accuracy of a uniform random choice (0 for continuation tasks)."""
    if kind == "continuation":
        return 0.0
    return sum(1.0 / ex.num_choices for ex in examples) / len(examples)


def evaluate_task(
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    keep_documents: bool = False,
) -> dict[str, Any]:
    """Score `task` with `model`: metrics with standard errors, chance and reference scores, settings.

    Returns:
        `{"acc", "acc_stderr", "acc_norm", ..., "documents", "chance", "reference", "num_fewshot", "kind"}`;
        with `keep_documents`, also "per_document" (every choice's log-probability).
    """
    examples = prepared_examples(task)
    metrics, documents = score_examples(
        model,
        tokenizer,
        examples,
        kind=task.kind,
        delimiter=task.delimiter,
        batch_size=batch_size,
        max_length=max_length,
        task=task.name,
    )
    metrics["chance"] = task.chance if task.chance is not None else chance_level(examples, task.kind)
    metrics["reference"] = dict(task.reference)
    metrics.update(kind=task.kind, num_fewshot=task.num_fewshot, path=task.path)
    if keep_documents:
        metrics["per_document"] = documents
    return metrics


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named list of tasks, evaluated together and reported with a macro average of `acc`."""

    name: str
    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"suite {self.name!r} names a task twice: {names}")
        if not self.tasks:
            raise ValueError(f"suite {self.name!r} has no task")

    def missing_files(self) -> list[str]:
        """Files the suite's tasks need that are not there."""
        paths = [p for t in self.tasks for p in (t.path, t.fewshot_path) if p]
        return [p for p in dict.fromkeys(paths) if not os.path.exists(p)]

    def check_files(self) -> None:
        """Raise `FileNotFoundError` naming every missing file of the suite's tasks (before anything runs)."""
        missing = self.missing_files()
        if missing:
            raise FileNotFoundError(
                f"suite {self.name!r} cannot run: missing {len(missing)} file(s): {', '.join(missing)}; put "
                "each task's rows there in its Hugging Face layout (or evaluate the tasks that are present one "
                "by one)"
            )


# Marin's CORE_TASKS (DCLM's core set) where a layout exists here: (name, layout, shots, eval split, shots' split)
CORE_TASKS: tuple[tuple[str, str, int, str, str], ...] = (
    ("arc_easy", "arc", 10, "test", "train"),
    ("arc_challenge", "arc", 10, "test", "train"),
    ("boolq", "boolq", 10, "validation", "train"),
    ("commonsense_qa", "commonsense_qa", 10, "validation", "train"),
    ("copa", "copa", 0, "validation", "train"),
    ("hellaswag", "hellaswag", 10, "validation", "train"),
    ("lambada_openai", "lambada", 0, "test", "test"),
    ("openbookqa", "openbookqa", 0, "test", "train"),
    ("piqa", "piqa", 10, "validation", "train"),
    ("winogrande", "winogrande", 0, "validation", "train"),
)


def _split_file(folder: str, split: str) -> str:
    for ext in (".jsonl", ".jsonl.gz", ".parquet", ".json"):
        candidate = os.path.join(folder, split + ext)
        if os.path.exists(candidate):
            return candidate
    return os.path.join(folder, split + ".jsonl")


def core_suite(data_dir: str, *, limit: int | None = None) -> Suite:
    """The core suite over `data_dir/<task>/<split>.jsonl` (or .jsonl.gz/.parquet/.json) in the HF layouts.

    Example: `data_dir/arc_easy/test.jsonl` (allenai/ai2_arc ARC-Easy test) with 10-shot demonstrations from
    `data_dir/arc_easy/train.jsonl`. See `CORE_TASKS` for every task, its split and shots.
    """
    tasks = []
    for name, layout, shots, split, shot_split in CORE_TASKS:
        folder = os.path.join(data_dir, name)
        path = _split_file(folder, split)
        fewshot = None if shots == 0 or shot_split == split else _split_file(folder, shot_split)
        tasks.append(
            Task(name=name, path=path, layout=layout, num_fewshot=shots, fewshot_path=fewshot, limit=limit)
        )
    return Suite("core", tuple(tasks))


def evaluate_suite(
    model: Any,
    tokenizer: Any,
    suite: Suite,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    keep_documents: bool = False,
) -> dict[str, Any]:
    """Every task of `suite` (`evaluate_task`), and the macro average of `acc` and of `acc - chance`.
    With `keep_documents`, each task's result also holds "per_document" (see `evaluate_task`).

    Raises:
        FileNotFoundError: a task's file is missing, naming every missing file before anything runs.
    """
    suite.check_files()
    tasks = {}
    for i, t in enumerate(suite.tasks):
        # a lone task is a suite of its own name: "task mc (1 of 1): scoring", not "(1 of 1 in mc)"
        where = "" if (suite.name, len(suite.tasks)) == (t.name, 1) else f" in {suite.name}"
        logger.info("task %s (%d of %d%s): scoring", t.name, i + 1, len(suite.tasks), where)
        start = time.perf_counter()
        tasks[t.name] = r = evaluate_task(
            model, tokenizer, t, batch_size=batch_size, max_length=max_length, keep_documents=keep_documents
        )
        logger.info(
            "task %s: acc %.4f ± %.4f (chance %.4f) over %d documents in %.1fs",
            t.name,
            r["acc"],
            r.get("acc_stderr", float("nan")),
            r["chance"],
            r["documents"],
            time.perf_counter() - start,
        )
    accs = [r["acc"] for r in tasks.values()]
    return {
        "tasks": tasks,
        "average": {
            "acc": sum(accs) / len(accs),
            "acc_above_chance": sum(r["acc"] - r["chance"] for r in tasks.values()) / len(accs),
        },
    }
