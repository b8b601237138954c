"""Task files and checkpoints as step inputs (keyed by content), malformed rows, task-definition errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import pytest

from schooner.cluster import StepRunner
from schooner.eval import Suite, Task, evaluate_task
from schooner.eval._taskspec import load_examples
from schooner.eval.steps import evaluate, evaluate_checkpoints, task_texts
from schooner.model import init, load_model, presets, save_model
from schooner.tokenize import train_bpe

ROWS = [
    {"contexts": ["The quick brown"], "continuations": ["fox", "dog jumps"], "gold": 0},
    {"contexts": ["def add(a, b):"], "continuations": ["return a + b", "class"], "gold": 1},
    {"contexts": ["The lazy"], "continuations": ["dog", "fox jumps over"], "gold": 0},
]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n"] * 8
    tok = train_bpe(texts, vocab_size=280)
    tok.save(str(root / "tok"))
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=128,
    )  # fmt: skip
    _checkpoint(root / "ck", config, 0, 1)
    return root, tok, config


def _checkpoint(folder: Path, config, seed: int, step: int) -> None:
    save_model(str(folder), init(config, key=jax.random.key(seed)), config)
    (folder / "checkpoint.json").write_text(json.dumps({"step": step, "seed": seed}))


def _evaluate(root: Path, checkpoint, task) -> object:
    return evaluate(
        "eval/t", checkpoint=checkpoint, tokenizer=str(root / "tok"), seq_len=32, tasks=[task], prompts=()
    )


# ---------------------------------------------------------------- D1: task files keyed by content


def test_a_tasks_only_evaluation_logs_what_it_scores(env, tmp_path, caplog):
    """With `datasets={}` it logged `evaluating <checkpoint> on ` (nothing after "on"), and a lone task as
    `task mc (1 of 1 in mc)`, its own name for a suite."""
    import logging

    root, tok, config = env
    _jsonl(tmp_path / "mc.jsonl", ROWS)
    step = _evaluate(
        root, str(root / "ck"), Task(name="mc", path=str(tmp_path / "mc.jsonl"), layout="examples")
    )
    caplog.set_level(logging.INFO, logger="schooner.eval")
    StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([step])
    said = [r.getMessage() for r in caplog.records]
    evaluating = [m for m in said if m.startswith("evaluating ")]
    assert evaluating and evaluating[0].endswith(" on task mc (no validation data)"), said
    assert "task mc (1 of 1): scoring" in said, said


def test_task_file_edit_reruns_and_move_does_not(env, tmp_path):
    root, tok, config = env
    _checkpoint(tmp_path / "ck", config, 0, 1)
    data = tmp_path / "a"
    data.mkdir()
    _jsonl(data / "mc.jsonl", ROWS)
    (data / "mc.yaml").write_text("name: mc\npath: mc.jsonl\nlayout: examples\n")
    first = _evaluate(root, str(tmp_path / "ck"), Task.from_yaml(str(data / "mc.yaml")))
    runner = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True)
    out = runner.run([first])[first]
    results = json.loads((Path(out.output_path) / "results.json").read_text())
    assert results["tasks"]["mc"]["documents"] == 3
    # moved with its YAML: same key (the key holds names and content, not where they sit)
    shutil.copytree(data, tmp_path / "b")
    moved = _evaluate(root, str(tmp_path / "ck"), Task.from_yaml(str(tmp_path / "b" / "mc.yaml")))
    assert moved.key == first.key
    # an edited gold label: a new key, and the step reruns with the new answer
    edited_rows = [dict(ROWS[0], gold=1), *ROWS[1:]]
    _jsonl(tmp_path / "b" / "mc.jsonl", edited_rows)
    edited = _evaluate(root, str(tmp_path / "ck"), Task.from_yaml(str(tmp_path / "b" / "mc.yaml")))
    assert edited.key != first.key
    out = runner.run([edited])[edited]
    got = json.loads((Path(out.output_path) / "results.json").read_text())["tasks"]["mc"]
    model, _ = load_model(str(tmp_path / "ck"))
    want = evaluate_task(
        model, tok, Task(name="mc", path=str(tmp_path / "b" / "mc.jsonl"), layout="examples")
    )
    assert got["acc"] == want["acc"] and got["logprob"] == want["logprob"]
    # an edited YAML (a setting, not a file) changes the key too
    (tmp_path / "b" / "mc.yaml").write_text("name: mc\npath: mc.jsonl\nlayout: examples\nnum_fewshot: 1\n")
    shots = _evaluate(root, str(tmp_path / "ck"), Task.from_yaml(str(tmp_path / "b" / "mc.yaml")))
    assert shots.key not in (first.key, edited.key)
    # results.json's per-document file re-derives the scores
    docs = [
        json.loads(line) for line in (Path(out.output_path) / got["documents_file"]).read_text().splitlines()
    ]
    assert len(docs) == 3
    acc = sum(max(range(len(d["logprobs"])), key=d["logprobs"].__getitem__) == d["gold"] for d in docs) / 3
    assert acc == got["acc"]
    assert sum(d["logprobs"][d["gold"]] for d in docs) / 3 == pytest.approx(got["logprob"], abs=1e-12)
    norm = [[lp / n for lp, n in zip(d["logprobs"], d["norm_chars"], strict=True)] for d in docs]
    acc_norm = sum(
        max(range(len(v)), key=v.__getitem__) == d["gold"] for v, d in zip(norm, docs, strict=True)
    )
    assert acc_norm / 3 == got["acc_norm"]
    assert docs[1]["norm_chars"] == [len("return a + b"), len("class")]


def test_fewshot_file_and_task_texts_are_keyed_by_content(env, tmp_path):
    root, _, _ = env
    path = _jsonl(tmp_path / "mc.jsonl", ROWS)
    shots = _jsonl(tmp_path / "shots.jsonl", ROWS[:2])
    task = Task(name="mc", path=str(path), layout="examples", num_fewshot=1, fewshot_path=str(shots))
    before = (
        _evaluate(root, str(root / "ck"), task).key,
        task_texts("t", tasks=[task]).key,
    )
    _jsonl(shots, ROWS[1:])
    after = (
        _evaluate(root, str(root / "ck"), task).key,
        task_texts("t", tasks=[task]).key,
    )
    assert before[0] != after[0] and before[1] != after[1]


def test_a_missing_task_file_fails_when_the_step_is_built(env, tmp_path):
    root, _, _ = env
    task = Task(name="gone", path=str(tmp_path / "nope.jsonl"), layout="examples")
    with pytest.raises(FileNotFoundError, match=r"task 'gone'.*nope\.jsonl"):
        _evaluate(root, str(root / "ck"), task)
    with pytest.raises(
        FileNotFoundError, match=r"suite 'set' cannot run: missing 1 file\(s\): .*nope\.jsonl"
    ):
        _evaluate(root, str(root / "ck"), Suite("set", (task,)))


# ---------------------------------------------------------------- D2: a run folder's checkpoint


def test_run_folder_resolves_to_its_latest_checkpoint_when_built(env, tmp_path):
    root, _, config = env
    path = _jsonl(tmp_path / "mc.jsonl", ROWS)
    task = Task(name="mc", path=str(path), layout="examples")
    run = tmp_path / "run"
    _checkpoint(run / "step-000003", config, 1, 3)
    first = _evaluate(root, str(run), task)
    curve = evaluate_checkpoints(
        "eval/c", run=str(run), tokenizer=str(root / "tok"), seq_len=32, tasks=[task]
    )
    assert _evaluate(root, str(run / "step-000003"), task).key == first.key  # the same checkpoint
    _checkpoint(run / "step-000007", config, 2, 7)
    later = _evaluate(root, str(run), task)
    assert later.key != first.key
    more = evaluate_checkpoints("eval/c", run=str(run), tokenizer=str(root / "tok"), seq_len=32, tasks=[task])
    assert more.key != curve.key  # every checkpoint of the run, as it is when the step is built
    out = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([later])[later]
    results = json.loads((Path(out.output_path) / "results.json").read_text())
    assert results["checkpoint"] == str(run / "step-000007")
    # moving the run folder reruns nothing
    shutil.copytree(run, tmp_path / "moved")
    assert _evaluate(root, str(tmp_path / "moved"), task).key == later.key
    (tmp_path / "empty-run" / "step-000001").mkdir(parents=True)  # unfinished: no config.json
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        _evaluate(root, str(tmp_path / "empty-run"), task)


# ---------------------------------------------------------------- D4/D5: malformed rows


@pytest.mark.parametrize(
    ("row", "layout", "field", "fix"),
    [
        ({"contexts": ["x"], "continuations": "ab", "gold": 0}, "examples", "continuations", "list"),
        ({"contexts": "x", "continuations": ["a", "b"], "gold": 0}, "examples", "contexts", "list"),
        ({"contexts": ["x"], "continuations": ["a", "b"], "gold": 1.7}, "examples", "gold", "integer"),
        ({"contexts": ["x"], "continuations": ["a", "b"], "gold": "1"}, "examples", "gold", "integer"),
        ({"contexts": ["x"], "continuations": ["a", ""], "gold": 0}, "examples", "continuations", "empty"),
        ({"contexts": ["x"], "continuations": ["a", 3], "gold": 0}, "examples", "continuations", "string"),
        ({"contexts": ["x"], "continuations": ["a"], "gold": 0}, "examples", "continuations", "2 choices"),
        (
            {"contexts": ["x"], "continuations": ["a", "b"], "gold": 0, "answer_texts": ["a"]},
            "examples",
            "answer_texts",
            "one per choice",
        ),
        (
            {"question": "q", "choices": {"text": ["a", "b", "c"], "label": ["A", "B"]}, "answerKey": "A"},
            "arc",
            "choices",
            "one label per",
        ),
        (
            {"question": "q", "choices": {"text": "abc", "label": ["A", "B", "C"]}, "answerKey": "A"},
            "arc",
            "choices.text",
            "list",
        ),
        ({"goal": "g", "sol1": "a", "sol2": "b", "label": 0.5}, "piqa", "label", "integer"),
    ],
)
def test_malformed_rows_name_file_line_field_and_fix(tmp_path, row, layout, field, fix):
    good = {
        "examples": ROWS[0],
        "arc": {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"},
        "piqa": {"goal": "g", "sol1": "a", "sol2": "b", "label": 1},
    }
    path = _jsonl(tmp_path / "bad.jsonl", [good[layout], row])  # the bad row is line 2
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t", kind="multiple_choice")
    message = str(info.value)
    assert f"{path}:2" in message and repr(field) in message and fix in message, message


_MC = {"contexts": ["x"], "continuations": ["a", "b"], "gold": 0}


@pytest.mark.parametrize(
    ("row", "layout", "says"),
    [
        (
            _MC | {"gold": "1"},
            "examples",
            "field 'gold' must be an integer choice index, got a string: \"1\"; write",
        ),
        (_MC | {"gold": None}, "examples", "field 'gold' must be an integer choice index, got null; write"),
        (_MC | {"continuations": ["a", None]}, "examples", "entry 1 is null; give its text, or drop the row"),
        (_MC | {"continuations": ["a", 3]}, "examples", 'entry 1 is a number: 3; quote it: "3"'),
        (_MC | {"continuations": {"a": 1}}, "examples", 'list of strings, got an object: {"a": 1}'),
        (
            {"goal": "g", "sol1": None, "sol2": "b", "label": 0},
            "piqa",
            "'sol1' must be a string, got null; give",
        ),
        (
            {"goal": "g", "sol1": 5, "sol2": "b", "label": 0},
            "piqa",
            "'sol1' must be a string, got a number: 5; quote",
        ),
    ],
)
def test_malformed_row_values_are_named_in_jsons_words_with_the_fix(tmp_path, row, layout, says):
    """It said "got '1' (str)", "entry 1 is None (NoneType); quote it" (quoting is no fix for a null)."""
    path = _jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t", kind="multiple_choice")
    message = str(info.value)
    assert says in message and f"{path}:1" in message, message
    for python in ("(str)", "NoneType", "(int)", "None", "dict"):
        assert python not in message, message
    assert "null" not in message or "quote" not in message, message


def test_one_choice_rows_are_fine_for_continuation_tasks(tmp_path):
    path = _jsonl(tmp_path / "cont.jsonl", [{"contexts": ["x y"], "continuations": ["z"], "gold": 0}])
    (ex,) = load_examples(str(path), "examples", task="t", kind="continuation")
    assert ex.num_choices == 1
    integral = _jsonl(tmp_path / "f.jsonl", [{"contexts": ["x"], "continuations": ["a", "b"], "gold": 1.0}])
    assert load_examples(str(integral), "examples", kind="multiple_choice")[0].gold == 1


# ---------------------------------------------------------------- D6: task-definition errors


@pytest.mark.parametrize(
    ("yaml", "field"),
    [
        ("name: t\npath: mc.jsonl\nlayout: examples\nnum_fewshot: two\n", "num_fewshot"),
        ("path: mc.jsonl\nlayout: examples\n", "name"),
        ("name: t\npath: mc.jsonl\nlayout: examples\nlimit: 1.5\n", "limit"),
        ("name: t\npath: mc.jsonl\nlayout: examples\nseed: x\n", "seed"),
        ("name: t\npath: mc.jsonl\nlayout: examples\ndelimiter: 3\n", "delimiter"),
    ],
)
def test_task_definition_errors_name_the_file_and_field(tmp_path, yaml, field):
    _jsonl(tmp_path / "mc.jsonl", ROWS)
    message = _yaml_error(tmp_path, yaml)
    assert str(tmp_path / "t.yaml") in message and repr(field) in message, message


_HEAD = "name: t\npath: mc.jsonl\nlayout: examples\n"


def _yaml_error(tmp_path: Path, text: str) -> str:
    """The message `Task.from_yaml` raises for a task file `t.yaml` holding `text`."""
    (tmp_path / "t.yaml").write_text(text)
    with pytest.raises(ValueError) as info:
        Task.from_yaml(str(tmp_path / "t.yaml"))
    return str(info.value)


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        ("- name: t\n- path: mc.jsonl\n", "a task definition is a mapping of Task fields, got a sequence"),
        ("just a name\n", "a task definition is a mapping of Task fields, got a string"),
        ("~\n", "a task definition is a mapping of Task fields, got null"),
        ("# nothing but a comment\n", "a task definition is a mapping of Task fields, got an empty document"),
        (_HEAD + "num_fewshot: two\n", "field 'num_fewshot' must be an integer, got a string: \"two\""),
        (_HEAD + "num_fewshot: true\n", "field 'num_fewshot' must be an integer, got a boolean: true"),
        (_HEAD + "num_fewshot:\n", "field 'num_fewshot' must be an integer, got null"),
        (_HEAD + "limit: 1.5\n", "field 'limit' must be an integer or null, got a number: 1.5"),
        (_HEAD + "seed: [1, 2]\n", "field 'seed' must be an integer, got a sequence: [1, 2]"),
        (_HEAD + "delimiter: 3\n", "field 'delimiter' must be a string, got a number: 3"),
        (_HEAD + "description: {a: 1}\n", "field 'description' must be a string, got a mapping: {\"a\": 1}"),
        (_HEAD + "chance: 2024-01-02\n", "field 'chance' must be a number or null, got a date: 2024-01-02"),
        (
            _HEAD + "reference: [0.3]\n",
            "field 'reference' must be a mapping of score name -> value, got a sequence: [0.3]",
        ),
        (
            "name: 5\npath: mc.jsonl\nlayout: examples\n",
            "Task field 'name' must be a non-empty string, got a number: 5",
        ),
        (
            "name: t\npath: [a, b]\nlayout: examples\n",
            'field \'path\' must be a string, got a sequence: ["a", "b"]',
        ),
    ],
)
def test_task_definition_values_are_named_in_yamls_words(tmp_path, yaml, says):
    """It said "got dict", "(str)", "(NoneType)" (Python's names for what the user wrote in YAML)."""
    message = _yaml_error(tmp_path, yaml)
    assert message.startswith(f"{tmp_path / 't.yaml'}:"), message
    assert says in message, message
    for python in ("dict", "list", "NoneType", "(str)", "(int)", "(float)", "(bool)", "datetime"):
        assert python not in message, message


def test_task_definition_with_unknown_keys_of_several_kinds_names_them(tmp_path):
    """Unknown keys that YAML reads as a number and a string were sorted together: a bare TypeError."""
    message = _yaml_error(tmp_path, _HEAD + "1: x\nshots: 3\n")
    assert message.startswith(
        f"{tmp_path / 't.yaml'}: unknown Task fields 1 (line 4), 'shots' (line 5); known: "
    ), message


@pytest.mark.parametrize(
    ("yaml", "line", "says"),
    [
        (_HEAD + "num_fewshot: two\n", 4, "field 'num_fewshot' must be an integer"),
        ("name: t\n\npath: mc.jsonl\nlimit: 0\nlayout: examples\n", 4, "field 'limit' must be None or >= 1"),
        ("name: t\npath: mc.jsonl\nlayout: arc_easyy\n", 3, "unknown layout 'arc_easyy'"),
        (_HEAD + "kind: mc\n", 4, "kind must be one of"),
        (_HEAD + "# a comment\nreference: [0.3]\n", 5, "field 'reference' must be a mapping"),
        ("path: mc.jsonl\nname: 5\nlayout: examples\n", 2, "field 'name' must be a non-empty string"),
        (_HEAD + "num_fewshot: -1\n", 4, "field 'num_fewshot' must be >= 0"),
    ],
)
def test_task_definition_errors_name_the_line_of_the_field(tmp_path, yaml, line, says):
    """A wrong value is named at its line (`t.yaml:4: ...`), as a malformed JSON row is; it named the file only."""
    message = _yaml_error(tmp_path, yaml)
    assert message.startswith(f"{tmp_path / 't.yaml'}:{line}: "), message
    assert says in message, message


def test_a_misspelt_task_field_is_named_at_its_line_with_the_field_meant(tmp_path):
    message = _yaml_error(tmp_path, _HEAD + "num_fewshots: 5\n")
    assert message.startswith(f"{tmp_path / 't.yaml'}:4: unknown Task field 'num_fewshots'"), message
    assert "did you mean 'num_fewshot'?" in message, message
    message = _yaml_error(tmp_path, _HEAD + "fewshot_pth: a.jsonl\nlimt: 3\n")
    assert "'fewshot_pth' (line 4; did you mean 'fewshot_path'?)" in message, message
    assert "'limt' (line 5; did you mean 'limit'?)" in message, message


@pytest.mark.parametrize(
    ("yaml", "line", "says"),
    [
        # a tab indenting a field, and one after a colon: YAML allows none
        ("name: t\npath: mc.jsonl\n\tlayout: examples\n", 3, "YAML allows no tabs"),
        ("name: t\npath:\tmc.jsonl\nlayout: examples\n", 2, "YAML allows no tabs"),
        # a field indented under the one above it
        (_HEAD + "  num_fewshot: 2\n", 4, "line 4 is indented"),
        # a value holding ': ' unquoted
        (_HEAD + "description: Answer: the right one\n", 4, 'quoted, e.g. `description: "Answer: yes"`'),
        # two documents in one file
        (_HEAD + "---\nname: u\n", 4, "a task file holds one task"),
        # a bracket left open
        ("name: t\npath: [mc.jsonl\nlayout: examples\n", 3, "line 2 ('path: [mc.jsonl') opens a bracket"),
        # a control character YAML's reader refuses
        (
            "name: t\x07\npath: mc.jsonl\nlayout: examples\n",
            1,
            "(U+0007) is not allowed in YAML, at column 8",
        ),
    ],
)
def test_task_yaml_that_does_not_parse_is_named_at_its_line_with_the_fix(tmp_path, yaml, line, says):
    """It said `t.yaml: not valid YAML: while scanning for the next token ... in "<unicode string>", line 3,
    column 1`: the line only inside PyYAML's text, the file named "<unicode string>" there, and no fix for a tab."""
    message = _yaml_error(tmp_path, yaml)
    assert message.startswith(f"{tmp_path / 't.yaml'}:{line}: not valid YAML"), message
    assert says in message, message
    assert "<unicode string>" not in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        (_HEAD + "reference: {unigram_acc: high}\n", "'unigram_acc' is a string: \"high\""),
        (_HEAD + "reference: {5: 0.3}\n", "score name 5 is a number"),
        (_HEAD + "reference: {unigram_acc: true}\n", "'unigram_acc' is a boolean: true"),
    ],
)
def test_task_reference_scores_must_be_named_numbers(tmp_path, yaml, says):
    """`reference: {unigram_acc: high}` was taken, and went into results.json and the scores table as "high"."""
    message = _yaml_error(tmp_path, yaml)
    assert message.startswith(f"{tmp_path / 't.yaml'}:4: "), message
    assert "field 'reference' must map score names to numbers" in message and says in message, message
    assert Task(name="t", path="x.jsonl", layout="examples", reference={"unigram_acc": 1}).reference


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        (
            "name: t\npath: mc.jsonl\nlayout: Examples\n",
            "unknown layout 'Examples'; did you mean 'examples'?",
        ),
        (_HEAD + "kind: multiple-choice\n", "got 'multiple-choice'; did you mean 'multiple_choice'?"),
        (_HEAD + "limit: 1e3\n", 'got a string: "1e3"; YAML reads it as text: write 1000, unquoted'),
        (_HEAD + 'num_fewshot: "5"\n', 'got a string: "5"; YAML reads it as text: write 5, unquoted'),
        (_HEAD + "chance: 1e-1\n", 'got a string: "1e-1"; YAML reads it as text: write 0.1, unquoted'),
    ],
)
def test_task_values_a_user_likely_meant_are_named(tmp_path, yaml, says):
    message = _yaml_error(tmp_path, yaml)
    assert says in message, message


def test_a_task_field_given_twice_is_refused_naming_both_lines(tmp_path):
    """YAML's loader kept the last of two equal keys without a word: `limit: 5` then `limit: 50` ran 50."""
    message = _yaml_error(tmp_path, _HEAD + "limit: 5\nseed: 1\nlimit: 50\n")
    assert message.startswith(f"{tmp_path / 't.yaml'}:6: field 'limit' given twice (first at line 4)"), (
        message
    )
    assert "keep one" in message, message


def test_too_small_fewshot_pool_names_task_and_file(env, tmp_path):
    _, tok, config = env
    path = _jsonl(tmp_path / "mc.jsonl", ROWS)
    task = Task(name="small", path=str(path), layout="examples", num_fewshot=3)
    model = init(config, key=jax.random.key(0))
    with pytest.raises(ValueError) as info:
        evaluate_task(model, tok, task)
    message = str(info.value)
    assert "task 'small'" in message and str(path) in message and "'num_fewshot'" in message, message


# ---------------------------------------------------------------- empty and repeated choices


@pytest.mark.parametrize(
    ("row", "layout", "choice"),
    [
        ({"goal": "g", "sol1": "a", "sol2": "  ", "label": 0}, "piqa", "choice 1 "),
        (
            {"sentence": "The cat _ sat.", "option1": "", "option2": "dog", "answer": "2"},
            "winogrande",
            "choice 0 ",
        ),
        (
            {
                "activity_label": "A",
                "ctx_a": "x",
                "ctx_b": "y",
                "endings": ["a", "[title]", "c", "d"],
                "label": 0,
            },
            "hellaswag",
            "choice 1 ",
        ),
    ],
)
def test_an_empty_choice_names_task_document_and_choice(tmp_path, row, layout, choice):
    # document 1 (line 3: a blank line in between is skipped and not a document)
    good = {
        "piqa": {"goal": "g", "sol1": "a", "sol2": "b", "label": 1},
        "winogrande": {"sentence": "The cat _ sat.", "option1": "dog", "option2": "cat", "answer": "1"},
        "hellaswag": {"activity_label": "A", "ctx_a": "x", "ctx_b": "y", "endings": list("abcd"), "label": 0},
    }[layout]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t")
    message = str(info.value)
    assert "task 't'" in message and "document 1" in message and f"{path}:3" in message, message
    assert choice in message and "empty" in message, message


@pytest.mark.parametrize(
    ("row", "layout", "choices"),
    [
        ({"goal": "g", "sol1": "Boil it.", "sol2": "Boil it.", "label": 1}, "piqa", "choices 0 and 1"),
        (
            {
                "question": "q",
                "choices": {"text": ["a", "b", "a"], "label": ["A", "B", "C"]},
                "answerKey": "C",
            },
            "arc",
            "choices 0 and 2",
        ),
        (
            {"sentence": "The _ sat.", "option1": "cat", "option2": "cat", "answer": "2"},
            "winogrande",
            "choices 0 and 1",
        ),
        (
            {"contexts": ["x"], "continuations": ["a", "b", "c", "b"], "gold": 0},
            "examples",
            "choices 1 and 3",
        ),
    ],
)
def test_a_repeated_choice_names_task_document_and_choices(tmp_path, row, layout, choices):
    path = _jsonl(tmp_path / "dup.jsonl", [row])
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t")
    message = str(info.value)
    assert "task 't'" in message and "document 0" in message and f"{path}:1" in message, message
    assert choices in message and "same" in message, message


def test_repeated_choices_in_a_separate_fewshot_pool_are_fine(tmp_path):
    # demonstrations show only the right answer: a pool row's repeated wrong choices change nothing
    from schooner.eval._taskspec import prepared_examples

    pool = _jsonl(tmp_path / "pool.jsonl", [{"contexts": ["p"], "continuations": ["a", "b", "b"], "gold": 0}])
    path = _jsonl(tmp_path / "mc.jsonl", ROWS)
    task = Task(name="t", path=str(path), layout="examples", num_fewshot=1, fewshot_path=str(pool))
    assert prepared_examples(task)[0].contexts == ("p a\n\nThe quick brown",)


# ---------------------------------------------------------------- unreadable files


def _load(path, layout="examples"):
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t")
    return str(info.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json"])
def test_a_file_that_is_not_utf8_names_path_line_and_fix(tmp_path, suffix):
    import gzip

    rows = [json.dumps(r) for r in ROWS]
    text = (rows[0] + "\n" + rows[1].replace("class", "caf\u00e9") + "\n").encode("latin-1")
    if suffix == ".json":
        text = ("[" + rows[0] + ",\n" + rows[1].replace("class", "caf\u00e9") + "]").encode("latin-1")
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    message = _load(path)
    assert f"{path}:2" in message and "UTF-8" in message and "0xe9" in message, message


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".yaml"])
def test_a_file_that_is_not_utf8_is_named_as_the_storage_layer_names_it(tmp_path, suffix):
    """Task files and task YAML are decoded by `storage.decode_utf8`, the one decoder of input files: the
    same message (file, line, byte, column, offset in the file, fix) whichever reader met the bytes."""
    from schooner.cluster import storage

    rows = [json.dumps(r) for r in ROWS]
    text = {
        ".jsonl": rows[0] + "\n" + rows[1].replace("class", "caf\u00e9") + "\n",
        ".json": "[" + rows[0] + ",\n" + rows[1].replace("class", "caf\u00e9") + "]",
        ".yaml": "name: t\npath: mc.jsonl\nlayout: caf\u00e9\n",
    }[suffix].encode("latin-1")
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(text)
    with pytest.raises(ValueError) as expected:
        storage.decode_utf8(text, str(path), what="" if suffix == ".yaml" else "task 't'")
    with pytest.raises(ValueError) as got:
        Task.from_yaml(str(path)) if suffix == ".yaml" else load_examples(str(path), "examples", task="t")
    assert str(got.value) == str(expected.value), (got.value, expected.value)
    assert "offset" in str(got.value) and "iconv" in str(got.value), got.value


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json"])
def test_an_escaped_lone_surrogate_names_file_row_and_field(tmp_path, suffix):
    """`"\\ud800"` in JSON is half of a UTF-16 pair: Python's json reads it as a lone surrogate, which is no
    Unicode text (it cannot be encoded as UTF-8 or tokenized: a bare `TypeError` from the tokenizer). lm-eval's
    loader (`datasets` over pyarrow) refuses the file ("The surrogate pair in string is invalid. in row 0")."""
    import gzip

    bad = {"contexts": ["The quick brown"], "continuations": ["fox \ud800 jumps", "dog"], "gold": 0}
    lines = [json.dumps(ROWS[0]), json.dumps(bad)]  # ensure_ascii: the surrogate is written as \ud800
    assert "\\ud800" in lines[1]
    text = ("[" + ",\n".join(lines) + "]" if suffix == ".json" else "\n".join(lines) + "\n").encode()
    path = tmp_path / f"surrogate{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    message = _load(path)
    where = f"{path}:item 1" if suffix == ".json" else f"{path}:2"
    assert where in message and "'continuations'" in message and "surrogate" in message, message
    assert "\\ud800" in message and "item 0" in message and "write the character itself" in message, message


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json"])
def test_a_utf8_bom_at_the_start_of_a_task_file_is_read_past(tmp_path, suffix):
    """Windows tools write a byte-order mark first; lm-eval's loader (`datasets` over pyarrow) reads such a file."""
    import gzip

    lines = [json.dumps(r) for r in ROWS]
    text = "[" + ",\n".join(lines) + "]" if suffix == ".json" else "\n".join(lines) + "\n"
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"bom{suffix}"
    for path, data in ((plain, text.encode()), (marked, b"\xef\xbb\xbf" + text.encode())):
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    assert load_examples(str(marked), "examples", task="t") == load_examples(str(plain), "examples", task="t")


def test_a_bom_elsewhere_than_the_start_is_still_refused(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n\xef\xbb\xbf" + json.dumps(ROWS[1]).encode() + b"\n")
    message = _load(path)
    assert f"{path}:2" in message and "JSON" in message, message


def test_a_row_that_is_not_an_object_names_task_path_line_and_fix(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(list(ROWS[1])) + "\n")
    message = _load(path)
    assert message.startswith(f"task 't': {path}:3 is an array, not a JSON object"), message
    assert "one JSON object per line" in message, message


@pytest.mark.parametrize(
    ("value", "kind"), [({"rows": ROWS}, "an object"), ("rows", "a string"), (None, "null")]
)
def test_a_json_task_file_that_is_no_array_names_its_kind_in_jsons_words(tmp_path, value, kind):
    """It said "holds a list of rows, got dict" (Python's names); JSON lines name a row's kind as JSON's."""
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(value))
    message = _load(path)
    assert message.startswith(f"task 't': {path}: a .json task file holds an array of rows, got {kind}"), (
        message
    )
    assert "dict" not in message and "list" not in message and "NoneType" not in message, message


def test_a_json_task_file_item_that_is_no_object_names_item_and_kind(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([ROWS[0], [ROWS[1]]]))
    message = _load(path)
    assert message.startswith(f"task 't': {path}:item 1 is an array, not a JSON object"), message


@pytest.mark.parametrize(("name", "data"), [("e.jsonl", b""), ("e.jsonl", b"\n\n"), ("e.json", b"[]")])
def test_a_task_file_without_rows_is_refused_naming_it(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    assert _load(path) == f"task 't': {path} holds no rows"


def test_an_empty_gzip_task_file_has_no_rows_and_a_zero_byte_one_is_cut_short(tmp_path):
    import gzip

    empty, zero = tmp_path / "empty.jsonl.gz", tmp_path / "zero.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))
    zero.write_bytes(b"")
    assert _load(empty) == f"task 't': {empty} holds no rows"
    message = _load(zero)  # it read as an empty file: "holds no rows", not the cut copy it is
    assert message.startswith(f"task 't': {zero}: the gzip data is truncated"), message
    assert "re-create" in message, message


def test_a_zstd_task_file_is_refused_naming_path_and_fix(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl.zst", ROWS)
    message = _load(path)
    assert message.startswith(f"task 't': {path}: zstd-compressed"), message
    assert "decompress" in message, message


def test_a_gz_file_that_is_not_gzip_names_path_and_fix(tmp_path):
    path = _jsonl(tmp_path / "plain.jsonl.gz", ROWS)
    message = _load(path)
    assert str(path) in message and "not gzip" in message and "rename" in message, message


def test_a_gzip_file_without_gz_in_its_name_says_so(tmp_path):
    import gzip

    path = tmp_path / "packed.jsonl"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS).encode()))
    message = _load(path)
    assert f"{path}" in message and "gzip" in message and ".gz" in message, message


def test_a_truncated_gzip_file_names_path(tmp_path):
    import gzip

    data = gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS * 50).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    message = _load(path)
    assert str(path) in message and "truncated" in message, message


def test_a_json_or_parquet_file_that_does_not_parse_names_path(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('[{"contexts": ["x"],\n "continuations": ["a", "b"] "gold": 0}]')
    message = _load(bad_json)
    assert f"{bad_json}:2" in message and "JSON" in message, message
    bad_parquet = tmp_path / "bad.parquet"
    bad_parquet.write_bytes(b"not parquet at all")
    message = _load(bad_parquet)
    assert str(bad_parquet) in message and "parquet" in message, message


def test_a_task_yaml_that_is_not_utf8_or_yaml_names_its_path(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\u00e9\npath: mc.jsonl\nlayout: examples\n".encode("latin-1"))
    with pytest.raises(ValueError) as info:
        Task.from_yaml(str(latin))
    assert f"{latin}:1" in str(info.value) and "UTF-8" in str(info.value), str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: t\npath: [mc.jsonl\nlayout: examples\n")
    with pytest.raises(ValueError) as info:
        Task.from_yaml(str(broken))
    assert str(broken) in str(info.value) and "YAML" in str(info.value), str(info.value)


def test_a_whitespace_choice_is_text_not_empty(tmp_path):
    """A blank next line is a real choice of a code task (lm-eval scores it): only "" is empty."""
    path = tmp_path / "code.jsonl"
    row = {"contexts": ["def f():"], "continuations": ["\n", "    return 1\n"], "gold": 1}
    path.write_text(json.dumps(row) + "\n")
    (example,) = load_examples(str(path), "examples", task="t")
    assert example.continuations == ("\n", "    return 1\n")
    path.write_text(json.dumps({**row, "continuations": ["", "x"]}) + "\n")
    with pytest.raises(ValueError, match="empty"):
        load_examples(str(path), "examples", task="t")


_TEXT_ROWS = {
    "lambada": {"text": "He opened the door and saw Tom"},
    "piqa": {"goal": "g", "sol1": "a", "sol2": "b", "label": 0},
    "hellaswag": {"activity_label": "Act", "ctx_a": "a", "ctx_b": "b", "endings": ["x", "y"], "label": "0"},
    "winogrande": {"sentence": "The _ is small.", "option1": "box", "option2": "cup", "answer": "1"},
    "copa": {"premise": "It rained.", "choice1": "A b.", "choice2": "C d.", "question": "effect", "label": 0},
    "boolq": {"question": "q", "passage": "p", "label": 1},
    "arc": {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"},
    "openbookqa": {
        "question_stem": "q",
        "choices": {"text": ["a", "b"], "label": ["A", "B"]},
        "answerKey": "B",
    },
}


@pytest.mark.parametrize(
    ("layout", "field", "value", "fix"),
    [
        ("lambada", "text", 5, "string"),
        ("lambada", "text", None, "string"),
        ("piqa", "sol1", None, "string"),
        ("piqa", "goal", ["g"], "string"),
        ("hellaswag", "activity_label", None, "string"),
        ("hellaswag", "ctx_b", 3, "string"),
        ("winogrande", "sentence", None, "string"),
        ("copa", "choice1", "", "empty"),
        ("copa", "premise", None, "string"),
        ("copa", "question", "why", "'cause' or 'effect'"),
        ("boolq", "passage", None, "string"),
        ("arc", "question", None, "string"),
        ("openbookqa", "question_stem", {"x": 1}, "string"),
    ],
)
def test_a_text_field_of_the_wrong_type_names_the_field(tmp_path, layout, field, value, fix):
    """A text field holding a number, null, a list or an object (a mis-exported dataset) is a ValueError naming
    the file:line, the field and the fix (was a raw AttributeError, a message about an operand type, "string
    index out of range", or "missing field 'why'" for COPA's `question`)."""
    row = {**_TEXT_ROWS[layout], field: value}
    path = _jsonl(tmp_path / "bad.jsonl", [_TEXT_ROWS[layout], row])
    with pytest.raises(ValueError) as info:
        load_examples(str(path), layout, task="t")
    message = str(info.value)
    assert f"{path}:2" in message and repr(field) in message and fix in message, message


def test_a_checkpoint_trained_with_other_special_tokens_is_refused(env, tmp_path):
    """The same tokenizer.json with another EOS (its tokenizer_config.json edited): the fingerprint matches, but
    the model learnt to end documents with the recorded id, and generation, the harness's end-of-text and
    rolling scores would use another one. `checkpoint.json`'s `tokenizer_special_ids` are compared."""
    from schooner.eval import load_checkpoint
    from schooner.tokenize import load_tokenizer

    root, tok, config = env
    tok.save(str(tmp_path / "tok"))
    other = load_tokenizer(str(tmp_path / "tok"), eos_token=tok.pad_token)
    assert other.fingerprint == tok.fingerprint and other.eos_id != tok.eos_id
    folder = tmp_path / "run" / "step-000001"
    save_model(str(folder), init(config, key=jax.random.key(0)), config)
    record = {
        "step": 1,
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_special_ids": {"bos_id": tok.bos_id, "eos_id": tok.eos_id},
    }
    (folder / "checkpoint.json").write_text(json.dumps(record))
    load_checkpoint(str(tmp_path / "run"), tokenizer=tok)
    with pytest.raises(ValueError, match=rf"eos_id={tok.eos_id}.*eos_id={other.eos_id}"):
        load_checkpoint(str(tmp_path / "run"), tokenizer=other)


def test_a_checkpoint_trained_with_another_tokenizer_of_the_same_size_is_refused(env, tmp_path):
    """The train loop records its tokenizer's fingerprint in each checkpoint's `checkpoint.json`. Another
    tokenizer of the same vocabulary size (the same corpus' BPE trained on other texts) gives valid ids and
    plausible-looking, wrong scores: `load_checkpoint(..., tokenizer=)` and the evaluate step refuse it, naming
    both fingerprints; the checkpoint's own tokenizer loads."""
    from schooner.eval import load_checkpoint

    root, tok, config = env
    other = train_bpe(
        ["Lorem ipsum dolor sit amet, consectetur adipiscing elit."] * 8, vocab_size=tok.vocab_size
    )
    assert other.vocab_size == tok.vocab_size and other.fingerprint != tok.fingerprint
    other.save(str(tmp_path / "other-tok"))
    folder = tmp_path / "run" / "step-000001"
    save_model(str(folder), init(config, key=jax.random.key(0)), config)
    (folder / "checkpoint.json").write_text(json.dumps({"step": 1, "tokenizer_fingerprint": tok.fingerprint}))
    model, _, found = load_checkpoint(str(tmp_path / "run"), tokenizer=tok)
    assert found == str(folder)
    with pytest.raises(ValueError, match=f"{tok.fingerprint}.*{other.fingerprint}"):
        load_checkpoint(str(tmp_path / "run"), tokenizer=other)
    _jsonl(tmp_path / "mc.jsonl", ROWS)
    task = Task(name="mc", path=str(tmp_path / "mc.jsonl"), layout="examples")
    handle = evaluate(
        "eval/t", checkpoint=str(tmp_path / "run"), tokenizer=str(tmp_path / "other-tok"), seq_len=32,
        tasks=[task], prompts=(),
    )  # fmt: skip
    with pytest.raises(Exception, match="trained with the tokenizer of fingerprint"):
        StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([handle])


def test_a_missing_row_field_says_the_field_the_row_likely_meant(tmp_path):
    """A row with `context` where the layout reads `contexts` listed the row's keys, leaving the match to the
    reader; it now says which key it likely is."""
    path = _jsonl(tmp_path / "mc.jsonl", [{"context": ["x"], "continuations": ["a", "b"], "gold": 0}])
    with pytest.raises(ValueError) as info:
        load_examples(str(path), "examples", task="t")
    message = str(info.value)
    assert "missing field 'contexts'" in message, message
    assert "the row has 'context': rename it to 'contexts'" in message, message
    unrelated = _jsonl(tmp_path / "u.jsonl", [{"prompt": ["x"], "continuations": ["a", "b"], "gold": 0}])
    with pytest.raises(ValueError) as info:
        load_examples(str(unrelated), "examples", task="t")
    assert "missing field 'contexts'" in str(info.value) and "rename" not in str(info.value), str(info.value)


def test_an_empty_path_in_a_task_yaml_is_named_at_its_line(tmp_path):
    """`path: ""` was read as the task's folder and failed only when the task ran ("no file at ''")."""
    message = _yaml_error(tmp_path, 'name: t\npath: ""\nlayout: examples\n')
    assert message.startswith(f"{tmp_path / 't.yaml'}:2: "), message
    assert "field 'path' is empty" in message and "path: rows.jsonl" in message, message
    message = _yaml_error(tmp_path, _HEAD + 'fewshot_path: ""\n')
    assert message.startswith(f"{tmp_path / 't.yaml'}:4: "), message
    assert "field 'fewshot_path' is empty" in message, message
