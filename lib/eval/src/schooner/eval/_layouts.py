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
| `copa` | super_glue/copa | multiple choice | `{premise minus '.'} because/therefore` + `  {choice, lowercased}` (two spaces, as lm-eval) |
| `openbookqa` | allenai/openbookqa | multiple choice | `{question_stem}` + ` {choice}` |
| `commonsense_qa` | tau/commonsense_qa | multiple choice | `Question: {question}\\nAnswer:` + ` {choice}` |
| `lambada` | EleutherAI/lambada_openai | continuation | `{text minus its last word}` + ` {last word}` |
| `examples` | Schooner's own | either | `{"contexts": [...], "continuations": [...], "gold": i}` |

A row missing a field raises `KeyError` naming the field; a malformed field (a string where a list of choices
is expected, a fractional or non-numeric index, an empty choice, labels and texts of different lengths) raises
`ValueError` naming the field and the fix; `_taskspec.load_examples` adds the file and line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from schooner.cluster import storage

from ._tasks import Example


def _text_fix(value: Any) -> str:
    """The fix for a value where text belongs: quoting a number or a boolean; for null, the missing text."""
    return "give its text, or drop the row" if value is None else "quote it, or drop the row"


def _strings(value: Any, field: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    """`value` as a non-empty tuple of strings, or a ValueError naming `field` and the fix."""
    if isinstance(value, str):
        raise ValueError(
            f"field {field!r} must be a list of strings, got the string {value!r}; wrap it in a list: [{value!r}]"
        )
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(
            f"field {field!r} must be a non-empty list of strings, got {storage.json_value(value)}"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            fix = (
                _text_fix(item) if item is None else f"quote it: {json.dumps(json.dumps(item, default=str))}"
            )
            raise ValueError(
                f"field {field!r} must hold strings, entry {i} is {storage.json_value(item)}; {fix}"
            )
        if not allow_empty and not item:  # whitespace is text: "\n" is a real next line of a code task
            raise ValueError(f"field {field!r} entry {i} is empty; every choice needs text")
    return tuple(value)


def _text(row: dict[str, Any], field: str, *, allow_empty: bool = True) -> str:
    """`row[field]` as a string, or a ValueError naming `field` and the fix (a number or null formatted into a
    prompt would be scored as the text "5" or "None")."""
    value = row[field]
    if not isinstance(value, str):
        raise ValueError(
            f"field {field!r} must be a string, got {storage.json_value(value)}; {_text_fix(value)}"
        )
    if not allow_empty and not value.strip():
        raise ValueError(f"field {field!r} is empty ({value!r}); every choice needs text")
    return value


def _index(row: dict[str, Any], field: str, *, digits: bool = False) -> int:
    """`row[field]` as a choice index: an integer (an integral float such as 1.0 is taken as is; with `digits`,
    a string of digits too, as Hugging Face publishes some labels, e.g. HellaSwag's "2")."""
    value = row[field]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if digits and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"field {field!r} must be an integer choice index, got {storage.json_value(value)}; "
            "write the 0-based index of the right choice, e.g. 0"
        )
    return value


def _labelled_choices(row: dict[str, Any], key: str = "answerKey") -> tuple[tuple[str, ...], int]:
    choices = row["choices"]
    if not isinstance(choices, dict):
        raise ValueError(
            f'field \'choices\' must be an object {{"text": [...], "label": [...]}}, got {choices!r}'
        )
    texts = _strings(choices["text"], "choices.text")
    labels_in = choices["label"]
    if isinstance(labels_in, str) or not isinstance(labels_in, list | tuple):
        raise ValueError(f"field 'choices.label' must be a list of labels, got {labels_in!r}")
    labels = [str(x).strip() for x in labels_in]
    if len(texts) != len(labels):
        raise ValueError(
            f"field 'choices' holds {len(texts)} texts but {len(labels)} labels ({labels}); give one label per "
            "choice text"
        )
    if len(set(labels)) != len(labels):
        raise ValueError(f"field 'choices.label' repeats a label: {labels}; labels must be distinct")
    answer = str(row[key]).strip()
    if answer not in labels:
        raise ValueError(f"{key}={answer!r} is not one of the choice labels {labels}")
    return texts, labels.index(answer)


def arc(row: dict[str, Any]) -> Example:
    texts, gold = _labelled_choices(row)
    return Example((f"Question: {_text(row, 'question')}\nAnswer:",), texts, gold)


def commonsense_qa(row: dict[str, Any]) -> Example:
    return arc(row)


def openbookqa(row: dict[str, Any]) -> Example:
    texts, gold = _labelled_choices(row)
    return Example((_text(row, "question_stem"),), texts, gold)


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(row: dict[str, Any]) -> Example:
    ctx = _text(row, "ctx_a") + " " + _text(row, "ctx_b").capitalize()
    query = _hellaswag_clean(_text(row, "activity_label") + ": " + ctx)
    endings = _strings(row["endings"], "endings")
    return Example((query,), tuple(_hellaswag_clean(e) for e in endings), _index(row, "label", digits=True))


def piqa(row: dict[str, Any]) -> Example:
    return Example(
        (f"Question: {_text(row, 'goal')}\nAnswer:",),
        (_text(row, "sol1"), _text(row, "sol2")),
        _index(row, "label", digits=True),
    )


def boolq(row: dict[str, Any]) -> Example:
    context = f"{_text(row, 'passage')}\nQuestion: {_text(row, 'question')}?\nAnswer:"
    return Example((context,), ("no", "yes"), _index(row, "label", digits=True))


def winogrande(row: dict[str, Any]) -> Example:
    sentence = _text(row, "sentence")
    if "_" not in sentence:
        raise ValueError(f"a WinoGrande sentence needs a '_' blank, got {sentence!r}")
    blank = sentence.index("_")
    for i, field in enumerate(("option1", "option2")):
        if not _text(row, field).strip():
            raise ValueError(
                f"choice {i} (field {field!r}) is empty ({row[field]!r}); every choice needs text"
            )
    contexts = (sentence[:blank] + row["option1"], sentence[:blank] + row["option2"])
    answer = str(row["answer"]).strip()
    if answer not in ("1", "2"):
        raise ValueError(f"WinoGrande answer must be '1' or '2', got {answer!r}")
    return Example(contexts, (sentence[blank + 1 :].strip(),), int(answer) - 1)


def copa(row: dict[str, Any]) -> Example:
    connectors = {"cause": "because", "effect": "therefore"}
    question = row["question"]
    if question not in connectors:
        raise ValueError(f"field 'question' must be 'cause' or 'effect', got {question!r}")
    connector = connectors[question]
    premise = _text(row, "premise").strip()
    premise = premise[:-1] if premise.endswith(".") else premise
    for field in ("choice1", "choice2"):
        _text(row, field, allow_empty=False)
    # lm-eval's choices start with a space, after its default target delimiter " ": two spaces, and acc_norm
    # divides by the length with that space (super_glue/copa/utils.py); published COPA scores are these
    choices = tuple(" " + c[0].lower() + c[1:] for c in (row["choice1"], row["choice2"]))
    return Example((f"{premise} {connector}",), choices, _index(row, "label", digits=True))


def lambada(row: dict[str, Any]) -> Example:
    context, _, word = _text(row, "text").rpartition(" ")
    if not word or not context:
        raise ValueError(f"a LAMBADA text needs at least two words, got {row['text']!r}")
    return Example((context,), (word,), 0)


def examples(row: dict[str, Any]) -> Example:
    contexts = _strings(row["contexts"], "contexts", allow_empty=True)
    continuations = _strings(row["continuations"], "continuations")
    n = max(len(contexts), len(continuations))
    for field, items in (("contexts", contexts), ("continuations", continuations)):
        if len(items) not in (1, n):
            raise ValueError(
                f"field {field!r} holds {len(items)} entries but the row has {n} choices; give 1 (shared) or {n}"
            )
    gold = _index(row, "gold")
    if not 0 <= gold < n:
        raise ValueError(f"field 'gold' is {gold}, not a choice index 0..{n - 1}; count choices from 0")
    answer_texts = _strings(row["answer_texts"], "answer_texts") if "answer_texts" in row else ()
    if answer_texts and len(answer_texts) != n:
        raise ValueError(
            f"field 'answer_texts' holds {len(answer_texts)} entries for {n} choices; give one per choice"
        )
    return Example(contexts, continuations, gold, answer_texts)


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
