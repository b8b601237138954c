"""AdamH: Adam whose projection matrices stay on the sphere of their initial Frobenius norm ("hyperball").

Wen, Dang, Lyu, Ma and Liang (2025, "Hyperball Optimization"), used by Marin's Delphi scaling suite. For a
matrix W with initial norm R (stored in the optimizer state at `init`):

    u    = m_hat / (sqrt(v_hat) + eps)                     Adam's direction (bias-corrected moments)
    W'   = W - lr * ||W|| * u / ||u||                      a step of size lr x ||W||, whatever u's scale
    W    <- R * W' / ||W'||                                 back onto the sphere of radius R

so `lr` is a relative (angular) step and weight decay has nothing left to do: the norm it would control is
fixed. Leaves off the sphere (norm scales, embeddings, biases: whatever the caller labels "adam") take plain
Adam, `-adam_lr * u`, with their own learning rate; "frozen" leaves are never changed. No weight decay on any
leaf.

A leaf's label is "adam", "frozen" or a `Sphere`, whose `axes` are the axes of one matrix (its norm's); the
other axes index independent matrices, so a stacked [layers, embed, heads, head_dim] projection keeps one
norm per layer. `model_labels` builds the labels of a `schooner.model` model from its declared parameter
groups. The state is a pytree of arrays (count, moments, radii), so it checkpoints and resumes like Adam's.

`AdamHConfig` is the optimizer config the trainer takes (like `AdamConfig`): `build(model, num_steps)` gives
`adamh` with the labels of `model_labels`, both learning rates on the config's schedule, and a gradient clip.

Example:
    >>> import jax.numpy as jnp
    >>> tx = adamh(0.02, adam_learning_rate=1e-3)
    >>> params = {"w": jnp.ones((4, 3)), "scale": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.eye(4, 3), "scale": jnp.ones(3)}, state, params)
    >>> round(float(jnp.linalg.norm(params["w"] + updates["w"])), 4)  # the initial norm, sqrt(12)
    3.4641
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._optim import OptimizerConfig, _check_types, _groups, _with_clipping

__all__ = ["SPHERE_KINDS", "AdamHConfig", "AdamHState", "Sphere", "adamh", "model_labels"]

_TINY = 1e-30
"""Floor of a norm before dividing by it (a zero Adam direction gives a zero step, not NaN)."""


@dataclass(frozen=True)
class Sphere:
    """The label of a leaf kept on the sphere of its initial norm.

    `axes`: the axes one matrix spans, whose Frobenius norm is kept (negative indices allowed); None = all
    axes (the leaf is one matrix). The remaining axes index independent matrices (stacked layers, experts).
    """

    axes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.axes is not None and (
            not isinstance(self.axes, tuple)
            or not self.axes
            or not all(isinstance(a, int) for a in self.axes)
        ):
            raise ValueError(f"Sphere.axes must be None or a non-empty tuple of ints, got axes={self.axes!r}")


Label = str | Sphere
LABELS = ("adam", "frozen")
"""The string labels; "adamh" is accepted as `Sphere()` (the whole leaf one matrix)."""


class AdamHState(NamedTuple):
    """AdamH's state: the step count, Adam's moments for every leaf (float32, shaped and named like the
    parameters, so they shard like them), and the radii of the sphere leaves in leaf order (keepdims-shaped,
    one per matrix; plain arrays, small enough to replicate)."""

    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's Adam state does
    mu: Any
    nu: Any
    radius: tuple[jax.Array, ...]


def _is_label(x: Any) -> bool:
    return isinstance(x, str | Sphere)


def _resolve(labels: Any, params: Any) -> list[Label]:
    """One label per array leaf of `params` (labels may be a prefix tree, or a function of params)."""
    if labels is None:
        return [Sphere() if jnp.ndim(x) >= 2 else "adam" for x in jax.tree.leaves(params)]
    leaves = jax.tree.leaves(labels, is_leaf=_is_label)
    if len(leaves) == 1 and leaves[0] is labels and callable(labels):  # a function, not a tree of labels
        return _resolve(labels(params), params)
    lab_leaves, lab_def = jax.tree.flatten(labels, is_leaf=_is_label)
    lab_def = cast(Any, lab_def)  # jax's PyTreeDef stub lacks flatten_up_to
    try:
        subtrees = lab_def.flatten_up_to(params)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"AdamH labels must be a tree shaped like the parameters (or a prefix of them): {e}"
        ) from None
    return [lab for lab, sub in zip(lab_leaves, subtrees, strict=True) for _ in jax.tree.leaves(sub)]


def _check(labels: Sequence[Label], params: Any) -> list[Label]:
    """Labels validated against their leaves: known strings, spheres only on matrices with valid axes."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    out: list[Label] = []
    for path, lab, x in zip(paths, labels, jax.tree.leaves(params), strict=True):
        lab = Sphere() if lab == "adamh" else lab
        if isinstance(lab, str) and lab not in LABELS:
            raise ValueError(
                f"AdamH label of parameter {path} must be 'adam', 'frozen', 'adamh' or a Sphere, got {lab!r}"
            )
        if isinstance(lab, Sphere):
            ndim = jnp.ndim(x)
            if ndim < 2:
                raise ValueError(
                    f"AdamH keeps matrices on a sphere; parameter {path} has shape {jnp.shape(x)} (ndim "
                    f"{ndim} < 2): label it 'adam'"
                )
            if lab.axes is not None and not all(-ndim <= a < ndim for a in lab.axes):
                raise ValueError(
                    f"AdamH Sphere.axes={lab.axes} of parameter {path} are out of range for its shape "
                    f"{jnp.shape(x)}"
                )
        out.append(lab)
    return out


def _norm(x: jax.Array, sphere: Sphere) -> jax.Array:
    """The Frobenius norm of each matrix of `x`, keepdims-shaped (float32)."""
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=sphere.axes, keepdims=True))


def _concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _radius(path: str, x: jax.Array, sphere: Sphere) -> jax.Array:
    r = _norm(x, sphere)
    if _concrete(r) and not bool(np.all(np.asarray(r) > 0)):
        raise ValueError(
            f"AdamH keeps each matrix on the sphere of its initial norm, but parameter {path} (shape "
            f"{jnp.shape(x)}, norm axes {sphere.axes}) has a matrix of norm 0 (zero-initialised): it could never "
            "move; label it 'adam' or initialise it with non-zero values"
        )
    return r


def _as_schedule(lr: float | optax.Schedule, name: str) -> optax.Schedule:
    if callable(lr):
        return lr
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"adamh {name} must be a finite number > 0 or a schedule, got {name}={lr!r}")
    return lambda _: lr


def adamh(
    learning_rate: float | optax.Schedule,
    *,
    adam_learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    labels: Any = None,
) -> optax.GradientTransformation:
    """AdamH for the sphere leaves, plain Adam for the others (see the module docstring for the rule).

    Args:
        learning_rate: the sphere leaves' relative step (each matrix moves by `learning_rate x ||W||` before
            its projection), a number or an optax schedule of the step count.
        adam_learning_rate: the learning rate of the "adam" leaves (number or schedule).
        b1, b2, eps: Adam's moment decays and denominator epsilon, shared by both groups.
        labels: per leaf "adam", "frozen", "adamh" or a `Sphere`; a tree shaped like the parameters (or a
            prefix of them, e.g. one label per haliax NamedArray), or a function of the parameters. None:
            `Sphere()` for every leaf with ndim >= 2, "adam" for the rest.

    Raises:
        ValueError (at `init`): an unknown label, a sphere on a leaf with fewer than two axes or with axes out
            of range, or a sphere matrix of norm 0 (it could never move): each names the parameter's path.
    """
    lr = _as_schedule(learning_rate, "learning_rate")
    adam_lr = _as_schedule(adam_learning_rate, "adam_learning_rate")
    for name, v in (("b1", b1), ("b2", b2)):
        if not 0.0 <= v < 1.0:
            raise ValueError(f"adamh {name} must be in [0, 1), got {name}={v!r}")
    if not eps > 0:
        raise ValueError(f"adamh eps must be > 0, got eps={eps!r}")

    def init(params: Any) -> AdamHState:
        labs = _check(_resolve(labels, params), params)
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        radius = tuple(
            _radius(jax.tree_util.keystr(p), x, lab)
            for (p, x), lab in zip(flat, labs, strict=True)
            if isinstance(lab, Sphere)
        )
        return AdamHState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.map(lambda x: jnp.zeros_like(x, dtype=jnp.float32), params),
            nu=jax.tree.map(lambda x: jnp.zeros_like(x, dtype=jnp.float32), params),
            radius=radius,
        )

    def update(updates: Any, state: AdamHState, params: Any = None) -> tuple[Any, AdamHState]:
        if params is None:
            raise ValueError(
                "adamh needs the parameters in update(updates, state, params) (it projects them)"
            )
        labs = _check(_resolve(labels, params), params)
        grads, flat_def = jax.tree.flatten(updates)
        treedef = cast(Any, flat_def)  # jax's PyTreeDef stub lacks flatten_up_to / unflatten
        ws = treedef.flatten_up_to(params)
        mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
        radii = iter(state.radius)
        count = optax.safe_increment(state.count)
        step_lr, step_adam_lr = lr(state.count), adam_lr(state.count)
        c1 = 1.0 - jnp.asarray(b1, jnp.float32) ** count
        c2 = 1.0 - jnp.asarray(b2, jnp.float32) ** count
        out, new_mu, new_nu = [], [], []
        for g, w, m, v, lab in zip(grads, ws, mus, nus, labs, strict=True):
            if lab == "frozen":
                out.append(jnp.zeros_like(g))
                new_mu.append(m)
                new_nu.append(v)
                continue
            g32 = g.astype(jnp.float32)
            m = b1 * m + (1.0 - b1) * g32
            v = b2 * v + (1.0 - b2) * jnp.square(g32)
            direction = (m / c1) / (jnp.sqrt(v / c2) + eps)
            new_mu.append(m)
            new_nu.append(v)
            if isinstance(lab, Sphere):
                out.append(_sphere_step(w, direction, next(radii), lab, step_lr).astype(g.dtype))
            else:
                out.append((-step_adam_lr * direction).astype(g.dtype))
        return treedef.unflatten(out), AdamHState(
            count=count, mu=treedef.unflatten(new_mu), nu=treedef.unflatten(new_nu), radius=state.radius
        )

    return optax.GradientTransformation(init, update)


def _sphere_step(w: jax.Array, u: jax.Array, radius: jax.Array, sphere: Sphere, lr: Any) -> jax.Array:
    """The update that takes `w` a step of size `lr ||w||` along -u/||u|| and back to the sphere `radius`."""
    w32 = w.astype(jnp.float32)
    moved = w32 - lr * _norm(w32, sphere) * u / jnp.maximum(_norm(u, sphere), _TINY)
    projected = radius * moved / jnp.maximum(_norm(moved, sphere), _TINY)
    return projected - w32


def model_labels(model: Any, sphere_kinds: Sequence[str] = ("matrix",)) -> Any:
    """AdamH labels of a `schooner.model` model from its declared parameter groups: a `Sphere` over each
    matrix's own axes (stacked layers and experts excluded) for the groups in `sphere_kinds`, "frozen" for
    what the optimizer must not touch (the MoE router bias), "adam" for the rest (embeddings, norms, ...).

    The default keeps only hidden projections on spheres; Marin's AdamH also puts the untied output head on
    one (`sphere_kinds=("matrix", "head")`); the MoE router stays on Adam like it does under Muon.
    """
    from schooner.model import STACKED_AXES, ParamGroup, parameter_groups

    kinds = ("embedding", "head", "norm", "matrix", "router")
    unknown = [k for k in sphere_kinds if k not in kinds]
    if unknown:
        raise ValueError(f"model_labels sphere_kinds must be among {kinds}, got {unknown}")

    def one(g: ParamGroup, x: Any) -> Label:
        if not g.trainable:
            return "frozen"
        if g.kind not in sphere_kinds:
            return "adam"
        axes = tuple(i for i, a in enumerate(x.axes) if a.name not in STACKED_AXES)
        return Sphere(axes=axes)

    return jax.tree.map(one, parameter_groups(model), model, is_leaf=lambda g: isinstance(g, ParamGroup))


SPHERE_KINDS = ("matrix", "head", "embedding", "router")
"""The parameter groups `AdamHConfig.sphere_kinds` may put on spheres (norm scales are vectors: no sphere)."""


@dataclass(frozen=True)
class AdamHConfig(OptimizerConfig):
    """AdamH: hidden projections on the sphere of their initial norm, plain Adam (own learning rate) for
    embeddings, norm scales and the rest; no weight decay; a small gradient clip.

    Takes the schedule fields of every optimizer config (`schedule`, `warmup`, `decay`, `min_lr_ratio`): both
    learning rates follow the same shape. `weight_decay` must stay 0 (the norms it would control are fixed).

    Example:
        >>> AdamHConfig(learning_rate=0.01, adam_learning_rate=3e-3).max_grad_norm
        0.1
    """

    learning_rate: float = 0.01
    """Peak relative step of the sphere matrices: each moves by `learning_rate x ||W||` per step."""
    max_grad_norm: float | None = 0.1
    """Clip gradients to this global L2 norm (small, as in Marin's AdamH runs); None disables clipping."""
    adam_learning_rate: float = 3e-3
    """Peak learning rate of the leaves on plain Adam (embeddings, norm scales, the head unless on a sphere)."""
    beta1: float = 0.9
    """First-moment decay (both groups)."""
    beta2: float = 0.95
    """Second-moment decay (both groups)."""
    eps: float = 1e-8
    """Denominator epsilon (both groups)."""
    sphere_kinds: tuple[str, ...] = ("matrix",)
    """Parameter groups kept on spheres (`model_labels`): hidden matrices by default; add "head" for an untied
    output head as Marin's AdamH does."""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        _check_types(
            self, {"adam_learning_rate": "> 0", "beta1": "in [0, 1)", "beta2": "in [0, 1)", "eps": "> 0"}, ()
        )
        if not (np.isfinite(self.adam_learning_rate) and self.adam_learning_rate > 0):
            raise ValueError(
                f"{name}.adam_learning_rate must be a finite number > 0, got "
                f"adam_learning_rate={self.adam_learning_rate!r}"
            )
        for f in ("beta1", "beta2"):
            v = getattr(self, f)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"{name}.{f} must be in [0, 1), got {f}={v!r}")
        if not self.eps > 0:
            raise ValueError(f"{name}.eps must be > 0, got eps={self.eps!r}")
        if self.weight_decay != 0:
            raise ValueError(
                f"{name}.weight_decay must be 0, got weight_decay={self.weight_decay!r}: AdamH keeps each "
                "projection's norm fixed, so decay has no norm to control (embeddings and norms take none either)"
            )
        kinds = self.sphere_kinds
        if isinstance(kinds, list):  # JSON has no tuples: a config read back from run.json gives a list
            kinds = tuple(kinds)
            object.__setattr__(self, "sphere_kinds", kinds)
        if not isinstance(kinds, tuple) or not all(isinstance(k, str) for k in kinds):
            raise ValueError(
                f"{name}.sphere_kinds must be a tuple of group kinds, got sphere_kinds={kinds!r}"
            )
        bad = [k for k in kinds if k not in SPHERE_KINDS]
        if bad:
            raise ValueError(
                f"{name}.sphere_kinds must be among {SPHERE_KINDS}, got {bad} in sphere_kinds={kinds!r}"
                + (" (norm scales are vectors: they take plain Adam)" if "norm" in bad else "")
            )

    def group_rule(self, group: Any) -> str:
        """The update rule of a parameter group (a `schooner.model.ParamGroup`): "adamh" (on a sphere),
        "adam" or "frozen"; what `describe_param_groups` should report for this optimizer (no group decays)."""
        if not group.trainable:
            return "frozen"
        return "adamh" if group.kind in self.sphere_kinds else "adam"

    def build(self, params: Any, num_steps: int) -> optax.GradientTransformation:
        """`adamh` for `params`, a `schooner.model` model (or its shapes): `model_labels(params,
        sphere_kinds)`, both learning rates on this config's schedule, clipping first."""
        _groups(params)  # a clear TypeError for anything that is not a schooner.model model
        adam = dataclasses.replace(self, learning_rate=self.adam_learning_rate)
        tx = adamh(
            self.lr_schedule(num_steps),
            adam_learning_rate=adam.lr_schedule(num_steps),
            b1=self.beta1,
            b2=self.beta2,
            eps=self.eps,
            labels=model_labels(params, self.sphere_kinds),
        )
        return _with_clipping(tx, self.max_grad_norm)
