"""Tasks in the evaluate step, the bundled tasks from the embedded corpus, and task texts for decontamination."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import jax
import pytest

from schooner.cluster import StepRunner, write_report
from schooner.data import read_shards
from schooner.eval import BundledTasks, SamplingConfig, Task, bundled_suite, evaluate_task, generate_texts
from schooner.eval._bundled import Unigram
from schooner.eval._taskspec import load_examples
from schooner.eval.steps import evaluate, evaluate_checkpoints, task_texts
from schooner.model import init, load_model, presets, save_model
from schooner.tokenize import train_bpe

ROWS = [
    {"contexts": ["The quick brown"], "continuations": ["fox", "dog jumps"], "gold": 0},
    {"contexts": ["def add(a, b):"], "continuations": ["return a + b", "class"], "gold": 0},
]


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundled")
    return folder, bundled_suite(str(folder), size=40)


def test_bundled_tasks_carry_chance_and_a_unigram_reference(bundled):
    folder, suite = bundled
    assert [t.name for t in suite.tasks] == ["docs_cloze", "docs_function_name", "docs_next_sentence"]
    from schooner.data.sources import iter_source

    unigram = Unigram([r["text"] for r in iter_source("python-docs")])
    for task in suite.tasks:
        examples = load_examples(task.path, task.layout)
        assert len(examples) == 40
        assert task.kind == "multiple_choice" and task.chance == pytest.approx(0.25)
        assert all(e.num_choices == 4 and 0 <= e.gold < 4 for e in examples)
        if (
            task.name != "docs_function_name"
        ):  # one context: the unigram's pick (a tie: a random pick among the tied)
            hits = 0.0
            for e in examples:
                lps = [unigram.logprob(c) for c in e.continuations]
                tied = [i for i, lp in enumerate(lps) if lp == max(lps)]
                hits += (e.gold in tied) / len(tied)
            assert task.reference["unigram_acc"] == pytest.approx(hits / 40)
    # function names: the docstring is shared, the name differs (a unigram cannot tell: it scores chance)
    names = next(t for t in suite.tasks if t.name == "docs_function_name")
    assert names.reference["unigram_acc"] == pytest.approx(0.25)
    # the same settings reuse the files; the construction is deterministic
    assert bundled_suite(str(folder), size=40) == suite
    again = bundled_suite(str(folder / "again"), size=40)
    for a, b in zip(suite.tasks, again.tasks, strict=True):
        assert Path(a.path).read_text() == Path(b.path).read_text()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("taskstep")
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n"] * 8
    tok = train_bpe(texts, vocab_size=280)
    tok.save(str(root / "tok"))
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=256,  # a byte-sized vocabulary: long choices
    )  # fmt: skip
    save_model(str(root / "ckpt"), init(config, key=jax.random.key(0)), config)
    path = root / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root, tok, Task(name="mc", path=str(path), layout="examples")


@pytest.mark.slow  # ~70 s on 2 cores: 600 bundled documents at 256 tokens
def test_evaluate_step_scores_tasks_and_bundled_suites(run, tmp_path):
    root, tok, task = run
    handle = evaluate(
        "eval/tasks", checkpoint=str(root / "ckpt"), tokenizer=str(root / "tok"), seq_len=32,
        tasks=[task, "bundled"], prompts=("The",), max_new_tokens=6, task_batch_size=4,
        sampling=SamplingConfig(temperature=0.8, seed=2),
    )  # fmt: skip
    outcome = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([handle])[handle]
    results = json.loads((Path(outcome.output_path) / "results.json").read_text())
    model, _ = load_model(str(root / "ckpt"))
    want = evaluate_task(model, tok, task)
    got = results["tasks"]["mc"]
    assert got["acc"] == want["acc"] and got["logprob"] == want["logprob"]
    assert set(results["tasks"]) == {"mc", "docs_cloze", "docs_function_name", "docs_next_sentence"}
    assert set(results["suites"]) == {"bundled"}
    summary = outcome.result["tasks"]["docs_next_sentence"]
    assert summary["chance"] == pytest.approx(0.25) and "unigram_acc" in summary["reference"]
    assert summary["documents"] == 200
    assert math.isfinite(summary["acc_stderr"])
    (sample,) = results["samples"]
    assert (
        sample["sampled"]
        == generate_texts(model, tok, ["The"], 6, sampling=SamplingConfig(temperature=0.8, seed=2))[0]
    )
    assert results["parameters"] == outcome.result["parameters"] > 0


def test_evaluate_step_rejects_what_it_cannot_run(run):
    root, _, task = run
    with pytest.raises(ValueError, match="a Task, a Suite, a BundledTasks or the string 'bundled'"):
        evaluate("eval/x", checkpoint="c", tokenizer="t", seq_len=8, tasks=["arc"])
    with pytest.raises(ValueError, match="BundledTasks: size must be a positive int, got size=0"):
        BundledTasks(size=0)
    with pytest.raises(ValueError, match=r"non-empty dict of name -> dataset \(or give tasks=\)"):
        evaluate("eval/x", checkpoint="c", tokenizer="t", seq_len=8)


def test_task_texts_writes_records_decontamination_reads(run, tmp_path):
    root, _, task = run
    shots = root / "shots.jsonl"
    shots.write_text(json.dumps(ROWS[0]) + "\n")
    with_shots = dataclasses.replace(task, name="mc5", num_fewshot=1, fewshot_path=str(shots))
    handle = task_texts("eval/texts", tasks=[task, with_shots])
    outcome = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([handle])[handle]
    records = list(read_shards(outcome.output_path))
    assert [r["id"] for r in records] == ["mc/0", "mc/1", "mc5/0", "mc5/1", "mc5/fewshot/0"]
    assert records[0]["source"] == "mc" and records[0]["text"] == "The quick brown\nfox\ndog jumps"
    assert records[-1]["metadata"]["split"] == "fewshot"
    assert outcome.result["per_task"] == {"mc/eval": 2, "mc5/eval": 2, "mc5/fewshot": 1}
    from schooner.data.curation import load_eval_items

    items = load_eval_items(outcome.output_path)
    assert {it["task"] for it in items} == {"mc", "mc5"} and len(items) == 5


def test_evaluate_checkpoints_scores_every_step_and_plots(run, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="schooner.eval")
    root, tok, task = run
    config = load_model(str(root / "ckpt"))[1]
    folder = tmp_path / "train-run"
    for number, seed in ((3, 1), (7, 2)):
        save_model(str(folder / f"step-{number:06d}"), init(config, key=jax.random.key(seed)), config)
        (folder / f"step-{number:06d}" / "checkpoint.json").write_text("{}")
    (folder / "step-000009").mkdir()  # unfinished: no config.json, no marker
    handle = evaluate_checkpoints(
        "eval/curve", run=str(folder), tokenizer=str(root / "tok"), seq_len=32, tasks=[task], prompts=()
    )
    outcome = StepRunner(prefix=str(tmp_path / "prefix"), quiet=True).run([handle])[handle]
    out = Path(outcome.output_path)
    rows = json.loads((out / "scores.json").read_text())
    assert [r["step"] for r in rows] == outcome.result["steps"] == [3, 7]
    for row in rows:
        model, _ = load_model(row["checkpoint"])
        assert row["mc/acc"] == evaluate_task(model, tok, task)["acc"]
        assert (out / f"step-{row['step']:06d}" / "results.json").is_file()
    assert (out / "scores.png").read_bytes().startswith(b"\x89PNG")
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task mc: acc")]
    assert len(progress) == 2 and all("over 2 documents in" in m for m in progress), progress
    # the report (which knows nothing of evaluation) shows a table per checkpoint and embeds the plot
    page = Path(write_report(str(tmp_path / "prefix"))).read_text(encoding="utf-8")
    png = base64.b64encode((out / "scores.png").read_bytes()).decode("ascii")
    assert f"data:image/png;base64,{png}" in page
    for row in rows:
        drawn = re.search(
            rf"<h4>Scores at step {row['step']}</h4>(?:<div class=\"wide\">)?<table class=\"named\">(.*?)</table>",
            page,
        )
        assert drawn, f"no table for step {row['step']}"
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", drawn.group(1))]
        task_result = json.loads((out / f"step-{row['step']:06d}" / "results.json").read_text())["tasks"][
            "mc"
        ]
        acc = cells[cells.index("acc") + 1 : cells.index("acc") + 4]
        assert float(acc[0]) == pytest.approx(row["mc/acc"], abs=1e-6)
        assert float(acc[1]) == pytest.approx(task_result["acc_stderr"], rel=1e-5)
        assert float(acc[2]) == pytest.approx(task_result["chance"], rel=1e-5)
