"""The `rl_train` step: GRPO-family RL from verifiable rewards, a `TrainerConfig` whose objective is `Grpo`
(see `schooner.train._rl`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from schooner.cluster import InputPath, ResourceConfig, StepHandle, storage
from schooner.train._checkpoint import CheckpointConfig
from schooner.train._config import TrainerConfig
from schooner.train._init import InitialCheckpoint, pin_initialize_from, resolve_source
from schooner.train._mesh import MeshConfig
from schooner.train._optim import AdamConfig, OptimizerConfig
from schooner.train._rl import Grpo
from schooner.train._rl_eval import PassAtK
from schooner.train._rl_objective import PolicyLossConfig
from schooner.train._tracking import TrackerConfig

from ._lm import pinned_start, training_step

_CPU = ResourceConfig.with_cpu()


def rl_train(
    name: str,
    *,
    checkpoint: Any,
    prompts: Any,
    reward: Any,
    tokenizer: Any,
    num_train_steps: int,
    prompts_per_step: int = 8,
    num_generations: int = 4,
    max_prompt_tokens: int = 128,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float | None = None,
    top_k: int | None = None,
    num_iterations: int = 1,
    advantage: str = "grpo",
    scale_rewards: str = "group",
    loss: PolicyLossConfig | None = None,
    chat: bool = True,
    prompt_field: str = "prompt",
    id_field: str = "id",
    required_fields: tuple[str, ...] | None = None,
    rollout_chunk: int | None = None,
    rollout_workers: int = 0,
    dynamic_sampling: bool = False,
    max_sampling_rounds: int = 3,
    heldout: Mapping[str, Any] | None = None,
    eval_every: int | None = None,
    optimizer: OptimizerConfig | None = None,
    model: Any = None,
    checkpoint_step: int | None = None,
    seed: int = 0,
    microbatches: int = 1,
    compute_dtype: str | None = None,
    checkpoint_every: int | None = 100,
    keep_checkpoints: int = 2,
    mesh: MeshConfig | None = None,
    trackers: TrackerConfig | None = None,
    resources: ResourceConfig | None = _CPU,
    **options: Any,
) -> StepHandle:
    """A step that trains a policy with GRPO (Dr. GRPO, RLOO) on prompts scored by a verifiable reward.

    Each rollout batch samples `num_generations` completions of `prompts_per_step` prompts from the current
    policy, scores them with `reward`, turns the rewards into group-relative advantages and serves
    `num_iterations` optimizer steps of TRL's clipped policy loss. Checkpoints resume exactly (prompts and
    rollout RNG are pure functions of `(seed, step)`); the output folder is a training run like `train_lm`'s
    (`step-NNNNNN/`, `metrics.jsonl`, `loss.png`, `reward.png`), so `hf_export` and `evaluate` take it.

    Args:
        name: step name.
        checkpoint: the starting policy (an `sft` / `train_lm` step, a run, checkpoint or HF folder; a path is
            pinned to the checkpoint it resolves to now). With `loss.beta > 0` it is also the KL reference.
        prompts: a JSON-lines file (or a folder holding `train.jsonl`, e.g. `schooner.eval.arithmetic
            .arithmetic_task`'s), each row `prompt_field` (a user message or a conversation) and the fields
            the reward reads (`answer`, `tests`...); or a step producing such a folder.
        reward: `(prompt, completion, fields) -> float` (e.g. `schooner.eval.rewards.exact_answer()`), a
            module-level function or one a module-level factory returns (its name and code key the step).
            A row whose reward raises is scored nan, counted and named, never fatal.
        tokenizer: the policy's tokenizer (folder, file or step): renders the prompts (its chat template,
            as SFT did) and decodes the completions.
        num_train_steps: optimizer steps (rollout batches x `num_iterations`).
        prompts_per_step: P, prompts per rollout batch.
        num_generations: G, completions per prompt (batch = P x G rows).
        max_prompt_tokens: the prompt cap; longer prompts are left out, counted and named.
        max_new_tokens: the completion cap.
        temperature, top_p, top_k: sampling (the loss's log-probs use the same temperature).
        num_iterations: optimizer steps per rollout batch.
        advantage: "grpo", "dr_grpo" or "rloo".
        scale_rewards: GRPO's std: "group", "batch" or "none".
        loss: `PolicyLossConfig` (clipping, `beta`, aggregation; TRL's defaults).
        chat: render prompts with the chat template (False: raw text).
        prompt_field, id_field: the rows' prompt and id fields.
        required_fields: fields every row must hold, checked before training (None: those the reward
            declares, e.g. `exact_answer()`'s answer field); a row without one is an error naming it.
        rollout_chunk: prompts per sampling call (None: the whole batch, or split evenly over the workers);
            the rollouts depend on it, not on `rollout_workers`.
        rollout_workers: N > 0 samples the chunks in N jobs of the cluster client the step runs under (Ray
            tasks on Ray; local processes otherwise, within the CPUs the step reserved: give
            `resources=ResourceConfig.with_cpu(1 + N)` for them to run side by side), from weights sent
            each rollout batch. Runtime-only: the same rollouts and weights as N = 0 with the same chunk.
        dynamic_sampling: DAPO's dynamic sampling: keep only prompt groups whose rewards differ, sampling
            further rounds of `prompts_per_step` prompts until the batch is full of them or
            `max_sampling_rounds` rounds are spent (a shortfall is filled with groups without signal, counted
            as `rollout/dynamic/shortfall` and logged). Off by default (the step's key as before).
        max_sampling_rounds: with `dynamic_sampling`, the most rounds per rollout batch (the first included).
        heldout: held-out pass@k evaluations `{name: PassAtK(...) or prompts path}` (e.g.
            `{"arithmetic": PassAtK(task / "heldout.jsonl", samples=8, ks=(1, 8))}`): sampled at a fixed seed
            and scored with `reward` every `eval_every` steps and at the end, logged as
            `eval/<name>/pass@<k>` and `eval/<name>/pass@<k>_stderr` (`pass_at_k_eval` measures a checkpoint,
            e.g. the SFT model, the same way).
        eval_every: evaluate `heldout` every this many steps (and at the end); None: only at the end.
        optimizer: default `AdamConfig(learning_rate=1e-6, weight_decay=0.0, warmup=0, schedule="constant")`
            (TRL's rate); small models need more.
        model: the model config; None: the checkpoint's.
        checkpoint_step: with a run in `checkpoint`, its checkpoint of this step (None: the latest).
        seed, microbatches, compute_dtype, checkpoint_every, keep_checkpoints, mesh, trackers, resources:
            as in `train_lm`.
        **options: any other `TrainerConfig` field.
    """
    # the checkpoint is resolved once (a run folder may gain a checkpoint meanwhile): the config is the pinned one's
    pinned, pinned_step = check_rl_inputs(
        f"rl_train({name!r})",
        checkpoint=checkpoint,
        checkpoint_step=checkpoint_step,
        prompts=prompts,
        heldout=heldout,
        tokenizer=tokenizer,
    )
    model, initialize_from, initialize_from_step = pinned_start(
        model, pinned, pinned_step, who=f"rl_train({name!r})"
    )
    objective = Grpo(
        reward=reward,
        num_generations=num_generations,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_p=top_p,
        top_k=top_k,
        num_iterations=num_iterations,
        advantage=advantage,
        scale_rewards=scale_rewards,
        loss=loss if loss is not None else PolicyLossConfig(),
        chat=chat,
        prompt_field=prompt_field,
        id_field=id_field,
        required_fields=required_fields,
        rollout_chunk=rollout_chunk,
        rollout_workers=rollout_workers,
        dynamic_sampling=dynamic_sampling,
        max_sampling_rounds=max_sampling_rounds,
    )
    config = TrainerConfig(  # validated now
        model=model,
        datasets=((prompts, 1.0),),
        seq_len=max_prompt_tokens + max_new_tokens,
        objective=objective,
        optimizer=optimizer
        if optimizer is not None
        else AdamConfig(learning_rate=1e-6, weight_decay=0.0, warmup=0, schedule="constant"),
        batch_size=prompts_per_step * num_generations,
        num_train_steps=num_train_steps,
        validation={k: v if isinstance(v, PassAtK) else PassAtK(v) for k, v in (heldout or {}).items()},
        eval_every=eval_every,
        seed=seed,
        microbatches=microbatches,
        compute_dtype=compute_dtype,
        tokenizer=tokenizer,
        initialize_from=initialize_from,
        initialize_from_step=initialize_from_step,
        mesh=mesh or MeshConfig(),
        checkpoint=CheckpointConfig(every=checkpoint_every, keep_last=keep_checkpoints),
        trackers=trackers or TrackerConfig(),
        name=name,
        **options,
    )
    return training_step(
        name,
        config,
        resources,
        f"GRPO ({advantage}, G={num_generations}, {num_iterations} update(s) per batch) for "
        f"{num_train_steps} steps",
    )


def check_rl_inputs(
    who: str,
    *,
    checkpoint: Any,
    checkpoint_step: int | None,
    prompts: Any,
    heldout: Mapping[str, Any] | None,
    tokenizer: Any,
) -> tuple[Any, int | None]:
    """Refuse, while the experiment is built, an input given as a path that the run could not read: the
    checkpoint (a run folder with a complete checkpoint, a checkpoint folder or a Hugging Face folder), the
    prompts (a file, or a folder holding `train.jsonl`), each held-out evaluation's prompts (a file, or a folder
    holding `heldout.jsonl`) and the tokenizer; the error names the field and the fix. As `sft` and `dpo` check
    their inputs, the files' rows are not read here (the run reads them, naming a bad row); a step's output is
    checked when it exists. `pass_at_k_eval` runs the same checks (`pin_checkpoint`, `check_heldout`,
    `check_tokenizer`) on its inputs.

    Returns:
        `(initialize_from, initialize_from_step)` for the trainer's config (`pin_checkpoint`): a checkpoint
        path pinned to the `InitialCheckpoint` it was checked against (resolved once: a run folder that gains a
        checkpoint while the experiment is built does not give the config of one checkpoint and the weights of
        another); a step (or an `InputPath`, an `InitialCheckpoint`) as `pin_initialize_from` keeps it.
    """
    pinned = pin_checkpoint(who, checkpoint, checkpoint_step)
    _check_prompts(who, "prompts", prompts, "prompts", "train.jsonl")
    if heldout is not None and not isinstance(heldout, Mapping):
        raise TypeError(
            f"{who}: heldout must be heldout={{'name': path or PassAtK}}, got {heldout!r}; e.g. "
            "heldout={'arithmetic': PassAtK('task/heldout.jsonl', samples=8, ks=(1, 8))}"
        )
    for key, entry in (heldout or {}).items():
        check_heldout(who, f"heldout[{key!r}]", entry)
    check_tokenizer(who, tokenizer, required=True)
    return pinned


def pin_checkpoint(who: str, checkpoint: Any, step: int | None, *, hf: bool = True) -> tuple[Any, int | None]:
    """`check_checkpoint`'s checks, and `(checkpoint, step)` for a step config pinned to what they checked: a
    path becomes the `InitialCheckpoint` of the folder `check_checkpoint` resolved it to (resolved once, the
    step folded into it: a run that gains a checkpoint gives a new step key, and the run uses the checkpoint
    the key names); a step, an `InputPath` or an `InitialCheckpoint` is kept (`pin_initialize_from`)."""
    resolved = check_checkpoint(who, checkpoint, step, hf=hf)
    if resolved is None:
        return pin_initialize_from(checkpoint, step)
    return InitialCheckpoint.at(*resolved), None


def check_checkpoint(
    who: str, checkpoint: Any, step: int | None, *, hf: bool = True
) -> tuple[str, str] | None:
    """Refuse a `checkpoint` that is no path or step (None too), or a path that does not exist or holds no
    weights (or no checkpoint of `step`), naming the `checkpoint` field (`schooner.train._init.resolve_source`'s
    checks); with `hf=False` a Hugging Face folder too. A step is not checked here.

    Returns:
        `resolve_source`'s `(kind, folder)` of a path (pin that, not the path again); None for a step, an
        `InputPath` or an `InitialCheckpoint`.
    """
    if isinstance(checkpoint, StepHandle | InputPath | InitialCheckpoint):
        return None
    if not isinstance(checkpoint, str | os.PathLike):
        raise TypeError(
            f"{who}: checkpoint must be the policy: a run folder, a checkpoint folder or a training step, got "
            f"{checkpoint!r}"
        )
    path = os.fspath(checkpoint)
    try:
        kind, folder = resolve_source(path, step, field="checkpoint")
    except (FileNotFoundError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    if kind == "hf" and not hf:
        raise ValueError(
            f"{who}: checkpoint = {path!r} is a Hugging Face folder; give a schooner run or checkpoint folder "
            "(or the step that trains it)"
        )
    return kind, folder


def check_heldout(who: str, field: str, entry: Any) -> None:
    """Refuse held-out prompts (a path, or a `PassAtK` whose `prompts` is one; `field` names it) that the run
    could not read: a missing path, a folder without `heldout.jsonl`, a value that is no path or step."""
    if isinstance(entry, PassAtK):
        field, entry = f"{field}.prompts", entry.prompts
    _check_prompts(who, field, entry, "held-out prompts", "heldout.jsonl")


def check_tokenizer(who: str, tokenizer: Any, *, required: bool = False) -> None:
    """Refuse a `tokenizer` path that does not exist (and, when `required`, no tokenizer at all)."""
    if tokenizer is None and required:
        raise TypeError(
            f"{who}: tokenizer must be the tokenizer the policy was trained with (its tokenizer.json or "
            "folder) or the step that made it, got None"
        )
    if isinstance(tokenizer, str | os.PathLike) and not storage.exists(os.fspath(tokenizer)):
        raise FileNotFoundError(
            f"{who}: tokenizer = {os.fspath(tokenizer)!r} does not exist; give the tokenizer the policy was "
            "trained with (its tokenizer.json or folder), or the step that made it"
        )


def _check_prompts(who: str, field: str, value: Any, kind: str, inner: str) -> None:
    """A TypeError for a `value` that is no path or step, a FileNotFoundError for a path the run cannot read."""
    if isinstance(value, StepHandle | InputPath):
        return
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise TypeError(
            f"{who}: {field} must be a {kind} file, a folder holding {inner} or a step producing one, got "
            f"{value!r}"
        )
    path = os.fspath(value)
    if not storage.exists(path):
        raise FileNotFoundError(
            f"{who}: {field} = {path!r} does not exist; give a JSON-lines {kind} file (or a folder holding "
            f"{inner}), or the step that writes it"
        )
    if storage.isdir(path) and not storage.exists(storage.join(path, inner)):
        raise FileNotFoundError(
            f"{who}: {field} = {path!r} is a folder that holds no {inner}; give the {kind} file itself, or a "
            f"folder holding {inner}"
        )
