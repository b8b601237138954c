import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import init, loss_fn, target_mask_to_loss_mask, target_weights, token_losses


@eqx.filter_jit
def run(model, tokens, segment_ids=None):
    return model(tokens, segment_ids=segment_ids)


@eqx.filter_jit
def loss_and_grad(model, tokens, segment_ids, loss_mask, z):
    # Tests call this with the same shapes and argument kinds so one compilation serves them all.
    f = lambda m: loss_fn(m, tokens, segment_ids=segment_ids, loss_mask=loss_mask, z_loss_weight=z)  # noqa: E731
    return jax.value_and_grad(f, has_aux=True)(model)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_eos_rule_on_a_hand_made_row():
    eos = 2
    toks = jnp.array([[5, 6, eos, 7, 8, eos, 9]])
    # The loader's rule: a new segment starts AFTER each EOS.
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 2]])
    w = np.asarray(target_weights(toks, seg))
    # predictions: 5->6 yes, 6->EOS yes, EOS->7 no, 7->8 yes, 8->EOS yes, EOS->9 no
    np.testing.assert_array_equal(w, [[1, 1, 0, 1, 1, 0]])
    mask = jnp.array([[1, 1, 1, 1, 0, 1, 1]])
    np.testing.assert_array_equal(np.asarray(target_weights(toks, seg, mask)), [[1, 1, 0, 1, 0, 0]])
    np.testing.assert_array_equal(np.asarray(target_weights(toks, seg, mask[:, :-1])), [[1, 1, 0, 1, 0, 0]])
    with pytest.raises(ValueError, match="loss_mask must be"):
        target_weights(toks, seg, mask[:, :-2])
    target = jnp.array([[0, 0, 0, 1, 1, 1, 0]])  # SFT: learn tokens 3..5
    np.testing.assert_array_equal(np.asarray(target_mask_to_loss_mask(target)), [[0, 0, 1, 1, 1, 0]])


def test_loss_matches_numpy_cross_entropy(tiny_dense, tokens):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, tiny_dense.vocab_size)
    seg = jnp.array([[0] * 5 + [1] * 11, [4] * 16], jnp.int32)
    mask = jnp.ones((2, 16), jnp.int32).at[1, 3].set(0)
    (loss, metrics), _ = loss_and_grad(model, toks, seg, mask, jnp.float32(1e-3))
    logp = _log_softmax(np.asarray(run(model, toks, seg), np.float64))
    lse = np.log(np.exp(np.asarray(run(model, toks, seg), np.float64)).sum(-1))
    t, s, m = np.asarray(toks), np.asarray(seg), np.asarray(mask)
    nll, z, count = 0.0, 0.0, 0
    for b in range(2):
        for i in range(15):
            if s[b, i] == s[b, i + 1] and m[b, i]:
                nll -= logp[b, i, t[b, i + 1]]
                z += lse[b, i] ** 2
                count += 1
    assert metrics["token_count"] == count == 28
    np.testing.assert_allclose(metrics["ce_loss"], nll / count, rtol=1e-5)
    np.testing.assert_allclose(metrics["z_loss"], z / count, rtol=1e-5)
    np.testing.assert_allclose(loss, nll / count + 1e-3 * z / count, rtol=1e-5)
    assert metrics["loss"] == loss
    # A fully masked batch: zero loss and finite gradients, not 0/0 (same compiled function).
    (loss, metrics), grads = loss_and_grad(model, toks, seg, jnp.zeros_like(mask), jnp.float32(1e-3))
    assert float(loss) == 0.0 and float(metrics["token_count"]) == 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))


def test_token_losses_are_per_position_nats(tiny_dense, tokens):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    toks = tokens(2, 9, tiny_dense.vocab_size)
    got = eqx.filter_jit(token_losses)(model, toks)
    logp = _log_softmax(np.asarray(run(model, toks), np.float64))
    want = -np.take_along_axis(logp[:, :-1], np.asarray(toks)[:, 1:, None], axis=-1)[..., 0]
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_chunked_loss_equals_unchunked(tiny_dense, tokens):
    base = init(tiny_dense, key=jax.random.PRNGKey(0))
    # 2 x 15 = 30 predictions in chunks of 8 tokens = 4 positions of both rows: the last chunk is padded.
    chunked = init(dataclasses.replace(tiny_dense, loss_chunk_tokens=8), key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, tiny_dense.vocab_size)
    seg = jnp.array([[0] * 8 + [1] * 8, [0] * 16], jnp.int32)
    mask = jnp.ones((2, 16), jnp.int32)
    (la, ma), ga = loss_and_grad(base, toks, seg, mask, jnp.float32(1e-4))
    (lb, mb), gb = loss_and_grad(chunked, toks, seg, mask, jnp.float32(1e-4))
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    np.testing.assert_allclose(ma["z_loss"], mb["z_loss"], rtol=1e-6)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, atol=1e-7, rtol=1e-5)


def test_loss_fn_rejects_single_token_rows(tiny_dense):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="T >= 2"):
        loss_fn(model, jnp.zeros((2, 1), jnp.int32))
