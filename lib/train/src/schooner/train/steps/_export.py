"""The `hf_export` step: one checkpoint of a training run written in the Hugging Face layout.

A step of its own (not a flag of `train_lm`), so adding it to a finished run exports without training
again. What cannot be exported (quantile balancing's router bias, sigmoid routers, shared experts...) is
refused when the step is built, from the run's model config, naming the field. (`export_hf`, its name
before, is a deprecated alias: `schooner.model.export_hf` is the function that writes the folder.)
"""

from __future__ import annotations

import os
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle
from schooner.cluster import step as make_step
from schooner.train._export import VERSION, ExportHfConfig, _run_export_hf

from ._lm import trained_model_config


def hf_export(
    checkpoint: StepHandle | str,
    name: str | None = None,
    *,
    step: int | None = None,
    tokenizer: Any = None,
    dtype: str = "float32",
    max_shard_bytes: int = 5 * 10**9,
    chat_template: str | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step that writes a training run's checkpoint as a Hugging Face model folder.

    Args:
        checkpoint: the `train_lm` step handle (or a run folder or checkpoint folder path).
        name: the step's name; default `hf/<the train step's name>`.
        step: which checkpoint (its step number); None: the latest complete one.
        tokenizer: the tokenizer to ship (folder, file or step); None: the run's own (its `tokenizer`, else
            the one its datasets were tokenized with).
        dtype: "float32" or "bfloat16" tensors.
        max_shard_bytes: largest safetensors file (bigger models are sharded with an index).
        chat_template: the chat template `tokenizer_config.json` gets as Jinja ("schooner", "chatml"); None:
            the tokenizer folder's own, else the one the run's chat caches were rendered with, else the
            tokenizer's default when it has its tokens (none otherwise).
        resources: where it runs (runtime-only); None: in the runner's process.

    Returns:
        The step handle; its output folder loads with `transformers.AutoModelForCausalLM.from_pretrained`
        and with `schooner.model.import_hf`.

    Raises:
        ValueError: the run's model cannot be represented in an HF layout (the message names the field,
            e.g. `load_balancing='quantile'`), or a bad argument.

    Example:
        >>> model = train_lm("checkpoints/nano", ...)                            # doctest: +SKIP
        >>> hf = hf_export(model)                                               # doctest: +SKIP
        >>> StepRunner().run([lower(hf)])  # trains if needed, then exports       # doctest: +SKIP
    """
    from schooner.model import hf_export_problems

    sources: tuple = ()
    if isinstance(checkpoint, StepHandle):
        model_config = trained_model_config(checkpoint)
        if model_config is None:
            raise TypeError(
                f"export_hf: {checkpoint.name!r} is not a train_lm step; pass a train_lm handle or a path"
            )
        problems = hf_export_problems(model_config)
        if problems:
            raise ValueError(
                f"export_hf({checkpoint.name!r}): the run's model has no Hugging Face layout: "
                + "; ".join(problems)
                + "."
            )
        tc = checkpoint.config
        sources = tuple(x for x in (tc.tokenizer, *tc.inputs) if x is not None)
        default_name = f"hf/{checkpoint.name}"
    elif isinstance(checkpoint, str | os.PathLike):
        checkpoint = os.fspath(checkpoint)
        default_name = "hf/" + os.path.basename(checkpoint.rstrip("/"))
    else:
        raise TypeError(f"export_hf: checkpoint must be a train_lm handle or a path, got {checkpoint!r}")
    config = ExportHfConfig(
        run=checkpoint,
        step=step,
        tokenizer=tokenizer,
        tokenizer_sources=sources,
        dtype=dtype,
        max_shard_bytes=max_shard_bytes,
        chat_template=chat_template,
    )
    return make_step(
        name or default_name,
        _run_export_hf,
        config,
        version=VERSION,
        resources=resources,
        description=f"export {'the latest' if step is None else f'step {step}'} checkpoint in the HF layout",
    )
