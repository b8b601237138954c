"""KV-cache generation: greedy equals recomputing the prefix, batching, sampling, stop sequences."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import numpy as np
import pytest

from schooner.eval import SamplingConfig, generate_texts, generate_tokens, greedy_tokens
from schooner.model import RopeConfig, init, presets
from schooner.tokenize import train_bpe

from .rigged import chain_model


def _model(**changes):
    small = dict(
        vocab_size=97, num_layers=2, hidden_dim=32, intermediate_dim=64, num_heads=4, num_kv_heads=2, max_seq_len=64
    )  # fmt: skip
    config = dataclasses.replace(presets.llama_nano, **{**small, **changes})
    # larger weights than the default init, so the argmax is decided by the context, not by near-ties
    return init(dataclasses.replace(config, initializer_range=0.3), key=jax.random.key(1))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"qk_norm": True, "tie_embeddings": False},
        {"rope": RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position_embeddings=16)},
    ],
)
def test_greedy_with_the_cache_equals_recomputing_the_prefix(changes):
    model = _model(**changes)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 97, n).tolist() for n in (1, 5, 17)]
    got = generate_tokens(model, prompts, 20)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == greedy_tokens(model, prompt, 20)


@pytest.mark.slow  # 25-30 s each on 2 loaded cores (compiling the MoE twice, 60 recomputed prefixes)
@pytest.mark.parametrize(
    "changes",
    [
        {},  # softmax router, top-2 of 4, renormalised
        {"router_activation": "sigmoid", "normalize_topk": False, "num_shared_experts": 1},
    ],
)
def test_greedy_with_the_cache_equals_recomputing_the_prefix_for_moe(changes):
    small = dict(
        vocab_size=97, num_layers=2, hidden_dim=32, intermediate_dim=32, num_heads=4, num_kv_heads=2,
        max_seq_len=64, num_experts=4, num_experts_per_token=2, initializer_range=0.3,
    )  # fmt: skip
    config = dataclasses.replace(presets.moe_small, **{**small, **changes})
    model = init(config, key=jax.random.key(2))
    # a router bias as quantile balancing leaves it: it steers the choice, not the combine weights
    bias = jax.random.normal(jax.random.key(3), model.layers.stacked.mlp.router_bias.array.shape)
    model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, bias)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 97, n).tolist() for n in (1, 5, 17)]
    got = generate_tokens(model, prompts, 20)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == greedy_tokens(model, prompt, 20)
    capped = init(dataclasses.replace(config, capacity_factor=1.25), key=jax.random.key(2))
    with pytest.raises(NotImplementedError, match="needs dropless routing .* capacity_factor=1.25"):
        generate_tokens(capped, prompts, 4)


def test_a_prompt_decodes_the_same_alone_and_in_a_batch():
    model = _model()
    prompts = [[3, 4, 5], [7] * 30, [9, 2]]
    batch = generate_tokens(model, prompts, 12, eos_id=5)
    for prompt, row in zip(prompts, batch, strict=True):
        assert row == generate_tokens(model, [prompt], 12, eos_id=5)[0]
        assert 5 not in row[:-1]


def test_sampling_is_seeded_and_respects_top_k():
    model = _model()
    prompts = [[1, 2, 3], [4]]
    a = generate_tokens(model, prompts, 15, sampling=SamplingConfig(temperature=1.0, seed=3))
    assert a == generate_tokens(model, prompts, 15, sampling=SamplingConfig(temperature=1.0, seed=3))
    assert a != generate_tokens(model, prompts, 15, sampling=SamplingConfig(temperature=1.0, seed=4))
    greedy = generate_tokens(model, prompts, 15)
    assert generate_tokens(model, prompts, 15, sampling=SamplingConfig(temperature=1.0, top_k=1)) == greedy
    assert generate_tokens(model, prompts, 15, sampling=SamplingConfig(temperature=1.0, top_p=1e-9)) == greedy


def test_text_generation_cuts_at_stop_sequences_and_checks_lengths():
    tok = train_bpe(["The quick brown fox jumps over the lazy dog.\n"] * 8, vocab_size=280)
    model = _model(vocab_size=tok.vocab_size)
    free = generate_texts(model, tok, ["The", "fox"], 20, stop_at_eos=False)
    stopped = generate_texts(model, tok, ["The", "fox"], 20, stop=["o"], stop_at_eos=False)
    for a, b in zip(free, stopped, strict=True):
        assert a.startswith(b) and "o" not in b
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len=64"):
        generate_tokens(model, [[1] * 60], 10)


def test_generation_stops_at_extra_stop_token_ids_as_at_eos():
    """A chat model ends its answer with its end-of-turn token; transformers' `generate` stops at every id of
    `generation_config.eos_token_id` (`export_hf` writes [EOS, end-of-turn] for a chat model)."""
    tok = train_bpe(["The quick brown fox jumps over the lazy dog.\n"] * 8, vocab_size=280)
    eot, fox = tok.token_to_id("<|end_of_turn|>"), tok.encode(" fox")[-1]
    prompt = tok.encode("The quick")
    model = chain_model(_model(vocab_size=tok.vocab_size, tie_embeddings=False), {prompt[-1]: eot}, fox)
    assert generate_tokens(model, [prompt], 4) == [[eot, fox, fox, fox]]  # the rigged chain
    assert generate_tokens(model, [prompt], 4, eos_id=[tok.eos_id, eot]) == [[eot]]
    assert generate_texts(model, tok, [prompt], 4, stop_token_ids=[eot]) == [""]
    assert generate_texts(model, tok, [prompt], 4, stop_token_ids=[eot], stop_at_eos=False) == [""]
    assert generate_texts(model, tok, [prompt], 4, skip_special_tokens=True) == [tok.decode([fox] * 3)]
