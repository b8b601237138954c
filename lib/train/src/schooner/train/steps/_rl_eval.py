"""The `pass_at_k_eval` step: held-out pass@k of a checkpoint (an SFT model, an RL run) on a verifiable
task, sampled and scored exactly as an `rl_train` run's held-out evaluation (`schooner.train._rl_eval`)."""

from __future__ import annotations

from typing import Any

from schooner.cluster import ResourceConfig, StepHandle
from schooner.cluster import step as make_step
from schooner.train._rl_eval import PassAtK, PassAtKEvalConfig, evaluate_pass_at_k

from ._rl import check_heldout, check_tokenizer, pin_checkpoint

VERSION = "pass-at-k-v1"
_CPU = ResourceConfig.with_cpu()


def pass_at_k_eval(
    name: str,
    *,
    checkpoint: Any,
    task: PassAtK | Any,
    reward: Any,
    tokenizer: Any,
    task_name: str = "heldout",
    checkpoint_step: int | None = None,
    chat: bool = True,
    max_prompt_tokens: int = 128,
    prompt_field: str = "prompt",
    id_field: str = "id",
    resources: ResourceConfig | None = _CPU,
) -> StepHandle:
    """A step that measures held-out pass@k of a checkpoint: `results.json` (`scores` with `pass@<k>` and
    `pass@<k>_stderr`, per-row correct counts) and `samples.jsonl` (every completion and its reward).

    Give it the `PassAtK` and `max_prompt_tokens` an `rl_train` run evaluates with (its `heldout` entry and
    its `max_prompt_tokens`) and its numbers on a checkpoint are that run's evaluation of the same weights:
    the SFT model measured as the RL run's curve is.

    Args:
        name: step name.
        checkpoint: an `sft` / `train_lm` / `rl_train` step, a run folder (its latest checkpoint) or a
            checkpoint folder. A path is pinned when the step is declared, as `rl_train`'s `checkpoint` is
            (`_init.InitialCheckpoint`): the key names the checkpoint scored (a run folder, its latest
            checkpoint's folder and its step give one key), and a run that gains a checkpoint gives a new step
            instead of the cached scores of the old one. A step is keyed by its own key and scored at its
            latest checkpoint when this step runs.
        task: a `PassAtK` (prompts, samples, ks, seed, sampling), or a prompts path for the defaults.
        reward: `(prompt, completion, fields) -> float`, e.g. `schooner.eval.rewards.exact_answer()`.
        tokenizer: renders prompts (chat template) and decodes completions.
        task_name: the name in the results.
        checkpoint_step: with a run, its checkpoint of this step (None: the latest).
        chat: render prompts with the chat template (as `rl_train(chat=True)`).
        max_prompt_tokens: longer prompts are left out, counted and named.
        prompt_field, id_field: the rows' prompt and id fields.
        resources: where it runs (runtime-only).

    Raises:
        FileNotFoundError: (when declared, as `rl_train` checks its inputs) a `checkpoint` path without weights
            (or without `checkpoint_step`), a `task` path that does not exist or a folder without
            `heldout.jsonl`, a `tokenizer` path that does not exist; the message names the field and the fix.
        ValueError: a `checkpoint` that is a Hugging Face folder, or one checkpoint given a `checkpoint_step`.
        TypeError: a `task` or `tokenizer` that is no path or step (e.g. None).
    """
    who = f"pass_at_k_eval({name!r})"
    # pinned as rl_train's checkpoint is: the key names the checkpoint scored, a new one gives a new step
    checkpoint, checkpoint_step = pin_checkpoint(who, checkpoint, checkpoint_step, hf=False)
    check_heldout(who, "task", task)
    check_tokenizer(who, tokenizer, required=True)
    config = PassAtKEvalConfig(
        checkpoint=checkpoint,
        task=task if isinstance(task, PassAtK) else PassAtK(prompts=task),
        reward=reward,
        tokenizer=tokenizer,
        name=task_name,
        checkpoint_step=checkpoint_step,
        chat=chat,
        max_prompt_tokens=max_prompt_tokens,
        prompt_field=prompt_field,
        id_field=id_field,
    )
    return make_step(
        name,
        evaluate_pass_at_k,
        config,
        version=VERSION,
        resources=resources,
        description=f"held-out pass@k ({config.task.samples} samples a prompt)",
    )
