"""Rollouts for the GRPO family: prompts x G samples -> the batch `_rl_objective.policy_loss` consumes.

`rollout(model, prompts, sampling, seed=, step=, max_prompt_tokens=)` samples `sampling.n` (= G)
completions of each prompt with `schooner.model.sample` and lays them out as training rows of one fixed width
`S = max_prompt_tokens + sampling.max_new_tokens` (so the update step compiles once):

    tokens        int32[B, S]    prompt, completion, then `pad_id`            (B = kept prompts x G)
    mask          float32[B, S-1]  1 where position t predicts a completion token (t + 1), stop id included
    old_logprobs  float32[B, S-1]  the sampler's log-prob of token t + 1 at position t, 0 off the mask

Position `t` predicts token `t + 1`, as `schooner.model`'s loss counts predictions, so the policy's log-probs
are `token_logprobs(model(tokens)[:, :-1], tokens[:, 1:], temperature=T)` and with them
`policy_loss(logprobs, batch.old_logprobs, advantages, batch.mask, config)` (ratio 1 on the first update:
the sampler records TRL's log-probs, logits over the temperature before top-p). Rewards of the kept rows come
grouped as `(len(batch.row_ids), G)`, prompt-major, as `group_advantages` wants them.

**Randomness.** The key is `fold_in(key(seed), step)`: a pure function of `(seed, step)`, so a resumed run
samples the same completions at step `s` whatever ran before (with the same weights and prompts).

**Chat.** `chat_prompts(tokenizer, texts_or_conversations)` renders prompts as SFT renders chats (ending with
the assistant header) and gives the stop ids: EOS and the template's end-of-turn token.

**Bad rows.** A prompt longer than `max_prompt_tokens` (or empty) is skipped, counted and named in
`batch.skipped` (and logged); the other prompts are sampled as usual. A batch whose every prompt is skipped is
an error naming them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from schooner.model import SamplingConfig, sample

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Skip:
    """A prompt left out of a rollout batch: its row id, its length and why."""

    row_id: str
    prompt_tokens: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    """One step's rollouts (module docstring for the layout).

    Attributes:
        tokens: int32[B, S] prompt + completion + padding.
        mask: float32[B, S-1] 1 on the predictions of completion tokens.
        old_logprobs: float32[B, S-1] the sampler's log-probs of those tokens, 0 elsewhere.
        prompt_lengths: int32[B] tokens of each row's prompt.
        completion_lengths: int32[B] tokens of each row's completion (stop id included).
        stop_reasons: per row, `"stop_id"` or `"length"` (ran into `max_new_tokens`).
        row_ids: the ids of the kept prompts, in row order (row `r` continues `row_ids[r // group_size]`).
        group_size: G, completions per prompt.
        skipped: the prompts left out.
    """

    tokens: np.ndarray
    mask: np.ndarray
    old_logprobs: np.ndarray
    prompt_lengths: np.ndarray
    completion_lengths: np.ndarray
    stop_reasons: tuple[str, ...]
    row_ids: tuple[str, ...]
    group_size: int
    skipped: tuple[Skip, ...] = ()

    def completions(self) -> list[list[int]]:
        """Each row's completion tokens."""
        return [
            row[p : p + c].tolist()
            for row, p, c in zip(self.tokens, self.prompt_lengths, self.completion_lengths, strict=True)
        ]

    def metrics(self) -> dict[str, float]:
        """`rollout/skipped_prompts`, and `completions/clipped_ratio` (TRL's name: the share of completions
        that reached the length cap without a stop id)."""
        clipped = sum(r == "length" for r in self.stop_reasons) / max(len(self.stop_reasons), 1)
        return {"rollout/skipped_prompts": float(len(self.skipped)), "completions/clipped_ratio": clipped}


def chat_prompts(
    tokenizer: Any, prompts: Sequence[str | Sequence[Mapping[str, str]]], template: Any = None
) -> tuple[list[list[int]], tuple[int, ...]]:
    """Prompts rendered as SFT renders chats, ready for the assistant's turn, and the ids a completion stops at.

    Args:
        tokenizer: a `schooner.tokenize.Tokenizer`.
        prompts: each a user message's text, or a whole conversation (`[{"role": ..., "content": ...}]`).
        template: the chat template (default: the tokenizer's own, as `render_chat` picks it).

    Returns:
        The token ids of each prompt (`render_chat(..., add_generation_prompt=True)`: it ends with the
        assistant header), and the stop ids for `SamplingConfig.stop_ids`: the tokenizer's EOS and the special
        token that closes a turn in the template (the first of its footer's tokens that is one of the
        template's special tokens), those that exist.
    """
    from schooner.tokenize import render_chat, resolve_template

    chat = resolve_template(tokenizer, template)
    ids = [
        render_chat(
            tokenizer,
            [{"role": "user", "content": p}] if isinstance(p, str) else p,
            chat,
            add_generation_prompt=True,
        ).ids.tolist()
        for p in prompts
    ]
    special = {tokenizer.token_to_id(t) for t in chat.required_tokens} - {None}
    end_of_turn = next(
        (int(i) for i in tokenizer.encode(chat.footer, parse_special=True) if i in special), None
    )
    stops = [i for i in (tokenizer.eos_id, end_of_turn) if i is not None]
    return ids, tuple(dict.fromkeys(int(i) for i in stops))


def rollout_key(seed: int, step: int) -> jax.Array:
    """The rollout RNG of `step`: `fold_in(key(seed), step)`."""
    return jax.random.fold_in(jax.random.key(seed), step)


def rollout(
    model: Any,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    seed: int,
    step: int,
    max_prompt_tokens: int,
    row_ids: Sequence[str] | None = None,
    pad_id: int = 0,
    key: jax.Array | None = None,
) -> RolloutBatch:
    """Sample `sampling.n` completions of each prompt and lay them out for the policy loss (module docstring).

    Args:
        model: the policy, a `schooner.model.Transformer`.
        prompts: token ids of each prompt, rendered as in SFT (`chat_prompts` renders text or conversations).
        sampling: temperature, top-p, `n` = G, the completion cap and the stop ids (EOS, end of turn).
        seed: the run's seed; with `step`, all the randomness.
        step: the training step the rollouts are for.
        max_prompt_tokens: the prompt cap; longer prompts are skipped and named.
        row_ids: a name per prompt for the skip records (default: its index as a string).
        pad_id: fills rows after their completion.
        key: the sampling key (default `rollout_key(seed, step)`; `_rl_workers` gives each chunk of a group
            its own).
    """
    cap, n_new = max_prompt_tokens, sampling.max_new_tokens
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_prompt_tokens must be an int >= 1, got {max_prompt_tokens=}")
    limit = model.config.max_seq_len
    if cap + n_new > limit:
        raise ValueError(
            f"max_prompt_tokens={cap} plus max_new_tokens={n_new} exceeds the model's max_seq_len={limit}; "
            "lower one of them"
        )
    ids = [str(i) for i in range(len(prompts))] if row_ids is None else [str(r) for r in row_ids]
    if len(ids) != len(prompts):
        raise ValueError(f"row_ids names {len(ids)} rows but there are {len(prompts)} prompts")
    kept: list[list[int]] = []
    kept_ids: list[str] = []
    skipped: list[Skip] = []
    for row_id, prompt in zip(ids, prompts, strict=True):
        n = len(prompt)
        if n == 0 or n > cap:
            reason = "empty prompt" if n == 0 else f"prompt longer than max_prompt_tokens={cap}"
            skipped.append(Skip(row_id, n, reason))
            continue
        kept.append([int(t) for t in prompt])
        kept_ids.append(row_id)
    if skipped:
        named = ", ".join(f"{s.row_id} ({s.prompt_tokens} tokens)" for s in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        logger.warning(
            "step %d: skipped %d prompt(s) over the cap or empty: %s%s", step, len(skipped), named, more
        )
    if not kept:
        raise ValueError(
            f"every prompt of step {step} was skipped ({skipped[0].reason}: row {skipped[0].row_id}, "
            f"{skipped[0].prompt_tokens} tokens); raise max_prompt_tokens or shorten the prompts"
        )
    out = sample(model, kept, sampling, key=rollout_key(seed, step) if key is None else key, pad_id=pad_id)
    b, width = out.tokens.shape[0], cap + n_new
    tokens = np.full((b, width), pad_id, np.int32)
    mask = np.zeros((b, width - 1), np.float32)
    old = np.zeros((b, width - 1), np.float32)
    prompt_lengths = np.array([len(kept[p]) for p in out.prompt_index], np.int32)
    lengths = out.lengths
    for r in range(b):
        p, c = prompt_lengths[r], lengths[r]
        tokens[r, :p] = kept[out.prompt_index[r]]
        tokens[r, p : p + c] = out.tokens[r, :c]
        mask[r, p - 1 : p - 1 + c] = 1.0  # position t predicts token t + 1
        old[r, p - 1 : p - 1 + c] = out.logprobs[r, :c]
    return RolloutBatch(
        tokens=tokens,
        mask=mask,
        old_logprobs=old,
        prompt_lengths=prompt_lengths,
        completion_lengths=lengths,
        stop_reasons=out.stop_reasons,
        row_ids=tuple(kept_ids),
        group_size=sampling.n,
        skipped=tuple(skipped),
    )
