"""KV-cache sampling: log-probs equal a full forward pass's, greedy equals recomputing the prefix, top-k/top-p
against numpy, stop reasons, and the same key giving the same samples."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import LlamaConfig, Samples, SamplingConfig, filter_logits, init, sample
from schooner.model._sampling import LENGTH, STOP_ID, STOP_SEQUENCE, _choose

CONFIG = LlamaConfig(
    vocab_size=97, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2,
    max_seq_len=64, compute_dtype="float32", initializer_range=0.3,
)  # fmt: skip
PROMPTS = [[3, 4, 5], [7] * 19, [9, 2]]


@pytest.fixture(scope="module")
def model():
    # larger weights than the default init, so the argmax is decided by the context, not by near-ties
    return init(CONFIG, key=jax.random.key(1))


def _forward_logprobs(model, prompts, out: Samples, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) of each sampled token, from one full forward pass over prompt + completion."""
    rows = [prompts[p] + c for p, c in zip(out.prompt_index, out.completions(), strict=True)]
    buf = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, r in enumerate(rows):
        buf[i, : len(r)] = r
    logp = np.asarray(_log_softmax(model, jnp.asarray(buf), temperature))
    want = np.zeros(out.logprobs.shape, np.float32)
    for i, c in enumerate(out.completions()):
        start = len(prompts[out.prompt_index[i]])
        for j, t in enumerate(c):
            want[i, j] = logp[i, start - 1 + j, t]
    return want


@jax.jit
def _log_softmax(model, tokens, temperature):
    # jitted: op by op the forward pass took most of each test's time
    return jax.nn.log_softmax(model(tokens) / temperature, axis=-1)


@jax.jit
def _argmax_at(model, tokens, position):
    return jnp.argmax(model(tokens)[0, position])


def _greedy_by_recomputing(model, prompt: list[int], steps: int) -> list[int]:
    """Each token the argmax of a full forward pass over the whole prefix (in a fixed-shape, right-padded
    buffer: causal attention keeps the padding out, and it compiles once)."""
    buf = np.zeros((1, CONFIG.max_seq_len), np.int32)
    ids = list(prompt)
    for _ in range(steps):
        buf[0, : len(ids)] = ids
        ids.append(int(_argmax_at(model, jnp.asarray(buf), len(ids) - 1)))
    return ids[len(prompt) :]


def test_sampled_logprobs_equal_a_full_forward_pass(model):
    cfg = SamplingConfig(temperature=0.7, top_p=0.9, n=3, max_new_tokens=24, stop_ids=(5, 11))
    out = sample(model, PROMPTS, cfg, key=jax.random.key(0))
    assert out.tokens.shape == out.logprobs.shape == out.mask.shape == (9, 24)
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    want = _forward_logprobs(model, PROMPTS, out, 0.7)
    np.testing.assert_allclose(out.logprobs, want, atol=1e-5, rtol=0)
    assert (out.logprobs[~out.mask] == 0).all() and (out.logprobs[out.mask] < 0).all()
    assert len({tuple(c) for c in out.completions()[:3]}) > 1  # the n samples of a prompt differ


def test_greedy_equals_recomputing_the_prefix_and_records_untempered_logprobs(model):
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=20)
    out = sample(model, PROMPTS, cfg, key=jax.random.key(7))
    for prompt, row in zip(PROMPTS, out.completions(), strict=True):
        assert row == _greedy_by_recomputing(model, prompt, 20)
    np.testing.assert_allclose(out.logprobs, _forward_logprobs(model, PROMPTS, out, 1.0), atol=1e-5, rtol=0)
    assert out.stop_reasons == (LENGTH,) * 3 and out.mask.all()
    # the key plays no part in greedy decoding; a prompt decodes alike alone and in the batch
    again = sample(model, PROMPTS[1:2], cfg, key=jax.random.key(8))
    assert again.completions()[0] == out.completions()[1]


def test_stop_ids_and_the_stop_callable_end_rows_with_their_reason(model):
    greedy = sample(model, PROMPTS, SamplingConfig(temperature=0.0, max_new_tokens=12), key=jax.random.key(0))
    rows = greedy.completions()
    stop_at = rows[0][3]  # prompt 0's 4th token: row 0 ends there, at its first occurrence
    first = rows[0].index(stop_at)
    calls = []

    def stop(row: int, new: list[int]) -> bool:
        calls.append(row)
        return row == 2 and len(new) == 5

    cfg = SamplingConfig(temperature=0.0, max_new_tokens=12, stop_ids=(stop_at,))
    out = sample(model, PROMPTS, cfg, key=jax.random.key(0), stop=stop, pad_id=-1)
    assert out.completions()[0] == rows[0][: first + 1]
    assert out.stop_reasons[0] == STOP_ID and out.lengths[0] == first + 1
    assert (out.tokens[0, first + 1 :] == -1).all() and not out.mask[0, first + 1 :].any()
    assert out.stop_reasons[2] == STOP_SEQUENCE and out.completions()[2] == rows[2][:5]
    if stop_at not in rows[1]:
        assert out.stop_reasons[1] == LENGTH and out.completions()[1] == rows[1]
    assert calls.count(0) == first  # asked after each token but its stop id, and not after its end


def test_the_same_key_gives_the_same_samples(model):
    cfg = SamplingConfig(temperature=1.0, top_k=20, n=2, max_new_tokens=40)  # two device chunks
    a = sample(model, PROMPTS, cfg, key=jax.random.key(3))
    b = sample(model, PROMPTS, cfg, key=jax.random.key(3))
    c = sample(model, PROMPTS, cfg, key=jax.random.key(4))
    for x in ("tokens", "logprobs", "mask"):
        np.testing.assert_array_equal(getattr(a, x), getattr(b, x))
    assert a.stop_reasons == b.stop_reasons
    assert not np.array_equal(a.tokens, c.tokens)


def _numpy_filter(z: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """The kept tokens of each row, by sorting: top-k, then the smallest most-likely set whose probability
    reaches top_p; a token tied with the last one kept is kept too."""
    keep = np.ones(z.shape, bool)
    z = z.astype(np.float64)
    if top_k is not None:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        keep &= z >= kth
    if top_p is not None:
        for i, row in enumerate(np.where(keep, z, -np.inf)):
            desc = np.sort(row)[::-1]
            p = np.exp(desc - desc[0])
            p /= p.sum()
            n = int(np.searchsorted(np.cumsum(p), top_p - 1e-7)) + 1  # smallest n with mass >= top_p
            keep[i] &= row >= desc[n - 1]
    return keep


@pytest.mark.parametrize(
    ("top_k", "top_p"), [(None, 0.5), (None, 0.9), (None, 0.999), (5, None), (10, 0.8), (None, 1e-9)]
)
def test_top_k_and_top_p_keep_the_numpy_reference_set(top_k, top_p):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(128, 50)) * np.exp(rng.uniform(np.log(0.01), np.log(30), size=(128, 1)))
    z[:8, :4] = 3.0  # ties at the top
    z[8:16, 10:13] = z[8:16, 10:11]  # ties anywhere
    got = np.isfinite(np.asarray(filter_logits(jnp.asarray(z, jnp.float32), top_k=top_k, top_p=top_p)))
    want = _numpy_filter(z.astype(np.float32), top_k, top_p)
    np.testing.assert_array_equal(got, want)


def test_samples_follow_the_truncated_distribution_and_logprobs_the_untruncated_one():
    z = jnp.asarray([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])
    temperature, top_p = 0.8, 0.7
    draws = 20000
    keys = jax.random.split(jax.random.key(0), draws)
    tokens, logps = jax.vmap(lambda k: _choose(z, k, (temperature, None, top_p)))(keys)
    tokens, logps = np.asarray(tokens[:, 0]), np.asarray(logps[:, 0])
    full = np.asarray(jax.nn.log_softmax(z[0] / temperature))
    np.testing.assert_allclose(logps, full[tokens], atol=1e-6)
    p = np.exp(full)
    kept = _numpy_filter(np.asarray(z) / temperature, None, top_p)[0]
    assert kept.tolist() == [True, True, False, False, False, False]
    want = np.where(kept, p, 0) / p[kept].sum()
    freq = np.bincount(tokens, minlength=6) / draws
    np.testing.assert_allclose(freq, want, atol=4 * np.sqrt(0.25 / draws))


def test_bad_input_is_refused_naming_the_prompt(model):
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sample(model, [[1], []], key=key)
    with pytest.raises(ValueError, match="prompt 0 holds token id 97 but the model's vocabulary has 97"):
        sample(model, [[97]], key=key)
    with pytest.raises(ValueError, match="prompt 1 \\(60 tokens\\) plus max_new_tokens=10 exceeds"):
        sample(model, [[1], [1] * 60], SamplingConfig(max_new_tokens=10), key=key)
    for bad in (
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": 0},
        {"n": 0},
        {"max_new_tokens": -1},
        {"stop_ids": (-2,)},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingConfig(**bad)
    assert SamplingConfig(stop_ids=[2, np.int64(3)]).stop_ids == (2, 3)
    empty = sample(model, [[1, 2]], dataclasses.replace(SamplingConfig(), max_new_tokens=0), key=key)
    assert empty.tokens.shape == (1, 0) and empty.stop_reasons == (LENGTH,)


@pytest.mark.slow  # compiles a dropless MoE twice (~30 s on 2 loaded cores)
def test_moe_sampled_logprobs_equal_a_full_forward_pass():
    from schooner.model import MoEConfig

    config = MoEConfig(
        vocab_size=97, hidden_dim=32, intermediate_dim=16, num_layers=2, num_heads=4, num_kv_heads=2,
        max_seq_len=64, num_experts=4, num_experts_per_token=2, num_shared_experts=1, compute_dtype="float32",
        initializer_range=0.3,
    )  # fmt: skip
    moe = init(config, key=jax.random.key(2))
    cfg = SamplingConfig(temperature=0.8, top_p=0.9, n=2, max_new_tokens=16)
    out = sample(moe, PROMPTS, cfg, key=jax.random.key(0))
    np.testing.assert_allclose(out.logprobs, _forward_logprobs(moe, PROMPTS, out, 0.8), atol=1e-5, rtol=0)
