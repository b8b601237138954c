"""Model FLOPs utilization: the device's peak FLOP/s, and on CPU a measured matmul ceiling.

A CPU has no meaningful datasheet peak for this purpose, so there the "peak" is what a jitted square
matmul reaches on the same machine in the same process: MFU on CPU says how close the train step gets to
the best dense matmul XLA can do here.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per device (per chip for TPU), from vendor datasheets (no sparsity). Matched as
# substrings of `device_kind`, longest first: a variant ("h100 pcie", "l40s") before its family ("h100", "l4").
PEAK_BF16_FLOPS: dict[str, float] = {
    "h200": 989e12,
    "h100 pcie": 756e12,
    "h100 nvl": 835e12,
    "h100": 989e12,
    "gh200": 989e12,
    "b200": 2250e12,
    "a100": 312e12,
    "a10g": 70e12,
    "a10": 125e12,
    "l40s": 362e12,
    "l40": 181e12,
    "l4": 121e12,
    "v100": 125e12,
    "t4": 65e12,
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,
    "tpu v6e": 918e12,
}


def datasheet_peak(device: jax.Device) -> float | None:
    """The datasheet bf16 peak of `device` in FLOP/s, or None when unknown (and for CPUs)."""
    kind = device.device_kind.lower()
    for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if name in kind:
            return PEAK_BF16_FLOPS[name]
    return None


@functools.lru_cache(maxsize=8)
def matmul_ceiling(size: int = 2048, dtype: str = "float32", *, repeats: int = 5) -> float:
    """FLOP/s of a jitted `size x size` matmul on the default device (best of `repeats`).

    Args:
        size: the square matrix size.
        dtype: input dtype; "bfloat16" inputs accumulate in float32 (`preferred_element_type`), the way
            bf16 training computes.
        repeats: timed runs after one warm-up; the best is kept (the ceiling, not the average).

    Returns:
        Achieved FLOP/s (2 * size**3 per matmul).
    """
    dt = jnp.dtype(dtype)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (size, size), jnp.float32).astype(dt)
    b = jax.random.normal(k2, (size, size), jnp.float32).astype(dt)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def peak_flops(
    dtype: str = "float32", *, size: int = 1024, devices: list[jax.Device] | None = None
) -> tuple[float, str]:
    """Peak FLOP/s of `devices` (default: all local devices) together, and where the figure comes from.

    GPUs/TPUs use the datasheet bf16 peak (for float32 compute too: that is what MFU is quoted against).
    CPUs (and unknown accelerators) use the measured `size x size` matmul ceiling for `dtype` (1024 during
    training: as compute-bound as 2048 on CPUs but 8x cheaper to measure; the benchmark uses 2048); the
    fake devices of `--xla_force_host_platform_device_count` share the same cores, so the ceiling is not
    multiplied by their count.
    """
    devices = devices if devices is not None else jax.local_devices()
    peak = datasheet_peak(devices[0])
    if peak is not None:
        return peak * len(devices), f"datasheet bf16 peak of {len(devices)} x {devices[0].device_kind}"
    ceiling = matmul_ceiling(size, "bfloat16" if dtype == "bfloat16" else "float32", repeats=3)
    return ceiling, f"measured {size}x{size} {dtype} matmul ceiling on {devices[0].platform}"


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the peak."""
    return flops_per_token * tokens_per_second / peak if peak > 0 else 0.0
