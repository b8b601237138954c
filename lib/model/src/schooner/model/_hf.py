"""Hugging Face interop: export to / import from ``LlamaForCausalLM``-style folders.

Layouts: a dense model without qk-norm is ``LlamaForCausalLM`` (``model_type="llama"``); with qk-norm,
``Qwen3ForCausalLM``. A MoE model is ``MixtralForCausalLM`` (or ``Qwen3MoeForCausalLM`` with qk-norm)
when its architecture maps: softmax router, top-k renormalised, no shared experts, and no router bias
(quantile balancing steers selection with a bias those layouts cannot hold, so such a model is refused).
Both use the "rotate half" RoPE layout the model uses internally, so q/k weights map without permutation.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._checkpoint import model_shapes
from ._config import LlamaConfig, MoEConfig, RopeConfig
from ._safetensors import read_safetensors, write_safetensors
from ._transformer import Transformer

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def _hf_config(config: LlamaConfig, dtype: str) -> dict[str, Any]:
    moe = isinstance(config, MoEConfig)
    if moe:
        arch, model_type = (
            ("Qwen3MoeForCausalLM", "qwen3_moe") if config.qk_norm else ("MixtralForCausalLM", "mixtral")
        )
    else:
        arch, model_type = ("Qwen3ForCausalLM", "qwen3") if config.qk_norm else ("LlamaForCausalLM", "llama")
    rope = config.rope
    rope_scaling = None
    if rope.kind == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": rope.factor,
            "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        }
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.resolved_head_dim,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": rope.theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": config.initializer_range,
        "torch_dtype": dtype,
    }
    if moe:
        if model_type == "mixtral":
            out.update(
                {"num_local_experts": config.num_experts, "num_experts_per_tok": config.num_experts_per_token}
            )
        else:
            out.update(
                {
                    "num_experts": config.num_experts,
                    "num_experts_per_tok": config.num_experts_per_token,
                    "moe_intermediate_size": config.intermediate_dim,
                    "norm_topk_prob": config.normalize_topk,
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                }
            )
        out["router_aux_loss_coef"] = config.aux_loss_weight
    return out


def _check_moe_exportable(model: Transformer, config: MoEConfig) -> None:
    problems = []
    if config.router_activation != "softmax":
        problems.append(f"router_activation={config.router_activation!r} (HF layouts use softmax)")
    if config.num_shared_experts:
        problems.append(f"num_shared_experts={config.num_shared_experts} (Mixtral/Qwen3-MoE have none)")
    if not config.normalize_topk and not config.qk_norm:
        problems.append("normalize_topk=False (Mixtral always renormalises the top-k weights)")
    bias = np.asarray(model.layers.stacked.mlp.router_bias.array)
    if np.any(bias != 0):
        problems.append(
            f"a nonzero router bias (max |bias| {np.abs(bias).max():.3g}) from quantile balancing steers expert "
            "selection, which the HF layouts cannot represent"
        )
    if problems:
        raise ValueError("this MoE model does not map to an HF layout: " + "; ".join(problems) + ".")


def hf_state_dict(model: Transformer) -> dict[str, np.ndarray]:
    """The model's weights under HF names and shapes (float32 numpy)."""
    cfg = model.config
    a = lambda x: np.asarray(x.array, dtype=np.float32)  # noqa: E731
    blocks = model.layers.stacked
    out = {"model.embed_tokens.weight": a(model.embed), "model.norm.weight": a(model.final_norm)}
    if model.lm_head is not None:
        out["lm_head.weight"] = a(model.lm_head)
    q, k, v, o = (
        a(w) for w in (blocks.attn.q_proj, blocks.attn.k_proj, blocks.attn.v_proj, blocks.attn.o_proj)
    )
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = a(blocks.attn_norm)[i]
        out[p + "post_attention_layernorm.weight"] = a(blocks.mlp_norm)[i]
        out[p + "self_attn.q_proj.weight"] = q[i].reshape(-1, cfg.hidden_dim)
        out[p + "self_attn.k_proj.weight"] = k[i].reshape(-1, cfg.hidden_dim)
        out[p + "self_attn.v_proj.weight"] = v[i].reshape(-1, cfg.hidden_dim)
        out[p + "self_attn.o_proj.weight"] = o[i].reshape(cfg.hidden_dim, -1)
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = a(blocks.attn.q_norm)[i]
            out[p + "self_attn.k_norm.weight"] = a(blocks.attn.k_norm)[i]
        if isinstance(cfg, MoEConfig):
            mlp = blocks.mlp
            gate, up, down, router = a(mlp.gate)[i], a(mlp.up)[i], a(mlp.down)[i], a(mlp.router)[i]
            if cfg.qk_norm:  # Qwen3-MoE names
                out[p + "mlp.gate.weight"] = router
                for e in range(cfg.num_experts):
                    out[p + f"mlp.experts.{e}.gate_proj.weight"] = gate[e].T
                    out[p + f"mlp.experts.{e}.up_proj.weight"] = up[e].T
                    out[p + f"mlp.experts.{e}.down_proj.weight"] = down[e].T
            else:
                out[p + "block_sparse_moe.gate.weight"] = router
                for e in range(cfg.num_experts):
                    out[p + f"block_sparse_moe.experts.{e}.w1.weight"] = gate[e].T
                    out[p + f"block_sparse_moe.experts.{e}.w3.weight"] = up[e].T
                    out[p + f"block_sparse_moe.experts.{e}.w2.weight"] = down[e].T
        else:
            out[p + "mlp.gate_proj.weight"] = a(blocks.mlp.gate)[i]
            out[p + "mlp.up_proj.weight"] = a(blocks.mlp.up)[i]
            out[p + "mlp.down_proj.weight"] = a(blocks.mlp.down)[i]
    return {k_: np.ascontiguousarray(v_) for k_, v_ in out.items()}


def export_hf(
    model: Transformer,
    config: LlamaConfig | None,
    folder: str | os.PathLike,
    tokenizer_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    dtype: str = "float32",
) -> None:
    """Write an HF folder: ``config.json``, ``model.safetensors`` and (optionally) tokenizer files.

    Args:
        model: the model to export.
        config: its config (``None``: ``model.config``).
        folder: a local folder (created).
        tokenizer_files: a tokenizer folder (its ``tokenizer.json``, ``tokenizer_config.json``,
            ``special_tokens_map.json``, ``tokenizer.model`` are copied) or a list of files to copy.
        dtype: ``"float32"`` or ``"bfloat16"`` tensors.

    Raises:
        ValueError: the config does not match the model, or a MoE feature has no HF equivalent.
    """
    config = model.config if config is None else config
    if config != model.config:
        raise ValueError(
            f"config does not match the model's config:\n  given {config}\n  model {model.config}"
        )
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16'; got {dtype!r}.")
    if isinstance(config, MoEConfig):
        _check_moe_exportable(model, config)
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tensors = hf_state_dict(model)
    if dtype == "bfloat16":
        tensors = {k: np.asarray(jnp.asarray(v, jnp.bfloat16)) for k, v in tensors.items()}
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, {"format": "pt"})
    _copy_tokenizer(tokenizer_files, folder)
    with open(os.path.join(folder, "config.json.tmp"), "w") as f:
        json.dump(_hf_config(config, dtype), f, indent=2)
    os.replace(os.path.join(folder, "config.json.tmp"), os.path.join(folder, "config.json"))


def _copy_tokenizer(source: Any, folder: str) -> None:
    if source is None:
        return
    if isinstance(source, str | os.PathLike) and os.path.isdir(source):
        files = [os.path.join(source, n) for n in _TOKENIZER_FILES if os.path.exists(os.path.join(source, n))]
        if not files:
            raise FileNotFoundError(f"no tokenizer files {_TOKENIZER_FILES} in {os.fspath(source)!r}.")
    else:
        files = [source] if isinstance(source, str | os.PathLike) else list(source)
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {os.fspath(path)!r} does not exist.")
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def config_from_hf(hf: dict[str, Any]) -> LlamaConfig:
    """Our config for an HF ``config.json`` dict (llama, mistral without sliding window, qwen3, mixtral, qwen3_moe)."""
    model_type = hf.get("model_type")
    if model_type not in ("llama", "mistral", "qwen3", "mixtral", "qwen3_moe"):
        raise ValueError(
            f"unsupported HF model_type {model_type!r}; supported: llama, mistral, qwen3, mixtral, qwen3_moe."
        )
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError(
            "HF configs with attention_bias/mlp_bias are not supported (Llama-style models have no biases)."
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"only SwiGLU (hidden_act='silu') is supported; got hidden_act={hf.get('hidden_act')!r}."
        )
    if hf.get("sliding_window") and hf.get("use_sliding_window", model_type == "mistral"):
        raise ValueError(
            f"sliding-window attention is not supported; got sliding_window={hf['sliding_window']}."
        )
    scaling = hf.get("rope_scaling")
    rope = RopeConfig(theta=float(hf.get("rope_theta", 10000.0)))
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("llama3", "default"):
            raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: llama3.")
        if kind == "llama3":
            rope = RopeConfig(
                theta=rope.theta,
                kind="llama3",
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
    heads = int(hf["num_attention_heads"])
    common: dict[str, Any] = dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_dim=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        rope=rope,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    if model_type == "mixtral":
        return MoEConfig(
            intermediate_dim=int(hf["intermediate_size"]),
            num_experts=int(hf["num_local_experts"]),
            num_experts_per_token=int(hf["num_experts_per_tok"]),
            load_balancing="aux_loss",
            **common,
        )
    if model_type == "qwen3_moe":
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step", 1)) != 1:
            raise ValueError(
                "Qwen3-MoE models with dense layers (mlp_only_layers / decoder_sparse_step) are not supported."
            )
        return MoEConfig(
            intermediate_dim=int(hf["moe_intermediate_size"]),
            num_experts=int(hf["num_experts"]),
            num_experts_per_token=int(hf["num_experts_per_tok"]),
            normalize_topk=bool(hf.get("norm_topk_prob", True)),
            load_balancing="aux_loss",
            **common,
        )
    return LlamaConfig(intermediate_dim=int(hf["intermediate_size"]), **common)


def _read_weights(folder: str) -> dict[str, np.ndarray]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(folder, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {folder!r}.")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(folder, name)))
    return tensors


def import_hf(
    folder: str | os.PathLike, *, config: LlamaConfig | None = None
) -> tuple[Transformer, LlamaConfig]:
    """Load an HF folder (config.json + safetensors, single or sharded) as ``(model, config)`` in float32.

    Args:
        folder: local HF model folder (e.g. a downloaded ``meta-llama/Llama-3.2-1B`` or ``export_hf`` output).
        config: override the config derived from ``config.json`` (architecture fields must agree);
            e.g. to set ``compute_dtype`` or ``load_balancing``.
    """
    folder = os.fspath(folder)
    with open(os.path.join(folder, "config.json")) as f:
        derived = config_from_hf(json.load(f))
    config = derived if config is None else config
    tensors = _read_weights(folder)
    state = _Recorder(tensors, folder)
    model = _from_state_dict(model_shapes(config), state)
    ignorable = {k for k in tensors if "rotary_emb.inv_freq" in k}
    if config.tie_embeddings:
        ignorable.add("lm_head.weight")  # some tied checkpoints still store it
    unused = sorted(set(tensors) - state.used - ignorable)
    if unused:
        raise ValueError(
            f"{folder}: {len(unused)} tensors were not used (architecture mismatch?): {unused[:6]}."
        )
    return model, config


class _Recorder(dict):
    """Read-only view of the safetensors tensors that records which names were read (as float32)."""

    def __init__(self, tensors: dict[str, np.ndarray], folder: str):
        super().__init__()
        self.tensors, self.folder, self.used = tensors, folder, set()

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise KeyError(f"{self.folder}: tensor {name!r} is missing from the safetensors files.")
        self.used.add(name)
        return np.asarray(self.tensors[name], dtype=np.float32)


def _from_state_dict(shapes: Transformer, state: Any) -> Transformer:
    cfg = shapes.config
    L, d = cfg.num_layers, cfg.hidden_dim
    blocks = shapes.layers.stacked

    def stack(fmt: str, shape: tuple[int, ...], transpose: bool = False) -> np.ndarray:
        parts = []
        for i in range(L):
            w = state[fmt.format(i=i)]
            parts.append((w.T if transpose else w).reshape(shape))
        return np.stack(parts)

    p = "model.layers.{i}."
    values: list[tuple[Any, np.ndarray]] = [
        (lambda m: m.embed.array, state["model.embed_tokens.weight"]),
        (lambda m: m.final_norm.array, state["model.norm.weight"]),
        (lambda m: m.layers.stacked.attn_norm.array, stack(p + "input_layernorm.weight", (d,))),
        (lambda m: m.layers.stacked.mlp_norm.array, stack(p + "post_attention_layernorm.weight", (d,))),
        (
            lambda m: m.layers.stacked.attn.q_proj.array,
            stack(p + "self_attn.q_proj.weight", blocks.attn.q_proj.array.shape[1:]),
        ),
        (
            lambda m: m.layers.stacked.attn.k_proj.array,
            stack(p + "self_attn.k_proj.weight", blocks.attn.k_proj.array.shape[1:]),
        ),
        (
            lambda m: m.layers.stacked.attn.v_proj.array,
            stack(p + "self_attn.v_proj.weight", blocks.attn.v_proj.array.shape[1:]),
        ),
        (
            lambda m: m.layers.stacked.attn.o_proj.array,
            stack(p + "self_attn.o_proj.weight", blocks.attn.o_proj.array.shape[1:]),
        ),
    ]
    if shapes.lm_head is not None:
        values.append((lambda m: m.lm_head.array, state["lm_head.weight"]))
    if cfg.qk_norm:
        values.append(
            (
                lambda m: m.layers.stacked.attn.q_norm.array,
                stack(p + "self_attn.q_norm.weight", (cfg.resolved_head_dim,)),
            )
        )
        values.append(
            (
                lambda m: m.layers.stacked.attn.k_norm.array,
                stack(p + "self_attn.k_norm.weight", (cfg.resolved_head_dim,)),
            )
        )
    if isinstance(cfg, MoEConfig):
        f, ne = cfg.intermediate_dim, cfg.num_experts
        if cfg.qk_norm:
            router, names = (
                p + "mlp.gate.weight",
                ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj"),
            )
        else:
            router, names = (
                p + "block_sparse_moe.gate.weight",
                tuple(f"block_sparse_moe.experts.{{e}}.{w}" for w in ("w1", "w3", "w2")),
            )

        def experts(name: str, shape: tuple[int, int]) -> np.ndarray:
            return np.stack(
                [
                    np.stack(
                        [state[(p + name + ".weight").format(i=i, e=e)].T.reshape(shape) for e in range(ne)]
                    )
                    for i in range(L)
                ]
            )

        values += [
            (lambda m: m.layers.stacked.mlp.router.array, stack(router, (ne, d))),
            (lambda m: m.layers.stacked.mlp.router_bias.array, np.zeros((L, ne), np.float32)),
            (lambda m: m.layers.stacked.mlp.gate.array, experts(names[0], (d, f))),
            (lambda m: m.layers.stacked.mlp.up.array, experts(names[1], (d, f))),
            (lambda m: m.layers.stacked.mlp.down.array, experts(names[2], (f, d))),
        ]
    else:
        values += [
            (
                lambda m: m.layers.stacked.mlp.gate.array,
                stack(p + "mlp.gate_proj.weight", blocks.mlp.gate.array.shape[1:]),
            ),
            (
                lambda m: m.layers.stacked.mlp.up.array,
                stack(p + "mlp.up_proj.weight", blocks.mlp.up.array.shape[1:]),
            ),
            (
                lambda m: m.layers.stacked.mlp.down.array,
                stack(p + "mlp.down_proj.weight", blocks.mlp.down.array.shape[1:]),
            ),
        ]
    model = shapes
    for where, value in values:
        target = where(shapes)
        if tuple(target.shape) != value.shape:
            raise ValueError(
                f"HF weight of shape {value.shape} does not fit the parameter of shape {tuple(target.shape)}."
            )
        model = eqx.tree_at(where, model, jnp.asarray(value, jnp.float32))
    return model
