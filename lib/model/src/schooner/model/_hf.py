"""Hugging Face interop: export to / import from ``LlamaForCausalLM``-style folders, streaming tensors.

Layouts: a dense model without qk-norm is ``LlamaForCausalLM`` (``model_type="llama"``); with qk-norm,
``Qwen3ForCausalLM``. A MoE model is ``MixtralForCausalLM`` (or ``Qwen3MoeForCausalLM`` with qk-norm)
when its architecture maps (see ``hf_export_problems``). Both use the "rotate half" RoPE layout the model
uses internally, so q/k weights map without permutation.

Streaming: :func:`hf_layout` lists every HF tensor with the model parameter (and the layer / expert index
within it) it comes from. Export writes each safetensors header first and then copies one tensor at a time
from the device (the same layer of a parameter is fetched once for all its experts), starting a new shard
file at ``max_shard_bytes`` with a ``model.safetensors.index.json`` as HF does. Import fills each parameter
on the device one layer at a time from the memory-mapped files. Neither holds the whole model on the host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._checkpoint import model_shapes
from ._config import RUNTIME_FIELDS, LlamaConfig
from ._hf_config import (
    TOKENIZER_FILES,
    check_hf_exportable,
    config_from_hf,
    hf_config_dict,
    special_token_ids,
)
from ._io import _broadcast_shardings
from ._safetensors import TensorSpec, read_safetensors, write_safetensors_stream
from ._transformer import Transformer

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
"""Shard size of exported safetensors files (5 GB, transformers' long-standing default)."""
_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@dataclass(frozen=True)
class HFTensor:
    """One tensor of the HF layout and where it lives in the model.

    ``where(model)`` is the (named) parameter; ``index`` selects the layer (and expert) within its leading
    stacked axes; the selected slice, transposed when ``transpose``, reshaped to ``shape`` is the HF tensor.
    """

    name: str
    where: Callable[[Any], Any]
    index: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool = False


def hf_layout(config: LlamaConfig) -> list[HFTensor]:
    """Every tensor of ``config``'s HF layout, grouped by layer (the order export writes them in)."""
    d, hd, L = config.hidden_dim, config.resolved_head_dim, config.num_layers
    n, kv = config.num_heads, config.num_kv_heads
    b = lambda m: m.layers.stacked  # noqa: E731
    out = [HFTensor("model.embed_tokens.weight", lambda m: m.embed, (), (config.vocab_size, d))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [
            HFTensor(p + "input_layernorm.weight", lambda m: b(m).attn_norm, (i,), (d,)),
            HFTensor(p + "post_attention_layernorm.weight", lambda m: b(m).mlp_norm, (i,), (d,)),
            HFTensor(p + "self_attn.q_proj.weight", lambda m: b(m).attn.q_proj, (i,), (n * hd, d)),
            HFTensor(p + "self_attn.k_proj.weight", lambda m: b(m).attn.k_proj, (i,), (kv * hd, d)),
            HFTensor(p + "self_attn.v_proj.weight", lambda m: b(m).attn.v_proj, (i,), (kv * hd, d)),
            HFTensor(p + "self_attn.o_proj.weight", lambda m: b(m).attn.o_proj, (i,), (d, n * hd)),
        ]
        if config.qk_norm:
            out += [
                HFTensor(p + "self_attn.q_norm.weight", lambda m: b(m).attn.q_norm, (i,), (hd,)),
                HFTensor(p + "self_attn.k_norm.weight", lambda m: b(m).attn.k_norm, (i,), (hd,)),
            ]
        out += _mlp_layout(config, p, i)
    out.append(HFTensor("model.norm.weight", lambda m: m.final_norm, (), (d,)))
    if not config.tie_embeddings:
        out.append(HFTensor("lm_head.weight", lambda m: m.lm_head, (), (config.vocab_size, d)))
    return out


def _mlp_layout(config: LlamaConfig, p: str, i: int) -> list[HFTensor]:
    d, f = config.hidden_dim, config.intermediate_dim
    mlp = lambda m: m.layers.stacked.mlp  # noqa: E731
    moe = config.moe
    if moe is None:
        return [
            HFTensor(p + "mlp.gate_proj.weight", lambda m: mlp(m).gate, (i,), (f, d)),
            HFTensor(p + "mlp.up_proj.weight", lambda m: mlp(m).up, (i,), (f, d)),
            HFTensor(p + "mlp.down_proj.weight", lambda m: mlp(m).down, (i,), (d, f)),
        ]
    names: tuple[str, ...]
    if config.qk_norm:  # Qwen3-MoE names
        router = p + "mlp.gate.weight"
        names = ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj")
    else:  # Mixtral names
        router = p + "block_sparse_moe.gate.weight"
        names = tuple(f"block_sparse_moe.experts.{{e}}.{w}" for w in ("w1", "w3", "w2"))
    out = [HFTensor(router, lambda m: mlp(m).router, (i,), (moe.num_experts, d))]
    for e in range(moe.num_experts):
        out += [
            HFTensor(p + names[0].format(e=e) + ".weight", lambda m: mlp(m).gate, (i, e), (f, d), True),
            HFTensor(p + names[1].format(e=e) + ".weight", lambda m: mlp(m).up, (i, e), (f, d), True),
            HFTensor(p + names[2].format(e=e) + ".weight", lambda m: mlp(m).down, (i, e), (d, f), True),
        ]
    return out


class _LayerFetcher:
    """Host copies of model slices, fetched from the device one (parameter, layer) at a time."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self._key: tuple[int, int] | None = None
        self._value: np.ndarray | None = None

    def __call__(self, t: HFTensor) -> np.ndarray:
        leaf = t.where(self.model).array
        if not t.index:
            return np.asarray(leaf, np.float32)
        key = (id(leaf), t.index[0])
        value = self._value
        if key != self._key or value is None:  # (the value is None only before the first fetch)
            value = np.asarray(leaf[t.index[0]], np.float32)
            self._key, self._value = key, value
        x = value[t.index[1:]]
        return x.T if t.transpose else x.reshape(t.shape)


def hf_state_dict(model: Transformer) -> dict[str, np.ndarray]:
    """The model's weights under HF names and shapes (float32 numpy; the whole model: small models only)."""
    fetch = _LayerFetcher(model)
    return {t.name: np.ascontiguousarray(fetch(t)) for t in hf_layout(model.config)}


def _shards(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive groups of at most ``max_bytes`` (a larger tensor gets a file of its own)."""
    groups: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if groups[-1] and size + spec.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    return groups


def _tokenizer_files(source: Any) -> list[str]:
    if source is None:
        return []
    if isinstance(source, str | os.PathLike) and os.path.isdir(source):
        files = [os.path.join(source, n) for n in TOKENIZER_FILES if os.path.exists(os.path.join(source, n))]
        if not files:
            raise FileNotFoundError(f"no tokenizer files {TOKENIZER_FILES} in {os.fspath(source)!r}.")
        return files
    files = [os.fspath(source)] if isinstance(source, str | os.PathLike) else [os.fspath(p) for p in source]
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist.")
    return files


def _remove_previous_weights(folder: str) -> None:
    for name in os.listdir(folder):
        if name == "model.safetensors.index.json" or (
            name.startswith("model") and name.endswith(".safetensors")
        ):
            os.remove(os.path.join(folder, name))


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def export_hf(
    model: Transformer,
    config: LlamaConfig | None,
    folder: str | os.PathLike,
    tokenizer_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    dtype: str = "float32",
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    """Write an HF folder: ``config.json``, ``generation_config.json``, the weights and tokenizer files.

    The weights go to ``model.safetensors``, or to ``model-0000i-of-0000n.safetensors`` shards of at most
    ``max_shard_bytes`` with ``model.safetensors.index.json`` when they are larger. ``config.json`` is
    written last. Token ids not given are read from the tokenizer files (``tokenizer_config.json`` names
    the tokens, ``tokenizer.json`` numbers them); ``generate()`` in transformers needs at least the eos id.

    Args:
        model: the model to export.
        config: its config (``None``: ``model.config``).
        folder: a local folder (created).
        tokenizer_files: a tokenizer folder (its ``tokenizer.json``, ``tokenizer_config.json``,
            ``special_tokens_map.json``, ``tokenizer.model`` are copied) or a list of files to copy.
        dtype: ``"float32"`` or ``"bfloat16"`` tensors.
        bos_token_id / eos_token_id / pad_token_id: override the ids found in the tokenizer files.
        max_shard_bytes: largest safetensors file (a bigger single tensor gets a file of its own).

    Raises:
        ValueError: the config does not match the model, or names a feature no HF layout has.
    """
    config = model.config if config is None else config
    if config != model.config:
        raise ValueError(
            f"config does not match the model's config:\n  given {config}\n  model {model.config}"
        )
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}; got {dtype!r}.")
    if not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive int; got {max_shard_bytes!r}.")
    _check_router_bias(model, config)
    files = _tokenizer_files(tokenizer_files)
    ids = special_token_ids(files)
    given = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    ids.update({k: v for k, v in given.items() if v is not None})
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    _remove_previous_weights(folder)
    layout = hf_layout(config)
    by_name = {t.name: t for t in layout}
    specs = [TensorSpec(t.name, t.shape, _DTYPES[dtype]) for t in layout]
    fetch = _LayerFetcher(model)
    groups = _shards(specs, max_shard_bytes)
    weight_map = {}
    for i, group in enumerate(groups):
        name = (
            "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        )
        write_safetensors_stream(
            os.path.join(folder, name),
            group,
            lambda s: fetch(by_name[s.name]).astype(s.dtype),
            {"format": "pt"},
        )
        weight_map.update({s.name: name for s in group})
    if len(groups) > 1:
        total = sum(s.nbytes for s in specs)
        _write_json(
            os.path.join(folder, "model.safetensors.index.json"),
            {"metadata": {"total_size": total}, "weight_map": weight_map},
        )
    for path in files:
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))
    _write_json(
        os.path.join(folder, "generation_config.json"),
        {"_from_model_config": True, **{k: v for k, v in ids.items() if v is not None}},
    )
    _write_json(os.path.join(folder, "config.json"), hf_config_dict(config, dtype, ids))


def _check_router_bias(model: Transformer, config: LlamaConfig) -> None:
    check_hf_exportable(config)
    if config.moe is not None:
        bias = np.asarray(model.layers.stacked.mlp.router_bias.array)
        if np.any(bias != 0):
            raise ValueError(
                f"this model has a nonzero router bias (max |bias| {np.abs(bias).max():.3g}), which steers "
                "expert selection and which the HF layouts cannot represent."
            )


IMPORT_RUNTIME_FIELDS = RUNTIME_FIELDS | {"load_balancing"}
"""Config fields an ``import_hf(config=...)`` override may change: how the model runs and trains, not what the
imported weights compute (the router bias an imported MoE starts with is zero whatever its balancing)."""
_RESOLVED = {"head_dim": "resolved_head_dim", "shared_intermediate_dim": "resolved_shared_dim"}


def _check_override(config: LlamaConfig, derived: LlamaConfig, folder: str) -> None:
    """Refuse an override whose architecture differs from ``config.json``'s, naming every field and both values."""
    if (config.moe is None) != (derived.moe is None):
        raise ValueError(
            f"{folder}: config={type(config).__name__}(...) does not fit its config.json, which describes a "
            f"{type(derived).__name__}; pass a config derived from config_from_hf's with dataclasses.replace."
        )
    differ = []
    for f in dataclasses.fields(derived):
        if f.name in IMPORT_RUNTIME_FIELDS or f.name == "type":
            continue
        name = _RESOLVED.get(f.name, f.name)
        want, got = getattr(derived, name), getattr(config, name)
        if want != got:
            differ.append(
                f"  {f.name!r}: config.json gives {f.name}={want!r}, config= gives {f.name}={got!r}"
            )
    if differ:
        raise ValueError(
            f"{folder}: the config= override differs from config.json in what the weights compute:\n"
            + "\n".join(differ)
            + f"\nonly {sorted(IMPORT_RUNTIME_FIELDS)} may differ; leave config= out or derive it from "
            "config_from_hf(config.json) with dataclasses.replace."
        )


def _open_weights(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors files, memory-mapped (single file or sharded with an index)."""
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


def _set_slice(x: jax.Array, i: jax.Array, value: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(x, value, i, 0)


_set_slice_donated = jax.jit(_set_slice, donate_argnums=(0,))  # the parameter is updated in place


def _fill(
    shape_struct: Any, parts: list[HFTensor], tensors: dict[str, np.ndarray], sharding: Any
) -> jax.Array:
    """One parameter on the device, written layer by layer from its HF tensors."""
    shape = tuple(shape_struct.shape)

    def host(t: HFTensor) -> np.ndarray:
        w = np.asarray(tensors[t.name], np.float32)
        if w.shape != t.shape:
            raise ValueError(f"HF tensor {t.name!r} has shape {w.shape}; the config implies {t.shape}.")
        return w.T if t.transpose else w

    if not parts[0].index:  # an unstacked parameter: one tensor
        value = host(parts[0]).reshape(shape)
        return jax.device_put(value, sharding) if sharding is not None else jnp.asarray(value)
    x = jnp.zeros(shape, jnp.float32, device=sharding)
    for layer in range(shape[0]):
        layer_parts = [t for t in parts if t.index[0] == layer]
        slab = np.empty(shape[1:], np.float32)
        for t in layer_parts:
            slab[t.index[1:]] = host(t).reshape(slab[t.index[1:]].shape)
        x = _set_slice_donated(x, jnp.int32(layer), jnp.asarray(slab))
    return x


def import_hf(
    folder: str | os.PathLike, *, config: LlamaConfig | None = None, sharding: Any = None
) -> tuple[Transformer, LlamaConfig]:
    """Load an HF folder (config.json + safetensors, single or sharded) as ``(model, config)`` in float32.

    Tensors are read from the memory-mapped files and placed one layer at a time, so the host never holds
    more than one layer of one parameter (and the largest unstacked tensor, e.g. the embedding).

    Args:
        folder: local HF model folder (e.g. a downloaded ``meta-llama/Llama-3.2-1B`` or ``export_hf`` output).
        config: override the config derived from ``config.json``: only the fields of
            ``IMPORT_RUNTIME_FIELDS`` may differ (e.g. ``compute_dtype``, ``load_balancing``); every other field
            must agree (``head_dim`` and ``shared_intermediate_dim`` by their resolved value).
        sharding: place the parameters on these shardings (one Sharding, or a pytree like the model from
            :func:`schooner.model.model_shardings`); default: the default device.

    Raises:
        ValueError: an HF setting Schooner does not implement, a ``config`` override that differs from
            ``config.json`` in an architecture field, tensors of the wrong shape, or tensors left over (the
            architecture does not match).
        KeyError: a tensor the config needs is missing.
    """
    folder = os.fspath(folder)
    with open(os.path.join(folder, "config.json")) as f:
        hf = json.load(f)
    if isinstance(hf, dict) and "model_type" not in hf and "type" in hf:
        raise ValueError(
            f"{folder!r} holds a Schooner model config (type={hf['type']!r}), not a Hugging Face config.json: "
            "load the folder with schooner.model.load_model."
        )
    derived = config_from_hf(hf)
    if config is None:
        config = derived
    else:
        _check_override(config, derived, folder)
    tensors = _open_weights(folder)
    layout = hf_layout(config)
    missing = [t.name for t in layout if t.name not in tensors]
    if missing:
        raise KeyError(
            f"{folder}: {len(missing)} tensors are missing from the safetensors files: {missing[:6]}."
        )
    ignorable = {k for k in tensors if "rotary_emb.inv_freq" in k}
    if config.tie_embeddings:
        ignorable.add("lm_head.weight")  # some tied checkpoints still store it
    unused = sorted(set(tensors) - {t.name for t in layout} - ignorable)
    if unused:
        raise ValueError(
            f"{folder}: {len(unused)} tensors were not used (architecture mismatch?): {unused[:6]}."
        )
    shapes = model_shapes(config)
    leaves = jax.tree_util.tree_leaves(shapes)
    shardings = dict(zip(map(id, leaves), _broadcast_shardings(sharding, shapes, len(leaves)), strict=True))
    groups: dict[int, list[HFTensor]] = {}
    wheres: dict[int, Callable[[Any], Any]] = {}
    for t in layout:
        key = id(t.where(shapes).array)
        groups.setdefault(key, []).append(t)
        wheres.setdefault(key, t.where)
    model = shapes
    for key, parts in groups.items():
        target = wheres[key](shapes).array
        value = _fill(target, parts, tensors, shardings[key])

        def leaf(m: Any, where: Callable[[Any], Any] = wheres[key]) -> Any:
            return where(m).array

        model = eqx.tree_at(leaf, model, value)
    if config.moe is not None:  # HF routers have no bias: selection by the scores alone
        bias = shapes.layers.stacked.mlp.router_bias.array
        zeros = jnp.zeros(bias.shape, jnp.float32, device=shardings[id(bias)])
        model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, zeros)
    return model, config
