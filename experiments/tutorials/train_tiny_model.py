"""Tutorial: train a tiny Llama on Python's own documentation and source code, end to end, on a laptop CPU.

    uv run schooner run experiments/tutorials/train_tiny_model.py                 # a few minutes on 2 cores
    uv run schooner run experiments/tutorials/train_tiny_model.py --cluster ray   # the same on a local Ray

What happens, step by step (each step is cached under the prefix, `./schooner-output` by default, so running
the file again does nothing and finishes in seconds; change a setting and only what depends on it reruns):

1. `data/python-docs`, `data/python-code`: the embedded corpus (the Python standard library's docs and code,
   no download) written as record folders.
2. `tokenizers/python-bpe-2k`: a byte-level BPE tokenizer trained on both (see `experiments/tokenizer_defs.py`).
3. `tokenized/python-docs`, `tokenized/python-code`: token caches, each split into `train/` and `validation/`.
4. `checkpoints/tutorial-nano`: a ~1M-parameter Llama trained for 300 steps on a 75/25 mixture of prose and
   code (the tasks below are about the prose); its output holds checkpoints, `metrics.jsonl` and `loss.png`.
5. `eval/tutorial-nano`: validation loss and bits-per-byte on both validation splits; accuracy on three
   4-way multiple-choice tasks built from the documentation (the last word of a sentence, a function's name
   from its docstring, the next sentence), each against chance and a word-unigram model, with standard
   errors; and samples, greedy and with temperature.

At the end it prints the scores, the samples, the parameter count, where everything is, and writes an HTML
report of the run. Set SCHOONER_TUTORIAL_STEPS to train for fewer (or more) steps and
SCHOONER_TUTORIAL_TASK_DOCUMENTS to score fewer questions per task (700 by default: every cloze and
next-sentence question the corpus has; with fewer the accuracies have larger standard errors).
"""

import dataclasses
import math
import os

from experiments.models import llama_nano
from experiments.tokenizer_defs import default_tokenizer
from schooner.cluster import ResourceConfig, RunResult, StepRunner, write_report
from schooner.eval import BundledTasks, SamplingConfig
from schooner.eval.steps import evaluate
from schooner.tokenize.steps import tokenized
from schooner.train import AdamConfig
from schooner.train.steps import train_lm

NUM_TRAIN_STEPS = int(os.environ.get("SCHOONER_TUTORIAL_STEPS", "300"))
TASK_DOCUMENTS = int(os.environ.get("SCHOONER_TUTORIAL_TASK_DOCUMENTS", "700"))
SEQ_LEN = 128

# Lazy handles: nothing is read, tokenized or trained until the runner runs them.
docs = tokenized("tokenized/python-docs", source="python-docs", tokenizer=default_tokenizer)
code = tokenized("tokenized/python-code", source="python-code", tokenizer=default_tokenizer)

model = train_lm(
    "checkpoints/tutorial-nano",
    model=dataclasses.replace(llama_nano, max_seq_len=SEQ_LEN),
    optimizer=AdamConfig(learning_rate=6e-3, weight_decay=0.1, warmup=0.05),
    datasets={docs: 0.75, code: 0.25},
    batch_size=16,
    seq_len=SEQ_LEN,
    num_train_steps=NUM_TRAIN_STEPS,
    eval_every=max(NUM_TRAIN_STEPS // 3, 1),
    eval_max_tokens=40_000,  # as the evaluation below: the final train-time eval and it give the same numbers
    checkpoint_every=None,  # one checkpoint, at the end
    resources=ResourceConfig.with_cpu(),  # runtime only: not part of the step's identity
)


def fine_tune(
    name: str, datasets: dict, num_train_steps: int, optimizer: AdamConfig, eval_every: int
) -> object:
    """`sft` of this pretrained model, as the post-training tutorials run it: 16 rows of SEQ_LEN tokens a step,
    one checkpoint at the end, on the CPU (`posttrain_tiny_model.py`, `rl_tiny_model.py`)."""
    from schooner.train.steps import sft

    return sft(
        name,
        initialize_from=model,
        datasets=datasets,
        batch_size=16,
        seq_len=SEQ_LEN,
        num_train_steps=num_train_steps,
        optimizer=optimizer,
        eval_every=eval_every,
        checkpoint_every=None,
        resources=ResourceConfig.with_cpu(),
    )


scores = evaluate(
    "eval/tutorial-nano",
    checkpoint=model,
    datasets={"python-docs": docs, "python-code": code},  # their validation splits
    tokenizer=default_tokenizer,
    seq_len=SEQ_LEN,
    max_tokens=40_000,
    prompts=("The", "def "),
    max_new_tokens=40,
    sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=0),  # a second, sampled completion per prompt
    tasks=[BundledTasks(size=TASK_DOCUMENTS)],  # chance is 0.25; the cloze task is the first a model beats
    resources=ResourceConfig.with_cpu(),
)


def print_summary(result: RunResult) -> None:
    """The scores, a greedy sample, where the outputs are, and the report (works on a cached rerun too)."""
    if result.dry_run or scores.key not in {o.key for o in result.steps}:
        return  # a plan only, or `--only` left the evaluation out: nothing to summarise
    evaluation = result[scores].result
    print("\nValidation (held-out documents):")
    for name, d in sorted(evaluation["datasets"].items()):
        print(
            f"  {name:<12} loss {d['loss']:.3f} nats/token   {d['bpb']:.3f} bits/byte   ({d['tokens']:,} tokens)"
        )
    print(
        f"  {'average':<12} loss {evaluation['average']['loss']:.3f} nats/token   "
        f"{evaluation['average']['bpb']:.3f} bits/byte"
    )
    if evaluation.get("tasks"):
        print("\nTasks from the documentation (4-way multiple choice; accuracy ± 1 standard error):")
    for name, t in sorted(evaluation.get("tasks", {}).items()):
        chance, n = t["chance"], t["documents"]
        z = (t["acc"] - chance) / math.sqrt(
            chance * (1 - chance) / n
        )  # in standard errors of a chance scorer
        unigram = t["reference"].get("unigram_acc", float("nan"))
        print(
            f"  {name:<19} acc {t['acc']:.3f} ± {t['acc_stderr']:.3f} ({n} questions)   chance {chance:.3f}"
            f"   unigram model {unigram:.3f}   {z:+.1f} s.e. from chance"
        )
    print("\nGreedy samples:")
    for sample in evaluation["samples"]:
        print(f"  {sample['prompt']!r} -> {sample['completion']!r}")
    print("Sampled (temperature 0.8, top-p 0.95):")
    for sample in evaluation["samples"]:
        print(f"  {sample['prompt']!r} -> {sample.get('sampled', '')!r}")
    train_out = result[model].output_path
    print(f"\nModel: {evaluation.get('parameters', 0):,} parameters")
    print("\nOutputs:")
    print(f"  prefix      {result.prefix}")
    print(f"  checkpoint  {evaluation['checkpoint']}")
    print(f"  loss curve  {train_out}/loss.png")
    print(f"  scores      {result[scores].output_path}/results.json")
    print(f"  report      {write_report(result.prefix)}")


if __name__ == "__main__":
    # `main` reads the command line (`--dry-run`, `--force RE`, `--cluster ray`, `--quiet`, ...) and streams
    # each step's progress here as it runs.
    print_summary(StepRunner().main([scores]))
