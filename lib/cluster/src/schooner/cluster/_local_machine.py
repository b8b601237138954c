"""What this machine offers to `LocalClient`: cores, memory and accelerators, and whether a request fits."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

from ._client import ResourcesUnavailableError
from ._resources import ResourceConfig


@dataclass(frozen=True)
class Machine:
    """Capacity `LocalClient` schedules against."""

    cpus: float
    """Cores available to this process (affinity mask and cgroup CPU quota respected)."""
    memory: int
    """Bytes of memory (physical memory, or the cgroup limit when lower)."""
    gpus: tuple[str, ...] = ()
    """Model name of each visible GPU, e.g. ('NVIDIA H100 80GB HBM3',)."""
    gpu_ids: tuple[str, ...] = ()
    """CUDA device index of each entry of `gpus` (what CUDA_VISIBLE_DEVICES takes)."""
    tpu_chips: int = 0
    """TPU chips attached to this host (0 when none)."""

    def check(self, resources: ResourceConfig, *, what: str = "job") -> None:
        """Raise `ResourcesUnavailableError` when `resources` can never be satisfied here."""
        if resources.cpu > self.cpus:
            raise ResourcesUnavailableError(
                f"{what} asks for cpu={resources.cpu:g} but this client has {self.cpus:g} cores; "
                f"lower ResourceConfig.cpu or run it on a cluster (RayClient)"
            )
        if resources.ram_bytes is not None and resources.ram_bytes > self.memory:
            raise ResourcesUnavailableError(
                f"{what} asks for ram={_gib(resources.ram_bytes)} but this client has {_gib(self.memory)} of memory; "
                f"lower ResourceConfig.ram or run it on a cluster (RayClient)"
            )
        if resources.device == "gpu":
            matching = [g for g in self.gpus if gpu_matches(resources.device_kind or "", g)]
            if resources.device_count > len(matching):
                have = ", ".join(self.gpus) if self.gpus else "no GPUs"
                raise ResourcesUnavailableError(
                    f"{what} asks for device_count={resources.device_count} GPUs of "
                    f"device_kind={resources.device_kind!r} but this machine has {have}; "
                    f"use a machine or cluster that has them, or ResourceConfig.with_cpu()"
                )
        if resources.device == "tpu" and resources.tpu_chips * resources.slices > self.tpu_chips:
            raise ResourcesUnavailableError(
                f"{what} asks for device_kind={resources.device_kind!r} x slices={resources.slices} "
                f"({resources.tpu_chips * resources.slices} TPU chips) but this machine has {self.tpu_chips}; "
                f"run it on a TPU cluster (RayClient) or use ResourceConfig.with_cpu()"
            )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB ({n} bytes)"


def gpu_matches(kind: str, name: str) -> bool:
    """'H100' matches 'NVIDIA H100 80GB HBM3'; 'A100-80G' matches an A100 with 80GB."""
    base, _, mem = kind.upper().partition("-")
    name = name.upper().replace("-", " ")
    if base not in name.split():
        return False
    return not mem or mem.rstrip("G") + "GB" in name.replace(" ", "")


def _cgroup_cpus() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _cgroup_memory() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text != "max" and int(text) < 2**60:
                return int(text)
        except (OSError, ValueError):
            continue
    return None


def _gpus() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, CUDA indices) of the GPUs this process may use, from nvidia-smi (none without a driver)."""
    if not glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi") is None:
        return (), ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return (), ()
    found = [tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines() if "," in line]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # respect a restriction the user already made
        allowed = [v.strip() for v in visible.split(",") if v.strip()]
        found = [f for f in found if f[0] in allowed]
    return tuple(name for _, name in found), tuple(idx for idx, _ in found)


@functools.cache
def detect_machine() -> Machine:
    """This machine's capacity, measured once per process."""
    import psutil

    cpus: float = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (psutil.cpu_count() or 1)
    )
    quota = _cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, max(1.0, quota))
    memory = psutil.virtual_memory().total
    limit = _cgroup_memory()
    if limit is not None:
        memory = min(memory, limit)
    tpu_chips = len(glob.glob("/dev/accel[0-9]*")) or len(glob.glob("/dev/vfio/[0-9]*"))
    gpus, gpu_ids = _gpus()
    return Machine(cpus=float(cpus), memory=int(memory), gpus=gpus, gpu_ids=gpu_ids, tpu_chips=tpu_chips)
