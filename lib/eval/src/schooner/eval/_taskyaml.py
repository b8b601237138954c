"""Reading a task definition's YAML, and naming what is wrong with it in YAML's words.

`Task.from_yaml` reads the file here (`read_task_mapping`), then builds the `Task`, whose checks raise
`FieldError` naming the field; `from_yaml` puts that field's line in front (`t.yaml:4: ...`). Every message names
the file and says how to fix it: YAML's own text calls the file "<unicode string>" and Python's names a list a
"list", where the user wrote a sequence.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Any

from schooner.cluster import storage


class FieldError(ValueError):
    """A task-definition error about one field: `from_yaml` puts the field's line in front of it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _key_lines(path: str, node: Any) -> dict[Any, int]:
    """The 1-based line of each top-level key of a composed YAML document ({} when it is no mapping); a key
    given twice is refused, naming both lines (YAML's loader kept the last without a word)."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return {}
    lines: dict[Any, int] = {}
    constructor = yaml.constructor.SafeConstructor()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue  # a complex key (`? [a, b]`): the loader has refused it already
        key = constructor.construct_object(key_node)  # the key as the loader reads it (`1` is a number)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise ValueError(
                f"{path}:{line}: field {key!r} given twice (first at line {lines[key]}); keep one of the two"
            )
        lines[key] = line
    return lines


def at_line(path: str, lines: dict[Any, int], key: Any) -> str:
    """`t.yaml:4`, where `key` is on line 4 of the file, or just the path when its line is not known."""
    return f"{path}:{lines[key]}" if key in lines else path


def closest(word: Any, choices: Any, cutoff: float = 0.6) -> str | None:
    """The one of `choices` that `word` likely misspells (difflib's closest match), or None."""
    import difflib

    if not isinstance(word, str):
        return None
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def _unknown_fields(path: str, unknown: list[Any], lines: dict[Any, int], known: list[str]) -> str:
    """The message for keys that are no Task field: each at its line, with the field it likely misspells."""

    def hint(key: Any) -> str:
        meant = closest(key, known)
        return f"did you mean {meant!r}?" if meant else ""

    if len(unknown) == 1:
        key = unknown[0]
        said = f"; {hint(key)}" if hint(key) else ""
        return f"{at_line(path, lines, key)}: unknown Task field {key!r}{said}; known: {known}"
    parts = []
    for key in unknown:
        inside = "; ".join(x for x in (f"line {lines[key]}" if key in lines else "", hint(key)) if x)
        parts.append(f"{key!r} ({inside})" if inside else repr(key))
    return f"{path}: unknown Task fields {', '.join(parts)}; known: {known}"


def check_type(who: str, field: str, value: Any, kind: type, *, optional: bool = False) -> None:
    """A ValueError naming the task and field when `value` is not of `kind` (ints are floats too)."""
    if optional and value is None:
        return
    ok = isinstance(value, int | float) if kind is float else isinstance(value, kind)
    if isinstance(value, bool) or not ok:
        names = {int: "an integer", float: "a number", str: "a string"}
        raise FieldError(
            field,
            f"{who}: field {field!r} must be {names[kind]}{' or null' if optional else ''}, got "
            f"{yaml_value(value)}{_number_as_text(value, kind)}",
        )


def _number_as_text(value: Any, kind: type) -> str:
    """The fix for a number YAML read as text: quoted (`"5"`), or written as YAML 1.1 reads no number (`1e3`
    is a string to PyYAML; `1.0e+3` would be a float)."""
    if kind not in (int, float) or not isinstance(value, str):
        return ""
    try:
        number = float(value.strip())
    except ValueError:
        return ""
    if kind is int and not number.is_integer():
        return ""
    if not math.isfinite(number):
        return ""
    return f"; YAML reads it as text: write {int(number) if kind is int else number!r}, unquoted"


def meant(value: Any, choices: Any) -> str:
    """`; did you mean 'examples'?` for a value one of `choices` likely misspells (case and - for _ included)."""
    if not isinstance(value, str):
        return ""
    by_form = {c.lower().replace("-", "_"): c for c in choices}
    form = value.lower().replace("-", "_").strip()
    close = form if form in by_form else closest(form, by_form)
    return f"; did you mean {by_form[close]!r}?" if close else ""


def _yaml_syntax_error(path: str, text: str, error: Exception) -> str:
    """A task YAML that does not parse, as `t.yaml:3: not valid YAML (what, at column C; the line reads '...');
    the fix`: PyYAML's own text names the file "<unicode string>" and puts the line in the middle of it."""
    import yaml

    if isinstance(error, yaml.reader.ReaderError):  # a character YAML refuses (control characters)
        before = text[: error.position]
        line, column = before.count("\n"), error.position - (before.rfind("\n") + 1)
        what = f"the character {chr(error.character)!r} (U+{error.character:04X}) is not allowed in YAML"
        opened = None
    elif isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        line, column = error.problem_mark.line, error.problem_mark.column
        what = error.problem or str(error)
        if error.context and what.startswith("but "):
            what = f"{error.context}, {what}"  # "expected a single document in the stream, but found another"
        mark, context = error.context_mark, error.context or ""
        # "while parsing a flow sequence" opened on an earlier line: a bracket or quote left open
        opened = mark.line if mark is not None and mark.line < line and context.startswith("while") else None
    else:
        return f"{path}: not valid YAML: {' '.join(str(error).split())}"
    lines = text.splitlines()
    shown = lines[line] if line < len(lines) else ""
    if isinstance(error, yaml.reader.ReaderError):
        fix = 'remove it, or write it as an escape inside double quotes (`name: "a\\x07b"`)'
    elif "\t" in shown:
        fix = "YAML allows no tabs: indent with spaces and put a space, not a tab, after each colon"
    elif "single document" in what:
        fix = "a task file holds one task: remove the `---` line and what follows it, or give each task its own file"
    elif "mapping values are not allowed" in what and shown[:1].isspace():
        fix = (
            f"line {line + 1} is indented, so YAML reads it as part of the value above it; start every field "
            "at the start of its line"
        )
    elif "mapping values are not allowed" in what:
        fix = 'a value holding ": " must be quoted, e.g. `description: "Answer: yes"`'
    elif opened is not None:
        fix = (
            f"line {opened + 1} ({lines[opened]!r}) opens a bracket or quote that is not closed: close it, or "
            "quote the whole value"
        )
    else:
        fix = "fix that line (or the one before it: a bracket or quote left open ends there)"
    return (
        f"{path}:{line + 1}: not valid YAML ({what}, at column {column + 1}; the line reads {shown!r}); {fix}"
    )


def yaml_kind(value: Any) -> str:
    """What a value read from a task's YAML is, in YAML's words ("a mapping", "a sequence", "null"): the user
    wrote YAML, not Python (dict, list, NoneType). A value no YAML file holds is named by its type."""
    if value is None:
        return "null"
    kinds = (
        (bool, "a boolean"),
        (dict, "a mapping"),
        (list | tuple, "a sequence"),
        (str, "a string"),
        (int | float, "a number"),
        (datetime.datetime, "a timestamp"),
        (datetime.date, "a date"),
        (bytes, "binary data"),
        (set | frozenset, "a set"),
    )
    return next((name for kind, name in kinds if isinstance(value, kind)), f"a {type(value).__name__} value")


def yaml_value(value: Any) -> str:
    """A value of the wrong kind as a task-definition message names it: its kind in YAML's words and the value
    as YAML's flow style writes it ("a string: \"two\"", "a sequence: [1, 2]", "a boolean: true", "null")."""
    kind = yaml_kind(value)
    if value is None:
        return kind
    if isinstance(value, datetime.date):
        shown = value.isoformat(sep=" ") if isinstance(value, datetime.datetime) else value.isoformat()
    else:
        try:
            shown = json.dumps(value, ensure_ascii=False)  # JSON is YAML's flow style
        except (TypeError, ValueError):
            shown = repr(value)
    return f"{kind}: {shown if len(shown) <= 60 else shown[:57] + '...'}"


def read_task_mapping(path: str, known: list[str]) -> tuple[dict[Any, Any], dict[Any, int]]:
    """A task YAML's mapping of fields, checked: `(fields, the line of each top-level key)`. Refused, each naming
    the file (and the line where there is one) with the fix: bytes that are not UTF-8, YAML that does not
    parse, a document that is no mapping, a key given twice, a key that is no field of `known` (with the field
    it likely misspells), a required field missing. Relative `path` and `fewshot_path` are taken from the file's
    folder."""
    import yaml

    with open(path, "rb") as f:
        raw = f.read()
    text = storage.decode_utf8(raw, path)
    try:
        node = yaml.compose(text)  # parsed once: the data and each key's line come from the same nodes
        data = None if node is None else yaml.constructor.SafeConstructor().construct_document(node)
        lines = _key_lines(path, node)
    except yaml.YAMLError as e:
        raise ValueError(_yaml_syntax_error(path, text, e)) from None
    if not isinstance(data, dict):
        got = "an empty document" if node is None else yaml_kind(data)
        raise ValueError(
            f"{path}: a task definition is a mapping of Task fields, got {got}; write one `field: value` "
            "a line, e.g. `name: my_task`, `path: rows.jsonl`, `layout: examples`"
        )
    # in the file's order; YAML keys can be numbers too (`1: x`)
    unknown = [key for key in data if key not in known]
    if unknown:
        raise ValueError(_unknown_fields(path, unknown, lines, sorted(known)))
    missing = [f for f in ("name", "path", "layout") if f not in data]
    if missing:
        raise ValueError(
            f"{path}: missing required field(s) {', '.join(repr(f) for f in missing)}; add e.g. "
            "`name: my_task`, `path: rows.jsonl`, `layout: examples`"
        )
    for key, fix in (
        ("path", "give the file of documents, e.g. `path: rows.jsonl` (relative to this file's folder)"),
        (
            "fewshot_path",
            "give the file of demonstrations, or leave the field out (they then come from `path`)",
        ),
    ):
        if data.get(key) == "":  # read as this file's folder, it failed only when the task ran
            raise ValueError(f"{at_line(path, lines, key)}: field {key!r} is empty; {fix}")
    base = os.path.dirname(os.path.abspath(path))
    for key in ("path", "fewshot_path"):
        value = data.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value) and "://" not in value:
            data[key] = os.path.join(base, value)
    return data, lines
