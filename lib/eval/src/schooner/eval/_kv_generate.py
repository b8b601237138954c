"""Generation with a KV cache: batched prompts of different lengths, greedy or sampled, stop sequences.

The decoder is `schooner.model.sample` (prefill over the right-padded prompts, then one-token steps over a
KV cache; every row keeps its own positions, so a short prompt in a batch of long ones decodes exactly as it
would alone). Greedy output equals `greedy_tokens` (which recomputes the whole prefix every token), token for
token (tested). This module keeps evaluation's names: `SamplingConfig` (with its seed, part of a generation
task's step version) and the token/text functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from schooner.model import SamplingConfig as ModelSamplingConfig
from schooner.model import sample


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen.

    Attributes:
        temperature: 0 for greedy (argmax); else logits are divided by it before sampling.
        top_k: sample among the `top_k` most likely tokens only (None: all).
        top_p: sample among the smallest set of tokens whose probability reaches `top_p` (None: all).
        seed: the sampler's seed (the same seed, prompts and model give the same text).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be None or >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p}")


def generate_tokens(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int] | None = None,
    stop: Any = None,
) -> list[list[int]]:
    """New tokens for each prompt (a batch of any lengths), with a KV cache.

    Args:
        model: a `schooner.model.Transformer`, dense or mixture-of-experts (dropless).
        prompts: token ids of each prompt (each at least one token).
        max_new_tokens: tokens to generate at most per prompt; prompt + new must fit `max_seq_len`.
        sampling: greedy (default) or temperature / top-k / top-p sampling with a seed.
        eos_id: a row stops after producing it (it is included); several ids (EOS and a chat model's
            end-of-turn, as transformers' `generation_config.eos_token_id` list): after any of them.
        stop: a callable `stop(row_index, new_ids) -> bool` checked after each token (text stop sequences:
            see `generate_texts`).
    """
    from ._loglikelihood import check_token_ids

    rows = [[int(t) for t in p] for p in prompts]
    ends = {int(eos_id)} if isinstance(eos_id, int | np.integer) else {int(i) for i in eos_id or ()}
    if not rows or any(not r for r in rows):
        raise ValueError("every prompt needs at least one token (start empty prompts with BOS/EOS)")
    check_token_ids(model, rows, "prompt")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    config = ModelSamplingConfig(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        max_new_tokens=max_new_tokens,
        stop_ids=tuple(sorted(ends)),
    )
    return sample(model, rows, config, key=jax.random.key(sampling.seed), stop=stop).completions()


def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[int]],
    max_new_tokens: int = 64,
    *,
    sampling: SamplingConfig = SamplingConfig(),
    stop: Sequence[str] = (),
    stop_at_eos: bool = True,
    skip_special_tokens: bool = False,
    stop_token_ids: Sequence[int] = (),
) -> list[str]:
    """Continuations of prompts (text, or token ids) as text, batched over the KV cache, each cut before its
    first stop sequence (and at EOS, which is not included).

    `stop_token_ids` end a row as EOS does (not included): a chat model's end-of-turn token, which
    transformers' `generate` stops at when `generation_config.eos_token_id` lists it.

    Stop sequences are looked for in the text with its special tokens; `skip_special_tokens` leaves special
    tokens out of the returned text (as lm-eval's `hf` backend decodes generations), before it is cut.

    Example:
        >>> generate_texts(model, tok, ["def ", "The"], 32, sampling=SamplingConfig(temperature=0.8, top_p=0.9))
    """
    from ._loglikelihood import start_id

    ids = [
        (list(tokenizer.encode(p)) if isinstance(p, str) else list(p)) or [start_id(tokenizer)]
        for p in prompts
    ]
    eos = getattr(tokenizer, "eos_id", None) if stop_at_eos else None
    ends = {int(i) for i in stop_token_ids} | ({int(eos)} if eos is not None else set())
    stops = [s for s in stop if s]

    def hit(_: int, new: list[int]) -> bool:
        return any(s in tokenizer.decode(new) for s in stops)

    out = []
    for row in generate_tokens(
        model, ids, max_new_tokens, sampling=sampling, eos_id=sorted(ends), stop=hit if stops else None
    ):
        if row and row[-1] in ends:
            row = row[:-1]
        text = (
            tokenizer.decode(row, skip_special_tokens=True) if skip_special_tokens else tokenizer.decode(row)
        )
        cuts = [text.index(s) for s in stops if s in text]
        out.append(text[: min(cuts)] if cuts else text)
    return out
