"""The device mesh (data, FSDP, expert, tensor axes) and the haliax axis mappings onto it.

Logical axes (the model's named axes) map to physical mesh axes in two mappings, as in levanter:

- parameters: `embed` over `fsdp` (ZeRO-3 style sharding of every matrix), `mlp`/`heads`/`kv_heads`/`vocab`
  over `tensor`, `experts` over `expert`;
- compute (activations): `batch` over (`data`, `fsdp`, `expert`), and the same tensor/expert mapping.

Multi-host: `jax.distributed.initialize()` comes before the mesh (`train` does it in a gang,
`ResourceConfig(hosts=N)`, or when `JAX_COORDINATOR_ADDRESS` is set); `jax.devices()` then spans all hosts
and the same mesh code applies. Tested with 2 processes x 4 CPU devices (gloo) against 1 x 8
(lib/train/tests/test_multihost.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES: tuple[str, ...] = ("data", "fsdp", "expert", "tensor")
BATCH_AXES: tuple[str, ...] = ("data", "fsdp", "expert")

_DEFAULT_PARAM_MAPPING: dict[str, str | tuple[str, ...]] = {
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "vocab": "tensor",
    "experts": "expert",
}


@dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; one of them may be -1 ("all remaining devices").

    Example:
        >>> MeshConfig(data=-1, fsdp=2, tensor=2).shape(8)
        {'data': 2, 'fsdp': 2, 'expert': 1, 'tensor': 2}
    """

    data: int = -1
    """Pure data parallelism (parameters replicated)."""
    fsdp: int = 1
    """Data parallelism with parameters and optimizer state sharded (ZeRO-3)."""
    expert: int = 1
    """Expert parallelism: MoE experts split over this axis (also a batch axis)."""
    tensor: int = 1
    """Tensor (model) parallelism over mlp, heads and vocab."""
    devices: int | None = None
    """Use only the first N devices (None: all). E.g. a 1-device reference run on a multi-device host."""
    param_mapping: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    """Overrides of the logical -> physical mapping for parameters (merged over the defaults)."""
    compute_mapping: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    """Overrides of the logical -> physical mapping for activations (merged over the defaults)."""

    def __post_init__(self) -> None:
        sizes = {a: getattr(self, a) for a in AXES}
        for a, v in sizes.items():
            if not isinstance(v, int) or isinstance(v, bool) or (v <= 0 and v != -1):
                raise ValueError(
                    f"MeshConfig.{a} must be a positive int or -1 (remaining devices), got {a}={v!r}"
                )
        if self.devices is not None and (not isinstance(self.devices, int) or self.devices < 1):
            raise ValueError(
                f"MeshConfig.devices must be a positive int or None, got devices={self.devices!r}"
            )
        if sum(v == -1 for v in sizes.values()) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {sizes}")
        for name, mapping in (
            ("param_mapping", self.param_mapping),
            ("compute_mapping", self.compute_mapping),
        ):
            for logical, phys in mapping.items():
                for p in (phys,) if isinstance(phys, str) else tuple(phys):
                    if p not in AXES:
                        raise ValueError(
                            f"MeshConfig.{name}[{logical!r}] = {phys!r} names an unknown mesh axis; use {AXES}"
                        )

    def shape(self, num_devices: int) -> dict[str, int]:
        """The axis sizes for `num_devices` devices (resolving -1; `devices`, when set, wins).

        Raises:
            ValueError: the sizes do not multiply to `num_devices`.
        """
        num_devices = self.devices or num_devices
        sizes = {a: getattr(self, a) for a in AXES}
        fixed = math.prod(v for v in sizes.values() if v != -1)
        if -1 in sizes.values():
            if num_devices % fixed:
                raise ValueError(
                    f"mesh {sizes} cannot use {num_devices} devices: the fixed axes multiply to {fixed}, "
                    f"which does not divide {num_devices}"
                )
            sizes = {a: (num_devices // fixed if v == -1 else v) for a, v in sizes.items()}
        elif fixed != num_devices:
            raise ValueError(
                f"mesh {sizes} needs {fixed} devices but {num_devices} are available; set one axis to -1 "
                f"or make the sizes multiply to {num_devices}"
            )
        return sizes

    @property
    def param_axis_mapping(self) -> dict[str, str | tuple[str, ...]]:
        """Logical -> physical mapping for parameters and optimizer state."""
        return {**_DEFAULT_PARAM_MAPPING, **self.param_mapping}

    @property
    def compute_axis_mapping(self) -> dict[str, str | tuple[str, ...]]:
        """Logical -> physical mapping for activations (batch over all data-like axes)."""
        base = {k: v for k, v in _DEFAULT_PARAM_MAPPING.items() if k != "embed"}
        return {**base, "batch": BATCH_AXES, **self.compute_mapping}

    def data_parallel_size(self, num_devices: int) -> int:
        """How many ways the batch is split when `num_devices` devices are available."""
        s = self.shape(self.devices or num_devices)
        return math.prod(s[a] for a in BATCH_AXES)


def make_mesh(config: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """Build the `jax.sharding.Mesh` for `config` over `devices` (default: all devices)."""
    devices = list(devices if devices is not None else jax.devices())
    if config.devices is not None:
        if config.devices > len(devices):
            raise ValueError(
                f"MeshConfig.devices={config.devices} but only {len(devices)} devices are available"
            )
        devices = devices[: config.devices]
    shape = config.shape(len(devices))
    arr = np.array(devices, dtype=object).reshape(tuple(shape[a] for a in AXES))
    return Mesh(arr, AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of [B, T] token arrays: batch over the data-like axes, positions replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding."""
    return NamedSharding(mesh, PartitionSpec())
