"""HF interop, checked against a plain-numpy forward pass that reads the exported files by HF names."""

import dataclasses
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from schooner.model import LlamaConfig, MoEConfig, RopeConfig, config_from_hf, export_hf, import_hf, init


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _inv_freq(cfg):
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    sc = cfg.get("rope_scaling")
    if sc:  # the Llama 3.1 rule, per frequency
        out = []
        lo, hi = (
            sc["original_max_position_embeddings"] / sc["low_freq_factor"],
            sc["original_max_position_embeddings"] / sc["high_freq_factor"],
        )
        for f in inv:
            wl = 2 * math.pi / f
            if wl < hi:
                out.append(f)
            elif wl > lo:
                out.append(f / sc["factor"])
            else:
                s = (sc["original_max_position_embeddings"] / wl - sc["low_freq_factor"]) / (
                    sc["high_freq_factor"] - sc["low_freq_factor"]
                )
                out.append((1 - s) * f / sc["factor"] + s * f)
        inv = np.array(out)
    return inv


def _silu(x):
    return x / (1 + np.exp(-x))


def numpy_forward(folder, tokens):
    """HF LlamaForCausalLM / Qwen3 / Mixtral forward in float64 numpy, from config.json + model.safetensors."""
    cfg = json.loads((folder / "config.json").read_text())
    W = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    n, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // n
    eps = cfg["rms_norm_eps"]
    b, t = tokens.shape
    x = W["model.embed_tokens.weight"][tokens]
    ang = np.arange(t)[:, None] * _inv_freq(cfg)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(v):  # [b, t, heads, hd]
        rot = np.concatenate([-v[..., hd // 2 :], v[..., : hd // 2]], -1)
        return v * cos[None, :, None, :] + rot * sin[None, :, None, :]

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(b, t, n, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(b, t, kv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(b, t, kv, hd)
        if p + "self_attn.q_norm.weight" in W:
            q = _rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, n // kv, axis=2), np.repeat(v, n // kv, axis=2)
        s = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(hd)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("bnts,bsnh->btnh", s, v).reshape(b, t, n * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = _rms(x, W[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "mixtral":
            logits = h @ W[p + "block_sparse_moe.gate.weight"].T
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out = np.zeros_like(h)
            for bi in range(b):
                for ti in range(t):
                    top = np.argsort(-probs[bi, ti], kind="stable")[: cfg["num_experts_per_tok"]]
                    w = probs[bi, ti, top] / probs[bi, ti, top].sum()
                    for e, we in zip(top, w):
                        ep = p + f"block_sparse_moe.experts.{e}."
                        hv = h[bi, ti]
                        y = (_silu(hv @ W[ep + "w1.weight"].T) * (hv @ W[ep + "w3.weight"].T)) @ W[
                            ep + "w2.weight"
                        ].T
                        out[bi, ti] += we * y
            x = x + out
        else:
            g = _silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
            x = x + g @ W[p + "mlp.down_proj.weight"].T
    x = _rms(x, W["model.norm.weight"], eps)
    head = W[
        "embed_tokens.weight"
        if False
        else ("lm_head.weight" if "lm_head.weight" in W else "model.embed_tokens.weight")
    ]
    return x @ head.T


@eqx.filter_jit
def run(model, tokens):
    return model(tokens)


def _randomize_norms(model, seed=5):
    # Norm weights init to 1; make them random so a mix-up between norms would show.
    key = jax.random.PRNGKey(seed)
    for i, where in enumerate(
        [
            lambda m: m.final_norm.array,
            lambda m: m.layers.stacked.attn_norm.array,
            lambda m: m.layers.stacked.mlp_norm.array,
        ]
    ):
        arr = where(model)
        model = eqx.tree_at(where, model, 1 + 0.3 * jax.random.normal(jax.random.fold_in(key, i), arr.shape))
    if model.layers.stacked.attn.q_norm is not None:
        for i, where in enumerate(
            [lambda m: m.layers.stacked.attn.q_norm.array, lambda m: m.layers.stacked.attn.k_norm.array]
        ):
            arr = where(model)
            model = eqx.tree_at(
                where, model, 1 + 0.3 * jax.random.normal(jax.random.fold_in(key, 10 + i), arr.shape)
            )
    return model


CASES = {
    "llama-gqa-llama3rope-untied": LlamaConfig(
        vocab_size=61,
        hidden_dim=32,
        intermediate_dim=40,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope=RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position_embeddings=8),
        compute_dtype="float32",
        initializer_range=0.2,
    ),
    "qwen3-qknorm-tied-headdim": LlamaConfig(
        vocab_size=61,
        hidden_dim=32,
        intermediate_dim=40,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=12,
        qk_norm=True,
        tie_embeddings=True,
        compute_dtype="float32",
        initializer_range=0.2,
    ),
    "mixtral": MoEConfig(
        vocab_size=61,
        hidden_dim=32,
        intermediate_dim=24,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        num_experts=4,
        num_experts_per_token=2,
        load_balancing="aux_loss",
        compute_dtype="float32",
        initializer_range=0.2,
    ),
}


@pytest.mark.parametrize(
    "name",
    [
        "llama-gqa-llama3rope-untied",
        "mixtral",
        pytest.param("qwen3-qknorm-tied-headdim", marks=pytest.mark.slow),
    ],
)
def test_export_matches_numpy_reference_and_imports_back(tmp_path, tokens, name):
    cfg = CASES[name]
    model = _randomize_norms(init(cfg, key=jax.random.PRNGKey(0)))
    export_hf(model, cfg, tmp_path / "hf")
    toks = tokens(2, 11, cfg.vocab_size)
    want = numpy_forward(tmp_path / "hf", np.asarray(toks))
    ours = run(model, toks)
    np.testing.assert_allclose(ours, want, atol=2e-4, rtol=1e-4)
    assert float(np.abs(want).max()) > 0.1  # not a degenerate comparison
    back, back_cfg = import_hf(tmp_path / "hf")
    assert config_from_hf(json.loads((tmp_path / "hf" / "config.json").read_text())) == back_cfg
    arch = {"mixtral": "MixtralForCausalLM", "qwen3-qknorm-tied-headdim": "Qwen3ForCausalLM"}.get(
        name, "LlamaForCausalLM"
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [arch]
    np.testing.assert_allclose(run(back, toks), ours, atol=1e-6, rtol=1e-6)


def test_bf16_export_sharded_import_and_tokenizer_files(tmp_path, tokens):
    import ml_dtypes

    cfg = CASES["llama-gqa-llama3rope-untied"]
    model = init(cfg, key=jax.random.PRNGKey(1))
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    added = [{"id": 60, "content": "<|end|>"}, {"id": 59, "content": "<|pad|>"}]
    (tok_dir / "tokenizer.json").write_text(
        json.dumps({"added_tokens": added, "model": {"vocab": {"<s>": 1}}})
    )
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "<|end|>", "pad_token": "<|pad|>"})
    )
    export_hf(model, None, tmp_path / "hf", tokenizer_files=tok_dir, dtype="bfloat16")
    assert (tmp_path / "hf" / "tokenizer_config.json").exists()
    hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_cfg["dtype"] == "bfloat16" and "torch_dtype" not in hf_cfg
    ids = {"bos_token_id": 1, "eos_token_id": 60, "pad_token_id": 59}
    assert {k: hf_cfg[k] for k in ids} == ids
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert {k: gen[k] for k in ids} == ids
    back, _ = import_hf(tmp_path / "hf")
    for a, b in zip(jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(back)):
        rounded = np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(b), rounded)  # exactly the bfloat16 rounding
    # Explicit ids win over the tokenizer's.
    export_hf(model, None, tmp_path / "hf", tokenizer_files=tok_dir, eos_token_id=7)
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == 7


def test_export_shards_at_the_size_limit_with_an_index(tmp_path, tokens):
    cfg = CASES["mixtral"]
    model = init(cfg, key=jax.random.PRNGKey(1))
    export_hf(model, None, tmp_path / "one")
    single = load_file(str(tmp_path / "one" / "model.safetensors"))
    limit = 20_000
    export_hf(model, None, tmp_path / "hf", max_shard_bytes=limit)
    files = sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    n = len(files)
    assert n > 3 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(single)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in single.values())
    for name in files:
        part = load_file(str(tmp_path / "hf" / name))  # the safetensors library reads each shard
        biggest = max(v.nbytes for v in part.values())
        assert sum(v.nbytes for v in part.values()) <= max(limit, biggest)
        assert all(index["weight_map"][k] == name for k in part)
        for k, v in part.items():
            np.testing.assert_array_equal(v, single[k])
    toks = tokens(1, 7, cfg.vocab_size)
    np.testing.assert_array_equal(run(import_hf(tmp_path / "hf")[0], toks), run(model, toks))
    # Exporting again into the folder as one file removes the old shards.
    export_hf(model, None, tmp_path / "hf")
    assert sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors")) == ["model.safetensors"]
    assert not (tmp_path / "hf" / "model.safetensors.index.json").exists()


def test_export_and_import_stream_one_layer_at_a_time(tmp_path):
    """Host memory (numpy, traced) stays far below the model's size in both directions."""
    import tracemalloc

    cfg = LlamaConfig(
        vocab_size=256, hidden_dim=128, intermediate_dim=384, num_layers=12, num_heads=4, num_kv_heads=4
    )
    model = init(cfg, key=jax.random.PRNGKey(0))
    size = sum(x.nbytes for x in jax.tree_util.tree_leaves(model))  # 12 layers of ~0.8 MB
    # One round trip first, untraced: what a first call allocates once per process (jax's tracing and caches,
    # lazily imported modules) depends on which tests this worker ran before, and is not the weights' memory.
    export_hf(model, None, tmp_path / "warm")
    import_hf(tmp_path / "warm")
    tracemalloc.start()
    try:
        export_hf(model, None, tmp_path / "hf")
        _, export_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        back, _ = import_hf(tmp_path / "hf")
        _, import_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert export_peak < size / 4, (export_peak, size)
    assert import_peak < size / 4, (import_peak, size)
    for a, b in zip(jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_refusals(tmp_path):
    moe = dataclasses.replace(CASES["mixtral"], load_balancing="quantile")
    with pytest.raises(ValueError, match="load_balancing='quantile'"):
        export_hf(init(moe, key=jax.random.PRNGKey(0)), None, tmp_path / "x")
    # A model whose config is exportable but whose router bias was set anyway.
    model = init(CASES["mixtral"], key=jax.random.PRNGKey(0))
    model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="nonzero router bias"):
        export_hf(model, None, tmp_path / "x")
    shared = dataclasses.replace(CASES["mixtral"], num_shared_experts=1, router_activation="sigmoid")
    with pytest.raises(ValueError, match="router_activation='sigmoid'.*num_shared_experts=1"):
        export_hf(init(shared, key=jax.random.PRNGKey(0)), None, tmp_path / "y")
    dense = init(CASES["llama-gqa-llama3rope-untied"], key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="config does not match"):
        export_hf(dense, CASES["mixtral"], tmp_path / "z")
    with pytest.raises(ValueError, match="unsupported HF model_type 'gpt2'"):
        config_from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="attention_bias"):
        config_from_hf({"model_type": "llama", "attention_bias": True})
    with pytest.raises(ValueError, match="rope_scaling.rope_type='yarn' is not implemented"):
        config_from_hf(
            {
                "model_type": "llama",
                "vocab_size": 8,
                "hidden_size": 8,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            }
        )
    export_hf(dense, None, tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    cfg["num_hidden_layers"] = 1  # the file has 2 layers' tensors: one layer is left over
    (tmp_path / "ok" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="tensors were not used"):
        import_hf(tmp_path / "ok")
