"""The train step's memory without a device big enough to run it: compile the real step on shapes alone.

`estimate_step_memory(config)` builds the step `train()` would run for `config` (the same optimizer, mesh,
remat policy, microbatches and loss) and compiles it ahead of time on abstract arrays, for the backend this
process has: nothing of the model is allocated, so a 1B model's step is sized on a laptop. The figure is
what the preflight check (`CompiledStep`) compares with the device's memory: `StepMemory.total` (arguments,
outputs not donated, temporaries, code).

On another backend than the target's the figure is a lead, not a reading: the CPU compiler schedules and
fuses differently and takes other attention and matmul paths (the blocked attention where a GPU runs
cuDNN), so size with a margin and let the preflight check on the device have the last word.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._config import TrainerConfig
from ._memory import StepMemory, step_memory


def estimate_step_memory(config: TrainerConfig, model_config: Any = None) -> StepMemory | None:
    """The memory the train step of `config` needs per device (None where the backend does not say).

    Args:
        config: the run's `TrainerConfig` (its datasets are not read; `batch_size` at its largest stage).
        model_config: the model to size (default `config.model`).

    Example:
        >>> mem = estimate_step_memory(dataclasses.replace(cfg, batch_size=32))   # doctest: +SKIP
        >>> mem.total / 2**30                                                      # doctest: +SKIP
    """
    from ._lm import lm_loss
    from ._objective import Objective
    from ._trainer import Trainer

    model_config = config.model if model_config is None else model_config
    if model_config is None:
        raise ValueError("estimate_step_memory: give the model (TrainerConfig.model or model_config=)")
    trainer = Trainer(
        config,
        output_path="<estimate>",
        model_config=model_config,
        objective=Objective(loss=lm_loss(float(config.z_loss_weight))),
        data=None,  # type: ignore[arg-type]  # never read: nothing runs
    )
    trainer._setup_abstract()
    trainer._compile_step()
    state = trainer.abstract_state  # shapes only (the step takes its leaves); its in_shardings place them
    shape = (max(config.batch_sizes), config.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k in ("tokens", "loss_mask", "segment_ids")}
    return step_memory(trainer.step_fn.jitted.lower(jax.tree.leaves(state), batch).compile())
