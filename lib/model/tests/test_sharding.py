"""Sharded forward and gradients equal the unsharded ones on 8 fake CPU devices."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from schooner.model import (
    activation_sharding,
    batch_sharding,
    compute_axis_mapping,
    init,
    loss_fn,
    model_shardings,
    param_axis_mapping,
    pspec_for_named,
    shard_model,
)


def _value_and_grad(model, tokens, segment_ids):
    f = lambda m: loss_fn(m, tokens, segment_ids=segment_ids)  # noqa: E731
    return jax.value_and_grad(f, has_aux=True)(model)


def _compare(ref, got):
    (l0, m0), g0 = ref
    (l1, m1), g1 = got
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for k in m0:
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-4, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize(
    "moe,loss_chunks",
    [
        (False, "one"),
        # The fused loss over several chunks of positions, keeping the softmax / recomputing the logits.
        (False, "auto"),
        pytest.param(False, "recompute", marks=pytest.mark.slow),
        pytest.param(True, "one", marks=pytest.mark.slow),
    ],
)
def test_sharded_loss_and_grads_equal_unsharded(tiny_dense, tiny_moe, tokens, moe, loss_chunks, monkeypatch):
    assert len(jax.devices()) >= 8, "the root conftest provides 8 fake CPU devices"
    cfg = tiny_moe if moe else dataclasses.replace(tiny_dense, vocab_size=96)
    if loss_chunks == "auto":
        from schooner.model import _xent

        # Another vocabulary, so nothing compiled for the one-chunk case is reused; a budget of 4 positions
        # of the batch: 4 chunks over the 15 positions.
        cfg = dataclasses.replace(cfg, vocab_size=104)
        monkeypatch.setattr(_xent, "_AUTO_CHUNK_BYTES", 8 * 4 * 104 * 4)
        assert _xent.auto_chunk_positions(8, 15, 104) == 4
    elif loss_chunks == "recompute":
        cfg = dataclasses.replace(cfg, loss_chunk_tokens=8 * 6)  # 6 positions a chunk: 3 chunks, padded
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(8, 16, cfg.vocab_size)
    seg = jnp.repeat(jnp.array([[0] * 6 + [1] * 10]), 8, axis=0)
    ref = eqx.filter_jit(_value_and_grad)(model, toks, seg)

    if moe:
        mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "model", "expert"))
        axes = dict(data_axis="data", model_axis="model", expert_axis="expert")
    else:
        mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
        axes = dict(data_axis="data", model_axis="model")
    pmap, cmap = param_axis_mapping(**axes), compute_axis_mapping(**axes)
    sharded = shard_model(model, mesh, pmap)
    q = sharded.layers.stacked.attn.q_proj.array  # (layers, heads, head_dim, embed)
    assert q.sharding.spec == PartitionSpec(None, "model", None, "data")
    if moe:
        assert sharded.layers.stacked.mlp.gate.array.sharding.spec == PartitionSpec(
            None, "expert", "data", "model"
        )
    bs = batch_sharding(mesh, cmap)
    with activation_sharding(mesh, cmap):
        got = eqx.filter_jit(_value_and_grad)(sharded, jax.device_put(toks, bs), jax.device_put(seg, bs))
    _compare(ref, got)


def test_axis_mapping_rules():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    import haliax as hax

    embed, vocab = hax.Axis("embed", 32), hax.Axis("vocab", 97)
    mapping = param_axis_mapping(data_axis="data", model_axis="model")
    # vocab 97 is not divisible by 2: replicated instead of failing.
    assert pspec_for_named((vocab, embed), mesh, mapping) == PartitionSpec(None, "data")
    # The same mesh axis is never used twice in one array.
    assert pspec_for_named(
        (embed, hax.Axis("mlp", 8)), mesh, {"embed": "data", "mlp": "data"}
    ) == PartitionSpec("data", None)
    with pytest.raises(ValueError, match="mesh axis 'expert'"):
        pspec_for_named((hax.Axis("experts", 4),), mesh, {"experts": "expert"})
    assert compute_axis_mapping(data_axis="data", expert_axis="expert")["batch"] == ("data", "expert")


def test_model_shardings_drive_a_sharded_init(tiny_dense):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(8), ("data",))
    from schooner.model import model_shapes

    shardings = model_shardings(model_shapes(tiny_dense), mesh, param_axis_mapping())
    model = jax.jit(lambda k: init(tiny_dense, key=k), out_shardings=shardings)(jax.random.PRNGKey(0))
    assert model.embed.array.sharding.spec == PartitionSpec(None, "data")
    plain = init(tiny_dense, key=jax.random.PRNGKey(0))
    for a, b in zip(jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_haliax_axis_mapping_with_a_set_mesh_also_constrains(tiny_dense, tokens):
    import haliax as hax

    cfg = dataclasses.replace(tiny_dense, vocab_size=96)
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(8, 16, cfg.vocab_size)
    want = eqx.filter_jit(lambda m, t: loss_fn(m, t)[0])(model, toks)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    sharded = shard_model(model, mesh, param_axis_mapping(data_axis="data", model_axis="model"))
    with jax.set_mesh(mesh), hax.axis_mapping(compute_axis_mapping(data_axis="data", model_axis="model")):
        fn = jax.jit(lambda m, t: loss_fn(m, t)[0])
        assert "sharding_constraint" in fn.lower(sharded, toks).as_text()
        np.testing.assert_allclose(fn(sharded, toks), want, rtol=1e-5)
