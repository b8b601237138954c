"""Tutorial: post-train the tutorial's tiny Llama: supervised fine-tuning on chats, then DPO, on a laptop CPU.

    uv run schooner run experiments/tutorials/train_tiny_model.py      # first: the pretrained model (cached)
    uv run schooner run experiments/tutorials/posttrain_tiny_model.py  # then this, a few minutes on 2 cores

It starts from `checkpoints/tutorial-nano` of `train_tiny_model.py` (the same step, so its cached checkpoint
is reused; run that file first, or this one trains it too) and adds, each step cached under the prefix:

1. `data/docstring-chats`, `data/docstring-preferences`: records built from the docstrings of the Python
   standard library, which the model read in pretraining: "What does `textwrap.dedent` do?" answered with
   the docstring's first sentence; and the same questions as preference pairs, the true summary preferred
   over the same words in a garbled order. (Preferring the true summary over another function's needs
   knowledge this 1M-parameter model does not have: tried, DPO left its held-out reward accuracy at chance,
   0.40, and its preference for the true summary at 0.38.)
2. `tokenized/docstring-chat`, `tokenized/docstring-preferences`: chat and preference token caches
   (assistant-only loss masks; 10% of the functions held out as `validation/`).
3. `checkpoints/tutorial-nano-sft`: SFT from the pretrained checkpoint (`sft`, the loss on the answers only,
   conversations packed whole per row).
4. `dpo/tutorial-nano-ref`: the SFT model's log-probs of every preference pair (`reference_logprobs`).
5. `checkpoints/tutorial-nano-dpo`: DPO from the SFT model against that reference (`dpo`, beta 0.1), for
   half as many steps as SFT.
6. `eval/tutorial-nano-posttrain`: each stage on held-out functions: the answer loss of the chats, the share of
   pairs where the model prefers the true summary, DPO's reward accuracy against the SFT reference, and the
   loss on Python's held-out documentation (what fine-tuning cost the pretraining domain); and the bundled
   evaluation tasks of `schooner.eval` (cloze, function name, next sentence: 4-way multiple choice built from
   the documentation, plain text, no chat template), beside their chance level. They test what a stage kept
   of pretraining, not what it taught: with 200 questions a task, a difference under about 2 standard errors
   (2 x 0.03) is noise.
7. `hf/tutorial-nano-dpo`: the result as a Hugging Face folder (config, weights, tokenizer with its chat
   template, generation config).

Set SCHOONER_POSTTRAIN_STEPS to change the SFT and DPO lengths (DPO runs half as many steps as SFT), and
SCHOONER_POSTTRAIN_TASK_DOCUMENTS the questions per bundled task.
"""

import importlib
import inspect
import json
import os
from dataclasses import dataclass

import numpy as np

from experiments.tokenizer_defs import default_tokenizer
from experiments.tutorials.train_tiny_model import SEQ_LEN, docs, fine_tune
from experiments.tutorials.train_tiny_model import model as pretrained
from schooner.cluster import ResourceConfig, RunResult, StepRunner, step
from schooner.tokenize.steps import tokenized_chat, tokenized_preferences
from schooner.train import AdamConfig
from schooner.train.steps import dpo, hf_export, reference_logprobs

STEPS = int(os.environ.get("SCHOONER_POSTTRAIN_STEPS", "40"))
TASK_DOCUMENTS = int(os.environ.get("SCHOONER_POSTTRAIN_TASK_DOCUMENTS", "200"))
PAIR_LEN = (
    80  # prompt + answer of every pair fits (72 tokens at most): DPO pads each sequence to it, not to 128
)
CPU = ResourceConfig.with_cpu()
MODULES = (
    "textwrap", "json", "os.path", "shutil", "string", "functools", "itertools", "collections", "re", "math",
    "statistics", "random", "heapq", "bisect", "copy", "fnmatch", "glob", "base64", "binascii", "difflib",
    "html", "inspect", "operator", "pathlib", "pprint", "shlex", "struct", "tempfile", "time", "unicodedata",
    "urllib.parse", "zlib", "gzip", "csv", "datetime", "decimal", "fractions", "hashlib", "hmac", "io",
    "keyword", "locale", "calendar", "codecs", "contextlib", "enum", "gettext", "logging", "platform", "queue",
)  # fmt: skip


def docstring_summaries(modules: tuple[str, ...]) -> list[tuple[str, str]]:
    """`(qualified name, first sentence of its docstring)` of the public functions and classes of `modules`,
    in a fixed order; names whose docstring gives no plain sentence are left out."""
    out: dict[str, str] = {}
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (
                inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)
            ):
                continue
            doc = inspect.getdoc(obj) or ""
            # Builtins start with a signature line ("dedent(text)"): take the first paragraph after it.
            paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
            text = next((p for p in paragraphs if p and not p.startswith(f"{name}(")), "")
            summary = text.split(". ")[0].rstrip(".") + "."
            if 12 <= len(summary) <= 140 and summary[0].isupper():
                out.setdefault(f"{mod_name}.{name}", summary)
    return sorted(out.items())


@dataclass(frozen=True)
class DocstringRecordsConfig:
    modules: tuple[str, ...]
    kind: str  # "chat" or "preference"
    seed: int = 0


def question(name: str) -> dict:
    return {"role": "user", "content": f"What does `{name}` do?"}


def docstring_records(config: DocstringRecordsConfig, output_path: str) -> dict:
    """Chat records (question -> summary) or preference records (true summary over another's)."""
    from schooner.data import write_records
    from schooner.tokenize import chat_record, preference_record

    items = docstring_summaries(config.modules)
    rng = np.random.default_rng(config.seed)
    records = []
    for name, summary in items:
        answer = {"role": "assistant", "content": summary}
        if config.kind == "chat":
            records.append(chat_record([question(name), answer], source="docstrings", id=name))
            continue
        # The same words in a seeded random order: a garbled answer (see the module docstring for why not
        # another function's summary).
        words = summary.rstrip(".").split()
        order = rng.permutation(len(words))
        if (order == np.arange(len(words))).all():
            order = order[::-1]
        wrong = {"role": "assistant", "content": " ".join(words[i] for i in order) + "."}
        records.append(
            preference_record(
                chosen=[question(name), answer],
                rejected=[question(name), wrong],
                source="docstrings",
                id=name,
            )
        )
    write_records(records, output_path, num_shards=1)
    return {"records": len(records)}


chats = step("data/docstring-chats", docstring_records, DocstringRecordsConfig(MODULES, "chat"), version="v1")
pairs = step(
    "data/docstring-preferences",
    docstring_records,
    DocstringRecordsConfig(MODULES, "preference"),
    version="v2",
)
# Split by record id, with the same seed: the same functions are held out of both caches.
chat = tokenized_chat(
    "tokenized/docstring-chat", source=chats, tokenizer=default_tokenizer, validation_fraction=0.1
)
prefs = tokenized_preferences(
    "tokenized/docstring-preferences", source=pairs, tokenizer=default_tokenizer, validation_fraction=0.1
)

# SFT from the pretrained checkpoint: 16 rows of SEQ_LEN tokens a step (`fine_tune` calls `sft`)
sft_model = fine_tune(
    "checkpoints/tutorial-nano-sft",
    datasets={chat: 1.0},
    num_train_steps=STEPS,
    optimizer=AdamConfig(learning_rate=1e-3, warmup=0.05, schedule="linear", min_lr_ratio=0.0),
    eval_every=max(STEPS // 2, 1),
)
ref = reference_logprobs("dpo/tutorial-nano-ref", sft_model, prefs, seq_len=PAIR_LEN, resources=CPU)
dpo_model = dpo(
    "checkpoints/tutorial-nano-dpo",
    initialize_from=sft_model,
    reference=ref,
    preferences=prefs,
    beta=0.1,
    batch_size=8,
    seq_len=PAIR_LEN,
    num_train_steps=max(STEPS // 2, 1),
    optimizer=AdamConfig(learning_rate=1e-3, warmup=0.1, schedule="linear", min_lr_ratio=0.0),
    eval_every=max(STEPS // 4, 1),
    checkpoint_every=None,
    resources=CPU,
)


@dataclass(frozen=True)
class StagesConfig:
    stages: dict  # name -> training step
    chat: object
    prefs: object
    reference: object
    docs: object
    tokenizer: object
    seq_len: int
    pair_len: int
    task_documents: int


def score_stages(config: StagesConfig, output_path: str) -> dict:
    """Each stage on held-out data: chat answer loss, preference accuracy, DPO reward accuracy, docs loss, and
    the bundled tasks' accuracy (with its standard error and chance level)."""
    from schooner.eval import bundled_suite, evaluate_lm, evaluate_suite
    from schooner.model import load_model
    from schooner.tokenize import PreferenceDataset, load_tokenizer
    from schooner.train import ChatEvaluator, latest_checkpoint, score_pairs

    tok = load_tokenizer(config.tokenizer)
    suite = bundled_suite(os.path.join(output_path, "bundled-tasks"), size=config.task_documents)
    byte_lengths = tok.token_byte_lengths()
    chat_eval = ChatEvaluator(
        {"chat": f"{config.chat}/validation"},
        seq_len=config.seq_len,
        batch_size=16,
        max_tokens=None,
        byte_lengths=byte_lengths,
    )
    held_out = PreferenceDataset(f"{config.prefs}/validation", config.pair_len)
    with np.load(f"{config.reference}/validation.npz") as z:
        ref = {k: z[k] for k in z.files}
    out = {}
    for name, run in config.stages.items():
        model, _ = load_model(latest_checkpoint(run)[1])
        chat_scores = chat_eval.score(model, "chat")
        p = score_pairs(model, held_out, batch_size=16)
        margin = (p["chosen_logps"] - ref["chosen_logps"]) - (p["rejected_logps"] - ref["rejected_logps"])
        out[name] = {
            "chat_loss": chat_scores["loss"],
            "chat_bpb": chat_scores["bpb"],
            "preference_accuracy": float(np.mean(p["chosen_logps"] > p["rejected_logps"])),
            "reward_accuracy": float(np.mean(margin > 0)),
            "docs_loss": evaluate_lm(
                model, {"docs": f"{config.docs}/validation"}, seq_len=config.seq_len, max_tokens=40_000
            )["datasets"]["docs"]["loss"],
            "tasks": {
                task: {k: t[k] for k in ("acc", "acc_stderr", "chance", "documents")}
                for task, t in evaluate_suite(model, tok, suite, batch_size=32)["tasks"].items()
            },
        }
    with open(os.path.join(output_path, "stages.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


stages = step(
    "eval/tutorial-nano-posttrain",
    score_stages,
    StagesConfig(
        stages={"pretrained": pretrained, "sft": sft_model, "dpo": dpo_model},
        chat=chat,
        prefs=prefs,
        reference=ref,
        docs=docs,
        tokenizer=default_tokenizer,
        seq_len=SEQ_LEN,
        pair_len=PAIR_LEN,
        task_documents=TASK_DOCUMENTS,
    ),
    version="v2",
    resources=CPU,
)
hf = hf_export(dpo_model)


def print_summary(result: RunResult) -> None:
    """The stages side by side and where things are (works on a cached rerun too)."""
    if result.dry_run or stages.key not in {o.key for o in result.steps}:
        return
    scores = result[stages].result
    print("\nHeld-out functions (10% of them, in no training set):")
    print(
        f"  {'stage':<11} {'chat loss':>9} {'chat bpb':>9} {'prefers true':>13} {'reward acc':>11} {'docs loss':>10}"
    )
    for name, s in scores.items():
        print(
            f"  {name:<11} {s['chat_loss']:>9.3f} {s['chat_bpb']:>9.3f} {s['preference_accuracy']:>13.2f} "
            f"{s['reward_accuracy']:>11.2f} {s['docs_loss']:>10.3f}"
        )
    print(
        "  (reward acc: DPO's implicit reward against the SFT reference; the SFT model is its own reference)"
    )
    tasks = sorted(next(iter(scores.values()))["tasks"])
    print("\nBundled tasks (4-way multiple choice from the documentation, plain text; accuracy ± 1 s.e.):")
    print(f"  {'stage':<11}" + "".join(f" {t.removeprefix('docs_'):>16}" for t in tasks))
    for name, s in scores.items():
        print(
            f"  {name:<11}"
            + "".join(f" {s['tasks'][t]['acc']:>8.3f} ± {s['tasks'][t]['acc_stderr']:.3f}" for t in tasks)
        )
    first = next(iter(scores.values()))["tasks"]
    print(f"  {'chance':<11}" + "".join(f" {first[t]['chance']:>16.3f}" for t in tasks))
    print(f"  ({first[tasks[0]]['documents']} questions a task: a difference under ~2 s.e. is noise)")
    print("\nOutputs:")
    print(f"  SFT run     {result[sft_model].output_path}")
    print(f"  DPO run     {result[dpo_model].output_path}")
    print(f"  HF export   {result[hf].output_path}")


if __name__ == "__main__":
    print_summary(StepRunner().main([stages, hf]))
