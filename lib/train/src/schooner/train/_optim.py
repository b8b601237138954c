"""Optimizers: AdamW, and Muon for matrices with AdamW for the rest; gradient clipping; weight-decay masks.

Parameters are grouped by what the model declares (``schooner.model.parameter_groups``), never guessed from
names or shapes:

- "embedding" / "head": token embeddings and the output head. Decayed (``decay_embeddings``); AdamW under
  Muon (Muon is meant for hidden matrices, not for lookup tables or the classifier).
- "norm": RMSNorm scales. No weight decay by default (``decay_norms_and_biases``); AdamW.
- "matrix": hidden projections. Decayed; Muon under ``MuonConfig``, its input and output axes from the
  model's declaration (``fan_in``), stacked layers and experts orthogonalized one by one.
- "router": the MoE router. Decayed like a matrix, but AdamW under Muon too: its few rows decide which
  experts a token reaches, and Muon's orthogonalized updates would move every expert's logits by the same
  amount each step whatever its gradient, the opposite of what load balancing needs to keep up with.
- "balancing": the MoE router bias. Not touched by the optimizer (zero updates): load balancing sets it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from ._schedule import SCHEDULE_KINDS, build_schedule

_F32_MAX = float(jnp.finfo(jnp.float32).max)


def _check_types(config: Any, numbers_: dict[str, str], flags: tuple[str, ...]) -> None:
    """Numbers given as strings (a YAML file, a command line) or None, and bools given as anything else (the
    string "false" is truthy), named with the field and value before any comparison."""
    name = type(config).__name__
    for f, rule in numbers_.items():
        v = getattr(config, f)
        if rule.endswith("or None") and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"{name}.{f} must be a number {rule}, got {f}={v!r} ({type(v).__name__})")
        if not math.isfinite(v):  # NaN passes every `< 0` check and only fails at the first step
            raise ValueError(f"{name}.{f} must be a finite number {rule}, got {f}={v!r}")
    for f in flags:
        v = getattr(config, f)
        if not isinstance(v, bool):
            raise ValueError(f"{name}.{f} must be True or False, got {v!r} ({type(v).__name__})")


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
    """The floor, as a fraction of the peak: the schedule's value at step `num_steps`, one past the last update
    (optax's and transformers' convention; see `schooner.train._schedule`)."""
    decay_norms_and_biases: bool = False
    """Apply weight decay to 1-D parameters (norm scales, biases) too. Off by default, as is customary."""
    decay_embeddings: bool = True
    """Apply weight decay to embeddings and the output head."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_types(
            self,
            {
                "weight_decay": ">= 0",
                "max_grad_norm": "> 0 or None",
                "min_lr_ratio": "in [0, 1]",
                "warmup": ">= 0 (steps, or a fraction of the run)",
                "decay": ">= 0 (steps, or a fraction of the run) or None",
            },
            ("decay_norms_and_biases", "decay_embeddings"),
        )
        if not (isinstance(self.learning_rate, int | float) and math.isfinite(self.learning_rate)):
            raise ValueError(f"{name}.learning_rate must be a finite number, got {self.learning_rate!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"{name}.learning_rate must be > 0, got learning_rate={self.learning_rate!r}")
        if self.learning_rate > _F32_MAX:
            raise ValueError(
                f"{name}.learning_rate={self.learning_rate!r} overflows float32 (max {_F32_MAX:.3g}): every "
                "update would be infinite; learning rates are usually below 1"
            )
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
        """The optax transformation for `params`, a `schooner.model` model (or its shapes): its declared
        parameter groups decide weight decay, the Muon/AdamW split and which leaves stay untouched."""
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
        _check_types(self, {"beta1": "in [0, 1)", "beta2": "in [0, 1)", "eps": "> 0"}, ())
        for f in ("beta1", "beta2"):
            v = getattr(self, f)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"AdamConfig.{f} must be in [0, 1), got {f}={v!r}")
        if not self.eps > 0:
            raise ValueError(f"AdamConfig.eps must be > 0, got eps={self.eps!r}")

    def build(self, params: Any, num_steps: int) -> optax.GradientTransformation:
        groups = _groups(params)
        labels = _per_leaf(groups, params, lambda g: "adam" if g.trainable else "frozen")
        in_adam = lambda g: g.trainable  # noqa: E731
        adamw = optax.adamw(
            self.lr_schedule(num_steps),
            b1=self.beta1,
            b2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            mask=_const(_per_leaf(groups, params, _branch(in_adam, lambda g: _decays(g, self)))),
        )
        return _with_clipping(_partition({"adam": adamw}, labels), self.max_grad_norm)


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
        _check_types(
            self,
            {
                "momentum": "in [0, 1)",
                "consistent_rms": "> 0 or None",
                "adam_learning_rate": "> 0 or None",
                "beta1": "in [0, 1)",
                "beta2": "in [0, 1)",
                "eps": "> 0",
            },
            ("nesterov",),
        )
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
        adam_lr = self.adam_learning_rate or self.learning_rate
        adam_sched = dataclasses.replace(self, learning_rate=adam_lr, adam_learning_rate=None).lr_schedule(
            num_steps
        )
        groups = _groups(params)
        labels = _per_leaf(groups, params, _rule)
        in_muon = lambda g: _rule(g) == "muon"  # noqa: E731
        in_adam = lambda g: _rule(g) == "adam"  # noqa: E731
        dims = _dimension_numbers(groups, params, in_muon)
        # Our own partition rather than optax.contrib.muon: the latter decays every AdamW-group leaf
        # (norms included) because it passes no mask to its AdamW branch.
        return _with_clipping(
            _partition(
                {
                    "muon": optax.chain(
                        optax.contrib.scale_by_muon(
                            ns_steps=self.ns_steps,
                            beta=self.momentum,
                            eps=self.eps,
                            nesterov=self.nesterov,
                            weight_dimension_numbers=_const(dims),
                        ),
                        scale_by_shape(_fans(groups, params, in_muon), self.consistent_rms),
                        optax.add_decayed_weights(
                            self.weight_decay,
                            _const(_per_leaf(groups, params, _branch(in_muon, lambda g: _decays(g, self)))),
                        ),
                        optax.scale_by_learning_rate(self.lr_schedule(num_steps)),
                    ),
                    "adam": optax.adamw(
                        adam_sched,
                        b1=self.beta1,
                        b2=self.beta2,
                        eps=self.eps,
                        weight_decay=self.weight_decay,
                        mask=_const(_per_leaf(groups, params, _branch(in_adam, lambda g: _decays(g, self)))),
                    ),
                },
                labels,
            ),
            self.max_grad_norm,
        )


def _const(tree: Any) -> Any:
    """Wrap a static pytree for optax arguments that accept "tree or callable".

    Model pytrees are equinox Modules, which are callable; optax would call them as mask functions.
    """
    return lambda _: tree


def _with_clipping(tx: optax.GradientTransformation, max_norm: float | None) -> optax.GradientTransformation:
    return tx if max_norm is None else optax.chain(optax.clip_by_global_norm(max_norm), tx)


def _partition(
    branches: dict[str, optax.GradientTransformation], labels: Any
) -> optax.GradientTransformation:
    """`optax.partition` with a "frozen" branch that never changes its leaves (the router bias)."""
    return optax.partition({**branches, "frozen": optax.set_to_zero()}, _const(labels))


# -- parameter groups ----------------------------------------------------------------------------------
def _is_group(x: Any) -> bool:
    from schooner.model import ParamGroup

    return isinstance(x, ParamGroup)


def _groups(params: Any) -> Any:
    from schooner.model import parameter_groups

    try:
        return parameter_groups(params)
    except (AttributeError, ValueError) as e:
        raise TypeError(
            f"the optimizer needs a schooner.model model (its declared parameter groups); got "
            f"{type(params).__name__}: {e}"
        ) from None


def _per_leaf(groups: Any, params: Any, fn: Any) -> Any:
    """A tree like `params` with `fn(group)` at every array leaf of each parameter."""
    return jax.tree.map(lambda g, x: jax.tree.map(lambda _: fn(g), x), groups, params, is_leaf=_is_group)


def _branch(member: Any, fn: Any) -> Any:
    """`fn(group)` for the branch's own leaves, `MaskedNode` for the others (what optax.partition passes)."""
    return lambda g: fn(g) if member(g) else optax.MaskedNode()


def _decays(group: Any, config: OptimizerConfig) -> bool:
    if group.kind == "norm":
        return config.decay_norms_and_biases
    if group.kind in ("embedding", "head"):
        return config.decay_embeddings
    return group.kind in ("matrix", "router")


def _rule(group: Any) -> str:
    """The Muon optimizer's rule for a group: "muon" (hidden matrices), "adam", or "frozen"."""
    if not group.trainable:
        return "frozen"
    return "muon" if group.kind == "matrix" else "adam"


def _axes(group: Any, x: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input, output) axis indices of a named parameter from its declared `fan_in`."""
    from schooner.model import STACKED_AXES

    names = [a.name for a in x.axes]
    missing = [a for a in group.fan_in if a not in names]
    if missing or not group.fan_in:
        raise ValueError(f"a matrix parameter with axes {names} declares fan_in={group.fan_in}")
    fan_in = tuple(i for i, n in enumerate(names) if n in group.fan_in)
    fan_out = tuple(i for i, n in enumerate(names) if n not in group.fan_in and n not in STACKED_AXES)
    return fan_in, fan_out


def _dimension_numbers(groups: Any, params: Any, member: Any) -> Any:
    def one(g: Any, x: Any) -> Any:
        if not member(g):
            return jax.tree.map(lambda _: optax.MaskedNode(), x)
        fan_in, fan_out = _axes(g, x)
        return jax.tree.map(lambda _: MuonDimensionNumbers(reduction_axis=fan_in, output_axis=fan_out), x)

    return jax.tree.map(one, groups, params, is_leaf=_is_group)


@dataclass(frozen=True)
class Fans:
    """Input and output sizes of one matrix (what Muon's shape scaling needs)."""

    fan_in: int
    fan_out: int


def _fans(groups: Any, params: Any, member: Any) -> Any:
    def one(g: Any, x: Any) -> Any:
        if not member(g):
            return jax.tree.map(lambda _: optax.MaskedNode(), x)
        fan_in, fan_out = _axes(g, x)
        fans = Fans(math.prod(x.axes[i].size for i in fan_in), math.prod(x.axes[i].size for i in fan_out))
        return jax.tree.map(lambda _: fans, x)

    return jax.tree.map(one, groups, params, is_leaf=_is_group)


def scale_by_shape(fans: Any, consistent_rms: float | None) -> optax.GradientTransformation:
    """Muon's shape scaling of each matrix update (the rule of optax's Muon, from its declared fans).

    `consistent_rms` set: `consistent_rms * sqrt(max(fan_in, fan_out))`, which gives Muon's updates the RMS
    of AdamW's (Liu et al. 2025); None: `sqrt(max(1, fan_out / fan_in))` (Keller Jordan's width scaling).
    """

    def factor(f: Fans) -> float:
        if consistent_rms is not None:
            return consistent_rms * math.sqrt(max(f.fan_in, f.fan_out))
        return math.sqrt(max(1.0, f.fan_out / f.fan_in))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        scaled = jax.tree.map(lambda u, f: u * jnp.asarray(factor(f), u.dtype), updates, fans)
        return scaled, state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def decay_mask(params: Any, config: OptimizerConfig) -> Any:
    """A pytree of bools like `params`: True where weight decay applies (frozen leaves: False)."""
    return _per_leaf(_groups(params), params, lambda g: g.trainable and _decays(g, config))


def muon_dimension_numbers(params: Any) -> Any:
    """A pytree like `params`: `MuonDimensionNumbers` (input axes from the model's declared `fan_in`, the
    stacked layers/experts axes as batch axes) for hidden matrices, `MaskedNode` for the other leaves."""
    return _dimension_numbers(_groups(params), params, lambda g: _rule(g) == "muon")


def describe_param_groups(params: Any, config: OptimizerConfig) -> list[dict[str, Any]]:
    """One row per parameter: path, shape, kind, whether it decays and its update rule."""
    from haliax import NamedArray

    groups = jax.tree.leaves(_groups(params), is_leaf=_is_group)
    named = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, NamedArray))[0]
    rows = []
    # an optimizer that names its own rule per group (AdamH: "adamh" on a sphere, no decay anywhere)
    group_rule = getattr(config, "group_rule", None)
    for g, (path, x) in zip(groups, named, strict=True):
        if group_rule is not None:
            rule = group_rule(g)
        else:
            rule = _rule(g) if isinstance(config, MuonConfig) else ("adam" if g.trainable else "frozen")
        rows.append(
            {
                "path": jax.tree_util.keystr(path),
                "shape": tuple(x.array.shape),
                "kind": g.kind,
                "decay": group_rule is None and g.trainable and _decays(g, config),
                "rule": "adamw" if rule == "adam" and group_rule is None else rule,
            }
        )
    return rows
