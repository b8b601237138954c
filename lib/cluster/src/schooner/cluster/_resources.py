"""What a job needs from the machine: CPUs, memory, disk, an accelerator, environment and retries."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

GPU_KINDS: tuple[str, ...] = (
    "A10",
    "A10G",
    "A100",
    "A100-40G",
    "A100-80G",
    "B200",
    "B300",
    "GB200",
    "GH200",
    "H100",
    "H20",
    "H200",
    "L4",
    "L40S",
    "T4",
    "V100",
)
"""Accelerator names accepted by `ResourceConfig.with_gpu` (Ray's `accelerator_type` naming)."""

_TPU_KIND = re.compile(r"^v(2|3|4|5e|5p|5litepod|6e)-(\d+)$")
TPU_KINDS_HELP = "v2-N, v3-N, v4-N, v5p-N (N = TensorCores, 2 per chip), v5e-N, v5litepod-N or v6e-N (N = chips); e.g. 'v5p-8'"
_CORES_PER_CHIP = {"2": 2, "3": 2, "4": 2, "5p": 2, "5e": 1, "5litepod": 1, "6e": 1}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
    "p": 1e15,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "pi": 2**50,
}


def parse_bytes(value: int | float | str | None, *, field_name: str) -> int | None:
    """Parse `4GiB`, `512MB`, `1.5g` or a plain number of bytes; `None` stays `None`."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(
            f"ResourceConfig.{field_name} must be a byte count or a size like '4GiB', got {value!r}"
        )
    if isinstance(value, int | float):
        n = float(value)
    else:
        m = _SIZE.match(str(value))
        unit = (m.group(2) or "").lower().removesuffix("b") if m else ""
        if not m or unit not in _UNITS:
            raise ValueError(
                f"ResourceConfig.{field_name}: cannot parse size {value!r}; use bytes or a size like '512MiB', "
                "'4GB', '1.5GiB' (units: B, kB/KiB, MB/MiB, GB/GiB, TB/TiB, PB/PiB)"
            )
        n = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(n):
        raise ValueError(f"ResourceConfig.{field_name} must be a finite size, got {value!r}")
    if n < 0:
        raise ValueError(f"ResourceConfig.{field_name} must be >= 0, got {value!r}")
    return int(n)


@dataclass(frozen=True)
class ResourceConfig:
    """Resources for one job. Runtime-only: never part of a step's identity.

    Example:
        >>> ResourceConfig.with_cpu(cpu=2, ram="4GiB").cpu
        2.0
        >>> ResourceConfig.with_gpu("H100", count=8).device
        'gpu'
    """

    cpu: float = 1.0
    """CPU cores the job may use (fractions allowed for light jobs)."""
    ram: int | str | None = None
    """Memory in bytes, or a size string such as '8GiB'; None means no reservation."""
    disk: int | str | None = None
    """Scratch disk in bytes or a size string; None means no reservation."""
    device: Literal["cpu", "gpu", "tpu"] = "cpu"
    """Accelerator family: 'cpu' (none), 'gpu' or 'tpu'."""
    device_kind: str | None = None
    """GPU model (one of GPU_KINDS) or TPU slice type (e.g. 'v5p-8'); None for cpu."""
    device_count: int = 0
    """Number of GPUs (for 'gpu'); chips per slice are implied by the TPU kind."""
    slices: int = 1
    """Number of TPU slices (multislice); 1 otherwise."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the job. Secret-looking names are passed but never logged."""
    max_retries_failure: int = 0
    """How often to rerun a job whose function raised."""
    max_retries_preemption: int = 3
    """How often to rerun a job whose worker or node died (SIGKILL, OOM kill, preemption)."""
    hosts: int = 1
    """Processes of one job, one per host, started together or not at all (a gang, for multi-host
    training: see `current_gang`); `cpu`, `ram` and devices are per process. A gang restarts whole."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.cpu, bool)
            or not isinstance(self.cpu, int | float)
            or not math.isfinite(self.cpu)
            or self.cpu < 0
        ):
            raise ValueError(f"ResourceConfig.cpu must be a finite number >= 0, got cpu={self.cpu!r}")
        object.__setattr__(self, "cpu", float(self.cpu))
        object.__setattr__(self, "ram", parse_bytes(self.ram, field_name="ram"))
        object.__setattr__(self, "disk", parse_bytes(self.disk, field_name="disk"))
        if self.device not in ("cpu", "gpu", "tpu"):
            raise ValueError(
                f"ResourceConfig.device must be one of 'cpu', 'gpu', 'tpu', got device={self.device!r}"
            )
        for name in ("device_count", "slices", "max_retries_failure", "max_retries_preemption", "hosts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"ResourceConfig.{name} must be an integer >= 0, got {name}={v!r}")
        if self.device == "cpu":
            if self.device_kind is not None or self.device_count:
                raise ValueError(
                    f"ResourceConfig: device='cpu' takes no device_kind/device_count, got "
                    f"device_kind={self.device_kind!r}, device_count={self.device_count}; use with_gpu() or with_tpu()"
                )
        elif self.device == "gpu":
            if self.device_kind not in GPU_KINDS:
                raise ValueError(
                    f"ResourceConfig.device_kind={self.device_kind!r} is not a known GPU; allowed: {', '.join(GPU_KINDS)}"
                )
            if self.device_count < 1:
                raise ValueError(
                    f"ResourceConfig.device_count must be >= 1 for a GPU job, got {self.device_count}"
                )
        else:
            if not isinstance(self.device_kind, str) or not _TPU_KIND.match(self.device_kind):
                raise ValueError(
                    f"ResourceConfig.device_kind={self.device_kind!r} is not a TPU kind; allowed: {TPU_KINDS_HELP}"
                )
            if self.slices < 1:
                raise ValueError(f"ResourceConfig.slices must be >= 1 for a TPU job, got {self.slices}")
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ValueError("ResourceConfig.env must map str to str, got " + _redacted_env_repr(self.env))
        object.__setattr__(self, "env", dict(self.env))
        if self.hosts < 1:
            raise ValueError(f"ResourceConfig.hosts must be >= 1, got hosts={self.hosts}")

    @staticmethod
    def with_cpu(
        cpu: float = 1, *, ram: int | str | None = None, disk: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A CPU-only job."""
        return ResourceConfig(cpu=cpu, ram=ram, disk=disk, **kw)

    @staticmethod
    def with_gpu(
        kind: str = "H100", count: int = 1, *, cpu: float = 1, ram: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A job on `count` GPUs of model `kind` (one of GPU_KINDS)."""
        return ResourceConfig(cpu=cpu, ram=ram, device="gpu", device_kind=kind, device_count=count, **kw)

    @staticmethod
    def with_tpu(
        kind: str, slices: int = 1, *, cpu: float = 1, ram: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A job on `slices` TPU slices of type `kind` (e.g. 'v5p-8')."""
        return ResourceConfig(cpu=cpu, ram=ram, device="tpu", device_kind=kind, slices=slices, **kw)

    @property
    def tpu_chips(self) -> int:
        """Chips per TPU slice (0 for non-TPU jobs): 'v5p-8' is 4 chips (8 TensorCores), 'v5e-8' is 8 chips."""
        if self.device != "tpu":
            return 0
        m = _TPU_KIND.match(self.device_kind or "")
        return max(1, int(m.group(2)) // _CORES_PER_CHIP[m.group(1)]) if m else 0

    def replace(self, **changes: Any) -> ResourceConfig:
        """`dataclasses.replace` for convenience."""
        return dataclasses.replace(self, **changes)

    @property
    def ram_bytes(self) -> int | None:
        """`ram` in bytes (a size string given to the constructor is parsed there); None: no reservation."""
        return cast("int | None", self.ram)

    @property
    def disk_bytes(self) -> int | None:
        """`disk` in bytes; None: no reservation."""
        return cast("int | None", self.disk)

    def __repr__(self) -> str:  # never show env values: they may be secrets
        parts = [f"cpu={self.cpu:g}"]
        if self.ram is not None:
            parts.append(f"ram={self.ram}")
        if self.disk is not None:
            parts.append(f"disk={self.disk}")
        if self.device != "cpu":
            parts.append(f"device={self.device!r}, device_kind={self.device_kind!r}")
            parts.append(
                f"device_count={self.device_count}" if self.device == "gpu" else f"slices={self.slices}"
            )
        if self.env:
            parts.append("env=" + _redacted_env_repr(self.env))
        if self.hosts != 1:
            parts.append(f"hosts={self.hosts}")
        parts.append(f"max_retries_failure={self.max_retries_failure}")
        parts.append(f"max_retries_preemption={self.max_retries_preemption}")
        return f"ResourceConfig({', '.join(parts)})"


def _redacted_env_repr(env: object) -> str:
    from ._secrets import redact_env

    if isinstance(env, Mapping):
        return repr(redact_env({str(k): str(v) for k, v in env.items()}))
    return f"<{type(env).__name__}>"
