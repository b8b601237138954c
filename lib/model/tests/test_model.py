import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import LlamaConfig, RopeConfig, attention, blocked_attention, init, reference_attention
from schooner.model._layers import rope_inv_freq
from schooner.model._matmul import matmul, named_dot


@eqx.filter_jit
def run(model, tokens, segment_ids=None):
    return model(tokens, segment_ids=segment_ids)


@eqx.filter_jit
def run_aux(model, tokens):
    return model.forward(tokens)


@eqx.filter_jit
def grad_sq(model, tokens):
    return jax.grad(lambda m: jnp.mean(m(tokens) ** 2))(model)


def _leaves_equal(a, b) -> bool:
    return all(
        bool(jnp.array_equal(x, y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


@pytest.mark.parametrize(
    "kv_heads", [2, pytest.param(1, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_attention_matches_reference(kv_heads):
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(ks[0], (2, 12, 4, 8))
    k = jax.random.normal(ks[1], (2, 12, kv_heads, 8))
    v = jax.random.normal(ks[2], (2, 12, kv_heads, 8))
    seg = jnp.array([[0] * 5 + [1] * 7, [0] * 12], jnp.int32)
    # Jitted, as the model runs them (op by op, each op compiled on its own, cost ~7 s of CPU time).
    fast = jax.jit(attention, static_argnames="implementation")
    ref = jax.jit(reference_attention)
    for s in (None, seg):
        for impl in ("xla", "blocked"):
            np.testing.assert_allclose(
                fast(q, k, v, s, implementation=impl),
                ref(q, k, v, s),
                atol=2e-6,
                rtol=1e-5,
                err_msg=impl,
            )


def test_attention_rejects_an_unknown_implementation():
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(
        ValueError, match="must be None, 'blocked', 'splash', 'xla', 'cudnn' or 'cudnn_bias'; got 'flash'"
    ):
        attention(q, q, q, None, implementation="flash")


@pytest.mark.parametrize(
    "t,block",
    [pytest.param(12, 5, marks=pytest.mark.slow), pytest.param(16, 4, marks=pytest.mark.slow), (7, 16)],
)
def test_blocked_attention_values_and_gradients_match_reference(t, block):
    """Blocks that do not divide T, several blocks, one block larger than T; GQA; segments; gradients."""
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q = jax.random.normal(ks[0], (2, t, 4, 8))
    k = jax.random.normal(ks[1], (2, t, 2, 8))
    v = jax.random.normal(ks[2], (2, t, 2, 8))
    seg = jnp.asarray(np.sort(np.random.default_rng(t).integers(0, 3, size=(2, t)), axis=1), jnp.int32)
    w = jax.random.normal(ks[3], (2, t, 4, 8))

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * w)

    # Jitted, as the model runs them (op by op, each op compiled on its own: ~20 s of the default run's time).
    blocked = jax.jit(lambda q, k, v: blocked_attention(q, k, v, seg, block=block))
    ref = jax.jit(lambda q, k, v: reference_attention(q, k, v, seg))
    np.testing.assert_allclose(blocked(q, k, v), ref(q, k, v), atol=2e-6, rtol=1e-5)
    g_blocked = jax.jit(jax.grad(lambda *a: loss(blocked, *a), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_blocked, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    # bf16 inputs: scores in float32 inside, output in bf16 and close to the float32 result.
    out16 = jax.jit(blocked_attention)(
        q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), seg
    )
    assert out16.dtype == jnp.bfloat16
    np.testing.assert_allclose(out16.astype(jnp.float32), ref(q, k, v), atol=3e-2, rtol=3e-2)


def test_model_with_reference_attention_matches(tiny_dense, tokens):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, tiny_dense.vocab_size)
    seg = jnp.array([[0] * 6 + [1] * 10, [3] * 16], jnp.int32)
    hidden = eqx.filter_jit(
        lambda m, t, s, r: m.hidden_states(t, segment_ids=s, reference_attention=r)[0].array
    )
    fast = hidden(model, toks, seg, False)
    ref = hidden(model, toks, seg, True)
    np.testing.assert_allclose(fast, ref, atol=1e-5, rtol=1e-5)


def test_init_is_deterministic_and_key_dependent(tiny_dense):
    a = init(tiny_dense, key=jax.random.PRNGKey(1))
    b = init(tiny_dense, key=jax.random.PRNGKey(1))
    c = init(tiny_dense, key=jax.random.PRNGKey(2))
    assert _leaves_equal(a, b)
    assert not _leaves_equal(a, c)


def test_causality(tiny_dense, tokens):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    toks = tokens(2, 16, tiny_dense.vocab_size)
    changed = toks.at[:, 9:].set((toks[:, 9:] + 1) % tiny_dense.vocab_size)
    a, b = run(model, toks), run(model, changed)
    np.testing.assert_array_equal(a[:, :9], b[:, :9])
    assert not np.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_no_attention_across_documents(tiny_dense, tiny_moe, tokens, moe):
    cfg = tiny_moe if moe else tiny_dense
    model = init(cfg, key=jax.random.PRNGKey(0))
    toks = tokens(1, 20, cfg.vocab_size)
    seg = jnp.array([[0] * 7 + [1] * 13], jnp.int32)
    packed = run(model, toks, seg)
    # The second document alone (RoPE is relative, so its offset in the row does not matter).
    alone = run(model, toks[:, 7:])
    first_alone = run(model, toks[:, :7])
    np.testing.assert_allclose(packed[:, 7:], alone, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(packed[:, :7], first_alone, atol=2e-5, rtol=1e-5)
    # Without segment ids the second document does see the first.
    assert not np.allclose(run(model, toks)[:, 7:], alone, atol=1e-4)


def test_gqa_with_repeated_kv_equals_multi_head(tiny_dense, tokens):
    gqa_cfg = dataclasses.replace(tiny_dense, num_heads=4, num_kv_heads=2)
    mha_cfg = dataclasses.replace(tiny_dense, num_heads=4, num_kv_heads=4)
    gqa = init(gqa_cfg, key=jax.random.PRNGKey(0))
    mha = init(mha_cfg, key=jax.random.PRNGKey(0))
    attn = gqa.layers.stacked.attn
    # kv head j serves query heads 2j and 2j+1: repeat each kv head twice along the kv_heads axis.
    k = jnp.repeat(attn.k_proj.array, 2, axis=1)
    v = jnp.repeat(attn.v_proj.array, 2, axis=1)
    mha = eqx.tree_at(lambda m: m.layers.stacked.attn.k_proj.array, mha, k)
    mha = eqx.tree_at(lambda m: m.layers.stacked.attn.v_proj.array, mha, v)
    same = lambda m: m.layers.stacked.attn.q_proj.array  # noqa: E731
    for where in (
        same,
        lambda m: m.layers.stacked.attn.o_proj.array,
        lambda m: m.layers.stacked.mlp.gate.array,
        lambda m: m.layers.stacked.mlp.up.array,
        lambda m: m.layers.stacked.mlp.down.array,
        lambda m: m.embed.array,
        lambda m: m.lm_head.array,
    ):
        mha = eqx.tree_at(where, mha, where(gqa))
    toks = tokens(2, 12, tiny_dense.vocab_size)
    seg = jnp.array([[0] * 4 + [1] * 8, [0] * 12], jnp.int32)
    np.testing.assert_allclose(run(gqa, toks, seg), run(mha, toks, seg), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_scan_equals_unrolled(tiny_dense, tiny_moe, tokens, moe):
    cfg = tiny_moe if moe else tiny_dense
    scanned = init(cfg, key=jax.random.PRNGKey(0))
    # The unrolled run also rematerialises each block (its own checkpoint path): gradients must not change.
    unrolled = init(
        dataclasses.replace(cfg, scan_layers=False, gradient_checkpointing="full"), key=jax.random.PRNGKey(0)
    )
    toks = tokens(2, 10, cfg.vocab_size)
    a, aux_a = run_aux(scanned, toks)
    b, aux_b = run_aux(unrolled, toks)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert set(aux_a) == set(aux_b)
    for k in aux_a:
        np.testing.assert_allclose(aux_a[k], aux_b[k], atol=1e-5, rtol=1e-5)
    ga = grad_sq(scanned, toks)
    gb = grad_sq(unrolled, toks)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "save_carries", "nested"])
def test_gradient_checkpointing_does_not_change_gradients(tiny_dense, tokens, policy):
    cfg = tiny_dense
    base = init(cfg, key=jax.random.PRNGKey(0))
    ckpt = init(dataclasses.replace(cfg, gradient_checkpointing=policy), key=jax.random.PRNGKey(0))
    toks = tokens(2, 8, cfg.vocab_size)
    ga = grad_sq(base, toks)
    gb = grad_sq(ckpt, toks)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("policy", ["full", pytest.param("nested", marks=pytest.mark.slow)])
def test_gradient_checkpointing_is_applied(policy):
    """Rematerialisation shows in the compiled gradient: far less live memory than keeping every activation
    (measured 37.4 MB without, 7.8 MB "full", 9.2 MB "nested" for this model)."""
    cfg = LlamaConfig(
        vocab_size=97, hidden_dim=64, intermediate_dim=256, num_layers=4, num_heads=4, num_kv_heads=2,
        max_seq_len=128, compute_dtype="float32",
    )  # fmt: skip
    toks = jax.random.randint(jax.random.PRNGKey(0), (4, 128), 0, 97)

    def temp_bytes(policy: str) -> int:
        model = init(dataclasses.replace(cfg, gradient_checkpointing=policy), key=jax.random.PRNGKey(0))
        params, static = eqx.partition(model, eqx.is_array)
        f = jax.grad(lambda p: jnp.mean(eqx.combine(p, static)(toks) ** 2))
        return jax.jit(f).lower(params).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(policy) < temp_bytes("none") / 3


def test_bfloat16_compute_keeps_float32_params_and_logits(tiny_dense, tokens):
    cfg = dataclasses.replace(tiny_dense, compute_dtype="bfloat16")
    model = init(cfg, key=jax.random.PRNGKey(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(model))
    toks = tokens(2, 8, cfg.vocab_size)
    # The hidden states' dtype is fixed when the program is traced: traced, not compiled and run.
    h = eqx.filter_eval_shape(lambda m, t: m.hidden_states(t)[0].array, model, toks)
    assert h.dtype == jnp.bfloat16
    low = run(model, toks)
    assert low.dtype == jnp.float32
    high = run(init(tiny_dense, key=jax.random.PRNGKey(0)), toks)
    # bf16 keeps 8 significant bits (0.4% per rounding); through two layers the logits (|x| <= 0.49 here)
    # moved by 0.0021 at most (measured), on both kernel paths. A float32 run would match exactly.
    err = float(np.abs(np.asarray(low) - np.asarray(high)).max())
    assert 0 < err < 5e-3


def test_llama3_rope_frequencies_follow_the_published_rule():
    rope = RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position_embeddings=8192)
    got = np.asarray(rope_inv_freq(128, rope))
    # Written out per frequency from the Llama 3.1 reference (meta-llama/llama-models apply_scaling).
    base = 1.0 / (500000.0 ** (np.arange(0, 128, 2) / 128))
    low_wavelen, high_wavelen = 8192 / 1.0, 8192 / 4.0
    want = []
    for freq in base:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            want.append(freq)
        elif wavelen > low_wavelen:
            want.append(freq / 8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - smooth) * freq / 8.0 + smooth * freq)
    np.testing.assert_allclose(got, np.array(want), rtol=1e-5)
    plain = np.asarray(rope_inv_freq(128, RopeConfig(theta=500000.0)))
    np.testing.assert_allclose(plain, base, rtol=1e-6)


def test_bad_inputs_are_rejected(tiny_dense, tokens):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="tokens must be an int array"):
        model(jnp.zeros((2, 4), jnp.float32))
    with pytest.raises(ValueError, match="segment_ids must have the tokens' shape"):
        model(tokens(2, 4, 10), segment_ids=jnp.zeros((2, 5), jnp.int32))
    with pytest.raises(TypeError, match="init needs a LlamaConfig"):
        init({"type": "llama"}, key=jax.random.PRNGKey(0))  # type: ignore[arg-type]


@pytest.mark.parametrize("kernels", ["cpu", "xla"])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_bf16_matmul_accumulates_in_f32_and_its_gradients_stay_bf16(transpose_b, kernels):
    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    a = jax.random.normal(ks[0], (6, 300))
    b = jax.random.normal(ks[1], (5, 300) if transpose_b else (300, 5))
    g = jax.random.normal(ks[2], (6, 5))
    exact = a @ (b.T if transpose_b else b)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    out = matmul(a16, b16, transpose_b=transpose_b, out_dtype=jnp.float32, kernels=kernels)
    assert out.dtype == jnp.float32
    # Products of bf16-rounded inputs summed in float32: far closer than a bf16 running sum would be.
    exact16 = a16.astype(jnp.float32) @ (b16.T if transpose_b else b16).astype(jnp.float32)
    np.testing.assert_allclose(out, exact16, rtol=1e-5, atol=1e-4)
    assert float(jnp.abs(out - exact).max()) < 0.5
    da, db = jax.grad(
        lambda x, y: jnp.sum(
            matmul(x, y, transpose_b=transpose_b, out_dtype=jnp.float32, kernels=kernels) * g
        ),
        argnums=(0, 1),
    )(a16, b16)
    assert da.dtype == db.dtype == jnp.bfloat16
    ea, eb = jax.grad(lambda x, y: jnp.sum(x @ (y.T if transpose_b else y) * g), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(da.astype(jnp.float32), ea, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(db.astype(jnp.float32), eb, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a layout detail of XLA:CPU's 16-bit GEMMs")
@pytest.mark.parametrize("transpose_b", [False, True])
def test_bf16_matmul_gradients_compile_to_canonical_products_on_cpu(transpose_b):
    # XLA:CPU's fast bf16 GEMMs take only [M, K] x [K, N]; a product contracting the rows of its left operand
    # (lhs_contracting_dims={0}, how XLA folds a^T @ g) runs on the generic float32 path with converted
    # operands, at about half the speed. The weight gradient must not be one.
    a = jnp.ones((64, 32), jnp.bfloat16)
    b = jnp.ones((48, 32) if transpose_b else (32, 48), jnp.bfloat16)

    def loss(x, y):
        return jnp.sum(matmul(x, y, transpose_b=transpose_b, out_dtype=jnp.float32, kernels="cpu"))

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a, b).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert dots, "no products found in the compiled gradient"
    assert not [d for d in dots if "lhs_contracting_dims={0}" in d], dots


@pytest.mark.parametrize("kernels", ["cpu", "xla"])
def test_named_dot_matches_einsum_on_both_kernel_paths(kernels):
    import haliax as hax

    B, T, E, N, H = (
        hax.Axis("batch", 2),
        hax.Axis("position", 3),
        hax.Axis("embed", 4),
        hax.Axis("heads", 2),
        hax.Axis("head_dim", 5),
    )
    ks = jax.random.split(jax.random.PRNGKey(6), 3)
    x = hax.random.normal(ks[0], (B, T, E))
    w_first = hax.random.normal(ks[1], (N, H, E))  # contracted axis last in w
    w_mid = hax.random.normal(ks[2], (N, E, H))  # contracted axis in the middle: rearranged
    for w in (w_first, w_mid):
        got = named_dot(x, w, "embed", kernels=kernels)
        assert [a.name for a in got.axes] == ["batch", "position", "heads", "head_dim"]
        spec = "bte,nhe->btnh" if w is w_first else "bte,neh->btnh"
        np.testing.assert_allclose(got.array, jnp.einsum(spec, x.array, w.array), rtol=1e-6, atol=1e-6)
    # Two contracted axes (the output projection), x's order differing from w's.
    o = hax.random.normal(ks[0], (B, T, N, H))
    wo = hax.random.normal(ks[1], (E, H, N))
    got = named_dot(o, wo, ("heads", "head_dim"), kernels=kernels)
    np.testing.assert_allclose(
        got.array, jnp.einsum("btnh,ehn->bte", o.array, wo.array), rtol=1e-5, atol=1e-5
    )
