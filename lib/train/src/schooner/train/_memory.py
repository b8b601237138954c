"""The preflight memory check: the compiled train step's memory against the device's, before the first step.

XLA knows after compiling how much memory a program needs (``compiled.memory_analysis()``: its arguments,
outputs and temporaries, less what donation lets outputs reuse). ``train()`` compiles the step ahead of
its first run (:class:`CompiledStep`) and compares that figure with what the device can hold
(``device.memory_stats()["bytes_limit"]`` on GPUs and TPUs, the machine's RAM on CPU), so a step that
cannot fit fails at once with the figures and the options that fit it (a smaller batch, microbatches, a
remat policy), instead of a RESOURCE_EXHAUSTED traceback from inside XLA. A compile that XLA itself
refuses for lack of memory (TPU compiles do) gets the same message.

``SCHOONER_DEVICE_MEMORY_BYTES`` overrides the device's limit (e.g. to leave room for another program, or
to test the check); ``SCHOONER_MEMORY_CHECK=0`` turns the check off.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax

_GIB = 1 << 30
_UNITS = ((1 << 40, "TiB"), (_GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory")


def format_bytes(n: int | float) -> str:
    """``n`` bytes in the largest binary unit it reaches, e.g. ``"14.75 GiB"``, ``"512.00 MiB"``, ``"900 B"``."""
    for size, unit in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


class StepMemoryError(MemoryError):
    """The train step needs more memory than the device has (found before its first run)."""


StepMemoryError.__module__ = "schooner.train"  # tracebacks name it where users import it from


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """What a compiled program holds on its device, in bytes (``compiled.memory_analysis()``)."""

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        """Arguments + outputs not aliased to (donated) arguments + temporaries + generated code."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    def describe(self) -> str:
        return (
            f"{format_bytes(self.total)} (arguments {format_bytes(self.arguments)}, outputs not donated "
            f"{format_bytes(self.outputs - self.aliased)}, temporaries {format_bytes(self.temporaries)}, code "
            f"{format_bytes(self.code)})"
        )


def step_memory(compiled: Any) -> StepMemory | None:
    """The memory ``compiled`` (a ``jax.stages.Compiled``) needs, or None where the backend does not say."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return StepMemory(
        arguments=int(stats.argument_size_in_bytes),
        outputs=int(stats.output_size_in_bytes),
        aliased=int(stats.alias_size_in_bytes),
        temporaries=int(stats.temp_size_in_bytes),
        code=int(stats.generated_code_size_in_bytes),
    )


def local_device(sharding: Any) -> jax.Device:
    """The device of this process whose memory the check compares with: the lowest-id device of
    ``sharding`` that this process addresses (the train step's shards are alike on every device of its
    mesh), else this process's first device. On several hosts the sharding spans other processes' devices
    too, whose memory this process cannot ask about."""
    mine = [d for d in sharding.device_set if d.process_index == jax.process_index()]
    return min(mine, key=lambda d: d.id) if mine else jax.local_devices()[0]


def device_memory_limit(device: jax.Device) -> tuple[int, str] | None:
    """(bytes, where the figure comes from) that one program may hold on ``device``, or None if unknown."""
    override = os.environ.get("SCHOONER_DEVICE_MEMORY_BYTES")
    if override:
        try:
            return int(float(override)), "SCHOONER_DEVICE_MEMORY_BYTES"
        except ValueError:
            raise ValueError(
                f"SCHOONER_DEVICE_MEMORY_BYTES must be a number of bytes; got {override!r}"
            ) from None
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} memory limit"
    if device.platform == "cpu":
        import psutil

        share = len(jax.local_devices(backend="cpu"))  # fake CPU devices share the RAM
        return int(psutil.virtual_memory().total) // share, f"this machine's RAM / {share} CPU device(s)"
    return None


def advice(model_config: Any, batch_size: int, microbatches: int) -> str:
    """The options that lower a step's memory, with this run's values filled in."""
    policy = getattr(model_config, "gradient_checkpointing", None)
    lighter = {"none": "dots", "dots": "save_carries"}.get(str(policy))
    options = [
        f"a smaller batch_size (now {batch_size})",
        f"more microbatches (`microbatches=` of train_lm or TrainerConfig, now {microbatches}; the batch size must divide by it)",
    ]
    if lighter:
        options.append(
            f"a remat policy that keeps less: dataclasses.replace(model, gradient_checkpointing={lighter!r}) "
            f"(now {policy!r}; from most memory to least: 'none', 'dots', 'save_carries')"
        )
    options.append("a shorter seq_len, or more devices (MeshConfig fsdp/tensor) to split the parameters")
    return "; ".join(options)


def check_fits(memory: StepMemory, limit: tuple[int, str], hint: str) -> None:
    """Raise :class:`StepMemoryError` when ``memory`` exceeds ``limit``."""
    bytes_, source = limit
    if memory.total > bytes_:
        raise StepMemoryError(
            f"the train step needs {memory.describe()} but the device holds {format_bytes(bytes_)} ({source}); "
            f"it would fail with RESOURCE_EXHAUSTED. Options: {hint}. (SCHOONER_MEMORY_CHECK=0 skips this check.)"
        )


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is XLA's refusal for lack of device memory (at compile or run time)."""
    text = str(error)
    return any(marker in text for marker in _OOM_MARKERS)


class CompiledStep:
    """The jitted step compiled ahead of time for each batch shape, its memory checked before it first runs.

    ``CompiledStep(jitted, hint, bound=(x,))(state, batch)`` runs ``jitted(state, x, batch)``. The first
    batch of each shape lowers and compiles the step, checks :func:`step_memory` against
    :func:`device_memory_limit` (raising :class:`StepMemoryError` with ``hint``), logs the figures, and
    keeps the compiled program for that shape.
    """

    def __init__(
        self,
        jitted: Any,
        hint: str,
        *,
        bound: tuple[Any, ...] = (),
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.jitted = jitted
        self.hint = hint
        self.bound = bound
        self.log = log
        self.compiled: dict[Any, Any] = {}
        self.memory: dict[Any, StepMemory | None] = {}

    def __call__(self, state: Any, batch: dict[str, Any]) -> Any:
        key = tuple(sorted((k, v.shape, v.dtype) for k, v in batch.items()))  # per step: no str()
        if key not in self.compiled:
            self.compiled[key] = self._compile(key, state, batch)
        return self.compiled[key](state, *self.bound, batch)

    def _compile(self, key: Any, state: Any, batch: dict[str, Any]) -> Any:
        try:
            compiled = self.jitted.lower(state, *self.bound, batch).compile()
        except Exception as e:  # XLA's own refusal (TPU compiles check memory): the same advice
            if is_out_of_memory(e):
                raise StepMemoryError(
                    f"XLA could not fit the train step in device memory when compiling it: {_first_line(e)}. "
                    f"Options: {self.hint}."
                ) from e
            raise
        memory = step_memory(compiled)
        self.memory[key] = memory
        if memory is None:
            return compiled
        limit = device_memory_limit(local_device(next(iter(jax.tree.leaves(batch))).sharding))
        if self.log is not None:
            where = f" of {limit[1]} {format_bytes(limit[0])}" if limit else ""
            self.log(f"train step memory per device: {memory.describe()}{where}")
        if limit is not None and os.environ.get("SCHOONER_MEMORY_CHECK", "1") != "0":
            check_fits(memory, limit, self.hint)
        return compiled


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
