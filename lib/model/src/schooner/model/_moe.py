"""Mixture-of-experts MLP: top-k routing, dropless grouped matmuls (or capacity mode), load balancing.

Routing. Router logits are computed in float32. Scores are ``softmax(logits)`` or ``sigmoid(logits)``.
Experts are chosen by ``top_k(logits + router_bias)``; the combine weights are the UNBIASED scores of the
chosen experts (renormalised to sum to 1 when ``normalize_topk``), so the bias steers load without
changing what the gradient sees. ``router_bias`` is not trained by gradients (read through
``stop_gradient``; its parameter group is "balancing", which optimizers leave alone): with
``load_balancing="quantile"`` it is set after every step by :func:`balance_router` (see ``_rebalance.py``)
from the statistics each forward pass returns; otherwise it stays 0.

Dispatch. Dropless by default: the (token, expert) assignments are sorted by expert and run through
grouped matmuls (``grouped_matmul``: on a GPU the Pallas Triton kernel of ``_gmm.py``, elsewhere
``jax.lax.ragged_dot``, or jax's megablox Pallas kernel on a TPU when asked), so no token is ever dropped. With ``capacity_factor`` set, each
expert takes at most ``ceil(capacity_factor * tokens * k / E)`` assignments (earlier tokens first) in a
dense [experts, capacity, embed] buffer; the overflow is dropped and reported in ``moe/dropped_fraction``.

Losses. :func:`moe_loss_terms` turns the per-layer statistics into the router z-loss, the auxiliary
balancing loss (``load_balancing="aux_loss"``) and the ``moe/...`` metrics.
"""

from __future__ import annotations

import functools
import logging
import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis, NamedArray
from jax.ad_checkpoint import checkpoint_name

from ._balancing import balancing_shift
from ._config import GROUPED_MATMULS, MoEConfig
from ._gmm import supported as gmm_supported
from ._gmm import triton_grouped_matmul
from ._kernels import pallas_interpret, resolve_grouped_matmul, triton_interpret
from ._layers import EMBED, EXPERTS, MLP, MLP_GATE_UP, ParamFactory, SwiGLU, axes_for

logger = logging.getLogger(__name__)

MOE_ROUTING = "moe_routing"
"""``checkpoint_name`` of the routing's chosen experts and sort orders (integers; see the "dots" remat)."""


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

    def __call__(
        self, x: NamedArray, *, kernels: str = "xla", rebalance: jax.Array | None = None
    ) -> tuple[NamedArray, dict[str, jax.Array]]:
        """The layer's output and its routing statistics. ``rebalance`` (quantile balancing's re-solve pass,
        see ``_rebalance.py``), float32[experts]: solve the balancing shift on these tokens first and route
        them with it less ``rebalance`` (the rate's take-back; zeros for the whole solution), so the layers
        after this one see inputs routed as the next step will route them. None: the plain forward pass."""
        cfg = self.config
        dtype = x.dtype
        embed = x.resolve_axis(EMBED)
        lead = tuple(a for a in x.axes if a.name != EMBED)
        xf = x.rearrange((*lead, embed)).array.reshape(-1, embed.size)
        n, e, k = xf.shape[0], cfg.num_experts, cfg.num_experts_per_token

        x32 = xf.astype(jnp.float32)
        logits = x32 @ self.router.array.T  # router in fp32 always
        scores = (
            jax.nn.softmax(logits, axis=-1) if cfg.router_activation == "softmax" else jax.nn.sigmoid(logits)
        )
        # Both activations are increasing, so the top-k of the logits is the top-k of the scores.
        select = jax.lax.stop_gradient(logits + self.router_bias.array[None, :])
        shift = None
        if cfg.load_balancing == "quantile":
            shift = balancing_shift(select, k)
            if rebalance is not None:
                select = select + (shift - rebalance)[None, :]
        _, idx = jax.lax.top_k(select, k)  # [n, k]
        idx = checkpoint_name(idx, MOE_ROUTING)
        weights = jnp.take_along_axis(scores, idx, axis=-1)
        if cfg.normalize_topk:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-9)

        flat_expert = idx.reshape(-1)
        order = checkpoint_name(jnp.argsort(flat_expert, stable=True), MOE_ROUTING)
        inverse = checkpoint_name(jnp.argsort(order), MOE_ROUTING)
        sorted_expert = flat_expert[order]
        # Each token's row once per choice, in expert order. A permutation's gradient is the inverse
        # permutation (a gather), and the group sizes a comparison's sum: no scatter-add (slow on TPUs) in
        # the forward or the backward, as indexing's gradient and bincount would have.
        xs = permute_rows(jnp.repeat(xf.astype(dtype), k, axis=0), order, inverse)
        one_hot = flat_expert[:, None] == jnp.arange(e, dtype=flat_expert.dtype)[None, :]
        group_sizes = jnp.sum(one_hot, axis=0, dtype=jnp.int32)
        w_gate, w_up, w_down = (w.array.astype(dtype) for w in (self.gate, self.up, self.down))
        if cfg.capacity_factor is None:
            gmm = functools.partial(
                grouped_matmul, group_sizes=group_sizes, kernels=kernels, implementation=cfg.grouped_matmul
            )
            g = checkpoint_name(gmm(xs, w_gate), MLP_GATE_UP)
            u = checkpoint_name(gmm(xs, w_up), MLP_GATE_UP)

            def down(g: jax.Array, u: jax.Array, w: jax.Array) -> jax.Array:
                return gmm(jax.nn.silu(g) * u, w)

            if kernels != "cpu":  # keep g and u only (as the dense SwiGLU does)
                down = jax.checkpoint(down)
            ys = down(g, u, w_down)
            kept = jnp.ones((n * k,), dtype=bool)
        else:
            ys, kept = _capacity_dispatch(xs, sorted_expert, group_sizes, w_gate, w_up, w_down, cfg, n)
        y = permute_rows(ys, inverse, order).reshape(n, k, -1)
        out = jnp.sum(y * weights.astype(dtype)[:, :, None], axis=1)
        out_named = hax.named(out.reshape(*(a.size for a in lead), embed.size), (*lead, embed))
        if self.shared is not None:
            out_named = out_named + self.shared(x.rearrange((*lead, embed)), kernels=kernels)

        stats = _routing_stats(logits, scores, group_sizes, kept[inverse], cfg, n)
        if shift is not None:
            stats["balance_shift"] = shift
            stats["router_input_mean"] = jax.lax.stop_gradient(jnp.mean(x32, axis=0))
        return out_named, stats


@jax.custom_vjp
def permute_rows(x: jax.Array, perm: jax.Array, inverse: jax.Array) -> jax.Array:
    """``x[perm]`` for a permutation ``perm`` of x's rows, whose inverse is ``inverse``; the gradient is
    ``g[inverse]``, a gather, where autodiff of ``x[perm]`` would scatter-add."""
    return x[perm]


def _permute_rows_fwd(x: jax.Array, perm: jax.Array, inverse: jax.Array) -> tuple[jax.Array, tuple]:
    return x[perm], (perm, inverse)


def _permute_rows_bwd(res: tuple, g: jax.Array) -> tuple[jax.Array, None, None]:
    _, inverse = res
    return g[inverse], None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def _tile(size: int, largest: int = 512) -> int | None:
    """The largest of 512, 256, 128 (at most ``largest``) dividing ``size``, or None."""
    return next((t for t in (512, 256, 128) if t <= largest and size % t == 0), None)


def grouped_matmul(
    x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, kernels: str, implementation: str = "ragged_dot"
) -> jax.Array:
    """``x[rows of group g] @ w[g]`` for consecutive groups of rows: [m, k] x [groups, k, n] -> [m, n].

    ``implementation`` (``MoEConfig.grouped_matmul``, resolved by ``_kernels.resolve_grouped_matmul``):

    - ``"ragged_dot"``: ``jax.lax.ragged_dot``, every backend (on a GPU, jax 0.10-0.11 lower it to zero-padded
      dense products: about E/k times the experts' FLOPs);
    - ``"triton"``: the Pallas Triton kernel of ``_gmm.py`` (the GPU default; interpreted on the CPU, refused on
      a TPU), where ``k`` and ``n`` are multiples of 16 (``ragged_dot`` otherwise, with a log line);
    - ``"megablox"``: on the ``"tpu"`` kernel path, the megablox grouped matmul of
      ``jax.experimental.pallas.ops.tpu.megablox`` (a Pallas kernel with its own backward; interpreted on the
      CPU) when ``k`` and ``n`` are multiples of 128. Rows are padded to the kernel's row tile as zeros counted
      in the last group (zero rows give zero outputs and no gradient), then dropped. ragged_dot measured
      faster on a TPU v5e.
    - ``"auto"``: ``"triton"`` on the XLA path on a GPU, ``"ragged_dot"`` elsewhere.
    """
    m, k = x.shape
    n = w.shape[-1]
    if implementation not in GROUPED_MATMULS:
        raise ValueError(f"implementation must be one of {GROUPED_MATMULS}; got {implementation!r}.")
    impl = resolve_grouped_matmul(implementation, kernels)
    if impl == "triton":
        if gmm_supported(k, n):
            return triton_grouped_matmul(x, w, group_sizes, interpret=triton_interpret())
        _log_once(
            f"grouped matmul [{m}, {k}] x {list(w.shape)}: the Triton kernel needs k and n multiples of 16; "
            "using jax.lax.ragged_dot"
        )
        return jax.lax.ragged_dot(x, w, group_sizes)
    tk, tn = _tile(k), _tile(n)
    if impl != "megablox" or tk is None or tn is None:
        return jax.lax.ragged_dot(x, w, group_sizes)
    from jax.experimental.pallas.ops.tpu.megablox import ops

    tm = 512 if m >= 512 else 128
    pad = (-m) % tm
    if pad:
        x = jnp.pad(x, ((0, pad), (0, 0)))
        group_sizes = group_sizes.at[-1].add(pad)
    out = ops.gmm(x, w, group_sizes, x.dtype, (tm, tk, tn), None, None, False, pallas_interpret())
    return out[:m] if pad else out


@functools.cache
def _log_once(message: str) -> None:
    logger.warning(message)


def _capacity_dispatch(
    xs: jax.Array,
    sorted_expert: jax.Array,
    group_sizes: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    cfg: MoEConfig,
    n: int,
) -> tuple[jax.Array, jax.Array]:
    """Dense per-expert buffers of fixed capacity; assignments past capacity are dropped (output 0)."""
    assert cfg.capacity_factor is not None  # the caller takes the dropless path for None
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
    logits: jax.Array, scores: jax.Array, group_sizes: jax.Array, kept: jax.Array, cfg: MoEConfig, n: int
) -> dict[str, jax.Array]:
    """Per-layer router statistics and losses (all float32; arrays are stacked over layers by the scan)."""
    e, k = cfg.num_experts, cfg.num_experts_per_token
    load = group_sizes.astype(jnp.float32) / (n * k)  # fraction of assignments per expert; sums to 1
    probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    mean_prob = jnp.mean(probs, axis=0)
    aux_loss = e * jnp.sum(jax.lax.stop_gradient(load) * mean_prob)
    z = jax.nn.logsumexp(logits, axis=-1)
    entropy = -jnp.mean(jnp.sum(probs * jnp.log(probs + 1e-9), axis=-1))
    return {
        "load": load,
        "aux_loss": aux_loss,
        "router_z_loss": jnp.mean(z * z),
        "router_entropy": entropy,
        "dropped_fraction": jnp.mean(jnp.logical_not(kept).astype(jnp.float32)),
    }


def moe_loss_terms(config: MoEConfig, aux: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The MoE part of the loss (router z-loss, and the auxiliary loss when ``load_balancing="aux_loss"``)
    and the ``moe/...`` metrics, from the per-layer statistics ``aux`` of a forward pass."""
    router_z = jnp.mean(aux["router_z_loss"])
    aux_loss = jnp.mean(aux["aux_loss"])
    extra = config.router_z_loss_weight * router_z
    if config.load_balancing == "aux_loss":
        extra = extra + config.aux_loss_weight * aux_loss
    load = aux["load"]  # [layers, experts]
    metrics = {
        "moe/aux_loss": aux_loss,
        "moe/router_z_loss": router_z,
        "moe/max_load_ratio": jnp.max(load) * config.num_experts,
        "moe/mean_max_load_ratio": jnp.mean(jnp.max(load, axis=-1)) * config.num_experts,
        "moe/min_load_ratio": jnp.min(load) * config.num_experts,
        "moe/router_entropy": jnp.mean(aux["router_entropy"]),
        "moe/dropped_fraction": jnp.mean(aux["dropped_fraction"]),
    }
    return extra, metrics
