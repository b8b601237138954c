"""Optimizers: AdamW, and Muon for matrices with AdamW for the rest; gradient clipping; weight-decay masks.

Parameters are classified leaf by leaf from their (named) axes, so the rules work on any model pytree:

- "vector": at most one axis once the stacked `layers` (and per-expert `experts`) axes are set aside:
  norms' scales and biases. No weight decay by default, AdamW under Muon.
- "embedding": a leaf with a `vocab` axis (token embeddings, the output head). Decayed; AdamW under Muon
  (Muon is meant for hidden matrices, not for lookup tables or the classifier).
- "matrix": everything else. Decayed; Muon under `MuonConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from ._schedule import SCHEDULE_KINDS, build_schedule

# Axes that stack independent weights; Muon orthogonalizes each slice on its own.
_BATCH_AXES = ("layers", "layer", "experts", "expert")
_VOCAB_AXES = ("vocab",)
_EMBED_AXES = ("embed", "hidden")
_OUTPUT_PROJECTIONS = ("o_proj", "down", "out_proj", "wo", "w2", "c_proj")


@dataclass(frozen=True)
class OptimizerConfig:
    """Fields every optimizer shares: learning-rate schedule, weight decay and gradient clipping."""

    learning_rate: float = 3e-4
    """Peak learning rate (reached at the end of warmup)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW-style, multiplied by the learning rate)."""
    max_grad_norm: float | None = 1.0
    """Clip gradients to this global L2 norm; None disables clipping."""
    schedule: str = "cosine"
    """What follows warmup: "cosine", "linear", "constant" or "wsd" (warmup-stable-decay)."""
    warmup: float | int = 0.01
    """Warmup length: steps (int) or a fraction of the run (float < 1)."""
    decay: float | int | None = None
    """Decay phase length (steps or fraction). "wsd" defaults to 0.2; None for cosine/linear = all after warmup."""
    min_lr_ratio: float = 0.1
    """The learning rate at the final step, as a fraction of the peak."""
    decay_norms_and_biases: bool = False
    """Apply weight decay to 1-D parameters (norm scales, biases) too. Off by default, as is customary."""
    decay_embeddings: bool = True
    """Apply weight decay to embeddings and the output head."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not (isinstance(self.learning_rate, int | float) and math.isfinite(self.learning_rate)):
            raise ValueError(f"{name}.learning_rate must be a finite number, got {self.learning_rate!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"{name}.learning_rate must be > 0, got learning_rate={self.learning_rate!r}")
        if self.weight_decay < 0:
            raise ValueError(f"{name}.weight_decay must be >= 0, got weight_decay={self.weight_decay!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"{name}.max_grad_norm must be > 0 or None (no clipping), got max_grad_norm={self.max_grad_norm!r}"
            )
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(
                f"{name}.schedule must be one of {SCHEDULE_KINDS}, got schedule={self.schedule!r}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"{name}.min_lr_ratio must be in [0, 1], got min_lr_ratio={self.min_lr_ratio!r}")
        if self.schedule == "constant" and self.decay is not None:
            raise ValueError(f"{name}: schedule='constant' has no decay phase, got decay={self.decay!r}")
        for f in ("warmup", "decay"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
                raise ValueError(
                    f"{name}.{f} must be steps (int >= 0) or a fraction in [0, 1), got {f}={v!r}"
                )

    def lr_schedule(self, num_steps: int) -> optax.Schedule:
        """The learning-rate schedule over `num_steps` optimizer steps (raises if phases exceed the run)."""
        return build_schedule(
            learning_rate=self.learning_rate,
            num_steps=num_steps,
            kind=self.schedule,
            warmup=self.warmup,
            decay=self.decay,
            min_lr_ratio=self.min_lr_ratio,
        )

    def build(self, params: Any, num_steps: int) -> optax.GradientTransformation:
        """Build the optax transformation for `params` (used only for leaf classification)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define build(); use AdamConfig or MuonConfig"
        )


@dataclass(frozen=True)
class AdamConfig(OptimizerConfig):
    """AdamW with a warmup + decay schedule, clipping and a no-decay mask for norms and biases.

    Example:
        >>> AdamConfig(learning_rate=6e-4, weight_decay=0.1).schedule
        'cosine'
    """

    beta1: float = 0.9
    """First-moment decay."""
    beta2: float = 0.95
    """Second-moment decay."""
    eps: float = 1e-8
    """Denominator epsilon."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in ("beta1", "beta2"):
            v = getattr(self, f)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"AdamConfig.{f} must be in [0, 1), got {f}={v!r}")
        if not self.eps > 0:
            raise ValueError(f"AdamConfig.eps must be > 0, got eps={self.eps!r}")

    def build(self, params: Any, num_steps: int) -> optax.GradientTransformation:
        sched = self.lr_schedule(num_steps)
        mask = decay_mask(params, self)
        adamw = optax.adamw(
            sched,
            b1=self.beta1,
            b2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            mask=_const(mask),
        )
        return _with_clipping(adamw, self.max_grad_norm)


@dataclass(frozen=True)
class MuonConfig(OptimizerConfig):
    """Muon (orthogonalized momentum) for hidden matrices, AdamW for embeddings, the head, norms and biases.

    With `consistent_rms=0.2` (the default) Muon's update RMS matches AdamW's, so one learning rate serves
    both groups (Liu et al. 2025); set `adam_learning_rate` to give the AdamW group its own peak.
    """

    momentum: float = 0.95
    """Muon momentum (beta)."""
    nesterov: bool = True
    """Nesterov momentum for Muon."""
    ns_steps: int = 5
    """Newton-Schulz iterations."""
    consistent_rms: float | None = 0.2
    """Scale Muon updates to this RMS (None: optax's width scaling sqrt(max(1, fan_out/fan_in)))."""
    adam_learning_rate: float | None = None
    """Peak LR of the AdamW group; None = `learning_rate`. Follows the same schedule shape."""
    beta1: float = 0.9
    """AdamW first-moment decay (non-matrix group)."""
    beta2: float = 0.95
    """AdamW second-moment decay (non-matrix group)."""
    eps: float = 1e-8
    """Epsilon of Muon's normalization and of AdamW."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"MuonConfig.momentum must be in [0, 1), got momentum={self.momentum!r}")
        if not (isinstance(self.ns_steps, int) and self.ns_steps >= 1):
            raise ValueError(f"MuonConfig.ns_steps must be an int >= 1, got ns_steps={self.ns_steps!r}")
        if self.adam_learning_rate is not None and not self.adam_learning_rate > 0:
            raise ValueError(
                f"MuonConfig.adam_learning_rate must be > 0 or None, got {self.adam_learning_rate!r}"
            )
        if self.consistent_rms is not None and not self.consistent_rms > 0:
            raise ValueError(f"MuonConfig.consistent_rms must be > 0 or None, got {self.consistent_rms!r}")

    def build(self, params: Any, num_steps: int) -> optax.GradientTransformation:
        sched = self.lr_schedule(num_steps)
        adam_lr = self.adam_learning_rate or self.learning_rate
        adam_sched = dataclasses.replace(self, learning_rate=adam_lr, adam_learning_rate=None).lr_schedule(
            num_steps
        )
        mask = decay_mask(params, self)
        infos, treedef = leaf_infos(params)
        dim_list = [_muon_dims(i) for i in infos]
        labels = treedef.unflatten(["muon" if d is not None else "adam" for d in dim_list])
        # Inside optax.partition each branch sees MaskedNode at the other branch's leaves; the static
        # dimension tree must match that structure.
        muon_dims = treedef.unflatten([d if d is not None else optax.MaskedNode() for d in dim_list])
        # Our own partition rather than optax.contrib.muon: the latter decays every AdamW-group leaf
        # (norms and biases included) because it passes no mask to its AdamW branch.
        muon = optax.partition(
            {
                "muon": optax.chain(
                    optax.contrib.scale_by_muon(
                        ns_steps=self.ns_steps,
                        beta=self.momentum,
                        eps=self.eps,
                        nesterov=self.nesterov,
                        weight_dimension_numbers=_const(muon_dims),
                    ),
                    _muon_shape_scaling(_const(muon_dims), self.consistent_rms),
                    optax.add_decayed_weights(self.weight_decay, _const(mask)),
                    optax.scale_by_learning_rate(sched),
                ),
                "adam": optax.adamw(
                    adam_sched,
                    b1=self.beta1,
                    b2=self.beta2,
                    eps=self.eps,
                    weight_decay=self.weight_decay,
                    mask=_const(mask),
                ),
            },
            _const(labels),
        )
        return _with_clipping(muon, self.max_grad_norm)


def _const(tree: Any) -> Any:
    """Wrap a static pytree for optax arguments that accept "tree or callable".

    Model pytrees are equinox Modules, which are callable; optax would call them as mask functions.
    """
    return lambda _: tree


def _muon_shape_scaling(dims: Any, consistent_rms: float | None) -> optax.GradientTransformation:
    """optax's Muon shape scaling (consistent RMS or width transfer), from its only (contrib) home."""
    from optax.contrib._muon import scale_by_shape

    return scale_by_shape(weight_dimension_numbers=dims, consistent_rms=consistent_rms)


def _with_clipping(tx: optax.GradientTransformation, max_norm: float | None) -> optax.GradientTransformation:
    return tx if max_norm is None else optax.chain(optax.clip_by_global_norm(max_norm), tx)


@dataclass(frozen=True)
class LeafInfo:
    """What the optimizer needs to know about one parameter array."""

    path: str
    shape: tuple[int, ...]
    axes: tuple[str, ...] | None
    """Axis names when the leaf is a haliax NamedArray, else None."""

    @property
    def kind(self) -> str:
        """'vector', 'embedding' or 'matrix' (see the module docstring)."""
        core = self.core_axes()
        if len(core) <= 1:
            return "vector"
        if self.axes is not None and any(a in _VOCAB_AXES for a in self.axes):
            return "embedding"
        if self.axes is None and any(k in self.path.lower() for k in ("embed", "lm_head", "unembed", "wte")):
            return "embedding"
        return "matrix"

    def core_axes(self) -> tuple[int, ...]:
        """Indices of the axes that are not stacking axes (layers, experts)."""
        if self.axes is not None:
            return tuple(i for i, a in enumerate(self.axes) if a not in _BATCH_AXES)
        # Unnamed: treat leading dims beyond the last two as stacking dims (scan over layers).
        return tuple(range(max(0, len(self.shape) - 2), len(self.shape)))


def _is_named(x: Any) -> bool:
    import haliax as hax

    return isinstance(x, hax.NamedArray)


def leaf_infos(params: Any) -> tuple[list[LeafInfo], Any]:
    """Classify every array leaf of `params`; returns the infos in flatten order and the full treedef."""
    leaves, treedef = jax.tree.flatten(params)
    infos: list[LeafInfo] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_named)[0]:
        p = jax.tree_util.keystr(path)
        if _is_named(leaf):
            if leaf.array is None or isinstance(leaf.array, optax.MaskedNode):
                continue
            infos.append(LeafInfo(p, tuple(leaf.array.shape), tuple(a.name for a in leaf.axes)))
        else:
            infos.append(LeafInfo(p, tuple(getattr(leaf, "shape", ())), None))
    if len(infos) != len(leaves):
        raise ValueError(f"could not classify parameters: {len(infos)} named leaves vs {len(leaves)} arrays")
    return infos, treedef


def decay_mask(params: Any, config: OptimizerConfig) -> Any:
    """A pytree of bools like `params`: True where weight decay applies."""
    infos, treedef = leaf_infos(params)

    def decays(info: LeafInfo) -> bool:
        kind = info.kind
        if kind == "vector":
            return config.decay_norms_and_biases
        if kind == "embedding":
            return config.decay_embeddings
        return True

    return treedef.unflatten([decays(i) for i in infos])


def muon_dimension_numbers(params: Any) -> Any:
    """A pytree like `params`: MuonDimensionNumbers for hidden matrices, None for the AdamW group.

    With named axes the reduction side is the `embed` axis for input projections (q/k/v, gate/up) and the
    other axes for output projections (o_proj, down); Newton-Schulz does not depend on this choice, only
    optax's width scaling (`consistent_rms=None`) does.
    """
    infos, treedef = leaf_infos(params)
    return treedef.unflatten([_muon_dims(i) for i in infos])


def _muon_dims(info: LeafInfo) -> MuonDimensionNumbers | None:
    if info.kind != "matrix":
        return None
    core = info.core_axes()
    if info.axes is not None:
        embed = [i for i in core if info.axes[i] in _EMBED_AXES]
        if embed:
            e = embed[0]
            rest = tuple(i for i in core if i != e)
            # Named axes do not say which way a matrix maps; projections back into the residual stream
            # (o_proj, down) have `embed` as their output, all others read from it.
            name = info.path.rsplit(".", 1)[-1].lower()
            if any(k in name for k in _OUTPUT_PROJECTIONS):
                return MuonDimensionNumbers(reduction_axis=rest, output_axis=(e,))
            return MuonDimensionNumbers(reduction_axis=(e,), output_axis=rest)
    return MuonDimensionNumbers(reduction_axis=tuple(core[:-1]), output_axis=(core[-1],))


def describe_param_groups(params: Any, config: OptimizerConfig) -> list[dict[str, Any]]:
    """One row per parameter: path, shape, kind, whether it decays and (for Muon) its update rule."""
    infos, _ = leaf_infos(params)
    mask = jax.tree.leaves(decay_mask(params, config))
    rows = []
    for info, d in zip(infos, mask):
        rule = "adamw"
        if isinstance(config, MuonConfig) and info.kind == "matrix":
            rule = "muon"
        rows.append(
            {"path": info.path, "shape": info.shape, "kind": info.kind, "decay": bool(d), "rule": rule}
        )
    return rows
