"""Log-likelihood tasks: scores against numpy references, batch/padding/order invariance, few-shot, layouts."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import equinox as eqx
import jax
import numpy as np
import pytest

from schooner.eval import (
    Example,
    Request,
    Task,
    core_suite,
    encode_pair,
    evaluate_suite,
    evaluate_task,
    example_requests,
    rolling_requests,
    score_requests,
    score_rolling,
)
from schooner.model import init, presets
from schooner.tokenize import train_bpe

TEXTS = [
    "Question: What is the capital of France?\nAnswer: Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog. A lazy dog sleeps all day.",
    "def add(a, b):\n    return a + b\n",
    "Python is a programming language that lets you work quickly and integrate systems.",
] * 5


@pytest.fixture(scope="module")
def tok():
    return train_bpe(TEXTS, vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=2, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=96,
    )  # fmt: skip
    return init(config, key=jax.random.key(3))


@eqx.filter_jit
def _forward(model, tokens):
    return model(tokens)


def _reference_logprob(model, request: Request) -> tuple[float, bool]:
    """The request alone, unpadded, log-softmax in float64 numpy."""
    tokens = np.asarray(request.context + request.continuation, np.int32)[-(model.config.max_seq_len + 1) :]
    n = len(tokens) - 1
    window = np.zeros((1, model.config.max_seq_len), np.int32)  # one shape: causal attention ignores the tail
    window[0, :n] = tokens[:-1]
    logits = np.asarray(_forward(model, window), np.float64)[0, :n]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    k = len(request.continuation)
    targets = tokens[1:][-k:]
    rows = logp[-k:]
    return float(rows[np.arange(k), targets].sum()), bool((rows.argmax(-1) == targets).all())


def _requests(tok, n=13, seed=0, max_words=25):
    rng = random.Random(seed)
    words = " ".join(TEXTS).split()
    out = []
    for _ in range(n):
        a = rng.randint(0, len(words) - 30)
        ctx = " ".join(words[a : a + rng.randint(1, max_words)])
        cont = " ".join(words[a + 30 : a + 30 + rng.randint(1, 4)])
        out.append(encode_pair(tok, ctx, " " + cont))
    return out


def test_scores_match_an_unbatched_numpy_reference(model, tok):
    requests = _requests(tok)
    got = score_requests(model, requests, batch_size=4)
    for r, s in zip(requests, got, strict=True):
        want, greedy = _reference_logprob(model, r)
        assert s.num_tokens == len(r.continuation)
        assert s.greedy == greedy
        # float32 logits on both sides, the reference's log-softmax in float64: a few ulps of the sum
        assert s.logprob == pytest.approx(want, abs=2e-5 * s.num_tokens)


def test_scores_are_bitwise_the_same_for_any_batch_size_and_order(model, tok):
    requests = _requests(tok, n=17, seed=1, max_words=6)  # one length bucket: fewer compilations
    base = score_requests(model, requests, batch_size=1)
    for batch_size in (4, 16):
        assert score_requests(model, requests, batch_size=batch_size) == base
    order = list(range(len(requests)))
    random.Random(5).shuffle(order)
    shuffled = score_requests(model, [requests[i] for i in order], batch_size=4)
    assert [shuffled[order.index(i)] for i in range(len(requests))] == base


def test_padding_is_a_function_of_the_request_alone(model, tok, monkeypatch):
    """A row's padding is set by its own length (`BUCKET`), so batch-mates never change it (the bitwise test
    above). Padding the same rows to another bucket changes matmul shapes, hence XLA's summation order: the
    scores then agree to float32 rounding only (measured: 5e-7 on sums near -30), never more."""
    from schooner.eval import _loglikelihood

    requests = _requests(tok, n=6, seed=2)
    base = score_requests(model, requests, batch_size=2)
    monkeypatch.setattr(_loglikelihood, "BUCKET", 96)  # every row padded to the full window instead
    wide = score_requests(model, requests, batch_size=2)
    for a, b in zip(base, wide, strict=True):
        assert a.greedy == b.greedy and a.num_tokens == b.num_tokens
        assert a.logprob == pytest.approx(b.logprob, rel=1e-6, abs=1e-6 * a.num_tokens)


def test_long_requests_keep_their_last_tokens(model):
    request = Request(tuple(range(1, 200)), (7, 8))
    (got,) = score_requests(model, [request])
    want, _ = _reference_logprob(model, request)
    assert got.logprob == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="does not fit"):
        score_requests(model, [Request((1,), tuple(range(100)))])


def test_an_overlong_continuation_names_the_task_and_document(model, tok, tmp_path):
    """A continuation longer than the model's window is an error (lm-eval's `hf` backend asserts the same
    limit, with a bare AssertionError); it named no task or document, so the row could not be found."""
    long_answer = " ".join(["The quick brown fox jumps over the lazy dog."] * 20)
    assert len(tok.encode(" " + long_answer)) > model.config.max_seq_len
    rows = [
        {"contexts": ["The quick brown"], "continuations": ["fox", "dog"], "gold": 0},
        {"contexts": ["A lazy dog"], "continuations": ["sleeps", long_answer], "gold": 0},
    ]
    path = _write_jsonl(tmp_path / "long.jsonl", rows)
    with pytest.raises(ValueError) as err:
        evaluate_task(model, tok, Task(name="long", path=path, layout="examples"))
    message = str(err.value)
    assert "task 'long'" in message and "document 1" in message and f"{path}:2" in message, message
    assert "choice 1" in message and f"{model.config.max_seq_len}-token window" in message, message


def test_the_boundary_is_in_token_space(tok):
    # the context's trailing space moves to the continuation (lm-eval's split: see test_encode_pair.py)
    r1 = encode_pair(tok, "Answer: ", "Paris")
    r2 = encode_pair(tok, "Answer:", " Paris")
    assert r1 == r2
    assert list(r1.context) == tok.encode("Answer:")
    assert list(r1.continuation) == tok.encode(" Paris")
    empty = encode_pair(tok, "", "Paris")
    assert len(empty.context) == 1


def test_example_requests_are_each_choice_after_the_delimiter(tok):
    # one context, four choices (multiple choice); four contexts, one continuation (WinoGrande's partial scoring)
    mc = Example(contexts=("Question: 2 + 2?\nAnswer:",), continuations=("4", "5", "22", "four"), gold=0)
    assert example_requests(tok, mc, " ") == [
        encode_pair(tok, "Question: 2 + 2?\nAnswer:", " " + c) for c in ("4", "5", "22", "four")
    ]
    wino = Example(contexts=("The cat", "The dog"), continuations=("sat down.",), gold=1)
    assert example_requests(tok, wino, "") == [
        encode_pair(tok, "The cat", "sat down."),
        encode_pair(tok, "The dog", "sat down."),
    ]


def test_rolling_windows_predict_every_token_once(model):
    doc = list(range(3, 250))
    windows = rolling_requests(doc, start=0, max_length=96)
    assert [t for w in windows for t in w.continuation] == doc
    assert all(len(w.context) + len(w.continuation) <= 97 for w in windows)
    assert windows[0].context == (0,)
    (total,) = score_rolling(model, [doc], start=0, batch_size=2)
    want = sum(_reference_logprob(model, w)[0] for w in windows)
    assert total == pytest.approx(want, abs=1e-3)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_multiple_choice_metrics_by_hand(model, tok, tmp_path):
    rows = [
        {"contexts": ["Question: capital of France?\nAnswer:"], "continuations": ["Paris", "a lazy dog sleeps"], "gold": 0},
        {"contexts": ["The quick brown"], "continuations": ["fox", "Python is"], "gold": 1},
        {"contexts": ["def add(a, b):"], "continuations": ["return", "Ünï"], "gold": 0},
    ]  # fmt: skip
    task = Task(name="mc", path=_write_jsonl(tmp_path / "mc.jsonl", rows), layout="examples")
    out = evaluate_task(model, tok, task, batch_size=2, keep_documents=True)
    accs, norms, bnorms, probs = [], [], [], []
    for row, doc in zip(rows, out["per_document"], strict=True):
        lps = []
        for cont in row["continuations"]:
            lps.append(_reference_logprob(model, encode_pair(tok, row["contexts"][0], " " + cont))[0])
        assert doc["logprobs"] == pytest.approx(lps, abs=1e-4)
        lps = np.array(lps)
        chars = np.array([len(c) for c in row["continuations"]])
        nbytes = np.array([len(c.encode()) for c in row["continuations"]])
        accs.append(float(np.argmax(lps) == row["gold"]))
        norms.append(float(np.argmax(lps / chars) == row["gold"]))
        bnorms.append(float(np.argmax(lps / nbytes) == row["gold"]))
        probs.append(float(np.exp(lps[row["gold"]]) / np.exp(lps).sum()))
    assert out["acc"] == pytest.approx(np.mean(accs))
    assert out["acc_norm"] == pytest.approx(np.mean(norms))
    assert out["acc_norm_bytes"] == pytest.approx(np.mean(bnorms))
    assert out["prob_norm"] == pytest.approx(np.mean(probs), rel=1e-6)
    assert out["acc_stderr"] == pytest.approx(np.std(accs, ddof=1) / math.sqrt(3))
    assert out["chance"] == pytest.approx(0.5)
    assert out["documents"] == 3


def test_task_scores_invariant_to_batch_size_and_file_order(model, tok, tmp_path):
    rng = random.Random(0)
    words = " ".join(TEXTS).split()
    rows = [
        {"text": " ".join(words[a : a + rng.randint(3, 20)])}
        for a in (rng.randint(0, len(words) - 25) for _ in range(12))
    ]
    task = Task(name="lam", path=_write_jsonl(tmp_path / "a.jsonl", rows), layout="lambada")
    base = evaluate_task(model, tok, task, batch_size=1, keep_documents=True)
    for bs in (4, 16):
        assert evaluate_task(model, tok, task, batch_size=bs, keep_documents=True) == base
    assert base["kind"] == "continuation" and 0.0 <= base["acc"] <= 1.0
    assert base["perplexity"] == pytest.approx(math.exp(-base["logprob"]))


def test_fewshot_prompts_are_seeded_per_document_and_exclude_the_document(tmp_path, tok):
    from schooner.eval._taskspec import prepared_examples

    rows = [
        {"question": f"q{i}", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "B"}
        for i in range(8)
    ]
    path = _write_jsonl(tmp_path / "arc.jsonl", rows)
    task = Task(name="arc", path=path, layout="arc", num_fewshot=3, seed=7)
    full = prepared_examples(task)
    again = prepared_examples(task)
    assert full == again
    for i, ex in enumerate(full):
        shots = ex.contexts[0].split("\n\n")
        assert len(shots) == 4 and shots[-1] == f"Question: q{i}\nAnswer:"
        assert all(s.endswith("Answer: y") for s in shots[:3])
        assert f"Question: q{i}\n" not in "\n\n".join(shots[:3])
    # with a separate few-shot file, the first 5 documents alone get the prompts they get in the full run
    shots_file = _write_jsonl(tmp_path / "train.jsonl", rows)
    sep = dataclasses.replace(task, fewshot_path=shots_file)
    assert prepared_examples(dataclasses.replace(sep, limit=5)) == prepared_examples(sep)[:5]
    assert prepared_examples(dataclasses.replace(sep, seed=8)) != prepared_examples(sep)
    with pytest.raises(ValueError, match="few-shot pool .* 7 usable"):
        prepared_examples(dataclasses.replace(task, num_fewshot=8))


# One row per benchmark in its Hugging Face dataset's layout, with the prompt lm-evaluation-harness builds.
HF_ROWS = {
    "arc": (
        {"id": "Mercury_1", "question": "Which gas do plants absorb?", "choices": {"text": ["oxygen", "carbon dioxide"], "label": ["A", "B"]}, "answerKey": "B"},
        ["Question: Which gas do plants absorb?\nAnswer:"], ["oxygen", "carbon dioxide"], 1,
    ),
    "hellaswag": (
        {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.", "ctx_b": "then", "ctx": "...", "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift [title] while two men supporting the head of the person."], "source_id": "x", "split": "val", "split_type": "indomain", "label": "1"},
        ["Removing ice from car: Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. Then"],
        [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift. while two men supporting the head of the person."], 1,
    ),
    "piqa": (
        {"goal": "How do I open a jar?", "sol1": "Twist the lid.", "sol2": "Eat the lid.", "label": 0},
        ["Question: How do I open a jar?\nAnswer:"], ["Twist the lid.", "Eat the lid."], 0,
    ),
    "boolq": (
        {"question": "is paris in france", "passage": "Paris is the capital of France.", "idx": 0, "label": 1},
        ["Paris is the capital of France.\nQuestion: is paris in france?\nAnswer:"], ["no", "yes"], 1,
    ),
    "winogrande": (
        {"sentence": "The trophy doesn't fit into the suitcase because the _ is too small.", "option1": "trophy", "option2": "suitcase", "answer": "2"},
        ["The trophy doesn't fit into the suitcase because the trophy", "The trophy doesn't fit into the suitcase because the suitcase"],
        ["is too small."], 1,
    ),
    "copa": (
        {"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.", "choice2": "The grass was cut.", "question": "cause", "idx": 0, "label": 0},
        ["My body cast a shadow over the grass because"], [" the sun was rising.", " the grass was cut."], 0,
    ),
    "openbookqa": (
        {"id": "7-980", "question_stem": "The sun is responsible for", "choices": {"text": ["puppies learning new tricks", "plants sprouting"], "label": ["A", "B"]}, "answerKey": "B"},
        ["The sun is responsible for"], ["puppies learning new tricks", "plants sprouting"], 1,
    ),
    "commonsense_qa": (
        {"id": "x", "question": "Where do you keep milk?", "question_concept": "milk", "choices": {"label": ["A", "B", "C"], "text": ["fridge", "shoe", "sky"]}, "answerKey": "A"},
        ["Question: Where do you keep milk?\nAnswer:"], ["fridge", "shoe", "sky"], 0,
    ),
    "lambada": (
        {"text": "He opened the door and saw his old friend Tom"},
        ["He opened the door and saw his old friend"], ["Tom"], 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("layout", sorted(HF_ROWS))
def test_layouts_build_the_harness_prompts(layout, tmp_path):
    from schooner.eval._taskspec import load_examples

    row, contexts, continuations, gold = HF_ROWS[layout]
    path = _write_jsonl(tmp_path / f"{layout}.jsonl", [row])
    (ex,) = load_examples(path, layout, task=layout)
    assert (list(ex.contexts), list(ex.continuations), ex.gold) == (contexts, continuations, gold)


def test_parquet_and_yaml_task_files(tmp_path, model, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = HF_ROWS["piqa"][0]
    pq.write_table(pa.Table.from_pylist([row, {**row, "label": 1}]), tmp_path / "piqa.parquet")
    (tmp_path / "piqa.yaml").write_text("name: piqa\npath: piqa.parquet\nlayout: piqa\n")
    task = Task.from_yaml(str(tmp_path / "piqa.yaml"))
    assert task.path == str(tmp_path / "piqa.parquet") and task.kind == "multiple_choice"
    out = evaluate_task(model, tok, task)
    assert out["documents"] == 2 and out["acc"] == 0.5  # the same choices, one right each time
    (tmp_path / "bad.yaml").write_text("name: x\npath: p.jsonl\nlayout: arc\nshots: 3\n")
    with pytest.raises(ValueError, match=r"bad.yaml:4: unknown Task field 'shots'"):
        Task.from_yaml(str(tmp_path / "bad.yaml"))


def test_bad_rows_and_missing_files_are_named(tmp_path, model, tok):
    path = _write_jsonl(tmp_path / "arc.jsonl", [HF_ROWS["arc"][0], {"question": "q", "answerKey": "A"}])
    with pytest.raises(ValueError, match=r"document 1 \(.*arc.jsonl:2\): missing field 'choices'"):
        evaluate_task(model, tok, Task(name="arc", path=path, layout="arc"))
    with pytest.raises(ValueError, match="unknown layout"):
        Task(name="x", path=path, layout="arcc")
    suite = core_suite(str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=r"arc_easy/test.jsonl.*piqa/train.jsonl"):
        evaluate_suite(model, tok, suite)


def test_core_suite_runs_when_its_files_are_present(tmp_path, model, tok):
    from schooner.eval._taskspec import CORE_TASKS

    layout_of = {name: layout for name, layout, *_ in CORE_TASKS}
    for name, _, shots, split, shot_split in CORE_TASKS:
        row = HF_ROWS[layout_of[name]][0]
        (tmp_path / name).mkdir()
        _write_jsonl(tmp_path / name / f"{split}.jsonl", [row] * 2)
        if shots:
            _write_jsonl(tmp_path / name / f"{shot_split}.jsonl", [row] * 12)
    out = evaluate_suite(model, tok, core_suite(str(tmp_path)), batch_size=16)
    assert set(out["tasks"]) == set(layout_of)
    assert out["tasks"]["arc_easy"]["num_fewshot"] == 10
    assert 0.0 <= out["average"]["acc"] <= 1.0


def test_a_tokenizer_larger_than_the_models_vocabulary_is_an_error(tok, tmp_path):
    """A checkpoint of another vocabulary (here 260 entries) scored with a 300-token tokenizer: ids past the
    embedding table gave NaN log-probabilities, and `acc` 1.0 (argmax of NaNs is choice 0, the gold one)."""
    from schooner.eval import generate, generate_texts

    config = dataclasses.replace(
        presets.llama_nano, vocab_size=260, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=64,
    )  # fmt: skip
    small = init(config, key=jax.random.key(0))
    ids = tok.encode("The quick brown fox")
    assert max(ids) >= 260
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"contexts": ["The quick brown"], "continuations": ["fox", "dog"], "gold": 0}))
    with pytest.raises(ValueError, match=r"token id \d+ .*vocabulary has 260 entries"):
        evaluate_task(small, tok, Task(name="t", path=str(path), layout="examples"))
    with pytest.raises(ValueError, match=r"token id \d+ .*vocabulary has 260 entries"):
        score_rolling(small, [ids], start=tok.bos_id)
    with pytest.raises(ValueError, match=r"token id \d+ .*vocabulary has 260 entries"):
        generate_texts(small, tok, ["The quick brown"], 4)
    with pytest.raises(ValueError, match=r"token id \d+ .*vocabulary has 260 entries"):
        generate(small, tok, "The quick brown", 4)


def _lm_eval_task_module(relative: str):
    """A task helper module of the installed lm-eval (its own `utils.py`), loaded from its file alone."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("lm-eval is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tasks", relative)
    module_spec = importlib.util.spec_from_file_location(f"lm_eval_task_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


COPA_ROWS = [
    {"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.", "choice2": "The grass was cut.", "question": "cause", "idx": 0, "label": 0},
    {"premise": "The man broke his toe.", "choice1": "He dropped a hammer on his foot.", "choice2": "He got a hole in his sock.", "question": "cause", "idx": 1, "label": 0},
    {"premise": "I tipped the bottle. ", "choice1": "The liquid in the bottle froze.", "choice2": "The liquid in the bottle poured out.", "question": "effect", "idx": 2, "label": 1},
]  # fmt: skip


def test_copa_requests_and_lengths_are_lm_evals(tmp_path):
    """lm-eval's `copa` (super_glue/copa/utils.py): context `premise[:-1] + " because"`, choices
    `" " + lowercased choice` after the default target delimiter " " (two spaces), `acc_norm` dividing by the
    choice's length with its leading space."""
    from schooner.eval._taskspec import load_examples

    utils = _lm_eval_task_module("super_glue/copa/utils.py")
    path = _write_jsonl(tmp_path / "copa.jsonl", COPA_ROWS)
    examples = load_examples(path, "copa", task="copa")
    for row, ex in zip(COPA_ROWS, examples, strict=True):
        choices = utils.doc_to_choice(row)
        want = [
            (utils.doc_to_text(row), " " + c) for c in choices
        ]  # construct_requests, target_delimiter " "
        assert [(c, " " + cont) for c, cont in ex.pairs()] == want
        assert ex.gold == row["label"] and list(ex.norm_texts()) == choices


def test_limit_does_not_change_the_fewshot_prompts_drawn_from_the_evaluated_file(tmp_path):
    """With no `fewshot_path` the demonstrations come from the evaluated file. lm-eval draws them from the
    whole split whatever `--limit` says; Schooner drew them from the first `limit` rows only, so a document's
    prompt (and score) changed with `limit`, and `limit` <= `num_fewshot` was refused."""
    from schooner.eval._taskspec import prepared_examples

    rows = [
        {"question": f"q{i}", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "B"}
        for i in range(12)
    ]
    task = Task(
        name="arc", path=_write_jsonl(tmp_path / "arc.jsonl", rows), layout="arc", num_fewshot=4, seed=3
    )
    full = prepared_examples(task)
    for limit in (1, 4, 6):
        assert prepared_examples(dataclasses.replace(task, limit=limit)) == full[:limit], limit


WINOGRANDE_ROWS = [
    {"sentence": "The trophy would not fit in the suitcase because the _ was too big.", "option1": "trophy", "option2": "suitcase", "answer": "1"},
    {"sentence": "Python is a language that _ lets you work quickly.", "option1": "programming", "option2": "dog", "answer": "1"},
    {"sentence": "The quick brown fox jumps over the _ dog.", "option1": "lazy", "option2": "capital", "answer": "1"},
]  # fmt: skip


def _lm_eval_metrics(relative: str) -> set[str]:
    """The metrics an installed lm-eval task yaml reports (its `metric_list`)."""
    import importlib.util
    import os

    import yaml

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("lm-eval is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tasks", relative)
    with open(path) as f:
        text = "\n".join(line for line in f if "!function" not in line)  # no lm-eval loader here
    return {m["metric"] for m in yaml.safe_load(text)["metric_list"]}


def test_winogrande_reports_no_acc_norm_as_lm_eval(model, tok, tmp_path):
    """WinoGrande's choices share one continuation, so dividing by its length changes nothing: lm-eval's
    winogrande reports `acc` only. Schooner reported `acc_norm` (and `acc_norm_bytes`), always equal to acc."""
    path = _write_jsonl(tmp_path / "wg.jsonl", WINOGRANDE_ROWS)
    task = Task(name="wg", path=path, layout="winogrande")
    out = evaluate_task(model, tok, task, keep_documents=True)
    reported = {m for m in ("acc", "acc_norm", "acc_norm_bytes") if m in out}
    assert reported == _lm_eval_metrics("winogrande/default.yaml") & {"acc", "acc_norm"} == {"acc"}
    assert not any("acc_norm" in d or "acc_norm_bytes" in d for d in out["per_document"])
    assert "prob_norm" in out and "logprob" in out
    # a shared continuation with answer texts of their own lengths normalises: acc_norm is reported
    rows = [
        {"contexts": ["The quick brown fox", "A lazy dog"], "continuations": [" sleeps."], "answer_texts": ["fox", "dog!!"], "gold": 0},
        {"contexts": ["Paris is", "Python is"], "continuations": [" great."], "answer_texts": ["Paris", "Py"], "gold": 1},
    ]  # fmt: skip
    named = evaluate_task(
        model, tok, Task(name="ex", path=_write_jsonl(tmp_path / "ex.jsonl", rows), layout="examples")
    )
    assert "acc_norm" in named and "acc_norm_bytes" in named
