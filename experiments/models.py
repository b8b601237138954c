"""Model configs experiments import by name (the presets of `schooner.model.presets`).

Every config is a frozen dataclass: adapt it with `dataclasses.replace(llama_nano, num_layers=2)`. The
`train_lm` step raises `vocab_size` to the tokenizer's vocabulary, so the presets' vocab sizes need no care.
"""

from schooner.model.presets import llama_1b as llama_1b
from schooner.model.presets import llama_8b as llama_8b
from schooner.model.presets import llama_30m as llama_30m
from schooner.model.presets import llama_nano as llama_nano
from schooner.model.presets import moe_large as moe_large
from schooner.model.presets import moe_small as moe_small

__all__ = ["llama_1b", "llama_8b", "llama_30m", "llama_nano", "moe_large", "moe_small"]
