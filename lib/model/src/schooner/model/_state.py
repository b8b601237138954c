"""Non-gradient model state: which leaves an optimizer trains, and the MoE router-bias update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax

from ._config import MoEConfig
from ._moe import bias_update
from ._transformer import Transformer

ROUTER_QUANTILES = "aux/router_quantiles"


def trainable_mask(model: Transformer) -> Any:
    """A pytree of bools shaped like ``model``'s array leaves: False for leaves optimizers must not touch.

    The only non-trainable leaf is the MoE ``router_bias`` (updated by :func:`update_router_bias`). Use it
    as an optax mask, e.g. ``optax.masked(optax.adamw(...), trainable_mask(model))`` or to zero updates;
    weight decay applied to the bias would fight the balancing.
    """
    mask = jax.tree_util.tree_map(lambda _: True, model)
    if isinstance(model.config, MoEConfig):
        mask = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, mask, False)
    return mask


def update_router_bias(model: Transformer, metrics: Mapping[str, Any]) -> Transformer:
    """Apply one quantile-balancing step to every MoE layer's router bias; identity for other models.

    Args:
        model: the model after (or before) the optimizer step of this batch.
        metrics: the metrics returned by ``loss_fn`` on the batch (uses ``"aux/router_quantiles"``); a model
            without MoE or without quantile balancing, or metrics without the key, leave ``model`` unchanged.

    Returns:
        The model with ``router_bias <- router_bias - rate * (q - mean_e q)`` per layer.
    """
    cfg = model.config
    if not isinstance(cfg, MoEConfig) or cfg.load_balancing != "quantile" or ROUTER_QUANTILES not in metrics:
        return model
    quantiles = metrics[ROUTER_QUANTILES]
    bias = model.layers.stacked.mlp.router_bias.array
    if quantiles.shape != bias.shape:
        raise ValueError(
            f"router quantiles have shape {quantiles.shape}; the model's router bias is {bias.shape}."
        )
    new_bias = bias_update(bias, quantiles, cfg.router_bias_rate)
    return eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, new_bias)
