"""Generation with a KV cache: batched prompts of different lengths, greedy or sampled, stop sequences.

The decoder re-expresses a dense `schooner.model.Transformer` (its own weights, read by axis name) as a
prefill over the right-padded prompts followed by one-token steps that append each layer's keys and values
to a cache of `max(prompt) + max_new_tokens` positions. Every row keeps its own positions (RoPE and the
causal mask use them), so a short prompt in a batch of long ones decodes exactly as it would alone; the
cache slots after a row's prompt hold padding until decoding overwrites them, and a query never attends past
its own position. Greedy output equals `greedy_tokens` (which recomputes the whole prefix every token),
token for token (tested).

Mixture-of-experts models (dropless, `capacity_factor=None`) decode over the same cache: each token is routed
as the model routes it (router in float32, top-k of the biased logits, the unbiased scores as combine weights,
renormalised when `normalize_topk`, shared experts added) and every expert is evaluated for it, the chosen
ones weighted and the rest weighted 0: a token's output depends on that token alone, as in the model's
dropless dispatch, at `num_experts / num_experts_per_token` times the routed MLP's FLOPs (what a decode step
reads anyway: every expert's weights). Capacity mode drops tokens depending on the whole batch, which a cache
cannot reproduce: a clear error says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


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


def _arr(x: Any, *names: str) -> jax.Array:
    return x.rearrange(tuple(names)).array


def _mlp_weights(config: Any, mlp: Any) -> dict[str, Any]:
    """The stacked MLP's arrays: a dense SwiGLU's gate/up/down, or an MoE layer's router and experts."""
    if not getattr(config, "is_moe", False):
        return {
            "gate": _arr(mlp.gate, "layers", "mlp", "embed"),
            "up": _arr(mlp.up, "layers", "mlp", "embed"),
            "down": _arr(mlp.down, "layers", "embed", "mlp"),
        }
    if config.capacity_factor is not None:
        raise NotImplementedError(
            f"KV-cache generation of an MoE model needs dropless routing (capacity_factor=None); this model has "
            f"capacity_factor={config.capacity_factor}, whose dropped tokens depend on the whole batch. Use "
            "greedy_tokens, or load the model with dataclasses.replace(config, capacity_factor=None)"
        )
    out = {
        "router": _arr(mlp.router, "layers", "experts", "embed"),
        "router_bias": _arr(mlp.router_bias, "layers", "experts"),
        "experts_gate": _arr(mlp.gate, "layers", "experts", "embed", "mlp"),
        "experts_up": _arr(mlp.up, "layers", "experts", "embed", "mlp"),
        "experts_down": _arr(mlp.down, "layers", "experts", "mlp", "embed"),
    }
    if mlp.shared is not None:
        out |= {
            "gate": _arr(mlp.shared.gate, "layers", "shared_mlp", "embed"),
            "up": _arr(mlp.shared.up, "layers", "shared_mlp", "embed"),
            "down": _arr(mlp.shared.down, "layers", "embed", "shared_mlp"),
        }
    return out


def _weights(model: Any) -> dict[str, Any]:
    config = model.config
    block = model.layers.stacked
    arr = _arr
    attn = block.attn
    head = model.output_embedding()
    return {
        "embed": arr(model.embed, "vocab", "embed"),
        "head": arr(head, "vocab", "embed"),
        "final_norm": model.final_norm.array,
        "layers": {
            "attn_norm": arr(block.attn_norm, "layers", "embed"),
            "mlp_norm": arr(block.mlp_norm, "layers", "embed"),
            "q": arr(attn.q_proj, "layers", "heads", "head_dim", "embed"),
            "k": arr(attn.k_proj, "layers", "kv_heads", "head_dim", "embed"),
            "v": arr(attn.v_proj, "layers", "kv_heads", "head_dim", "embed"),
            "o": arr(attn.o_proj, "layers", "embed", "heads", "head_dim"),
            "q_norm": None if attn.q_norm is None else arr(attn.q_norm, "layers", "head_dim"),
            "k_norm": None if attn.k_norm is None else arr(attn.k_norm, "layers", "head_dim"),
            **_mlp_weights(config, block.mlp),
        },
    }


def _rms(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * inv * w.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + w.shape)).astype(x.dtype)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :].astype(x.dtype) + rotated * sin[:, :, None, :].astype(x.dtype)


def _forward(
    weights: dict[str, Any],
    cache: tuple[jax.Array, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    *,
    config: Any,
    dtype: Any,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Logits float32[B, T, V] of `tokens` at `positions` [B, T], writing their keys/values into the cache."""
    from schooner.model import rope_cos_sin

    eps, b = config.norm_eps, tokens.shape[0]
    cache_len = cache[0].shape[2]
    cos_table, sin_table = rope_cos_sin(cache_len, config.resolved_head_dim, config.rope)
    cos = jnp.take(cos_table, positions, axis=0, mode="clip")
    sin = jnp.take(sin_table, positions, axis=0, mode="clip")
    allowed = jnp.arange(cache_len)[None, None, :] <= positions[:, :, None]  # [B, T, S]
    rows = jnp.arange(b)[:, None]
    x = weights["embed"].astype(dtype)[tokens]

    def layer(
        x: jax.Array, scanned: tuple[dict[str, Any], jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        w, k_cache, v_cache = scanned
        h = _rms(x, w["attn_norm"], eps)
        q = jnp.einsum("bte,nde->btnd", h, w["q"].astype(dtype))
        k = jnp.einsum("bte,kde->btkd", h, w["k"].astype(dtype))
        v = jnp.einsum("bte,kde->btkd", h, w["v"].astype(dtype))
        if w["q_norm"] is not None:
            q, k = _rms(q, w["q_norm"], eps), _rms(k, w["k_norm"], eps)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        # steps past the cache (the tail of the last chunk, discarded) are dropped, not clipped onto the end
        k_cache = k_cache.at[rows, positions].set(k.astype(k_cache.dtype), mode="drop")
        v_cache = v_cache.at[rows, positions].set(v.astype(v_cache.dtype), mode="drop")
        _, t, n, d = q.shape
        kv = k_cache.shape[2]
        qg = q.reshape(b, t, kv, n // kv, d).astype(jnp.float32)
        scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_cache.astype(jnp.float32)) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(allowed[:, None, None], scores, jnp.float32(-1e30))
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache.astype(jnp.float32)).reshape(b, t, n, d)
        x = x + jnp.einsum("btnd,end->bte", out.astype(dtype), w["o"].astype(dtype))
        h = _rms(x, w["mlp_norm"], eps)
        parts = [_routed_experts(h, w, config, dtype)] if "router" in w else []
        if "gate" in w:  # the dense MLP, or an MoE layer's shared experts
            g = jnp.einsum("bte,me->btm", h, w["gate"].astype(dtype))
            u = jnp.einsum("bte,me->btm", h, w["up"].astype(dtype))
            parts.append(jnp.einsum("btm,em->bte", jax.nn.silu(g) * u, w["down"].astype(dtype)))
        x = x + (parts[0] if len(parts) == 1 else parts[0] + parts[1])
        return x, (k_cache, v_cache)

    x, cache = jax.lax.scan(layer, x, (weights["layers"], cache[0], cache[1]))
    x = _rms(x, weights["final_norm"], eps)
    logits = jnp.einsum("bte,ve->btv", x, weights["head"].astype(dtype), preferred_element_type=jnp.float32)
    return logits, cache


def _routed_experts(h: jax.Array, w: dict[str, Any], config: Any, dtype: Any) -> jax.Array:
    """An MoE layer's routed experts for h[B, T, E], routed as `schooner.model`'s MoE routes (see the module
    docstring): every expert is evaluated, the k chosen ones weighted by their combine weights."""
    logits = jnp.einsum("bte,xe->btx", h.astype(jnp.float32), w["router"])
    if config.router_activation == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
    _, idx = jax.lax.top_k(
        logits + w["router_bias"][None, None, :], config.num_experts_per_token
    )  # [B, T, k]
    chosen = jnp.take_along_axis(scores, idx, axis=-1)
    if config.normalize_topk:
        chosen = chosen / (jnp.sum(chosen, axis=-1, keepdims=True) + 1e-9)
    combine = jnp.sum(
        jax.nn.one_hot(idx, config.num_experts, dtype=dtype) * chosen.astype(dtype)[..., None], -2
    )
    g = jnp.einsum("bte,xem->btxm", h, w["experts_gate"].astype(dtype))
    u = jnp.einsum("bte,xem->btxm", h, w["experts_up"].astype(dtype))
    y = jnp.einsum("btxm,xme->btxe", jax.nn.silu(g) * u, w["experts_down"].astype(dtype))
    return jnp.einsum("btxe,btx->bte", y, combine)


@eqx.filter_jit
def _prefill(weights, cache, tokens, lengths, *, config, dtype):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1])[None, :], tokens.shape)
    logits, cache = _forward(weights, cache, tokens, positions, config=config, dtype=dtype)
    return logits[jnp.arange(tokens.shape[0]), lengths - 1], cache


def _choose(logits: jax.Array, key: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """The next token of each row: argmax, or a sample after temperature, top-k and top-p."""
    if sampling.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    z = logits.astype(jnp.float32) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < z.shape[-1]:
        kth = jnp.sort(z, axis=-1)[:, -sampling.top_k][:, None]
        z = jnp.where(z < kth, -jnp.inf, z)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        order = jnp.argsort(-z, axis=-1, stable=True)
        p = jax.nn.softmax(jnp.take_along_axis(z, order, -1), axis=-1)
        keep_sorted = jnp.cumsum(p, -1) - p < sampling.top_p  # always keeps the most likely token
        keep = jnp.zeros_like(keep_sorted).at[jnp.arange(z.shape[0])[:, None], order].set(keep_sorted)
        z = jnp.where(keep, z, -jnp.inf)
    return jax.random.categorical(key, z, axis=-1).astype(jnp.int32)


@eqx.filter_jit
def _first(logits, key, *, sampling):
    return _choose(logits, jax.random.fold_in(key, 0), sampling)


@eqx.filter_jit
def _decode(weights, cache, token, position, first_step, key, *, steps, config, dtype, sampling):
    """`steps` one-token steps on device (a scan): token i+1 from token i, keyed by (key, step)."""

    def body(carry, i):
        cache, token, position = carry
        logits, cache = _forward(
            weights, cache, token[:, None], position[:, None], config=config, dtype=dtype
        )
        nxt = _choose(logits[:, 0], jax.random.fold_in(key, first_step + i), sampling)
        return (cache, nxt, position + 1), nxt

    (cache, token, position), tokens = jax.lax.scan(body, (cache, token, position), jnp.arange(steps))
    return cache, token, position, tokens.T


CHUNK = 32
"""Tokens decoded per device call (EOS and stop sequences are checked between calls; a row's tokens after its
stop are discarded)."""


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
    config = model.config
    from schooner.model import resolve_compute_dtype

    rows = [[int(t) for t in p] for p in prompts]
    ends = {int(eos_id)} if isinstance(eos_id, int | np.integer) else {int(i) for i in eos_id or ()}
    if not rows or any(not r for r in rows):
        raise ValueError("every prompt needs at least one token (start empty prompts with BOS/EOS)")
    from ._loglikelihood import check_token_ids

    check_token_ids(model, rows, "prompt")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    longest = max(len(r) for r in rows)
    cache_len = longest + max_new_tokens
    if cache_len > config.max_seq_len:
        raise ValueError(
            f"the longest prompt ({longest} tokens) plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_seq_len={config.max_seq_len}; shorten the prompt or generate fewer tokens"
        )
    if max_new_tokens == 0:
        return [[] for _ in rows]
    dtype = resolve_compute_dtype(config)
    weights = _weights(model)
    b = len(rows)
    shape = (config.num_layers, b, cache_len, config.num_kv_heads, config.resolved_head_dim)
    cache = (jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
    tokens = np.zeros((b, longest), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], np.int32)
    logits, cache = _prefill(
        weights, cache, jnp.asarray(tokens), jnp.asarray(lengths), config=config, dtype=dtype
    )
    key = jax.random.key(sampling.seed)
    token = _first(logits, key, sampling=sampling)
    position = jnp.asarray(lengths, jnp.int32)
    chunk = np.asarray(token)[:, None]
    new: list[list[int]] = [[] for _ in rows]
    done = np.zeros(b, bool)
    made = 1
    while True:
        for i in range(b):
            for t in chunk[i]:
                if done[i] or len(new[i]) >= max_new_tokens:
                    break
                new[i].append(int(t))
                if int(t) in ends or (stop is not None and stop(i, new[i])):
                    done[i] = True
        if made >= max_new_tokens or all(done[i] or len(new[i]) >= max_new_tokens for i in range(b)):
            break
        cache, token, position, out = _decode(
            weights,
            cache,
            token,
            position,
            made,
            key,
            steps=CHUNK,
            config=config,
            dtype=dtype,
            sampling=sampling,
        )
        chunk = np.asarray(out)
        made += CHUNK
    return new


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
