"""The lm-evaluation-harness adapter against the real harness, offline, on task YAMLs reading local jsonl."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import pytest

from schooner.eval import Task, evaluate_task, score_rolling
from schooner.model import init, presets
from schooner.tokenize import train_bpe

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow  # importing the harness and its task machinery: ~3 minutes on 2 cores

ROWS = [
    {"question": "The quick brown", "choices": ["fox", "dog jumps", "cat"], "gold": 0},
    {"question": "def add(a, b):", "choices": ["return a + b", "class", "import"], "gold": 0},
    {"question": "Python is a", "choices": ["snake", "programming language", "fox"], "gold": 1},
    {"question": "A lazy dog", "choices": ["sleeps", "jumps", "returns"], "gold": 0},
]

TASK_YAML = """
task: local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n"] * 8
    tok = train_bpe(texts, vocab_size=280)
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=64,
    )  # fmt: skip
    model = init(config, key=jax.random.key(0))
    data = root / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "local_mc.yaml").write_text(TASK_YAML.format(path=data))
    return root, tok, model


def test_harness_multiple_choice_equals_schooners_scorer(setup, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from schooner.eval.harness import SchoonerLM

    root, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok, batch_size=3)
    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
    out = simple_evaluate(model=lm, tasks=["local_mc"], task_manager=manager, log_samples=True)
    harness = out["results"]["local_mc"]
    rows = [{"contexts": [r["question"]], "continuations": r["choices"], "gold": r["gold"]} for r in ROWS]
    path = root / "ours.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ours = evaluate_task(
        model, tok, Task(name="ours", path=str(path), layout="examples"), keep_documents=True
    )
    assert harness["acc,none"] == ours["acc"]
    assert harness["acc_norm,none"] == ours["acc_norm"]
    samples = sorted(out["samples"]["local_mc"], key=lambda s: s["doc_id"])
    for sample, doc in zip(samples, ours["per_document"], strict=True):
        assert [float(r[0][0]) for r in sample["resps"]] == doc["logprobs"]  # the same bits


def test_harness_rolling_and_generation(setup):
    from lm_eval.api.instance import Instance

    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok, batch_size=2)
    text = "The quick brown fox jumps over the lazy dog. " * 4
    req = Instance("loglikelihood_rolling", {}, (text,), 0)
    (got,) = lm.loglikelihood_rolling([req])
    (want,) = score_rolling(model, [tok.encode(text)], start=tok.bos_id, max_length=64)
    assert got == want and math.isfinite(got) and got < 0
    gen = Instance("generate_until", {}, ("The quick", {"until": ["\n"], "max_gen_toks": 8}), 0)
    (text_out,) = lm.generate_until([gen])
    assert "\n" not in text_out
    from schooner.eval import greedy_tokens

    full = tok.decode(greedy_tokens(model, tok.encode("The quick"), 8, eos_id=tok.eos_id))
    assert full.startswith(text_out)


# Boundaries that are not a space: a newline (code next-line), a tab, and no delimiter at all.
CODE_ROWS = [
    {"question": "def add(a, b):", "choices": ["    return a + b", "class", "    import os"], "gold": 0},
    {"question": "def add(a, b):\n    x = a", "choices": ["    return x + b", "\treturn", "def"], "gold": 0},
    {"question": "The quick brown", "choices": ["fox", " dog jumps", "\tcat"], "gold": 0},
    {"question": "A lazy dog\n", "choices": ["sleeps", "    jumps", "\nbarks"], "gold": 1},
]

DELIMITER_YAML = """
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: "{delimiter}"
metric_list:
  - metric: acc
"""

DELIMITERS = {"code_newline": ("\\n", "\n"), "code_tab": ("\\t", "\t"), "code_nodelim": ("", "")}


def test_newline_tab_and_empty_delimiters_split_as_lm_eval_does(setup, monkeypatch):
    """Schooner's own tasks and the adapter give, choice by choice, the numbers of lm-eval's own request path
    (`TemplateLM.loglikelihood` -> `_encode_pair`: whole-string encoding, all trailing whitespace moved to the
    continuation) fed to the same model, on harness tasks whose boundaries are a newline, a tab and nothing."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.api.model import TemplateLM
    from lm_eval.tasks import TaskManager

    from schooner.eval.harness import SchoonerLM

    class HarnessSplitLM(SchoonerLM):
        loglikelihood = TemplateLM.loglikelihood  # lm-eval's tokenization, then `_loglikelihood_tokens`

    root, tok, model = setup
    data = root / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in CODE_ROWS))
    tasks = root / "delimiter_tasks"
    tasks.mkdir()
    for name, (escaped, _) in DELIMITERS.items():
        (tasks / f"{name}.yaml").write_text(DELIMITER_YAML.format(name=name, path=data, delimiter=escaped))
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    names = sorted(DELIMITERS)

    def per_choice(lm):
        out = simple_evaluate(model=lm, tasks=names, task_manager=manager, log_samples=True)
        return {
            n: [
                [float(r[0][0]) for r in s["resps"]]
                for s in sorted(out["samples"][n], key=lambda s: s["doc_id"])
            ]
            for n in names
        }

    reference = per_choice(HarnessSplitLM(model=model, tokenizer=tok, batch_size=3))
    adapter = per_choice(SchoonerLM(model=model, tokenizer=tok, batch_size=3))
    rows = [
        {"contexts": [r["question"]], "continuations": r["choices"], "gold": r["gold"]} for r in CODE_ROWS
    ]
    path = root / "code_ours.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, (_, delimiter) in DELIMITERS.items():
        task = Task(name=name, path=str(path), layout="examples", delimiter=delimiter)
        ours = evaluate_task(model, tok, task, keep_documents=True)
        assert [d["logprobs"] for d in ours["per_document"]] == reference[name], name  # the same bits
        assert adapter[name] == reference[name], name


def test_the_command_line_runs_the_schooner_model_on_a_checkpoint(setup, tmp_path):
    """`schooner-lm-eval --model schooner ...` (lm-eval's own command line, the model registered first) in a
    subprocess, on a checkpoint and tokenizer folder and a local task YAML: its per-choice scores are Schooner's
    own for the checkpoint's model."""
    import glob
    import os
    import shutil
    import subprocess
    import sys

    from schooner.eval import load_checkpoint
    from schooner.model import save_model

    root, tok, model = setup
    save_model(str(tmp_path / "ckpt"), model, model.config)
    tok.save(str(tmp_path / "tok"))
    command = shutil.which("schooner-lm-eval", path=os.path.dirname(sys.executable))
    assert command, "the console script schooner-lm-eval is not installed beside this Python"
    args = [
        command,
        "--model", "schooner",
        "--model_args", f"checkpoint={tmp_path / 'ckpt'},tokenizer={tmp_path / 'tok'}",
        "--batch_size", "2",
        "--tasks", "local_mc",
        "--include_path", str(root / "tasks"),
        "--output_path", str(tmp_path / "out"),
        "--log_samples",
    ]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (samples_file,) = glob.glob(str(tmp_path / "out" / "**" / "samples_local_mc_*.jsonl"), recursive=True)
    with open(samples_file) as f:
        samples = sorted((json.loads(line) for line in f), key=lambda s: s["doc_id"])
    loaded, _, _ = load_checkpoint(str(tmp_path / "ckpt"))
    rows = [{"contexts": [r["question"]], "continuations": r["choices"], "gold": r["gold"]} for r in ROWS]
    path = tmp_path / "ours.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ours = evaluate_task(
        loaded, tok, Task(name="ours", path=str(path), layout="examples"), keep_documents=True
    )
    for sample, doc in zip(samples, ours["per_document"], strict=True):
        assert [float(r[0][0]) for r in sample["resps"]] == doc["logprobs"]


def test_bare_lm_eval_does_not_know_the_model_and_python_m_does(setup):
    """lm-eval has no plugin lookup for models: `lm_eval --model schooner` stops at "no model for this name"
    (the reason for `schooner-lm-eval`); `python -m schooner.eval.lm_eval_cli` gets as far as the model's own
    argument check (here: no checkpoint given)."""
    import os
    import subprocess
    import sys

    root, _, _ = setup
    args = ["--model", "schooner", "--model_args", "tokenizer=unused", "--tasks", "local_mc"]
    args += ["--include_path", str(root / "tasks")]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
    bare = subprocess.run(
        [sys.executable, "-m", "lm_eval", *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert bare.returncode != 0 and "no model for this name" in bare.stderr, bare.stderr[-2000:]
    ours = subprocess.run(
        [sys.executable, "-m", "schooner.eval.lm_eval_cli", *args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert ours.returncode != 0 and "SchoonerLM needs checkpoint=" in ours.stderr, ours.stderr[-2000:]
    assert "no model for this name" not in ours.stderr


def test_generate_until_truncates_a_long_prompt_from_the_left_and_keeps_max_gen_toks(setup):
    """lm-eval's `hf` backend keeps the last `max_length - max_gen_toks` prompt tokens and generates up to
    `max_gen_toks` tokens (its `generate_until`: `left_truncate_len=max_ctx_len`); `max_new_tokens` is an alias
    of `max_gen_toks` (`normalize_gen_kwargs`). The reference is the no-cache greedy decoder on that window."""
    from lm_eval.api.instance import Instance

    from schooner.eval import greedy_tokens
    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok, max_gen_toks=32)
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    ids = tok.encode(prompt)
    assert len(ids) > 64  # longer than the model's window

    def reference(prompt_ids, n):
        new = greedy_tokens(model, prompt_ids, n, eos_id=tok.eos_id)
        return tok.decode(new[:-1] if new and new[-1] == tok.eos_id else new)

    for kwargs, n in (({"until": [], "max_gen_toks": 16}, 16), ({"until": [], "max_new_tokens": 5}, 5)):
        (got,) = lm.generate_until([Instance("generate_until", {}, (prompt, kwargs), 0)])
        assert got == reference(ids[-(64 - n) :], n), kwargs
    # top_k=0 is "no top-k" in transformers' (and so lm-eval task files') terms: greedy here, not an error
    greedy = Instance("generate_until", {}, ("The quick", {"until": [], "max_gen_toks": 3, "top_k": 0}), 0)
    assert lm.generate_until([greedy]) == [reference(tok.encode("The quick"), 3)]
    short = Instance("generate_until", {}, ("The quick", {"until": [], "max_new_tokens": 3}), 0)
    (got,) = lm.generate_until([short])
    assert got == reference(tok.encode("The quick"), 3)
    # no max_gen_toks anywhere: 256 (lm-eval's default) does not fit a 64-token window; half of it is used
    unset = Instance("generate_until", {}, ("The quick", {"until": []}), 0)
    (got,) = SchoonerLM(model=model, tokenizer=tok).generate_until([unset])
    assert got == reference(tok.encode("The quick"), 32)
    too_many = Instance("generate_until", {}, ("The quick", {"until": [], "max_gen_toks": 64}), 0)
    with pytest.raises(ValueError, match="max_gen_toks=64"):
        lm.generate_until([too_many])


def test_the_adapter_runs_under_lm_evals_request_cache(setup, tmp_path):
    """`--use_cache` wraps the model in lm-eval's `CachingLM`, whose hook keys each partial result by
    `hash_args(attr, request)` (json of the request's strings): the adapter gave it a token-space `Request`,
    "not iterable", so every scored request failed. A second run reads the cache and gives the same numbers."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.model import CachingLM

    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    requests = [
        Instance("loglikelihood", {}, ("The quick brown", " fox"), 0),
        Instance("loglikelihood", {}, ("", "def add(a, b):"), 1),
    ]
    tokens = [Instance("loglikelihood", {}, ("x", "y"), 0)]
    direct = SchoonerLM(model=model, tokenizer=tok).loglikelihood(requests)
    first = CachingLM(SchoonerLM(model=model, tokenizer=tok), str(tmp_path / "cache.db"))
    assert first.loglikelihood(requests) == direct
    again = CachingLM(SchoonerLM(model=model, tokenizer=tok), str(tmp_path / "cache.db"))
    assert again.loglikelihood(requests) == direct
    lm = SchoonerLM(model=model, tokenizer=tok)
    CachingLM(lm, str(tmp_path / "tokens.db"))  # sets the hook
    pair = (("x", "y"), tok.encode("x"), tok.encode("xy")[len(tok.encode("x")) :])
    assert lm._loglikelihood_tokens([pair]) == SchoonerLM(model=model, tokenizer=tok).loglikelihood(tokens)


def test_an_overlong_continuation_names_the_harness_task_and_document(setup):
    """lm-eval's `hf` backend asserts `len(continuation_enc) <= max_length` (a bare AssertionError); the
    adapter's error named no task or document. It names lm-eval's task, doc_id and request index now."""
    from lm_eval.api.instance import Instance

    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    long_text = " " + " ".join(["The quick brown fox jumps over the lazy dog."] * 10)
    assert len(tok.encode(long_text)) > model.config.max_seq_len
    requests = [
        Instance("loglikelihood", {}, ("The quick brown", " fox"), 0, metadata=("local_mc", 2, 1)),
        Instance("loglikelihood", {}, ("The quick brown", long_text), 1, metadata=("local_mc", 3, 1)),
    ]
    with pytest.raises(
        ValueError, match=r"task 'local_mc': document 3 \(request 1\): a continuation of \d+ "
    ):
        SchoonerLM(model=model, tokenizer=tok).loglikelihood(requests)


def _hf_encode(tok, text: str, add_special_tokens: bool = True) -> list[int]:
    """HF `tokenizers`' own encoding, as lm-eval's `hf` backend's `tokenizer.encode(string)` gives it: special
    token strings in the text are the special tokens, and the post-processor runs (transformers' default
    `add_special_tokens=True`)."""
    import tokenizers

    return (
        tokenizers.Tokenizer.from_str(tok.to_json()).encode(text, add_special_tokens=add_special_tokens).ids
    )


def test_special_token_strings_in_task_text_encode_as_lm_evals_hf_backend(setup):
    """lm-eval's `hf` backend encodes task text with the HF tokenizer's `encode`, which reads "<|end_of_text|>"
    in a context (few-shot documents joined by an EOS string, say) as the EOS token. The adapter encoded it
    as plain text (seven-odd byte tokens), so the model was scored on another prompt than lm-eval's."""
    from lm_eval.api.instance import Instance

    from schooner.eval import Request, score_requests
    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok, batch_size=2)
    text = "The quick brown fox.<|end_of_text|>def add(a, b):<|user|> lazy dog"
    want = _hf_encode(tok, text)
    assert tok.eos_id in want and tok.token_to_id("<|user|>") in want
    assert lm.tok_encode(text) == want
    context, continuation = "The quick brown fox.<|end_of_text|>The lazy", " dog"
    (got,) = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    ctx = _hf_encode(tok, context)
    ref = Request(tuple(ctx), tuple(_hf_encode(tok, context + continuation)[len(ctx) :]))
    (score,) = score_requests(model, [ref])
    assert got == (score.logprob, score.greedy)
    (rolled,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolled == score_rolling(model, [want], start=tok.bos_id, max_length=64)[0]


def test_a_tokenizer_whose_post_processor_adds_bos_encodes_as_lm_evals_hf_backend(setup):
    """A hub tokenizer (Llama 3 style) whose post-processor prepends BOS: lm-eval's `hf` backend leaves
    `add_special_tokens` to the tokenizer's default (BOS added) unless the string already starts with the
    BOS string, and encodes an empty context's continuation without it."""
    import tokenizers
    from lm_eval.api.instance import Instance
    from tokenizers.processors import TemplateProcessing

    from schooner.eval import Request, score_requests
    from schooner.eval.harness import SchoonerLM
    from schooner.tokenize import Tokenizer

    _, tok, model = setup
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    bos = tok.bos_token
    hf.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.bos_id)])
    with_bos = Tokenizer(hf, bos_token=bos, eos_token=tok.eos_token, pad_token=tok.pad_token)
    lm = SchoonerLM(model=model, tokenizer=with_bos, batch_size=2)
    assert (
        lm.tok_encode("The lazy dog") == _hf_encode(with_bos, "The lazy dog")[:] != tok.encode("The lazy dog")
    )
    assert lm.tok_encode(bos + "The lazy dog") == _hf_encode(with_bos, bos + "The lazy dog", False)
    assert lm.tok_encode("The lazy dog", add_special_tokens=False) == tok.encode("The lazy dog")
    reqs = [("The lazy", " dog"), ("", "The lazy dog")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)])
    ctx = _hf_encode(with_bos, "The lazy")
    refs = [
        Request(tuple(ctx), tuple(_hf_encode(with_bos, "The lazy dog")[len(ctx) :])),
        Request((tok.bos_id,), tuple(_hf_encode(with_bos, "The lazy dog", False))),
    ]
    assert got == [(s.logprob, s.greedy) for s in score_requests(model, refs)]


def test_generated_special_tokens_are_left_out_of_the_text_as_lm_evals_hf_backend(setup):
    """lm-eval's `hf` backend decodes a generation with `skip_special_tokens=True` (`HFLM.tok_decode`), so a
    special token the model emits (a chat model's "<|end_of_turn|>" before the task's stop string) is not in
    the answer exact_match compares. The adapter kept it in the text."""
    import equinox as eqx
    import jax.numpy as jnp
    import tokenizers
    from lm_eval.api.instance import Instance

    from schooner.eval import greedy_tokens
    from schooner.eval.harness import SchoonerLM

    _, tok, model = setup
    # a final norm of zeros: every logit is 0 and greedy decoding emits token 0, the special BOS, each step
    flat = eqx.tree_at(lambda m: m.final_norm, model, jax.tree.map(jnp.zeros_like, model.final_norm))
    lm = SchoonerLM(model=flat, tokenizer=tok)
    gen = Instance("generate_until", {}, ("The quick", {"until": ["\n\n"], "max_gen_toks": 5}), 0)
    (text,) = lm.generate_until([gen])
    ids = greedy_tokens(flat, tok.encode("The quick"), 5, eos_id=tok.eos_id)
    assert ids == [tok.bos_id] * 5
    hf = tokenizers.Tokenizer.from_str(tok.to_json())
    assert text == hf.decode(ids, skip_special_tokens=True).split("\n\n")[0] == ""
    mixed = [*tok.encode("The quick"), tok.eos_id, tok.token_to_id("<|user|>"), *tok.encode(" fox")]
    assert lm.tok_decode(mixed) == hf.decode(mixed, skip_special_tokens=True) == "The quick fox"
    assert lm.tok_decode(mixed, skip_special_tokens=False) == hf.decode(mixed, skip_special_tokens=False)


CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "def add(a, b):"},
        {"role": "assistant", "content": "    return a + b\n"},
        {"role": "user", "content": "And sub?"},
    ],
]


def _transformers_render(template: str, tok, messages, add_generation_prompt: bool) -> str:
    """What `transformers`' `apply_chat_template(..., tokenize=False, continue_final_message=not
    add_generation_prompt)` gives (lm-eval's `hf` backend): transformers itself where installed, else its steps
    (transformers 5): the final message's content tagged, the Jinja template rendered with jinja2, the text cut
    at the tag, trailing white space kept where the template kept the content's spacing."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        pass
    else:
        import tokenizers

        hf = PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer.from_str(tok.to_json()), bos_token=tok.bos_token,
            eos_token=tok.eos_token, chat_template=template,
        )  # fmt: skip
        return hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )  # fmt: skip
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    tag = "CONTINUE_FINAL_MESSAGE_TAG "
    if not add_generation_prompt:
        messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + tag}]
    text = env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=tok.bos_token,
        eos_token=tok.eos_token,
    )  # fmt: skip
    if not add_generation_prompt:
        at = text.rindex(tag.strip())
        text = text[:at] if text[at : at + len(tag)] == tag else text[:at].rstrip()
    return text


# An assistant prefill continued (`continue_final_message=True`) as transformers 5.25.0 renders it with the
# exported "schooner" template: `PreTrainedTokenizerFast(chat_template=...).apply_chat_template([PREFILL_USER,
# {"role": "assistant", "content": prefill}], tokenize=False, add_generation_prompt=False,
# continue_final_message=True)`, after the BOS token. The content is kept as it is, trailing white space too.
PREFILL_USER = {"role": "user", "content": "What is 2 + 2?"}
PREFILLS = {
    "Answer: ": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>Answer: ",
    "Answer:": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>Answer:",
    "  return a -\n": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>  return a -\n",
    "x\t\n ": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>x\t\n ",
    "  ": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>  ",
    "": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>",
    "\n": "<|user|>What is 2 + 2?<|end_of_turn|><|assistant|>\n",
}


def test_an_assistant_prefill_keeps_its_trailing_white_space_as_transformers(setup):
    """lm-eval's `gen_prefix: "Answer: "` is an assistant prefill; transformers keeps its trailing space (the
    template keeps the content's spacing) and the adapter cut it (`.rstrip()`)."""
    from schooner.eval.harness import SchoonerLM
    from schooner.tokenize import jinja_chat_template, resolve_template

    _, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok)
    template = jinja_chat_template(resolve_template(tok, None))
    for prefill, rendered in PREFILLS.items():
        chat = [PREFILL_USER, {"role": "assistant", "content": prefill}]
        got = lm.apply_chat_template(chat, add_generation_prompt=False)
        assert got == tok.bos_token + rendered == _transformers_render(template, tok, chat, False), prefill


def test_chat_templates_apply_as_transformers_renders_the_tokenizers_template(setup, monkeypatch):
    """`--apply_chat_template`: the adapter renders chats as `transformers` renders the tokenizer's exported Jinja
    template (the hf backend's `apply_chat_template`), prefills included, names its tokenizer for lm-eval's
    cache, and a harness task runs with it (it raised lm-eval's NotImplementedError)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from schooner.eval.harness import SchoonerLM
    from schooner.tokenize import jinja_chat_template, resolve_template

    root, tok, model = setup
    lm = SchoonerLM(model=model, tokenizer=tok, batch_size=3)
    template = jinja_chat_template(resolve_template(tok, None))
    assert lm.chat_template(True) == template and lm.chat_template(False) is None
    for chat in CHATS:
        assert lm.apply_chat_template(chat) == _transformers_render(template, tok, chat, True)
    prefill = [*CHATS[1], {"role": "assistant", "content": "  return a -"}]
    assert lm.apply_chat_template(prefill, add_generation_prompt=False) == _transformers_render(
        template, tok, prefill, False
    )
    assert tok.fingerprint[:12] in lm.tokenizer_name
    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
    out = simple_evaluate(
        model=lm, tasks=["local_mc"], task_manager=manager, log_samples=True, apply_chat_template=True
    )
    context = out["samples"]["local_mc"][0]["arguments"][0][0]  # the first choice's (context, continuation)
    assert context.startswith(tok.bos_token + "<|user|>") and context.endswith("<|assistant|>"), context


def test_generate_until_stops_at_the_end_of_turn_token_as_lm_evals_hf_backend(setup):
    """lm-eval's `hf` backend generates with transformers' `generate`, which stops at every id of the model's
    `generation_config.eos_token_id`: [EOS, end-of-turn] for a chat model (Llama-3-Instruct; `export_hf` of a
    chat-trained Schooner run). The adapter stopped at EOS only and went on past the end of the answer."""
    from lm_eval.api.instance import Instance

    from schooner.eval.harness import SchoonerLM

    from .rigged import chain_model

    _, tok, model = setup
    eot, fox = tok.token_to_id("<|end_of_turn|>"), tok.encode(" fox")[-1]
    context = "The quick"
    untied = init(dataclasses.replace(model.config, tie_embeddings=False), key=jax.random.key(0))
    rigged = chain_model(untied, {tok.encode(context)[-1]: eot}, fox)
    gen = Instance("generate_until", {}, (context, {"until": ["\n\n"], "max_gen_toks": 4}), 0)
    # what the hf backend returns: generation ends at end-of-turn, decoded without special tokens
    assert SchoonerLM(model=rigged, tokenizer=tok).generate_until([gen]) == [""]
    # a tokenizer without a chat template's end-of-turn token, or the option off: EOS alone stops it
    off = SchoonerLM(model=rigged, tokenizer=tok, stop_at_end_of_turn="false")
    assert off.generate_until([gen]) == [tok.decode([fox] * 3)]


ROLLING_YAML = """
task: local_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
"""


def test_bits_per_byte_agrees_with_lm_evals_on_a_sentencepiece_style_tokenizer(tmp_path, monkeypatch):
    """lm-eval's `bits_per_byte` (a `loglikelihood_rolling` task) divides by `len(text.encode("utf-8"))`,
    whatever the backend. `evaluate_lm` on a cache of the same texts gives the same number: the same nats
    (documents after BOS, the EOS term left out) over the same bytes. It divided by the tokenizer's byte
    table, which counts 0 for `<unk>` (the Japanese sentence: 1 byte of 33)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import numpy as np
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from schooner.data import make_record, write_records
    from schooner.eval import evaluate_lm
    from schooner.eval.harness import SchoonerLM
    from schooner.tokenize import build_cache

    from .sentencepiece import JAPANESE, sentencepiece_style_tokenizer

    tok = sentencepiece_style_tokenizer()
    texts = [JAPANESE, "The lazy fox sleeps in the sun.", "A dog, 日本 and a fox."]
    config = dataclasses.replace(
        presets.llama_nano, vocab_size=tok.vocab_size, num_layers=1, hidden_dim=32, intermediate_dim=64,
        num_heads=2, num_kv_heads=1, max_seq_len=64,
    )  # fmt: skip
    model = init(config, key=jax.random.key(1))
    data = tmp_path / "texts.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8"
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_rolling.yaml").write_text(ROLLING_YAML.format(path=data))
    lm = SchoonerLM(model=model, tokenizer=tok, batch_size=2)
    assert lm.prefix_token_id == tok.bos_id
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    theirs = simple_evaluate(model=lm, tasks=["local_rolling"], task_manager=manager)
    theirs = theirs["results"]["local_rolling"]["bits_per_byte,none"]

    write_records([make_record(t, source="s") for t in texts], str(tmp_path / "records"), format="jsonl")
    build_cache(str(tmp_path / "records"), str(tmp_path / "cache"), tok, prepend_bos=True)
    ours = evaluate_lm(model, {"x": str(tmp_path / "cache" / "train")}, tokenizer=tok, seq_len=64)[
        "datasets"
    ]["x"]
    assert ours["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
    # lm-eval scores each text's tokens after the prefix token (BOS), not the EOS a cache appends
    eos_nats = (
        ours["nats"]
        - evaluate_lm(model, {"x": [np.array([tok.bos_id, *tok.encode(t)]) for t in texts]}, seq_len=64)[
            "datasets"
        ]["x"]["nats"]
    )
    assert (ours["nats"] - eos_nats) / math.log(2) / ours["bytes"] == pytest.approx(theirs, rel=1e-5)


def test_gen_prefix_requests_under_a_chat_template_match_lm_evals_hf_backend(setup, monkeypatch, tmp_path):
    """A task with `gen_prefix: "Answer: "` under `--apply_chat_template`: lm-eval continues an assistant message
    "Answer: " and, the prefix ending in white space, puts no delimiter before each choice. The hf backend's
    context keeps that space (transformers), the adapter's cut it, so every request differed. Reference: the
    hf backend's steps, each by its own code: transformers' rendering, HF `tokenizers`' encoding (special
    tokens read, no post-processor for a string that starts with BOS) and lm-eval's own split
    (`TemplateLM.loglikelihood`), scored by the same model."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.api.model import TemplateLM
    from lm_eval.tasks import TaskManager

    from schooner.eval.harness import SchoonerLM
    from schooner.tokenize import jinja_chat_template, resolve_template

    root, tok, model = setup
    template = jinja_chat_template(resolve_template(tok, None))

    class HfBackendLM(SchoonerLM):
        loglikelihood = TemplateLM.loglikelihood

        def apply_chat_template(self, chat_history, add_generation_prompt=True):
            return _transformers_render(template, tok, chat_history, add_generation_prompt)

        def tok_encode(self, string, add_special_tokens=None, **kwargs):
            add = not string.startswith(tok.bos_token) if add_special_tokens is None else add_special_tokens
            return _hf_encode(tok, string, add)

    yaml = TASK_YAML.replace("task: local_mc", "task: local_prefix").format(path=root / "mc.jsonl")
    (tmp_path / "local_prefix.yaml").write_text(yaml + 'gen_prefix: "Answer: "\n')
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)

    def samples(lm):
        out = simple_evaluate(
            model=lm, tasks=["local_prefix"], task_manager=manager, log_samples=True, apply_chat_template=True
        )
        return sorted(out["samples"]["local_prefix"], key=lambda s: s["doc_id"])

    ours = samples(SchoonerLM(model=model, tokenizer=tok, batch_size=3))
    reference = samples(HfBackendLM(model=model, tokenizer=tok, batch_size=3))
    assert len(ours) == len(ROWS)
    for mine, theirs, row in zip(ours, reference, ROWS, strict=True):
        assert mine["arguments"] == theirs["arguments"]
        context, continuation = mine["arguments"][0][:2]
        assert context.endswith(f"<|user|>{row['question']}<|end_of_turn|><|assistant|>Answer: "), context
        assert continuation == row["choices"][0]  # no delimiter after a prefix that ends in white space
        assert [float(r[0][0]) for r in mine["resps"]] == [float(r[0][0]) for r in theirs["resps"]]
