"""Shared tiny configs for the model tests (kept small so the default run stays fast on 2 cores)."""

import dataclasses

import jax
import pytest

from schooner.model import LlamaConfig, MoEConfig


@pytest.fixture
def tiny_dense() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=97,
        hidden_dim=32,
        intermediate_dim=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=64,
        compute_dtype="float32",
    )


@pytest.fixture
def tiny_moe() -> MoEConfig:
    return MoEConfig(
        vocab_size=97,
        hidden_dim=32,
        intermediate_dim=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=64,
        num_experts=4,
        num_experts_per_token=2,
        compute_dtype="float32",
    )


@pytest.fixture
def tokens():
    def make(batch: int, seq: int, vocab: int, seed: int = 0) -> jax.Array:
        return jax.random.randint(jax.random.PRNGKey(seed), (batch, seq), 0, vocab)

    return make


def replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)
