"""The fused output projection + cross-entropy against plain autodiff of the textbook formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model._xent import output_cross_entropy

B, T, D, V = 2, 10, 16, 37


def _reference(hidden, head, targets):
    logits = jnp.einsum("btd,vd->btv", hidden.astype(jnp.float32), head.astype(jnp.float32))
    lse = jax.nn.logsumexp(logits, axis=-1)
    tl = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return lse - tl, lse


def _weighted(fn, w_nll, w_lse):
    """A scalar using both outputs with different weights, so both cotangents are exercised."""

    def f(hidden, head):
        nll, lse = fn(hidden, head)
        return jnp.sum(w_nll * nll) + jnp.sum(w_lse * lse * lse)

    return jax.value_and_grad(f, argnums=(0, 1))


def _inputs(dtype=jnp.float32, scale=1.0, seed=0):
    k1, k2, k3, k4, k5 = jax.random.split(jax.random.PRNGKey(seed), 5)
    hidden = (scale * jax.random.normal(k1, (B, T, D))).astype(dtype)
    head = jax.random.normal(k2, (V, D)) / np.sqrt(D)
    targets = jax.random.randint(k3, (B, T), 0, V)
    w_nll = jax.random.uniform(k4, (B, T))
    w_lse = 1e-2 * jax.random.uniform(k5, (B, T))
    return hidden, head, targets, w_nll, w_lse


KERNELS = pytest.mark.parametrize("kernels", ["cpu", "xla"])


@KERNELS
@pytest.mark.parametrize("keep_probs", [True, False])
@pytest.mark.parametrize("chunk", [None, 1, 3, T])
def test_values_and_gradients_match_autodiff_in_float32(keep_probs, chunk, kernels):
    hidden, head, targets, w_nll, w_lse = _inputs()
    got_nll, got_lse = output_cross_entropy(
        hidden, head, targets, chunk_positions=chunk, keep_probs=keep_probs, kernels=kernels
    )
    want_nll, want_lse = _reference(hidden, head, targets)
    np.testing.assert_allclose(got_nll, want_nll, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_lse, want_lse, rtol=1e-5, atol=1e-6)

    fused = lambda h, w: output_cross_entropy(  # noqa: E731
        h, w, targets, chunk_positions=chunk, keep_probs=keep_probs, kernels=kernels
    )
    (v1, (gh1, gw1)) = jax.jit(_weighted(fused, w_nll, w_lse))(hidden, head)
    (v2, (gh2, gw2)) = jax.jit(_weighted(lambda h, w: _reference(h, w, targets), w_nll, w_lse))(hidden, head)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    assert gh1.dtype == hidden.dtype and gw1.dtype == head.dtype
    np.testing.assert_allclose(gh1, gh2, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-4, atol=1e-6)


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@KERNELS
@pytest.mark.parametrize("keep_probs", [True, False])
def test_bf16_gradients_keep_their_precision_when_the_model_is_confident(keep_probs, kernels):
    # Orthonormal output embeddings and hidden states alpha * e(target): every logit is 0 except the
    # target's alpha, so p(target) = 0.995 exactly and d logits at the target is the small p_t - 1 = -0.005.
    # Taking it from a bf16-rounded probability (0.99609375) would be 20% off and dominate the gradient.
    d, v = 64, 37
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(d, d)))
    head = jnp.asarray(q[:v], jnp.float32)
    targets = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, v)
    alpha = np.log((v - 1) * 0.995 / 0.005)
    hidden = (alpha * head[targets]).astype(jnp.bfloat16)
    w_nll = jax.random.uniform(jax.random.PRNGKey(2), (B, T))
    w_lse = jnp.zeros((B, T))
    nll, _ = _reference(hidden, head, targets)
    np.testing.assert_allclose(np.exp(-nll), 0.995, atol=2e-3)

    fused = lambda h, w: output_cross_entropy(  # noqa: E731
        h, w, targets, chunk_positions=3, keep_probs=keep_probs, kernels=kernels
    )
    (_, (gh1, gw1)) = jax.jit(_weighted(fused, w_nll, w_lse))(hidden, head)
    ref = jax.jit(_weighted(lambda h, w: _reference(h, w, targets), w_nll, w_lse))
    (_, (gh2, gw2)) = ref(hidden.astype(jnp.float32), head)
    assert gh1.dtype == jnp.bfloat16 and gw1.dtype == jnp.float32
    # bf16 operands in the matmuls cost a few parts in a thousand, not the 20% a rounded p_t gives.
    assert _rel_err(gw1, gw2) < 2e-2
    assert _rel_err(gh1, gh2) < 2e-2


@KERNELS
@pytest.mark.parametrize("keep_probs", [True, False])
@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_bf16_gradients_match_the_float32_reference_on_random_inputs(keep_probs, chunk, kernels):
    # chunk=None is a single chunk: XLA inlines the one-trip loops, which must still compile to products
    # XLA:CPU can run in bf16.
    hidden, head, targets, w_nll, w_lse = _inputs(jnp.bfloat16, scale=3.0)
    fused = lambda h, w: output_cross_entropy(  # noqa: E731
        h, w, targets, chunk_positions=chunk, keep_probs=keep_probs, kernels=kernels
    )
    (v1, (gh1, gw1)) = jax.jit(_weighted(fused, w_nll, w_lse))(hidden, head)
    ref = jax.jit(_weighted(lambda h, w: _reference(h, w, targets), w_nll, w_lse))
    (v2, (gh2, gw2)) = ref(hidden.astype(jnp.float32), head)
    np.testing.assert_allclose(v1, v2, rtol=1e-2)
    assert _rel_err(gw1, gw2) < 2e-2
    assert _rel_err(gh1, gh2) < 2e-2


def test_without_keep_probs_no_tokens_by_vocab_array_is_held():
    b, t, d, v = 4, 256, 32, 4096  # full logits: 4 MiB in float32
    hidden = jnp.ones((b, t, d), jnp.bfloat16)
    head = jnp.ones((v, d), jnp.float32)
    targets = jnp.zeros((b, t), jnp.int32)

    def temp_bytes(keep_probs, kernels="cpu"):
        def f(h, w):
            nll, _ = output_cross_entropy(
                h, w, targets, chunk_positions=16, keep_probs=keep_probs, kernels=kernels
            )
            return jnp.sum(nll)

        return (
            jax.jit(jax.grad(f, argnums=(0, 1)))
            .lower(hidden, head)
            .compile()
            .memory_analysis()
            .temp_size_in_bytes
        )

    full_logits = b * t * v * 4
    # keep_probs holds the [b*t, v] softmax in bf16 (half the float32 logits) for the backward...
    assert temp_bytes(True) >= full_logits // 2
    # ...without it only a chunk of 16 positions (1/16 of the logits) is ever live, plus small arrays.
    assert temp_bytes(False) < full_logits // 4
    # The plain ("xla") path always recomputes each chunk's logits in the backward.
    assert temp_bytes(True, "xla") < full_logits // 4


def test_automatic_chunks_are_balanced_and_bounded(monkeypatch):
    from schooner.model import _xent

    # 8 x 10 x 37 float32 logits = 11,840 bytes; a 3,000-byte budget asks for 4 chunks of 3 positions (not
    # 3 + 3 + 3 + 1), and at most 8 chunks whatever the budget.
    assert (
        _xent.balanced_chunk(10, 3) == 3
        and _xent.balanced_chunk(10, 9) == 5
        and _xent.balanced_chunk(10, 50) == 10
    )
    monkeypatch.setattr(_xent, "_AUTO_CHUNK_BYTES", 3000)
    assert _xent.auto_chunk_positions(8, 10, 37) == 3
    monkeypatch.setattr(_xent, "_AUTO_CHUNK_BYTES", 1)
    assert _xent.auto_chunk_positions(8, 100, 37) == 13  # 8 chunks of 13 positions
    # Several automatic chunks give the same values and gradients as the reference.
    hidden, head, targets, w_nll, w_lse = _inputs()
    (v1, (gh1, gw1)) = jax.jit(_weighted(lambda h, w: output_cross_entropy(h, w, targets), w_nll, w_lse))(
        hidden, head
    )
    (v2, (gh2, gw2)) = jax.jit(_weighted(lambda h, w: _reference(h, w, targets), w_nll, w_lse))(hidden, head)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    np.testing.assert_allclose(gh1, gh2, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-4, atol=1e-6)


@KERNELS
def test_edge_cases(kernels):
    hidden, head, targets, _, _ = _inputs()
    nll, lse = output_cross_entropy(
        hidden, head, targets, chunk_positions=10 * T, kernels=kernels
    )  # chunk > T
    np.testing.assert_allclose(nll, _reference(hidden, head, targets)[0], rtol=1e-5, atol=1e-6)
    nll, lse = output_cross_entropy(hidden[:, :0], head, targets[:, :0], kernels=kernels)  # no positions
    assert nll.shape == lse.shape == (B, 0)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="chunk_positions must be an int >= 1"):
            output_cross_entropy(hidden, head, targets, chunk_positions=bad)


@pytest.mark.parametrize("kernels", ["xla", "tpu"])
def test_accelerator_paths_take_as_many_automatic_chunks_as_the_budget_needs(monkeypatch, kernels):
    """Off the CPU path the automatic chunk count is uncapped (the CPU path stops at 8): with a budget of
    one position of the batch, every one of T=10 positions is its own chunk, and the loss and gradients
    still equal the full-logits reference."""
    from schooner.model import _xent

    monkeypatch.setattr(_xent, "_AUTO_CHUNK_BYTES", B * V * 4)  # one position's float32 logits
    assert _xent.auto_chunk_positions(B, T, V, max_chunks=None) == 1
    assert _xent.auto_chunk_positions(B, T, V) == 2  # capped at 8 chunks: 5 chunks of 2
    hidden, head, targets, w_nll, w_lse = _inputs(seed=3)

    def chunks_in(kernels: str) -> str:
        f = lambda h, w: output_cross_entropy(h, w, targets, kernels=kernels)  # noqa: E731
        return str(jax.make_jaxpr(f)(hidden, head))

    assert f"f32[{T},{B},1,{D}]" in chunks_in(kernels)  # T chunks of one position
    assert f"f32[5,{B},2,{D}]" in chunks_in("cpu") and f"f32[{T},{B},1,{D}]" not in chunks_in("cpu")

    fused = lambda h, w: output_cross_entropy(h, w, targets, kernels=kernels)  # noqa: E731
    (v1, (gh1, gw1)) = jax.jit(_weighted(fused, w_nll, w_lse))(hidden, head)
    (v2, (gh2, gw2)) = jax.jit(_weighted(lambda h, w: _reference(h, w, targets), w_nll, w_lse))(hidden, head)
    nll, lse = output_cross_entropy(hidden, head, targets, kernels=kernels)
    want_nll, want_lse = _reference(hidden, head, targets)
    np.testing.assert_allclose(nll, want_nll, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    np.testing.assert_allclose(gh1, gh2, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-4, atol=1e-6)
