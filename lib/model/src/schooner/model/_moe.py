"""Mixture-of-experts MLP: top-k routing, dropless grouped matmuls (or capacity mode), load balancing.

Routing. Router logits are computed in float32. Scores are ``softmax(logits)`` or ``sigmoid(logits)``.
Experts are chosen by ``top_k(scores + router_bias)``; the combine weights are the UNBIASED scores of the
chosen experts (renormalised to sum to 1 when ``normalize_topk``), so the bias steers load without
changing what the gradient sees (DeepSeek-V3's auxiliary-loss-free balancing).

Quantile balancing. ``router_bias`` is NOT trained by gradients (it is read through ``stop_gradient``
and ``trainable_mask`` marks it False so optimizers leave it alone). A token picks expert ``j`` iff its
biased score beats the k-th largest biased score of the other experts; call the difference the token's
margin for ``j``. Each forward pass returns, per layer, the ``1 - k/E`` quantile over the batch's tokens of
every expert's margin (``aux["router_quantiles"]``, float32[layers, experts]). Lowering ``bias[j]`` by that
quantile would make exactly the target share ``k/E`` of the batch pick ``j`` (the others held fixed), so
``update_router_bias`` moves each bias by ``-rate * (q_j - mean(q))`` (the mean is removed because a
common shift changes no selection). Repeated every step this drives every expert's load to ``k/E``.
The trainer calls it once per step with the metrics of that step's forward pass.

Dispatch. Dropless by default: the (token, expert) assignments are sorted by expert and run through
``jax.lax.ragged_dot`` grouped matmuls, so no token is ever dropped. With ``capacity_factor`` set, each
expert takes at most ``ceil(capacity_factor * tokens * k / E)`` assignments (earlier tokens first) in a
dense [experts, capacity, embed] buffer; the overflow is dropped and reported in ``moe/dropped_fraction``.
"""

from __future__ import annotations

import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis, NamedArray

from ._config import MoEConfig
from ._layers import EMBED, EXPERTS, MLP, ParamFactory, SwiGLU, axes_for


class MoE(eqx.Module):
    """Routed experts (gate/up: (experts, embed, mlp), down: (experts, mlp, embed)) plus optional shared MLP."""

    router: NamedArray
    router_bias: NamedArray
    gate: NamedArray
    up: NamedArray
    down: NamedArray
    shared: SwiGLU | None
    config: MoEConfig = eqx.field(static=True)

    @staticmethod
    def init(config: MoEConfig, params: ParamFactory, *, lead: tuple[Axis, ...] = ()) -> MoE:
        ax = axes_for(config)
        experts = Axis(EXPERTS, config.num_experts)
        std = config.initializer_range
        out_std = std / (2 * config.num_layers) ** 0.5
        shared = None
        if config.num_shared_experts > 0:
            shared_axis = Axis("shared_mlp", config.resolved_shared_dim)
            shared = SwiGLU.init(ax[EMBED], shared_axis, params, std=std, out_std=out_std, lead=lead)
        return MoE(
            router=params.normal((*lead, experts, ax[EMBED]), std),
            router_bias=hax.zeros((*lead, experts), dtype=jnp.float32),
            gate=params.normal((*lead, experts, ax[EMBED], ax[MLP]), std),
            up=params.normal((*lead, experts, ax[EMBED], ax[MLP]), std),
            down=params.normal((*lead, experts, ax[MLP], ax[EMBED]), out_std),
            shared=shared,
            config=config,
        )

    def __call__(self, x: NamedArray) -> tuple[NamedArray, dict[str, jax.Array]]:
        cfg = self.config
        dtype = x.dtype
        embed = x.resolve_axis(EMBED)
        lead = tuple(a for a in x.axes if a.name != EMBED)
        xf = x.rearrange((*lead, embed)).array.reshape(-1, embed.size)
        n, e, k = xf.shape[0], cfg.num_experts, cfg.num_experts_per_token

        logits = xf.astype(jnp.float32) @ self.router.array.T  # router in fp32 always
        scores = (
            jax.nn.softmax(logits, axis=-1) if cfg.router_activation == "softmax" else jax.nn.sigmoid(logits)
        )
        select = scores
        if cfg.load_balancing == "quantile":
            select = scores + jax.lax.stop_gradient(self.router_bias.array)[None, :]
        top_vals, top_idx = jax.lax.top_k(select, min(k + 1, e))
        idx = top_idx[:, :k]  # [n, k]
        weights = jnp.take_along_axis(scores, idx, axis=-1)
        if cfg.normalize_topk:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-9)

        flat_expert = idx.reshape(-1)
        order = jnp.argsort(flat_expert, stable=True)
        sorted_expert = flat_expert[order]
        xs = xf[order // k].astype(dtype)
        group_sizes = jnp.bincount(flat_expert, length=e).astype(jnp.int32)
        w_gate, w_up, w_down = (w.array.astype(dtype) for w in (self.gate, self.up, self.down))
        if cfg.capacity_factor is None:
            h = jax.nn.silu(jax.lax.ragged_dot(xs, w_gate, group_sizes)) * jax.lax.ragged_dot(
                xs, w_up, group_sizes
            )
            ys = jax.lax.ragged_dot(h, w_down, group_sizes)
            kept = jnp.ones((n * k,), dtype=bool)
        else:
            ys, kept = _capacity_dispatch(xs, sorted_expert, group_sizes, w_gate, w_up, w_down, cfg, n)
        inverse = jnp.argsort(order)
        y = ys[inverse].reshape(n, k, -1)
        out = jnp.sum(y * weights.astype(dtype)[:, :, None], axis=1)
        out_named = hax.named(out.reshape(*(a.size for a in lead), embed.size), (*lead, embed))
        if self.shared is not None:
            out_named = out_named + self.shared(x.rearrange((*lead, embed)))

        stats = _routing_stats(logits, scores, select, top_vals, idx, group_sizes, kept[inverse], cfg, n)
        return out_named, stats


def _capacity_dispatch(xs, sorted_expert, group_sizes, w_gate, w_up, w_down, cfg: MoEConfig, n: int):
    """Dense per-expert buffers of fixed capacity; assignments past capacity are dropped (output 0)."""
    e, k = cfg.num_experts, cfg.num_experts_per_token
    capacity = max(1, math.ceil(cfg.capacity_factor * n * k / e))
    starts = jnp.cumsum(group_sizes) - group_sizes
    pos = jnp.arange(n * k, dtype=jnp.int32) - starts[sorted_expert]
    kept = pos < capacity
    slot = jnp.where(kept, pos, capacity)  # out of range -> dropped by mode="drop"
    buf = jnp.zeros((e, capacity, xs.shape[-1]), xs.dtype).at[sorted_expert, slot].set(xs, mode="drop")
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, w_gate)) * jnp.einsum("ecd,edf->ecf", buf, w_up)
    out = jnp.einsum("ecf,efd->ecd", h, w_down)
    ys = out[sorted_expert, jnp.minimum(slot, capacity - 1)] * kept[:, None].astype(xs.dtype)
    return ys, kept


def _routing_stats(
    logits, scores, select, top_vals, idx, group_sizes, kept, cfg: MoEConfig, n: int
) -> dict[str, jax.Array]:
    """Per-layer router statistics and losses (all float32; arrays are stacked over layers by the scan)."""
    e, k = cfg.num_experts, cfg.num_experts_per_token
    load = group_sizes.astype(jnp.float32) / (n * k)  # fraction of assignments per expert; sums to 1
    probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    mean_prob = jnp.mean(probs, axis=0)
    aux_loss = e * jnp.sum(jax.lax.stop_gradient(load) * mean_prob)
    z = jax.nn.logsumexp(logits, axis=-1)
    entropy = -jnp.mean(jnp.sum(probs * jnp.log(probs + 1e-9), axis=-1))
    quantiles = _margin_quantiles(jax.lax.stop_gradient(select), jax.lax.stop_gradient(top_vals), idx, k, e)
    return {
        "load": load,
        "router_quantiles": quantiles.astype(jnp.float32),
        "aux_loss": aux_loss,
        "router_z_loss": jnp.mean(z * z),
        "router_entropy": entropy,
        "dropped_fraction": jnp.mean(jnp.logical_not(kept).astype(jnp.float32)),
    }


def _margin_quantiles(select: jax.Array, top_vals: jax.Array, idx: jax.Array, k: int, e: int) -> jax.Array:
    """Per expert, the ``1 - k/E`` quantile over tokens of its selection margin.

    A token picks expert ``j`` iff ``select[t, j]`` beats the k-th largest biased score among the OTHER
    experts: that is the (k+1)-th largest overall when ``j`` is picked, the k-th largest otherwise. The
    margin is the difference; shifting ``bias[j]`` by minus its ``1 - k/E`` quantile makes exactly the
    target share ``k/E`` of this batch's tokens pick ``j`` (others held fixed).
    """
    if k >= e:  # every expert is always picked: nothing to balance
        return jnp.zeros((e,), jnp.float32)
    chosen = jnp.any(jax.nn.one_hot(idx, e, dtype=jnp.bool_), axis=1)  # [n, e]
    threshold = jnp.where(chosen, top_vals[:, k : k + 1], top_vals[:, k - 1 : k])
    return jnp.quantile(select - threshold, 1.0 - k / e, axis=0)


def bias_update(bias: jax.Array, quantiles: jax.Array, rate: float) -> jax.Array:
    """One quantile-balancing step: ``bias - rate * (q - mean(q))`` along the last (experts) axis."""
    centred = quantiles - jnp.mean(quantiles, axis=-1, keepdims=True)
    return bias - rate * centred
