"""RoPE: the TPU path's signed-permutation product equals the rotate-half form exactly, and both equal the
HF Llama formula (``rotate_half`` / ``apply_rotary_pos_emb``, written out in numpy float64 here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model._config import RopeConfig
from schooner.model._layers import apply_rope, rope_cos_sin


def _hf_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """HF ``LlamaRotaryEmbedding`` (default rope) + ``apply_rotary_pos_emb`` on x[B, T, N, H], float64."""
    _b, t, _n, h = x.shape
    inv_freq = 1.0 / (theta ** (np.arange(0, h, 2, dtype=np.float64) / h))
    freqs = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]
    x1, x2 = x[..., : h // 2], x[..., h // 2 :]
    rotate_half = np.concatenate([-x2, x1], axis=-1)
    return x * cos + rotate_half * sin


def _x(shape, dtype, seed=0) -> jax.Array:
    return (jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32) * 3).astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("h", [8, 64, 128])
def test_rope_by_matmul_equals_rotate_half_exactly(dtype, h):
    """Every output of the signed permutation is one input times +-1, so the two forms agree bit for bit
    (float32 at HIGHEST precision; bf16 accumulated in float32 and rounded back)."""
    x = _x((2, 17, 3, h), dtype)
    cos, sin = rope_cos_sin(17, h, RopeConfig())
    plain = jax.jit(lambda x: apply_rope(x, cos, sin))(x)
    by_matmul = jax.jit(lambda x: apply_rope(x, cos, sin, by_matmul=True))(x)
    assert by_matmul.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(by_matmul, np.float32), np.asarray(plain, np.float32))


def test_rope_by_matmul_gradient_equals_rotate_half_gradient():
    x = _x((1, 9, 2, 16), jnp.float32, seed=1)
    cos, sin = rope_cos_sin(9, 16, RopeConfig())
    cot = _x((1, 9, 2, 16), jnp.float32, seed=2)
    grad = lambda m: jax.grad(lambda x: jnp.sum(apply_rope(x, cos, sin, by_matmul=m) * cot))(x)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(grad(True)), np.asarray(grad(False)))


@pytest.mark.parametrize("by_matmul", [False, True])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_matches_the_hf_formula(by_matmul, theta):
    x = _x((2, 40, 2, 32), jnp.float32, seed=3)
    cos, sin = rope_cos_sin(40, 32, RopeConfig(theta=theta))
    got = np.asarray(apply_rope(x, cos, sin, by_matmul=by_matmul), np.float64)
    want = _hf_rope(np.asarray(x, np.float64), theta)
    # float32 angles (position x frequency) and products: a few ulps of |x| ~ 10.
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * 40)
    np.testing.assert_allclose(got[:, :8], want[:, :8], rtol=0, atol=1e-5)  # small angles: tighter


def test_the_tpu_path_rotates_by_a_matmul():
    """The model's attention on the "tpu" path takes the product, the other paths the slices."""
    x = _x((1, 4, 2, 8), jnp.float32)
    cos, sin = rope_cos_sin(4, 8, RopeConfig())
    assert "dot_general" in str(jax.make_jaxpr(lambda x: apply_rope(x, cos, sin, by_matmul=True))(x))
    assert "dot_general" not in str(jax.make_jaxpr(lambda x: apply_rope(x, cos, sin))(x))
