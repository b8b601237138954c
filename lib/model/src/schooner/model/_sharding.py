"""Sharding: logical axis names -> mesh axes (FSDP, tensor parallel, expert parallel).

Every parameter and activation carries named axes (``embed``, ``mlp``, ``heads``, ``kv_heads``,
``head_dim``, ``vocab``, ``experts``, ``layers``, ``batch``, ``position``). An axis mapping names the mesh
axis (or axes) each logical axis is split over. Parameters and activations use different mappings:

* parameters (:func:`param_axis_mapping`): FSDP splits ``embed`` over the data axis; tensor parallelism
  splits ``heads``/``kv_heads``/``mlp``/``vocab`` over the model axis; expert parallelism splits
  ``experts`` over the expert axis.
* activations (:func:`compute_axis_mapping`): ``batch`` over the data (and expert) axes, the same tensor
  axes over the model axis. Trace the jitted step inside ``activation_sharding(mesh, mapping)`` to add
  activation sharding constraints inside the model (without it XLA propagates shardings on its own).

An axis whose size is not divisible by its mesh axes' size is left replicated rather than failing.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import haliax as hax
import jax
from haliax import NamedArray
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._layers import BATCH, EMBED, EXPERTS, HEADS, KV_HEADS, MLP, VOCAB

AxisMapping = Mapping[str, str | Sequence[str]]


def param_axis_mapping(
    *, data_axis: str | None = "data", model_axis: str | None = None, expert_axis: str | None = None
) -> dict[str, str]:
    """Parameter mapping: FSDP over ``data_axis``, tensor parallel over ``model_axis``, experts over ``expert_axis``."""
    mapping: dict[str, str] = {}
    if data_axis is not None:
        mapping[EMBED] = data_axis
    if model_axis is not None:
        mapping.update({HEADS: model_axis, KV_HEADS: model_axis, MLP: model_axis, VOCAB: model_axis})
    if expert_axis is not None:
        mapping[EXPERTS] = expert_axis
    return mapping


def compute_axis_mapping(
    *, data_axis: str | None = "data", model_axis: str | None = None, expert_axis: str | None = None
) -> dict[str, Any]:
    """Activation mapping: ``batch`` over the data (and expert) axes; tensor axes over ``model_axis``."""
    mapping: dict[str, Any] = {}
    batch_axes = tuple(a for a in (data_axis, expert_axis) if a is not None)
    if batch_axes:
        mapping[BATCH] = batch_axes[0] if len(batch_axes) == 1 else batch_axes
    if model_axis is not None:
        mapping.update({HEADS: model_axis, KV_HEADS: model_axis, MLP: model_axis, VOCAB: model_axis})
    return mapping


def _mesh_size(mesh: Mesh, physical: str | Sequence[str]) -> int:
    names = (physical,) if isinstance(physical, str) else tuple(physical)
    for n in names:
        if n not in mesh.shape:
            raise ValueError(
                f"axis mapping names mesh axis {n!r}, but the mesh has axes {tuple(mesh.shape)}."
            )
    return math.prod(mesh.shape[n] for n in names)


def pspec_for_named(axes: Sequence[hax.Axis], mesh: Mesh, axis_mapping: AxisMapping) -> PartitionSpec:
    """The PartitionSpec of an array with named ``axes`` (indivisible or repeated mesh axes stay replicated)."""
    used: set[str] = set()
    spec: list[str | tuple[str, ...] | None] = []
    for ax in axes:
        physical = axis_mapping.get(ax.name)
        names = () if physical is None else ((physical,) if isinstance(physical, str) else tuple(physical))
        if not names or used & set(names) or ax.size % _mesh_size(mesh, names) != 0:
            spec.append(None)
            continue
        used |= set(names)
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def model_shardings(model: Any, mesh: Mesh, axis_mapping: AxisMapping) -> Any:
    """A pytree of ``NamedSharding`` for ``model`` (arrays or shape structs): one per NamedArray, replicated
    for plain arrays. Usable with ``jax.device_put``, ``jax.jit(out_shardings=...)`` and ``load_model``."""

    def one(x: Any) -> Any:
        if isinstance(x, NamedArray):
            return NamedSharding(mesh, pspec_for_named(x.axes, mesh, axis_mapping))
        if hasattr(x, "shape"):
            return NamedSharding(mesh, PartitionSpec())
        return x

    return jax.tree_util.tree_map(one, model, is_leaf=lambda x: isinstance(x, NamedArray))


def shard_model(model: Any, mesh: Mesh, axis_mapping: AxisMapping) -> Any:
    """Place ``model``'s parameters on ``mesh`` per ``axis_mapping`` (e.g. :func:`param_axis_mapping`)."""
    return jax.device_put(model, model_shardings(model, mesh, axis_mapping))


def batch_sharding(mesh: Mesh, axis_mapping: AxisMapping) -> NamedSharding:
    """Sharding of [batch, position] token arrays under a compute mapping (batch split, positions whole)."""
    physical = axis_mapping.get(BATCH)
    if physical is not None:
        _mesh_size(mesh, physical)  # validates the names
    return NamedSharding(mesh, PartitionSpec(physical, None))


_ACTIVE = threading.local()


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, axis_mapping: AxisMapping) -> Iterator[None]:
    """While tracing inside this context, the model constrains its activations to ``axis_mapping`` on ``mesh``.

    Example:
        >>> with activation_sharding(mesh, compute_axis_mapping(data_axis="data", model_axis="model")):
        ...     loss, metrics = jax.jit(loss_fn)(model, tokens)
    """
    previous = getattr(_ACTIVE, "value", None)
    _ACTIVE.value = (mesh, dict(axis_mapping))
    try:
        yield
    finally:
        _ACTIVE.value = previous


def _haliax_context() -> tuple[Any, AxisMapping] | None:
    """A haliax ``axis_mapping`` plus a ``jax.set_mesh`` mesh, when the caller set both."""
    from haliax.partitioning import current_thread_local_mapping

    mapping = current_thread_local_mapping()
    if not mapping:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None
    return mesh, mapping


def active_specs(*axes: Sequence[hax.Axis]) -> tuple[Any, list[PartitionSpec]] | None:
    """The active mesh and the PartitionSpec of arrays with each of the named ``axes`` under the active
    activation mapping (see :func:`constrain`), or None when no mapping is active (then XLA decides).

    Kernels that cannot be partitioned by XLA (Pallas calls) run per shard with these in ``shard_map``.
    """
    active = getattr(_ACTIVE, "value", None) or _haliax_context()
    if active is None:
        return None
    mesh, mapping = active
    return mesh, [pspec_for_named(a, mesh, mapping) for a in axes]


def constrain(x: NamedArray) -> NamedArray:
    """Constrain an activation to the active :func:`activation_sharding`.

    Falls back to a haliax ``axis_mapping`` context when a mesh is also set with ``jax.set_mesh``; without
    either it is the identity (XLA then propagates shardings from the inputs).
    """
    active = getattr(_ACTIVE, "value", None) or _haliax_context()
    if active is None:
        return x
    mesh, mapping = active
    sharding = NamedSharding(mesh, pspec_for_named(x.axes, mesh, mapping))
    return hax.named(jax.lax.with_sharding_constraint(x.array, sharding), x.axes)
