"""Turning rows of the common benchmarks, in their Hugging Face datasets' layouts, into `Example`s.

Each layout reads one row (a dict, as a jsonl line or parquet row of the dataset's published files) and
builds the prompt lm-evaluation-harness builds for that task, so scores are comparable with published ones:

| layout | dataset | kind | prompt |
|---|---|---|---|
| `arc` | allenai/ai2_arc | multiple choice | `Question: {question}\\nAnswer:` + ` {choice}` |
| `hellaswag` | Rowan/hellaswag | multiple choice | `{activity_label}: {ctx_a} {Ctx_b}` + ` {ending}` (cleaned) |
| `piqa` | ybisk/piqa | multiple choice | `Question: {goal}\\nAnswer:` + ` {sol}` |
| `boolq` | super_glue/boolq | multiple choice | `{passage}\\nQuestion: {question}?\\nAnswer:` + ` no`/` yes` |
| `winogrande` | allenai/winogrande | partial (one context per choice) | `{sentence up to _ with option}` + ` {rest}` |
| `copa` | super_glue/copa | multiple choice | `{premise minus '.'} because/therefore` + ` {choice, lowercased}` |
| `openbookqa` | allenai/openbookqa | multiple choice | `{question_stem}` + ` {choice}` |
| `commonsense_qa` | tau/commonsense_qa | multiple choice | `Question: {question}\\nAnswer:` + ` {choice}` |
| `lambada` | EleutherAI/lambada_openai | continuation | `{text minus its last word}` + ` {last word}` |
| `examples` | Schooner's own | either | `{"contexts": [...], "continuations": [...], "gold": i}` |

A row missing a field raises `KeyError` naming the field; `_taskspec.load_rows` adds the file and line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ._tasks import Example


def _labelled_choices(row: dict[str, Any], key: str = "answerKey") -> tuple[tuple[str, ...], int]:
    choices = row["choices"]
    texts, labels = list(choices["text"]), [str(x) for x in choices["label"]]
    answer = str(row[key]).strip()
    if answer not in labels:
        raise ValueError(f"{key}={answer!r} is not one of the choice labels {labels}")
    return tuple(texts), labels.index(answer)


def arc(row: dict[str, Any]) -> Example:
    texts, gold = _labelled_choices(row)
    return Example((f"Question: {row['question']}\nAnswer:",), texts, gold)


def commonsense_qa(row: dict[str, Any]) -> Example:
    return arc(row)


def openbookqa(row: dict[str, Any]) -> Example:
    texts, gold = _labelled_choices(row)
    return Example((row["question_stem"],), texts, gold)


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: dict[str, Any]) -> Example:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = _hellaswag_clean(row["activity_label"] + ": " + ctx)
    return Example((query,), tuple(_hellaswag_clean(e) for e in row["endings"]), int(row["label"]))


def piqa(row: dict[str, Any]) -> Example:
    return Example((f"Question: {row['goal']}\nAnswer:",), (row["sol1"], row["sol2"]), int(row["label"]))


def boolq(row: dict[str, Any]) -> Example:
    context = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    return Example((context,), ("no", "yes"), int(row["label"]))


def winogrande(row: dict[str, Any]) -> Example:
    sentence = row["sentence"]
    if "_" not in sentence:
        raise ValueError(f"a WinoGrande sentence needs a '_' blank, got {sentence!r}")
    blank = sentence.index("_")
    contexts = (sentence[:blank] + row["option1"], sentence[:blank] + row["option2"])
    answer = str(row["answer"]).strip()
    if answer not in ("1", "2"):
        raise ValueError(f"WinoGrande answer must be '1' or '2', got {answer!r}")
    return Example(contexts, (sentence[blank + 1 :].strip(),), int(answer) - 1)


def copa(row: dict[str, Any]) -> Example:
    connector = {"cause": "because", "effect": "therefore"}[row["question"]]
    premise = row["premise"].strip()
    premise = premise[:-1] if premise.endswith(".") else premise
    choices = tuple(c[0].lower() + c[1:] for c in (row["choice1"], row["choice2"]))
    return Example((f"{premise} {connector}",), choices, int(row["label"]))


def lambada(row: dict[str, Any]) -> Example:
    context, _, word = row["text"].rpartition(" ")
    if not word or not context:
        raise ValueError(f"a LAMBADA text needs at least two words, got {row['text']!r}")
    return Example((context,), (word,), 0)


def examples(row: dict[str, Any]) -> Example:
    return Example(
        tuple(row["contexts"]),
        tuple(row["continuations"]),
        int(row["gold"]),
        tuple(row.get("answer_texts", ())),
    )


LAYOUTS: dict[str, tuple[Callable[[dict[str, Any]], Example], str]] = {
    "arc": (arc, "multiple_choice"),
    "hellaswag": (hellaswag, "multiple_choice"),
    "piqa": (piqa, "multiple_choice"),
    "boolq": (boolq, "multiple_choice"),
    "winogrande": (winogrande, "multiple_choice"),
    "copa": (copa, "multiple_choice"),
    "openbookqa": (openbookqa, "multiple_choice"),
    "commonsense_qa": (commonsense_qa, "multiple_choice"),
    "lambada": (lambada, "continuation"),
    "examples": (examples, "multiple_choice"),
}
"""layout name -> (row converter, default task kind)."""
