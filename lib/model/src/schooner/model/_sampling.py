"""Sampling with a KV cache: a batch of prompts, `n` samples each, greedy or temperature / top-k / top-p,
stopping at stop ids or a length cap, recording each sampled token's log-probability.

`sample(model, prompts, config, key=...)` prefills the right-padded prompts (each row keeps its own
positions), then decodes one token per step over the cache (`_kv_cache`), `CHUNK` steps per device call.
Between calls the host records the new tokens, ends a row at its first stop id (kept, as the completion's
last token) or when an optional `stop(row, new_ids)` callable says so, and stops decoding once every row has
ended or `max_new_tokens` are made; a row's tokens after its end are discarded.

**Log-probabilities** are those of the distribution sampled from, in TRL's convention (`GRPOTrainer`): the
log-softmax of the logits divided by the temperature, before top-k / top-p truncation (the policy's
log-probs a trainer computes with the same temperature then equal them, ratio 1). Greedy decoding
(`temperature=0`) records the log-softmax of the raw logits.

**Randomness** is a pure function of the key: new token `s` of every row is drawn with
`fold_in(key, s)` (one categorical draw over the batch), so the same key, prompts, config and model give the
same samples, on any number of calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._config import resolve_compute_dtype
from ._kv_cache import cached_forward, decoder_weights, empty_cache

CHUNK = 32
"""Tokens decoded per device call (stops are checked between calls)."""

PROMPT_BUCKET = 16
"""Prompt buffers are padded to a multiple of this, so batches of nearby prompt lengths share a compilation."""

STOP_ID = "stop_id"
"""Stop reason: the row produced one of `stop_ids` (its last kept token)."""
STOP_SEQUENCE = "stop_sequence"
"""Stop reason: the `stop` callable ended the row."""
LENGTH = "length"
"""Stop reason: the row reached `max_new_tokens` without stopping."""


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    Attributes:
        temperature: logits are divided by it before sampling; 0 for greedy decoding (argmax).
        top_p: sample among the smallest set of most likely tokens whose probability reaches `top_p`
            (nucleus sampling; None or 1.0: all tokens).
        top_k: sample among the `top_k` most likely tokens only (None: all).
        n: samples per prompt (rows `i * n .. i * n + n - 1` are prompt `i`'s).
        max_new_tokens: tokens generated at most per row (the completion length cap).
        stop_ids: a row ends after producing one of these (kept in the completion): the EOS and end-of-turn
            ids.
    """

    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got temperature={self.temperature!r}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be None or in (0, 1], got top_p={self.top_p!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k must be None or >= 1, got top_k={self.top_k!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n (samples per prompt) must be an int >= 1, got n={self.n!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an int, got max_new_tokens={self.max_new_tokens!r}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got max_new_tokens={self.max_new_tokens!r}")
        ids = tuple(self.stop_ids) if not isinstance(self.stop_ids, int) else (self.stop_ids,)
        if any(isinstance(i, bool) or not isinstance(i, int | np.integer) or i < 0 for i in ids):
            raise ValueError(f"stop_ids must be non-negative token ids, got stop_ids={self.stop_ids!r}")
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in ids))


@dataclasses.dataclass(frozen=True)
class Samples:
    """Sampled completions, one row per (prompt, sample), right-padded to `max_new_tokens` columns.

    Attributes:
        tokens: int32[B, N] the new tokens; `pad_id` after a row's end.
        logprobs: float32[B, N] each token's log-probability under the sampling distribution (module
            docstring); 0 after a row's end.
        mask: bool[B, N] True on a row's tokens (its stop id included).
        stop_reasons: per row, `STOP_ID`, `STOP_SEQUENCE` or `LENGTH`.
        prompt_index: int32[B] the prompt each row continues (`row // n`).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    mask: np.ndarray
    stop_reasons: tuple[str, ...]
    prompt_index: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """int32[B] tokens in each row."""
        return self.mask.sum(-1).astype(np.int32)

    def completions(self) -> list[list[int]]:
        """Each row's tokens as a list (stop id included)."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths, strict=True)]


def _nucleus_threshold(z: jax.Array, top_p: float) -> jax.Array:
    """[B, 1] the smallest logit of each row's nucleus: the largest logit `v` whose tokens at or above it hold
    at least `top_p` of the probability. Found by bisection on the threshold (the mass of `z >= t` falls as `t`
    rises), then snapped to the logit at or above it: no sort, which on a CPU costs more than the rest of a
    decode step."""
    p = jax.nn.softmax(z, axis=-1)
    finite = jnp.isfinite(z)

    def mass(t: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(z >= t, p, 0.0), axis=-1, keepdims=True)

    lo = jnp.min(jnp.where(finite, z, jnp.inf), axis=-1, keepdims=True)  # mass(lo) = 1 >= top_p
    hi = jnp.max(z, axis=-1, keepdims=True)

    def halve(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = bounds
        mid = lo + (hi - lo) / 2
        ok = mass(mid) >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    lo = jnp.where(mass(hi) >= top_p, hi, lo)  # the most likely token alone may hold top_p
    return jnp.min(jnp.where(z >= lo, z, jnp.inf), axis=-1, keepdims=True)


def filter_logits(z: jax.Array, *, top_k: int | None = None, top_p: float | None = None) -> jax.Array:
    """Logits [B, V] with the tokens outside the top-k and the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability (softmax of `z`) reaches
    `top_p`: a token is kept when the tokens more likely than it hold less than `top_p`, so the most likely
    token always is. A token tied with the last one kept (or with the k-th, for top-k) is kept too (up to
    float32 resolution: the rule is a threshold on the logit, found without sorting the vocabulary).
    """
    if top_k is not None and top_k < z.shape[-1]:
        kth = jax.lax.top_k(z, top_k)[0][:, -1:]
        z = jnp.where(z < kth, -jnp.inf, z)
    if top_p is not None and top_p < 1.0:
        z = jnp.where(z < _nucleus_threshold(z, top_p), -jnp.inf, z)
    return z


def _choose(logits: jax.Array, key: jax.Array, params: tuple[float, int | None, float | None]) -> Any:
    """The next token of each row and its log-prob (module docstring) from logits [B, V]."""
    temperature, top_k, top_p = params
    z = logits.astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
    logp = jax.nn.log_softmax(z, axis=-1)
    if temperature == 0.0:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        token = jax.random.categorical(key, filter_logits(z, top_k=top_k, top_p=top_p), axis=-1)
        token = token.astype(jnp.int32)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


@eqx.filter_jit
def _prefill(weights, cache, tokens, lengths, key, *, config, dtype, params):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1])[None, :], tokens.shape)
    logits, cache = cached_forward(weights, cache, tokens, positions, config=config, dtype=dtype)
    token, logp = _choose(
        logits[jnp.arange(tokens.shape[0]), lengths - 1], jax.random.fold_in(key, 0), params
    )
    return token, logp, cache


@eqx.filter_jit
def _decode(weights, cache, token, position, first_step, key, *, steps, config, dtype, params):
    """`steps` one-token steps on device (a scan): token s+1 from token s, drawn with `fold_in(key, s)`."""

    def body(carry, i):
        cache, token, position = carry
        logits, cache = cached_forward(
            weights, cache, token[:, None], position[:, None], config=config, dtype=dtype
        )
        nxt, logp = _choose(logits[:, 0], jax.random.fold_in(key, first_step + i), params)
        return (cache, nxt, position + 1), (nxt, logp)

    (cache, token, position), (tokens, logps) = jax.lax.scan(
        body, (cache, token, position), jnp.arange(steps)
    )
    return cache, token, position, tokens.T, logps.T


def _check_prompts(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    config = model.config
    rows = [[int(t) for t in p] for p in prompts]
    if not rows:
        raise ValueError("sample needs at least one prompt, got none")
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {i} is empty: every prompt needs a token (start one with BOS or EOS)")
        bad = [t for t in row if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError(
                f"prompt {i} holds token id {bad[0]} but the model's vocabulary has {config.vocab_size} "
                "entries: the tokenizer is not the one the model was trained with"
            )
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > config.max_seq_len:
        i = max(range(len(rows)), key=lambda j: len(rows[j]))
        raise ValueError(
            f"prompt {i} ({longest} tokens) plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_seq_len={config.max_seq_len}; shorten the prompt or generate fewer tokens"
        )
    return rows


def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    config: SamplingConfig = SamplingConfig(),
    *,
    key: jax.Array,
    stop: Callable[[int, list[int]], bool] | None = None,
    pad_id: int = 0,
) -> Samples:
    """`config.n` completions of each prompt, batched over one KV cache (module docstring).

    Args:
        model: a `Transformer`, dense or mixture-of-experts (dropless: `capacity_factor=None`).
        prompts: token ids of each prompt (each at least one token); prompt + `max_new_tokens` must fit the
            model's `max_seq_len`.
        config: temperature, top-k / top-p, samples per prompt, the length cap and the stop ids.
        key: a `jax.random.key`; the samples are a pure function of it (and the rest).
        stop: an optional host-side `stop(row, new_ids) -> bool`, asked after each new token of a row that
            did not produce a stop id (text stop sequences); True ends the row there.
        pad_id: fills `tokens` after each row's end.

    Returns:
        `Samples` with `len(prompts) * config.n` rows, prompt `i`'s samples at rows `i * n .. i * n + n - 1`.

    Example:
        >>> cfg = SamplingConfig(temperature=1.0, top_p=0.95, n=4, max_new_tokens=64, stop_ids=(eos_id,))
        >>> out = sample(model, [[1, 5, 9], [1, 7]], cfg, key=jax.random.key(0))
        >>> out.tokens.shape, out.stop_reasons[0]
        ((8, 64), 'stop_id')
    """
    mc = model.config
    n_new = config.max_new_tokens
    rows = [r for r in _check_prompts(model, prompts, n_new) for _ in range(config.n)]
    b = len(rows)
    prompt_index = np.repeat(np.arange(len(prompts), dtype=np.int32), config.n)
    tokens = np.full((b, n_new), pad_id, np.int32)
    logprobs = np.zeros((b, n_new), np.float32)
    mask = np.zeros((b, n_new), bool)
    reasons = [LENGTH] * b
    if n_new == 0:
        return Samples(tokens, logprobs, mask, tuple(reasons), prompt_index)
    longest = max(len(r) for r in rows)
    width = min(-(-longest // PROMPT_BUCKET) * PROMPT_BUCKET, mc.max_seq_len - n_new)
    dtype = resolve_compute_dtype(mc)
    weights = decoder_weights(model)
    cache = empty_cache(mc, b, width + n_new, dtype)
    buffer = np.zeros((b, width), np.int32)
    for i, r in enumerate(rows):
        buffer[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], np.int32)
    params = (float(config.temperature), config.top_k, config.top_p)
    token, logp, cache = _prefill(
        weights, cache, jnp.asarray(buffer), jnp.asarray(lengths), key, config=mc, dtype=dtype, params=params
    )
    position = jnp.asarray(lengths)
    chunk, chunk_logp = np.asarray(token)[:, None], np.asarray(logp)[:, None]
    stop_ids = np.asarray(config.stop_ids, np.int32)
    done = np.zeros(b, bool)
    made = 0  # columns of `tokens` filled
    steps = min(CHUNK, max(n_new - 1, 1))
    while True:
        for k in range(min(chunk.shape[1], n_new - made)):
            live = ~done
            col = made + k
            tokens[live, col] = chunk[live, k]
            logprobs[live, col] = chunk_logp[live, k]
            mask[live, col] = True
            hit = live & np.isin(chunk[:, k], stop_ids)
            for row in np.flatnonzero(hit).tolist():
                reasons[row] = STOP_ID
            done |= hit
            if stop is not None:
                for row in np.flatnonzero(live & ~hit).tolist():
                    if stop(row, tokens[row, : col + 1].tolist()):
                        reasons[row], done[row] = STOP_SEQUENCE, True
        made += min(chunk.shape[1], n_new - made)
        if made >= n_new or done.all():
            break
        cache, token, position, chunk, chunk_logp = _decode(
            weights,
            cache,
            token,
            position,
            jnp.int32(made),
            key,
            steps=steps,
            config=mc,
            dtype=dtype,
            params=params,
        )
        chunk, chunk_logp = np.asarray(chunk), np.asarray(chunk_logp)
    return Samples(tokens, logprobs, mask, tuple(reasons), prompt_index)
