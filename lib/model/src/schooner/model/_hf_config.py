"""Hugging Face ``config.json`` <-> Schooner model configs, and what an HF layout cannot hold.

Reading accepts both layouts transformers has written: 4.x (``rope_theta`` and ``rope_scaling``; Qwen3-MoE's
``num_experts``) and 5.x (``rope_parameters``, ``num_local_experts``, ``dtype``). Anything Schooner does not
implement (a ``rope_type`` other than default/llama3, partial rotary, sliding windows, biases, dense layers
inside a Qwen3-MoE) is refused with the field and its value, never silently dropped. A key the file leaves out
takes the default of transformers' config class for its model type (``_HF_DEFAULTS``), as transformers
would read the file; sizes have no default. Writing produces the
5.x keys plus the 4.x RoPE keys, which both versions read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._config import LlamaConfig, MoEConfig, RopeConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen3", "mixtral", "qwen3_moe")
_ROPE_TYPES = ("default", "llama3")
# What transformers' config classes (4.x and 5.x alike) give for a key a config.json leaves out; they differ by
# model type (Llama's eps is 1e-6, Mixtral's 1e-5 and its RoPE base 1e6; Qwen3's head_dim 128, ...). Sizes
# (hidden_size, layers, heads, vocab, intermediate sizes) have no default here: a config.json without them is
# not a model's. The experts' count is `_EXPERTS` (two key names).
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048},
    "mistral": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096 * 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
    },
    "qwen3": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "num_key_value_heads": 32,
        "head_dim": 128,
    },
    "mixtral": {
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "max_position_embeddings": 4096 * 32,
        "num_key_value_heads": 8,
        "num_experts_per_tok": 2,
    },
    "qwen3_moe": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "num_key_value_heads": 4,
        "num_experts_per_tok": 8,
        "norm_topk_prob": False,
    },
}
_EXPERTS = {"mixtral": 8, "qwen3_moe": 128}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope_from_hf(hf: Mapping[str, Any]) -> RopeConfig:
    """The RoPE settings of an HF config in either layout (``rope_parameters`` wins when both are there)."""
    params = hf.get("rope_parameters")
    if params:
        field = "rope_parameters"
        if all(isinstance(v, Mapping) for v in params.values()):  # one entry per attention layer type
            distinct = {json.dumps(v, sort_keys=True) for v in params.values()}
            if len(distinct) != 1:
                raise ValueError(
                    f"rope_parameters differ between layer types ({sorted(params)}); Schooner uses one RoPE "
                    "for every layer."
                )
            params = next(iter(params.values()))
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        field = "rope_scaling"
        params = hf.get("rope_scaling") or {}
        theta = hf.get("rope_theta", 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise ValueError(
            f"{field}.rope_type={kind!r} is not implemented by Schooner (supported: 'default', 'llama3'); "
            "importing it would silently change the model's positions."
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor={partial} is not supported (Schooner rotates every dimension)."
        )
    if kind == "default":
        return RopeConfig(theta=float(theta))
    missing = [k for k in _LLAMA3_KEYS if k not in params]
    if missing:
        raise ValueError(f"{field} of rope_type 'llama3' lacks {missing}; got {dict(params)}.")
    return RopeConfig(
        theta=float(theta),
        kind="llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def _refuse_unsupported(hf: Mapping[str, Any], model_type: str) -> None:
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise ValueError(f"{key}={hf[key]!r} is not supported (Llama-style models have no biases).")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"only SwiGLU (hidden_act='silu') is supported; got hidden_act={hf.get('hidden_act')!r}."
        )
    sliding = hf.get("sliding_window")
    if sliding and hf.get("use_sliding_window", model_type in ("mistral", "mixtral")):
        raise ValueError(f"sliding-window attention is not supported; got sliding_window={sliding}.")
    other_layers = sorted({t for t in hf.get("layer_types") or () if t != "full_attention"})
    if other_layers:
        raise ValueError(f"layer_types {other_layers} are not supported (only 'full_attention').")


def _num_experts(hf: Mapping[str, Any]) -> int:
    for key in ("num_local_experts", "num_experts"):  # transformers 5, then 4.x Qwen3-MoE
        if hf.get(key) is not None:
            return int(hf[key])
    return _EXPERTS[hf["model_type"]]  # neither key: the config class's default


def _required(hf: Mapping[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(
            f"the HF config.json of model_type {hf.get('model_type')!r} lacks {key!r}, which Schooner cannot "
            f"infer; add it (the value transformers' {hf.get('model_type')} config class was built with)."
        )
    return hf[key]


def config_from_hf(hf: Mapping[str, Any]) -> LlamaConfig:
    """Our config for an HF ``config.json`` dict (llama, mistral without sliding window, qwen3, mixtral,
    qwen3_moe), written by transformers 4.x or 5.x.

    Raises:
        ValueError: a model type or setting Schooner does not implement, naming the field and its value.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported HF model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    hf = {
        **_HF_DEFAULTS[model_type],
        **hf,
    }  # an absent key means the model type's default, as in transformers
    _refuse_unsupported(hf, model_type)
    heads = int(_required(hf, "num_attention_heads"))
    hidden = int(_required(hf, "hidden_size"))
    common: dict[str, Any] = dict(
        vocab_size=int(_required(hf, "vocab_size")),
        hidden_dim=hidden,
        num_layers=int(_required(hf, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        max_seq_len=int(hf["max_position_embeddings"]),
        rope=_rope_from_hf(hf),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        norm_eps=float(hf["rms_norm_eps"]),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    if model_type == "mixtral":
        return MoEConfig(
            intermediate_dim=int(_required(hf, "intermediate_size")),
            num_experts=_num_experts(hf),
            num_experts_per_token=int(hf["num_experts_per_tok"]),
            load_balancing="aux_loss",
            **common,
        )
    if model_type == "qwen3_moe":
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step", 1)) != 1:
            raise ValueError(
                "Qwen3-MoE models with dense layers are not supported; got "
                f"mlp_only_layers={hf.get('mlp_only_layers')}, decoder_sparse_step={hf.get('decoder_sparse_step')}."
            )
        return MoEConfig(
            intermediate_dim=int(_required(hf, "moe_intermediate_size")),
            num_experts=_num_experts(hf),
            num_experts_per_token=int(hf["num_experts_per_tok"]),
            normalize_topk=bool(hf["norm_topk_prob"]),
            load_balancing="aux_loss",
            **common,
        )
    return LlamaConfig(intermediate_dim=int(_required(hf, "intermediate_size")), **common)


def hf_export_problems(config: LlamaConfig) -> list[str]:
    """What in ``config`` no HF layout can hold, one ``field=value (why)`` string each; empty if exportable.

    Checked from the config alone, so an export can be refused before a model is trained. (A model trained
    without quantile balancing has no router bias to lose.)
    """
    moe = config.moe
    if moe is None:
        return []
    problems = []
    if moe.load_balancing == "quantile":
        problems.append(
            "load_balancing='quantile' (its router bias steers expert selection; Mixtral/Qwen3-MoE routers "
            "have no bias: train with load_balancing='aux_loss' or 'none' to export)"
        )
    if moe.router_activation != "softmax":
        problems.append(f"router_activation={moe.router_activation!r} (HF layouts use softmax)")
    if moe.num_shared_experts:
        problems.append(f"num_shared_experts={moe.num_shared_experts} (Mixtral/Qwen3-MoE have none)")
    if not moe.normalize_topk and not moe.qk_norm:
        problems.append("normalize_topk=False (Mixtral always renormalises the top-k weights)")
    if moe.capacity_factor is not None:
        problems.append(f"capacity_factor={moe.capacity_factor} (HF layouts drop no tokens)")
    return problems


def check_hf_exportable(config: LlamaConfig) -> None:
    """Raise ``ValueError`` naming every field of ``config`` that no HF layout can hold (see
    :func:`hf_export_problems`)."""
    problems = hf_export_problems(config)
    if problems:
        raise ValueError("this model does not map to a Hugging Face layout: " + "; ".join(problems) + ".")


def hf_architecture(config: LlamaConfig) -> tuple[str, str]:
    """``(architecture, model_type)`` of the HF layout ``config`` exports to."""
    if config.moe is not None:
        return ("Qwen3MoeForCausalLM", "qwen3_moe") if config.qk_norm else ("MixtralForCausalLM", "mixtral")
    return ("Qwen3ForCausalLM", "qwen3") if config.qk_norm else ("LlamaForCausalLM", "llama")


def hf_config_dict(config: LlamaConfig, dtype: str, token_ids: Mapping[str, int | None]) -> dict[str, Any]:
    """The HF ``config.json`` of ``config`` (5.x keys, plus ``rope_theta``/``rope_scaling`` for 4.x)."""
    arch, model_type = hf_architecture(config)
    rope = config.rope
    rope_parameters: dict[str, Any] = {"rope_type": rope.kind, "rope_theta": rope.theta}
    if rope.kind == "llama3":
        rope_parameters.update({k: getattr(rope, k) for k in _LLAMA3_KEYS})
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
        "rope_parameters": rope_parameters,
        "rope_theta": rope.theta,
        "rope_scaling": None if rope.kind == "default" else dict(rope_parameters),
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": config.initializer_range,
        "dtype": dtype,
        **dict(token_ids),
    }
    moe = config.moe
    if moe is not None:
        out.update(
            {
                "num_local_experts": moe.num_experts,
                "num_experts_per_tok": moe.num_experts_per_token,
                "router_aux_loss_coef": moe.aux_loss_weight,
            }
        )
        if model_type == "qwen3_moe":
            out.update(
                {
                    "num_experts": moe.num_experts,  # the 4.x name
                    "moe_intermediate_size": moe.intermediate_dim,
                    "norm_topk_prob": moe.normalize_topk,
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                }
            )
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
_SPECIAL = ("bos", "eos", "pad")


def _token_name(value: Any) -> str | None:
    if isinstance(value, Mapping):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_token_ids(files: Sequence[str]) -> dict[str, int | None]:
    """``{"bos_token_id", "eos_token_id", "pad_token_id"}`` named by a tokenizer's files (None if unnamed).

    ``tokenizer_config.json`` (or ``special_tokens_map.json``) names the tokens; ``tokenizer.json`` gives
    their ids (added tokens first, then the model's vocabulary).
    """
    by_name = {os.path.basename(f): f for f in files}
    names: dict[str, str | None] = dict.fromkeys(_SPECIAL)
    for source in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        if source in by_name:
            with open(by_name[source]) as f:
                cfg = json.load(f)
            for s in _SPECIAL:
                names[s] = _token_name(cfg.get(f"{s}_token")) or names[s]
    vocab: dict[str, int] = {}
    if "tokenizer.json" in by_name:
        with open(by_name["tokenizer.json"]) as f:
            tok = json.load(f)
        model_vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(model_vocab, Mapping):
            vocab.update({str(k): int(v) for k, v in model_vocab.items()})
        vocab.update({t["content"]: int(t["id"]) for t in tok.get("added_tokens") or ()})
    return {f"{s}_token_id": vocab.get(name) if name else None for s, name in names.items()}
