"""The KV-cache decoder: a dense or mixture-of-experts `Transformer` re-expressed as a forward pass over new
tokens at given positions that writes their keys and values into a cache and attends to it.

`decoder_weights(model)` reads the model's own weights by axis name into plain arrays; `cached_forward`
runs tokens [B, T] at positions [B, T] (each row keeps its own positions, so RoPE and the causal mask of a
short prompt in a batch of long ones are those it would have alone), writing each layer's keys/values at
those positions of a cache of `S` slots and attending to the slots at or before each query's position. A
prefill over right-padded prompts writes padding into the slots after a row's prompt; decoding overwrites
each such slot before any query can attend to it (a query never attends past its own position).

Mixture-of-experts models (dropless, `capacity_factor=None`) decode over the same cache: each token is routed
as the model routes it (router in float32, top-k of the biased logits, the unbiased scores as combine weights,
renormalised when `normalize_topk`, shared experts added) and every expert is evaluated for it, the chosen
ones weighted and the rest weighted 0: a token's output depends on that token alone, as in the model's
dropless dispatch, at `num_experts / num_experts_per_token` times the routed MLP's FLOPs (what a decode step
reads anyway: every expert's weights). Capacity mode drops tokens depending on the whole batch, which a cache
cannot reproduce: a clear error says so.

Moved here from `schooner.eval._kv_generate` (issue 39) so that training's rollouts can sample too.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._layers import rope_cos_sin


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
            "a full forward pass per token (schooner.eval.greedy_tokens), or load the model with "
            "dataclasses.replace(config, capacity_factor=None)"
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


def decoder_weights(model: Any) -> dict[str, Any]:
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


def cached_forward(
    weights: dict[str, Any],
    cache: tuple[jax.Array, jax.Array],
    tokens: jax.Array,
    positions: jax.Array,
    *,
    config: Any,
    dtype: Any,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Logits float32[B, T, V] of `tokens` at `positions` [B, T], writing their keys/values into the cache."""
    eps, b = config.norm_eps, tokens.shape[0]
    cache_len = cache[0].shape[2]
    cos_table, sin_table = rope_cos_sin(cache_len, config.resolved_head_dim, config.rope)
    cos = jnp.take(cos_table, positions, axis=0, mode="clip")
    sin = jnp.take(sin_table, positions, axis=0, mode="clip")
    allowed = jnp.arange(cache_len)[None, None, :] <= positions[:, :, None]  # [B, T, S]
    rows = jnp.arange(b)[:, None]
    x = weights["embed"].astype(dtype)[tokens]

    def layer(
        carry: tuple[jax.Array, jax.Array, jax.Array], scanned: tuple[dict[str, Any], jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], None]:
        # the whole cache is carried and updated in place (as scanned input and output it was copied whole
        # every step)
        x, k_all, v_all = carry
        w, i = scanned
        h = _rms(x, w["attn_norm"], eps)
        q = jnp.einsum("bte,nde->btnd", h, w["q"].astype(dtype))
        k = jnp.einsum("bte,kde->btkd", h, w["k"].astype(dtype))
        v = jnp.einsum("bte,kde->btkd", h, w["v"].astype(dtype))
        if w["q_norm"] is not None:
            q, k = _rms(q, w["q_norm"], eps), _rms(k, w["k_norm"], eps)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        # steps past the cache (the tail of the last chunk, discarded) are dropped, not clipped onto the end
        k_all = k_all.at[i, rows, positions].set(k.astype(k_all.dtype), mode="drop")
        v_all = v_all.at[i, rows, positions].set(v.astype(v_all.dtype), mode="drop")
        k_cache = jax.lax.dynamic_index_in_dim(k_all, i, keepdims=False)
        v_cache = jax.lax.dynamic_index_in_dim(v_all, i, keepdims=False)
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
        return (x, k_all, v_all), None

    layers = jnp.arange(config.num_layers)
    (x, k_all, v_all), _ = jax.lax.scan(layer, (x, cache[0], cache[1]), (weights["layers"], layers))
    cache = (k_all, v_all)
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


def empty_cache(config: Any, batch: int, slots: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """Zero keys and values [layers, batch, slots, kv_heads, head_dim] for `cached_forward`."""
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.resolved_head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
