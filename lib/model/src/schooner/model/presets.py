"""Named model configs, from a CPU-sized nano model to Llama-3 8B and two MoEs.

Every preset is a plain config: change it with ``dataclasses.replace`` (``vocab_size`` from your
tokenizer, ``max_seq_len``, ``compute_dtype``...). ``PRESETS`` maps names to configs.

Example:
    >>> import dataclasses
    >>> from schooner.model import presets
    >>> cfg = dataclasses.replace(presets.llama_nano, vocab_size=1024)
"""

from __future__ import annotations

from ._config import LlamaConfig, MoEConfig, RopeConfig

_LLAMA3_ROPE = RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position_embeddings=8192)

llama_nano = LlamaConfig(
    vocab_size=512,
    hidden_dim=128,
    intermediate_dim=384,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_seq_len=512,
    tie_embeddings=True,
)
"""~0.7M parameters (+ 65k per 512 vocab): tests, the CPU tutorial; trains in fp32 on a laptop in seconds."""

llama_30m = LlamaConfig(
    vocab_size=32000,
    hidden_dim=384,
    intermediate_dim=1024,
    num_layers=8,
    num_heads=6,
    num_kv_heads=6,
    max_seq_len=1024,
    tie_embeddings=True,
)
"""~26.5M parameters with a 32k vocab: quick CPU/GPU experiments and the throughput benchmark."""

llama_1b = LlamaConfig(
    vocab_size=128256,
    hidden_dim=2048,
    intermediate_dim=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    max_seq_len=8192,
    rope=RopeConfig(theta=500000.0, kind="llama3", factor=32.0, original_max_position_embeddings=8192),
    tie_embeddings=True,
    gradient_checkpointing="save_carries",
)
"""Llama-3.2-1B shape (1.24B parameters)."""

llama_8b = LlamaConfig(
    vocab_size=128256,
    hidden_dim=4096,
    intermediate_dim=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    max_seq_len=8192,
    rope=_LLAMA3_ROPE,
    tie_embeddings=False,
    gradient_checkpointing="save_carries",
)
"""Llama-3.1-8B shape (8.03B parameters)."""

moe_small = MoEConfig(
    vocab_size=32000,
    hidden_dim=512,
    intermediate_dim=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    max_seq_len=1024,
    tie_embeddings=True,
    num_experts=8,
    num_experts_per_token=2,
    load_balancing="quantile",
)
"""8 experts, top-2, ~60M total / ~35M active parameters: MoE experiments on one accelerator."""

moe_large = MoEConfig(
    vocab_size=50304,
    hidden_dim=2048,
    intermediate_dim=1024,
    num_layers=16,
    num_heads=16,
    num_kv_heads=16,
    max_seq_len=4096,
    qk_norm=True,
    num_experts=64,
    num_experts_per_token=8,
    load_balancing="quantile",
    gradient_checkpointing="save_carries",
)
"""OLMoE-1B-7B shape: 64 experts, top-8, qk-norm (~6.9B total, ~1.3B active parameters)."""

PRESETS: dict[str, LlamaConfig] = {
    "llama_nano": llama_nano,
    "llama_30m": llama_30m,
    "llama_1b": llama_1b,
    "llama_8b": llama_8b,
    "moe_small": moe_small,
    "moe_large": moe_large,
}


def get_preset(name: str) -> LlamaConfig:
    """The preset called ``name`` (a key of ``PRESETS``)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}.")
    return PRESETS[name]
