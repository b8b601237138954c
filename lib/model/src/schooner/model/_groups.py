"""Parameter groups: what each parameter of a :class:`Transformer` is, declared once, for optimizers.

Every parameter is listed by its exact path in the model with its kind and, for matrices, the axes it reads
its input from (``fan_in``); an unlisted parameter is an error, so a new parameter must be declared here.

Kinds:
    ``embedding``: the input embedding (the output head as well when tied).
    ``head``: the untied output projection.
    ``norm``: RMSNorm scales.
    ``matrix``: hidden projections (attention, MLP, experts, shared experts).
    ``router``: the MoE router [experts, embed]. Its own group: it is a small matrix whose logits decide
        which experts train, so optimizers treat it with care (see ``schooner.train``'s ``_optim``).
    ``balancing``: the MoE router bias; set by load balancing (:func:`balance_router`), never by gradients.

Axes named in ``STACKED_AXES`` (``layers``, ``experts``) hold independent copies of a parameter; the axes
that are neither stacked nor ``fan_in`` are the parameter's output (``fan_out``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
from haliax import NamedArray

from ._layers import EMBED, EXPERTS, HEAD_DIM, HEADS, LAYERS, MLP

KINDS = ("embedding", "head", "norm", "matrix", "router", "balancing")
STACKED_AXES = (LAYERS, EXPERTS)


@dataclass(frozen=True)
class ParamGroup:
    """The kind of one parameter and, for matrices and the router, its input axes."""

    kind: str
    fan_in: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ParamGroup.kind must be one of {KINDS}; got {self.kind!r}.")

    @property
    def trainable(self) -> bool:
        """Whether gradients (and so optimizers) update the parameter."""
        return self.kind != "balancing"


_NORM = ParamGroup("norm")
_READS_EMBED = ParamGroup("matrix", fan_in=(EMBED,))
_S = ".layers.stacked"
_GROUPS: dict[str, ParamGroup] = {
    ".embed": ParamGroup("embedding"),
    ".lm_head": ParamGroup("head"),
    ".final_norm": _NORM,
    f"{_S}.attn_norm": _NORM,
    f"{_S}.mlp_norm": _NORM,
    f"{_S}.attn.q_proj": _READS_EMBED,
    f"{_S}.attn.k_proj": _READS_EMBED,
    f"{_S}.attn.v_proj": _READS_EMBED,
    f"{_S}.attn.o_proj": ParamGroup("matrix", fan_in=(HEADS, HEAD_DIM)),
    f"{_S}.attn.q_norm": _NORM,
    f"{_S}.attn.k_norm": _NORM,
    f"{_S}.mlp.gate": _READS_EMBED,
    f"{_S}.mlp.up": _READS_EMBED,
    f"{_S}.mlp.down": ParamGroup("matrix", fan_in=(MLP,)),
    f"{_S}.mlp.router": ParamGroup("router", fan_in=(EMBED,)),
    f"{_S}.mlp.router_bias": ParamGroup("balancing"),
    f"{_S}.mlp.shared.gate": _READS_EMBED,
    f"{_S}.mlp.shared.up": _READS_EMBED,
    f"{_S}.mlp.shared.down": ParamGroup("matrix", fan_in=("shared_mlp",)),
}


def _is_named(x: Any) -> bool:
    return isinstance(x, NamedArray)


def parameter_groups(model: Any) -> Any:
    """A pytree like ``model`` with a :class:`ParamGroup` in place of each parameter (NamedArray).

    Usable as optax ``param_labels`` (a prefix of the model's tree) after mapping groups to labels.

    Raises:
        ValueError: a parameter the table does not declare (the message names its path).
    """

    def group(path: tuple, x: Any) -> Any:
        key = jax.tree_util.keystr(path)
        if not _is_named(x):
            raise ValueError(f"parameter {key} is not a named array; every parameter has named axes.")
        if key not in _GROUPS:
            raise ValueError(
                f"parameter {key} has no declared group; add it to schooner.model._groups._GROUPS "
                f"(kinds: {KINDS})."
            )
        return _GROUPS[key]

    return jax.tree_util.tree_map_with_path(group, model, is_leaf=_is_named)


def trainable_mask(model: Any) -> Any:
    """A pytree of bools shaped like ``model``'s array leaves: False for leaves optimizers must not touch
    (the MoE ``router_bias``, set by :func:`balance_router`)."""
    groups = parameter_groups(model)
    return jax.tree_util.tree_map(
        lambda g, x: jax.tree_util.tree_map(lambda _: g.trainable, x),
        groups,
        model,
        is_leaf=lambda g: isinstance(g, ParamGroup),
    )
