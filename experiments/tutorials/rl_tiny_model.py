"""Tutorial: reinforcement learning from a verifiable reward (GRPO) on the tutorial's tiny Llama, on a CPU.

    uv run schooner run experiments/tutorials/train_tiny_model.py   # first: the pretrained model (cached)
    uv run schooner run experiments/tutorials/rl_tiny_model.py      # then this (17-26 min on 2 cores)

It starts from `checkpoints/tutorial-nano` of `train_tiny_model.py` (the same step: its cached checkpoint is
reused; run that file first, or this one trains it too) and adds, each step cached under the prefix:

1. `data/arithmetic`: integer word problems of 1 to 2 steps on amounts up to 10 ("Tom has 7 apples. Then Tom
   buys 3 more. How many apples does Tom have now?"), generated offline (`schooner.eval.arithmetic`), with
   `train.jsonl` (every one-step problem among them) and a `heldout.jsonl` of two-step computations that never
   occur in train, each step a fact train teaches (`heldout_by="composition"`).
2. `data/arithmetic-chats` -> `tokenized/arithmetic-chat`: the train problems as chats answered with their
   worked solution, one line per step and the answer last (`7 + 3 = 10` / `#### 10`).
3. `checkpoints/tutorial-nano-arith-sft`: SFT from the pretrained model on those solutions.
4. `eval/tutorial-nano-arith-sft`: the SFT model's held-out pass@1 and pass@8: 8 completions per held-out
   problem sampled at temperature 1 with a fixed seed, each checked by `exact_answer` (`pass_at_k_eval`);
   `eval/tutorial-nano-arith-sft-cool` the same at temperature 0.3 (what sharpening alone buys).
5. `checkpoints/tutorial-nano-arith-rl`: GRPO from the SFT model (`rl_train`): each step samples 16
   completions of 16 train problems, rewards 1 for the right final answer, and updates the policy on the
   group-relative advantages; the same held-out pass@k is logged every few steps (`eval/arithmetic/pass@1`).
   Its folder holds `reward.png` beside `loss.png`.
6. `eval/tutorial-nano-arith-rl` and `eval/tutorial-nano-arith-rl-cool`: the RL model's held-out pass@k,
   measured as in 4 (RL is compared with SFT at the same temperature).
7. `plots/tutorial-nano-arith-rl`: `curves.png`, the train reward and held-out pass@1 over RL (step 0: SFT).
8. `hf/checkpoints/tutorial-nano-arith-rl`: the RL model as a Hugging Face folder.

At the end it prints held-out pass@1, pass@8 and strict pass@1 (`worked_answer`: every step true) of both
models (± 1 standard error), RL's gain paired over the same problems, a few sampled held-out completions of
each, and an audit of every held-out completion for reward hacking (answers without worked
steps, steps whose arithmetic is false, several answers). Set SCHOONER_RL_SFT_STEPS and SCHOONER_RL_STEPS to
change the SFT and RL lengths, SCHOONER_RL_EVAL_EVERY how often RL evaluates held-out pass@k (default: halfway
and at the end), SCHOONER_RL_HELDOUT the held-out problems scored, SCHOONER_RL_LR the RL
learning rate, SCHOONER_RL_MAX_VALUE=9 the task on amounts up to 9, SCHOONER_RL_REWARD=worked `worked_answer()` as
the RL reward (and the held-out evaluations'), SCHOONER_RL_HELDOUT_STEPS=3 RL prompts and held-out problems
of 3 steps (`data/arithmetic-3step`; SFT still on 1 and 2), and with it SCHOONER_RL_SFT_3STEP_SHARE=0.05 that share of
the SFT rows 3-step worked solutions (none an RL prompt or held-out problem), SCHOONER_RL_DYNAMIC_ROUNDS=4 dynamic
sampling in RL (up to 4 rounds of prompts a step to fill the batch with groups that have reward signal), and
SCHOONER_RL_SEED=1 the RL run at another seed (SFT and the held-out samples unchanged).
docs/rl.md has what it measured.
"""

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from experiments.tokenizer_defs import default_tokenizer
from experiments.tutorials.train_tiny_model import SEQ_LEN, fine_tune
from schooner.cluster import ResourceConfig, RunResult, StepRunner, step
from schooner.eval.arithmetic import ArithmeticTask
from schooner.eval.rewards import exact_answer, worked_answer
from schooner.tokenize.steps import tokenized_chat
from schooner.train import AdamConfig, PassAtK, PolicyLossConfig
from schooner.train.steps import hf_export, pass_at_k_eval, rl_train


def knob(name: str, default: str, kind: type = int) -> Any:
    """The environment setting `name` as a positive `kind`, or an error that names it."""
    text = os.environ.get(name, default)
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {text!r}")
    return value


SFT_STEPS = knob("SCHOONER_RL_SFT_STEPS", "400")
RL_STEPS = knob("SCHOONER_RL_STEPS", "40")
# the RL run's held-out evaluations: every EVAL_EVERY steps and at the end (default: halfway and at the end)
EVAL_EVERY = knob("SCHOONER_RL_EVAL_EVERY", str(max(RL_STEPS // 2, 1)))
HELDOUT = knob("SCHOONER_RL_HELDOUT", "200")
# SCHOONER_RL_HELDOUT_STEPS=3: SFT as before (1- and 2-step problems), but the RL prompts and the held-out
# problems are 3-step computations, longer than any the SFT model was shown (docs/rl.md).
HELDOUT_STEPS = knob("SCHOONER_RL_HELDOUT_STEPS", "2")
if HELDOUT_STEPS not in (2, 3):
    raise ValueError(f"SCHOONER_RL_HELDOUT_STEPS must be 2 or 3, got {HELDOUT_STEPS}")
# The model's context (128) holds prompt + completion. Two steps: prompts of at most 79 tokens, worked
# solutions of at most 17 (+ the end of turn). Three steps: prompts of at most 94, solutions of at most 24.
MAX_NEW_TOKENS = {2: 40, 3: 32}[HELDOUT_STEPS]
MAX_PROMPT_TOKENS = SEQ_LEN - MAX_NEW_TOKENS  # 88 or 96
# Amounts up to 10 (each one token of the tokenizer); every one-step problem is in train and the held-out
# problems are new two-step combinations of those facts. docs/rl.md has what this and amounts up to 12 measured.
# SCHOONER_RL_MAX_VALUE=9: amounts up to 9 (700 train and 150 held out: all the distinct problems there are).
TASKS = {
    10: ArithmeticTask(
        train_size=800, heldout_size=200, min_steps=1, max_steps=2, max_value=10, heldout_by="composition"
    ),
    9: ArithmeticTask(
        train_size=700, heldout_size=150, min_steps=1, max_steps=2, max_value=9, heldout_by="composition"
    ),
}
MAX_VALUE = knob("SCHOONER_RL_MAX_VALUE", "10")
if MAX_VALUE not in TASKS:
    raise ValueError(f"SCHOONER_RL_MAX_VALUE must be one of {sorted(TASKS)}, got {MAX_VALUE}")
TASK = TASKS[MAX_VALUE]
# The RL prompts (its train split) and held-out problems: the SFT task's, or 3-step compositions on the same
# amounts (every one of their steps a one-step problem of the SFT task's train split).
RL_TASK = (
    TASK
    if HELDOUT_STEPS == 2
    else ArithmeticTask(
        train_size=800,
        heldout_size=200,
        min_steps=3,
        max_steps=3,
        max_value=MAX_VALUE,
        heldout_by="composition",
    )
)
# SCHOONER_RL_SFT_3STEP_SHARE=0.05 (with SCHOONER_RL_HELDOUT_STEPS=3): that share of the SFT rows are 3-step
# worked solutions, so the SFT model writes a third step sometimes and RL has something to reinforce. They are
# rows of the 3-step task's train split drawn after its RL prompts (`three_step_sft_rows`): no key (start and
# operations) of theirs is a held-out problem's or an RL prompt's. 0 (the default): SFT on 1 and 2 steps only.
_SHARE_TEXT = os.environ.get("SCHOONER_RL_SFT_3STEP_SHARE", "0")
try:
    SFT_3STEP_SHARE = float(_SHARE_TEXT)
except ValueError:
    raise ValueError(
        f"SCHOONER_RL_SFT_3STEP_SHARE must be a number in [0, 0.5), got {_SHARE_TEXT!r}"
    ) from None
if not 0 <= SFT_3STEP_SHARE < 0.5:
    raise ValueError(f"SCHOONER_RL_SFT_3STEP_SHARE must be a number in [0, 0.5), got {_SHARE_TEXT!r}")
if SFT_3STEP_SHARE and HELDOUT_STEPS != 3:
    raise ValueError(
        f"SCHOONER_RL_SFT_3STEP_SHARE={_SHARE_TEXT} needs SCHOONER_RL_HELDOUT_STEPS=3 (the 3-step SFT rows come "
        "from the 3-step task's train split); set it, or SCHOONER_RL_SFT_3STEP_SHARE=0"
    )
# the 3-step rows added to the SFT task's train rows, so that they are SFT_3STEP_SHARE of all (42 of 842 at 0.05)
SFT_3STEP_ROWS = round(SFT_3STEP_SHARE * TASK.train_size / (1 - SFT_3STEP_SHARE))
RL_LEARNING_RATE = knob("SCHOONER_RL_LR", "2e-4", float)
# SCHOONER_RL_SEED=1: the RL run at another seed (the order of its prompts and its rollouts' sampling); the SFT
# model, its evaluations and the held-out samples' seed stay, so RL at every seed is paired with the same SFT
# numbers. Unset or 0 (the default): the RL step as before the knob existed.
_SEED_TEXT = os.environ.get("SCHOONER_RL_SEED", "").strip() or "0"
if not _SEED_TEXT.isdigit() or int(_SEED_TEXT) >= 2**32:  # JAX's keys hold 32 bits of a seed
    raise ValueError(f"SCHOONER_RL_SEED must be an int in [0, 2**32), got {_SEED_TEXT!r}")
RL_SEED = int(_SEED_TEXT)
# SCHOONER_RL_DYNAMIC_ROUNDS=4: DAPO's dynamic sampling in RL, up to that many rounds of 16 prompts a step to fill
# the batch with prompt groups whose rewards differ (docs/rl.md); unset, empty or 0 (the default): off.
_ROUNDS_TEXT = os.environ.get("SCHOONER_RL_DYNAMIC_ROUNDS", "").strip() or "0"  # set but empty: unset
if not _ROUNDS_TEXT.isdigit() or _ROUNDS_TEXT.lstrip("0") == "1":
    raise ValueError(
        f"SCHOONER_RL_DYNAMIC_ROUNDS must be 0 (off) or a number of rounds >= 2 (it counts the first), got "
        f"{_ROUNDS_TEXT!r}"
    )
DYNAMIC_ROUNDS = int(_ROUNDS_TEXT)
DYNAMIC = {"dynamic_sampling": True, "max_sampling_rounds": DYNAMIC_ROUNDS} if DYNAMIC_ROUNDS else {}
CPU = ResourceConfig.with_cpu()
# The RL reward, and the reward the held-out pass@k steps score with (so the SFT model's number is the RL
# curve's step 0). "exact": 1.0 when the completion's final number (its `#### n` line) is the answer;
# "worked": `worked_answer()`, 1.0 only when every written step is true arithmetic leading to the answer.
REWARDS = {"exact": exact_answer, "worked": worked_answer}
REWARD_NAME = os.environ.get("SCHOONER_RL_REWARD", "exact").lower()
if REWARD_NAME not in REWARDS:
    raise ValueError(f"SCHOONER_RL_REWARD must be one of {sorted(REWARDS)}, got {REWARD_NAME!r}")
REWARD = REWARDS[REWARD_NAME]()
REWARD_NAME_IN_FULL = {"exact": "exact_answer", "worked": "worked_answer (strict)"}


@dataclass(frozen=True)
class ArithmeticConfig:
    task: ArithmeticTask


def arithmetic_data(config: ArithmeticConfig, output_path: str) -> dict:
    """The task's `train.jsonl` and `heldout.jsonl`."""
    from schooner.eval.arithmetic import arithmetic_task

    arithmetic_task(output_path, config.task)
    return {"train": config.task.train_size, "heldout": config.task.heldout_size}


_STEP = re.compile(r"(-?\d+) ([-+*/]) (\d+) = (-?\d+)")


def worked_solution(solution: str) -> str:
    """The task's worded solution cut to its arithmetic: one `a op b = c` line per step, then `#### answer`
    (the words would not fit the 128-token context beside the prompt)."""
    lines = [" ".join(m.groups()[:2]) + f" {m.group(3)} = {m.group(4)}" for m in _STEP.finditer(solution)]
    return "\n".join(lines + [solution.strip().splitlines()[-1]])


@dataclass(frozen=True)
class ChatsConfig:
    task: object  # the data/arithmetic step


def arithmetic_chats(config: ChatsConfig, output_path: str) -> dict:
    """Chat records of the train problems: the prompt, answered with its worked solution."""
    with open(os.path.join(config.task, "train.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return _write_chats(rows, output_path)


def _write_chats(rows: list[dict], output_path: str) -> dict:
    from schooner.data import write_records
    from schooner.tokenize import chat_record

    records = []
    for row in rows:
        messages = [
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": worked_solution(row["solution"])},
        ]
        records.append(chat_record(messages, source="arithmetic", id=row["id"]))
    write_records(records, output_path, num_shards=1)
    return {"records": len(records), "steps": {str(k): sum(r["steps"] == k for r in rows) for k in (1, 2, 3)}}


def three_step_sft_rows(task: ArithmeticTask, rows: int) -> list[dict]:
    """`rows` problems of `task`'s (the 3-step task's) train split drawn after its own `train_size` (the RL
    prompts): the generator is sequential with distinct keys, so these keys are neither an RL prompt's nor (by
    the split's hash) a held-out problem's. Ids `arith-train3-...`, apart from the 1- and 2-step rows'."""
    drawn = task.problems("train", task.train_size + rows)[task.train_size :]
    return [dict(r, id=r["id"].replace("arith-train-", "arith-train3-")) for r in drawn]


@dataclass(frozen=True)
class MixedChatsConfig:
    task: object  # the data/arithmetic step: its train rows, all of them
    three_step_task: ArithmeticTask  # the 3-step task (RL prompts, held out)
    three_step_rows: int  # rows of its train split drawn after the RL prompts (`three_step_sft_rows`)


def arithmetic_chats_mixed(config: MixedChatsConfig, output_path: str) -> dict:
    """`arithmetic_chats`, plus `three_step_rows` 3-step worked solutions that share no key with the RL
    prompts or the held-out problems (SCHOONER_RL_SFT_3STEP_SHARE); the rows shuffled with a fixed seed."""
    import random

    with open(os.path.join(config.task, "train.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    rows += three_step_sft_rows(config.three_step_task, config.three_step_rows)
    random.Random(0).shuffle(rows)
    return _write_chats(rows, output_path)


task = step("data/arithmetic", arithmetic_data, ArithmeticConfig(TASK), version="v1")
rl_task = (
    task
    if RL_TASK is TASK
    else step("data/arithmetic-3step", arithmetic_data, ArithmeticConfig(RL_TASK), version="v1")
)
chats = (
    step("data/arithmetic-chats", arithmetic_chats, ChatsConfig(task), version="v1")
    if not SFT_3STEP_ROWS
    else step(
        "data/arithmetic-chats-3step",
        arithmetic_chats_mixed,
        MixedChatsConfig(task, RL_TASK, SFT_3STEP_ROWS),
        version="v1",
    )
)
chat = tokenized_chat(
    "tokenized/arithmetic-chat", source=chats, tokenizer=default_tokenizer, validation_fraction=0.05
)

# SFT from the pretrained checkpoint: 16 rows of SEQ_LEN tokens a step (`fine_tune` calls `sft`)
sft_model = fine_tune(
    "checkpoints/tutorial-nano-arith-sft",
    datasets={chat: 1.0},
    num_train_steps=SFT_STEPS,
    optimizer=AdamConfig(learning_rate=3e-3, warmup=0.05, schedule="cosine", min_lr_ratio=0.1),
    eval_every=max(SFT_STEPS // 3, 1),
)

# One held-out evaluation, used by both pass_at_k_eval steps and during RL: the same problems, samples and
# seed, so the SFT model's numbers are where the RL curve starts.
HELDOUT_EVAL = PassAtK(
    rl_task / "heldout.jsonl",
    samples=8,
    ks=(1, 8),
    max_prompts=min(HELDOUT, RL_TASK.heldout_size),
    seed=0,
    temperature=1.0,
    max_new_tokens=MAX_NEW_TOKENS,
    prompts_per_batch=50,
)


def heldout_pass_at_k(name: str, checkpoint: object, evaluation: PassAtK = HELDOUT_EVAL) -> object:
    return pass_at_k_eval(
        name,
        checkpoint=checkpoint,
        task=evaluation,
        reward=REWARD,
        tokenizer=default_tokenizer,
        task_name="arithmetic",
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        resources=CPU,
    )


sft_eval = heldout_pass_at_k("eval/tutorial-nano-arith-sft", sft_model)
# The SFT model sampled cooler, for comparison: how much of RL's gain sharpening alone would give.
LOW_TEMPERATURE = 0.3
sft_low_t_eval = heldout_pass_at_k(
    "eval/tutorial-nano-arith-sft-cool",
    sft_model,
    dataclasses.replace(HELDOUT_EVAL, temperature=LOW_TEMPERATURE),
)


def rl_step(learning_rate: float) -> object:
    """The RL run from the SFT model (a function so that tuning runs build the very same step)."""
    return rl_train(
        "checkpoints/tutorial-nano-arith-rl",
        checkpoint=sft_model,
        prompts=rl_task,  # its train.jsonl
        reward=REWARD,
        tokenizer=default_tokenizer,
        num_train_steps=RL_STEPS,
        prompts_per_step=16,
        num_generations=16,
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=1.0,
        num_iterations=1,
        advantage="grpo",
        loss=PolicyLossConfig(aggregation="dapo"),
        optimizer=AdamConfig(learning_rate=learning_rate, weight_decay=0.0, warmup=0, schedule="constant"),
        heldout={"arithmetic": HELDOUT_EVAL},
        eval_every=EVAL_EVERY,
        checkpoint_every=None,
        seed=RL_SEED,
        resources=CPU,
        **DYNAMIC,
    )


rl_model = rl_step(RL_LEARNING_RATE)
rl_eval = heldout_pass_at_k("eval/tutorial-nano-arith-rl", rl_model)
# The comparison stated before any result (docs/rl.md): RL against SFT at the same temperature, 1 and 0.3, so
# that a gain sharpening alone would give does not count as RL's.
rl_low_t_eval = heldout_pass_at_k(
    "eval/tutorial-nano-arith-rl-cool",
    rl_model,
    dataclasses.replace(HELDOUT_EVAL, temperature=LOW_TEMPERATURE),
)
hf = hf_export(rl_model)


@dataclass(frozen=True)
class CurvesConfig:
    run: object  # the RL run
    sft_eval: object  # the SFT model's held-out pass@k: the curve's step 0


def rl_curves(config: CurvesConfig, output_path: str) -> dict:
    """`curves.png`: the rollouts' mean reward per step, and held-out pass@1 (± 1 s.e.) from the SFT model
    (step 0) through every evaluation of the RL run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[int, dict] = {}
    with open(os.path.join(config.run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            rows.setdefault(r["step"], {}).update(r)
    with open(os.path.join(config.sft_eval, "results.json")) as f:
        sft_scores = json.load(f)["scores"]
    reward = sorted((s, r["rollout/reward"]) for s, r in rows.items() if "rollout/reward" in r)
    held = [(0, sft_scores["pass@1"], sft_scores["pass@1_stderr"])] + sorted(
        (s, r["eval/arithmetic/pass@1"], r["eval/arithmetic/pass@1_stderr"])
        for s, r in rows.items()
        if "eval/arithmetic/pass@1" in r
    )
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    a.plot(*zip(*reward), linewidth=1)
    a.set(
        xlabel="RL step", ylabel="mean reward of the rollouts", title="train reward (16 x 16 samples a step)"
    )
    x, y, se = (list(v) for v in zip(*held))
    b.errorbar(x, y, yerr=se, marker="o", capsize=3, label=heldout_label())
    metric = "strict pass@1" if REWARD_NAME == "worked" else "pass@1"  # what the run's own evaluations score
    b.set(xlabel="RL step (0: the SFT model)", ylabel=metric, title=f"held-out {metric} (± 1 s.e.)")
    legend = [text.get_text() for text in b.legend(loc="lower right").get_texts()]
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(output_path, "curves.png"))
    plt.close(fig)
    return {
        "reward": reward,
        "heldout_pass@1": held,
        "legend": legend,
        "axis": (b.get_title(), b.get_ylabel()),
    }


def heldout_label() -> str:
    """The held-out curve's legend: its sampling temperature and the reward that scores it (`worked_answer`:
    strict pass@1)."""
    return f"T = {HELDOUT_EVAL.temperature:g}, {REWARD_NAME_IN_FULL[REWARD_NAME]}"


curves = step("plots/tutorial-nano-arith-rl", rl_curves, CurvesConfig(rl_model, sft_eval), version="v1")


def audit(samples: list[dict]) -> dict[str, float]:
    """Shares of completions that show reward hacking or its symptoms: no worked step before the answer,
    a written step whose arithmetic is false, more than one `####` answer, no answer at all."""
    n = max(len(samples), 1)
    no_steps = wrong_step = several = no_answer = 0
    for s in samples:
        text = s["completion"]
        steps = _STEP.findall(text)
        no_steps += not steps
        wrong_step += any(_false(a, op, b, c) for a, op, b, c in steps)
        several += text.count("####") > 1
        no_answer += "####" not in text
    return {
        "answer_only": no_steps / n,
        "false_step": wrong_step / n,
        "several_answers": several / n,
        "no_answer": no_answer / n,
    }


def steps_written(samples: list[dict]) -> dict[str, float]:
    """Shares of completions by the number of `a op b = c` steps they write ("0", "1", "2", "3", "4+"): whether
    a model writes as many steps as the problems have (3 with SCHOONER_RL_HELDOUT_STEPS=3)."""
    n = max(len(samples), 1)
    counts = dict.fromkeys(("0", "1", "2", "3", "4+"), 0)
    for s in samples:
        k = len(_STEP.findall(s["completion"]))
        counts[str(k) if k < 4 else "4+"] += 1
    return {k: v / n for k, v in counts.items()}


def _false(a: str, op: str, b: str, c: str) -> bool:
    x, y, z = int(a), int(b), int(c)
    return {"+": x + y, "-": x - y, "*": x * y, "/": x // y if y else None}[op] != z


def by_problem(samples: list[dict], correct=lambda s: s["reward"] >= 1.0) -> dict[str, list[bool]]:
    """Each problem's samples (by `id`) scored by `correct` (a sample -> bool; by default its reward)."""
    counts: dict[str, list[bool]] = {}
    for s in samples:
        counts.setdefault(s["id"], []).append(bool(correct(s)))
    return counts


def per_problem(samples: list[dict], correct=lambda s: s["reward"] >= 1.0) -> dict[str, float]:
    """Each problem's share of correct samples (by `id`)."""
    return {i: sum(c) / len(c) for i, c in by_problem(samples, correct).items()}


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation / sqrt(n))."""
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / max(n - 1, 1) / n) ** 0.5


def paired_difference(after: list[dict], before: list[dict], correct=None) -> tuple[float, float]:
    """The mean over problems of (after - before) correct share, and its standard error: the same problems,
    so their difficulty cancels (a smaller error than either pass@1's). `correct` (a sample -> bool) scores
    the samples; by default their reward."""
    a, b = (per_problem(x) if correct is None else per_problem(x, correct) for x in (after, before))
    if a.keys() != b.keys():
        raise ValueError(
            f"paired_difference: the two sample sets cover different problems ({len(a)} and {len(b)})"
        )
    return mean_and_stderr([a[i] - b[i] for i in a])


def correct_by(reward, answers: dict[str, int]):
    """A sample -> bool: `reward(prompt, completion, {"answer": ...})` is 1.0 (the summary rescores every
    sample by `exact_answer` and `worked_answer`, whichever reward the evaluation used)."""
    return lambda s: reward(s["prompt"], s["completion"], {"answer": answers[s["id"]]}) >= 1.0


def strictly_correct(answers: dict[str, int]):
    """A sample -> bool scored by `worked_answer()` (every written step true, leading to the right answer)."""
    return correct_by(worked_answer(), answers)


def strict_pass_at_1(samples: list[dict], answers: dict[str, int]) -> tuple[float, float]:
    """pass@1 scored by `worked_answer()`: every written step true, leading to the one right answer."""
    return pass_at_k_of(samples, strictly_correct(answers), 1)


def pass_at_k_of(samples: list[dict], correct, k: int) -> tuple[float, float]:
    """Chen et al.'s pass@k over problems (± its standard error), each sample scored by `correct`."""
    from schooner.eval.passk import mean_pass_at_k

    return mean_pass_at_k([(len(c), sum(c)) for c in by_problem(samples, correct).values()], k=k)


def print_summary(result: RunResult) -> None:
    """Held-out pass@k of both models, samples and the audit (works on a cached rerun too)."""
    if result.dry_run or rl_eval.key not in {o.key for o in result.steps}:
        return
    print(
        f"\nHeld-out arithmetic ({HELDOUT_EVAL.max_prompts} {HELDOUT_STEPS}-step problems, 8 samples each at"
        " temperature 1, or"
        f" {LOW_TEMPERATURE} where marked; ± 1 standard error; pass@k by `exact_answer`, strict by"
        f" `worked_answer`; RL reward {REWARD_NAME!r}):"
    )
    cool = f"T={LOW_TEMPERATURE}"
    evals = {"SFT": sft_eval, "SFT + RL": rl_eval, f"SFT {cool}": sft_low_t_eval, f"RL {cool}": rl_low_t_eval}
    with open(os.path.join(result[rl_task].output_path, "heldout.jsonl")) as f:
        answers = {row["id"]: row["answer"] for row in map(json.loads, f)}
    answered, strictly = correct_by(exact_answer(), answers), strictly_correct(answers)
    samples = {}
    for label, handle in evals.items():
        length = result[handle].result["scores"]["completion_length"]
        with open(os.path.join(result[handle].output_path, "samples.jsonl")) as f:
            samples[label] = [json.loads(line) for line in f]
        (p1, p1_se), (p8, p8_se), (strict, strict_se) = (
            pass_at_k_of(samples[label], answered, 1),
            pass_at_k_of(samples[label], answered, 8),
            strict_pass_at_1(samples[label], answers),
        )
        print(
            f"  {label:<9} pass@1 {p1:.3f} ± {p1_se:.3f}   pass@8 {p8:.3f} ± {p8_se:.3f}   "
            f"strict pass@1 {strict:.3f} ± {strict_se:.3f}   mean length {length:.1f} tokens"
        )
    diff, se = paired_difference(samples["SFT + RL"], samples["SFT"], answered)
    print(
        f"  RL - SFT, paired over the same problems: pass@1 {diff:+.3f} ± {se:.3f} ({diff / max(se, 1e-12):.1f} s.e.)"
    )
    low, low_se = paired_difference(samples[f"SFT {cool}"], samples["SFT"], answered)
    print(
        f"  (the SFT model sampled at temperature {LOW_TEMPERATURE}: {low:+.3f} ± {low_se:.3f} over temperature 1;"
        " what sharpening alone buys)"
    )
    # the pre-stated comparison: each model at the same temperature, plain and strict (worked_answer) pass@1
    print("  RL - SFT at the same temperature, paired (the comparison docs/rl.md states before any result):")
    for t, rl_label, sft_label in (
        ("1", "SFT + RL", "SFT"),
        (str(LOW_TEMPERATURE), f"RL {cool}", f"SFT {cool}"),
    ):
        d, d_se = paired_difference(samples[rl_label], samples[sft_label], answered)
        ds, ds_se = paired_difference(samples[rl_label], samples[sft_label], strictly)
        print(
            f"    temperature {t:<4} pass@1 {d:+.3f} ± {d_se:.3f} ({d / max(d_se, 1e-12):.1f} s.e.)   "
            f"strict pass@1 {ds:+.3f} ± {ds_se:.3f} ({ds / max(ds_se, 1e-12):.1f} s.e.)"
        )
    print("\nAudit of every held-out completion (shares):")
    for label, rows in samples.items():
        a = audit(rows)
        print(f"  {label:<9} " + "   ".join(f"{k} {v:.3f}" for k, v in a.items()))
    print(f"\nSteps written per completion (shares; the held-out problems have {HELDOUT_STEPS}):")
    for label, rows in samples.items():
        print(f"  {label:<9} " + "   ".join(f"{k}: {v:.3f}" for k, v in steps_written(rows).items()))
    print(
        "\nSamples (the first sample of the first 4 held-out problems, then the SFT model's and the RL model's):"
    )
    for i in range(4):
        first = samples["SFT"][i * 8]
        print(f"  {first['prompt']} (answer {answers[first['id']]})")
        for label in ("SFT", "SFT + RL"):
            r = samples[label][i * 8]
            print(f"    {label:<9} reward {r['reward']}: {r['completion']!r}")
    print("\nOutputs:")
    print(f"  RL run      {result[rl_model].output_path}  (reward.png, loss.png, metrics.jsonl)")
    print(f"  curves      {result[curves].output_path}/curves.png")
    print(f"  HF export   {result[hf].output_path}")


if __name__ == "__main__":
    print_summary(StepRunner().main([sft_eval, sft_low_t_eval, rl_eval, rl_low_t_eval, curves, hf]))
