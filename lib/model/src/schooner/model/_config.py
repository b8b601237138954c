"""Model configs: frozen, validated dataclasses with a registry by ``type``.

``LlamaConfig`` describes a dense Llama-family decoder; ``MoEConfig`` extends it with a mixture-of-experts
MLP. Both are plain data: they serialise to JSON-able dicts with ``config_to_dict`` and back with
``config_from_dict`` (the ``"type"`` key selects the class), so checkpoints and experiment steps can carry
them without pickling.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from ._kernels import KERNELS, platform

_COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")
_ROPE_KINDS = ("default", "llama3")
_CHECKPOINTING = ("none", "dots", "save_carries", "full", "offload", "nested")
ATTENTION_IMPLEMENTATIONS = (None, "blocked", "splash", "xla", "cudnn", "cudnn_bias")
GROUPED_MATMULS = ("auto", "ragged_dot", "megablox", "triton")

RUNTIME_FIELDS = frozenset(
    {
        "compute_dtype",
        "kernels",
        "scan_layers",
        "loss_chunk_tokens",
        "gradient_checkpointing",
        "attention_implementation",
        "max_seq_len",
        "initializer_range",
        "aux_loss_weight",
        "router_z_loss_weight",
        "router_bias_rate",
        "router_bias_resolve",
        "router_bias_resolve_tokens",
        "grouped_matmul",
        "capacity_factor",
    }
)
"""Config fields that change no parameter: precision, kernels, the layer loop (the layers are always stacked),
loss chunking, rematerialisation, attention backend, context length, init scale, the MoE losses' weights,
balancing rate and re-solve, grouped-matmul kernel and capacity. Weights saved under one value load under
another (``schooner.train``'s ``initialize_from`` and ``import_hf(config=...)`` let them differ)."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings (HF ``rope_theta`` / ``rope_scaling`` conventions).

    Attributes:
        theta: base of the rotary frequencies (``rope_theta``).
        kind: ``"default"`` (plain RoPE) or ``"llama3"`` (Llama 3.1 frequency scaling for long context).
        factor: llama3 scaling factor (``rope_scaling.factor``).
        low_freq_factor: llama3 ``low_freq_factor``.
        high_freq_factor: llama3 ``high_freq_factor``.
        original_max_position_embeddings: llama3 context length the frequencies were trained at.
    """

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in _ROPE_KINDS:
            raise ValueError(f"RopeConfig.kind must be one of {_ROPE_KINDS}; got {self.kind=!r}.")
        _number("RopeConfig.theta", self.theta, "> 0")
        if self.kind == "llama3":
            _number("RopeConfig.factor", self.factor, ">= 1")
            _number("RopeConfig.low_freq_factor", self.low_freq_factor, "> 0")
            _number("RopeConfig.high_freq_factor", self.high_freq_factor, "> low_freq_factor")
        if not self.theta > 0:
            raise ValueError(f"RopeConfig.theta must be > 0; got {self.theta=}.")
        if self.kind == "llama3":
            if not self.factor >= 1:
                raise ValueError(f"llama3 rope scaling needs factor >= 1; got {self.factor=}.")
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                raise ValueError(
                    "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor; got "
                    f"{self.low_freq_factor=}, {self.high_freq_factor=}."
                )
            if self.original_max_position_embeddings <= 0:
                raise ValueError(
                    f"original_max_position_embeddings must be > 0; got {self.original_max_position_embeddings=}."
                )


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _number(name: str, value: Any, rule: str) -> None:
    """A number given as a string (from JSON, YAML or a command line) or None is named, not compared."""
    if not _is_number(value):
        raise ValueError(f"{name} must be a number {rule}; got {value!r} ({type(value).__name__}).")


def _flag(name: str, value: Any) -> None:
    """A bool field: the string "false" is truthy, so anything but True/False is refused, not coerced."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False; got {value!r} ({type(value).__name__}).")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int; got {name}={value!r}.")


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family dense decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU).

    Attributes:
        vocab_size: number of token ids (set it from the tokenizer with ``dataclasses.replace``).
        hidden_dim: model width (HF ``hidden_size``).
        intermediate_dim: SwiGLU hidden width (HF ``intermediate_size``).
        num_layers: number of decoder blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
        head_dim: per-head width; ``None`` means ``hidden_dim // num_heads``.
        max_seq_len: longest sequence the model is meant for (HF ``max_position_embeddings``).
        rope: rotary embedding settings.
        tie_embeddings: share the input embedding with the output projection.
        qk_norm: RMS-normalise queries and keys per head before RoPE (Qwen3 / OLMo2 style).
        norm_eps: RMSNorm epsilon.
        initializer_range: std of the normal init of embeddings and projections.
        compute_dtype: activation/matmul dtype; parameters stay float32. ``"auto"`` is bfloat16 on GPU/TPU
            and float32 on CPU.
        scan_layers: run the (always stacked) layers with ``lax.scan``; False unrolls a Python loop
            (same parameters and results, longer compile).
        gradient_checkpointing: the remat policy of the layers, from most memory and least recompute:
            ``"none"`` (keep every intermediate the backward needs), ``"dots"`` (keep q/k/v, the
            attention's output, the MLPs' gate/up products and the experts' routing; recompute norms, RoPE,
            activations, the attention's output projection and, in MoE layers, the router logits and the
            experts' down projection: a few percent more time), ``"save_carries"`` (keep only each block's input and recompute the whole block in the
            backward: one more forward, about a third more time), ``"full"`` (the same through haliax's
            non-carry policy), ``"offload"`` (block inputs offloaded to host memory) or ``"nested"``
            (sqrt-blocked remat of the layer stack). Which fits where: ``docs/accelerators.md``; ``train()``
            checks the compiled step's memory against the device before the first step.
        attention_implementation: ``None`` (by the kernel path: ``"blocked"`` on CPU, ``"splash"`` on TPU,
            ``"cudnn"`` on the XLA path on a GPU, jax's XLA attention elsewhere), ``"blocked"`` (pure-JAX causal
            attention by query blocks, skipping keys past each block; see ``blocked_attention``), ``"splash"``
            (jax's Pallas TPU flash-attention kernel: no [T, T] scores in memory; interpreted, slowly, on the
            CPU; refused on a GPU), ``"xla"`` (``jax.nn.dot_product_attention``'s XLA path: float32 scores
            [B, heads, T, T] in memory; this is also what jax's own default, None, means), ``"cudnn"`` (cuDNN
            flash attention, NVIDIA GPUs only: causal, grouped-query, documents through cuDNN's packed layout
            of segment offsets and lengths on Hopper and later, at most ``_cudnn.MAX_SEGMENTS`` documents per
            row, the blocked path for a batch past it; the blocked path, with a log line, where cuDNN cannot
            take the shape) or ``"cudnn_bias"`` (cuDNN flash attention with documents as a dense [B, 1, T, T]
            mask bias: the slower form, kept for comparison). The cuDNN forms need a bf16/fp16 compute dtype.
        loss_chunk_tokens: 0 (default): the output projection + cross-entropy works on chunks of about
            128 MiB of float32 logits (at most 8 chunks); on the CPU kernel path it keeps the softmax in the
            compute dtype for the backward (one [tokens, vocab] array). N > 0: chunks of N // batch positions
            (at least one position, i.e. batch tokens) whose logits are recomputed in the backward, so
            nothing of size [tokens, vocab] is ever held (one more vocab-sized matmul; the "xla" kernel path
            always recomputes).
        kernels: ``"auto"`` (``"cpu"`` on the CPU backend, ``"tpu"`` on TPUs, ``"xla"`` elsewhere),
            ``"cpu"`` (kernels tuned for XLA:CPU), ``"xla"`` (the plain path: ``preferred_element_type``
            products and plain autodiff) or ``"tpu"`` (the plain path with jax's Pallas TPU kernels: splash
            attention, and megablox grouped matmuls for experts where ``MoEConfig.grouped_matmul`` asks;
            refused on a GPU, where they would run through the Pallas interpreter); the one backend switch, see
            ``schooner.model._kernels``. Same model and
            parameters either way; results differ by float rounding only.
        type: registry key (``"llama"``); do not change.
    """

    vocab_size: int = 32000
    hidden_dim: int = 512
    intermediate_dim: int = 1536
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 8
    head_dim: int | None = None
    max_seq_len: int = 2048
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_embeddings: bool = False
    qk_norm: bool = False
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    compute_dtype: str = "auto"
    scan_layers: bool = True
    gradient_checkpointing: str = "none"
    attention_implementation: str | None = None
    loss_chunk_tokens: int = 0
    kernels: str = "auto"
    type: str = "llama"

    config_type: ClassVar[str] = "llama"

    def __post_init__(self) -> None:
        if isinstance(self.rope, Mapping):  # tolerate a dict from JSON
            object.__setattr__(self, "rope", rope_from_dict(self.rope))
        if not isinstance(self.rope, RopeConfig):
            raise ValueError(f"rope must be a RopeConfig (or a dict of its fields); got {self.rope!r}.")
        if self.type != self.config_type:
            raise ValueError(
                f"{type(self).__name__}.type must be {self.config_type!r}; got {self.type=!r}. "
                "Use config_from_dict to pick the class from a dict's 'type'."
            )
        for name in ("vocab_size", "hidden_dim", "intermediate_dim", "num_layers", "num_heads"):
            _positive(name, getattr(self, name))
        _positive("num_kv_heads", self.num_kv_heads)
        _positive("max_seq_len", self.max_seq_len)
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads must be divisible by num_kv_heads; got {self.num_heads=}, {self.num_kv_heads=}. "
                f"Pick num_kv_heads among the divisors of {self.num_heads}."
            )
        if self.head_dim is None:
            if self.hidden_dim % self.num_heads != 0:
                raise ValueError(
                    f"hidden_dim must be divisible by num_heads when head_dim is None; got {self.hidden_dim=}, "
                    f"{self.num_heads=}. Set head_dim explicitly or change num_heads."
                )
        else:
            _positive("head_dim", self.head_dim)
        if self.resolved_head_dim % 2 != 0:
            raise ValueError(
                f"rotary embeddings need an even head_dim; got head_dim={self.resolved_head_dim}."
            )
        for flag in ("tie_embeddings", "qk_norm", "scan_layers"):
            _flag(flag, getattr(self, flag))
        _number("norm_eps", self.norm_eps, "> 0")
        _number("initializer_range", self.initializer_range, "> 0")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0; got {self.norm_eps=}.")
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range must be > 0; got {self.initializer_range=}.")
        if self.compute_dtype not in _COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {_COMPUTE_DTYPES}; got {self.compute_dtype=!r}.")
        if self.gradient_checkpointing not in _CHECKPOINTING:
            raise ValueError(
                f"gradient_checkpointing must be one of {_CHECKPOINTING}; got {self.gradient_checkpointing=!r}."
            )
        if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"attention_implementation must be one of {ATTENTION_IMPLEMENTATIONS}; got "
                f"{self.attention_implementation=!r}."
            )
        if self.attention_implementation in ("cudnn", "cudnn_bias") and self.compute_dtype in ("float32",):
            raise ValueError(
                f"attention_implementation={self.attention_implementation!r} needs a bfloat16/float16 compute "
                "dtype; got "
                f"{self.compute_dtype=!r}. Set compute_dtype='bfloat16' (or 'auto' on GPU)."
            )
        if self.kernels not in KERNELS:
            raise ValueError(
                f"kernels must be one of {KERNELS} ('auto': 'cpu' on the CPU backend, 'tpu' on TPUs, 'xla' "
                "elsewhere); got "
                f"{self.kernels=!r}."
            )
        if not isinstance(self.loss_chunk_tokens, int) or self.loss_chunk_tokens < 0:
            raise ValueError(
                f"loss_chunk_tokens must be an int >= 0 (0 = automatic chunks, softmax kept for the backward); "
                f"got {self.loss_chunk_tokens=}."
            )

    @property
    def resolved_head_dim(self) -> int:
        """``head_dim``, or ``hidden_dim // num_heads`` when unset."""
        return self.head_dim if self.head_dim is not None else self.hidden_dim // self.num_heads

    @property
    def moe(self) -> MoEConfig | None:
        """This config as a :class:`MoEConfig` when its MLPs are mixtures of experts, else None.

        The one place the config's kind is decided: code that needs the expert settings writes
        ``if (moe := config.moe) is not None: ... moe.num_experts ...`` (typed, no ``isinstance``).
        """
        return None

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts: ``config.moe is not None`` (a subclass overrides ``moe``,
        not this)."""
        return self.moe is not None

    @property
    def resolves_router_bias(self) -> bool:
        """Whether the trainer re-solves the router bias after each optimizer step (never for a dense model;
        see ``MoEConfig.router_bias_resolve``)."""
        return False


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """A Llama-style decoder whose MLPs are mixtures of experts (Mixtral / DeepSeek-MoE style).

    ``intermediate_dim`` is the width of ONE expert. Routing selects ``num_experts_per_token`` of
    ``num_experts`` experts per token by router logit plus a non-gradient bias (set by quantile balancing,
    0 otherwise); combine weights come from the unbiased scores.

    Attributes:
        num_experts: routed experts per layer.
        num_experts_per_token: experts each token is sent to (top-k).
        num_shared_experts: always-on experts of width ``shared_intermediate_dim`` added to every token.
        shared_intermediate_dim: width of the shared expert MLP; ``None`` means ``intermediate_dim``.
        router_activation: ``"softmax"`` (softmax over all experts, Mixtral) or ``"sigmoid"`` (DeepSeek-V3).
        normalize_topk: renormalise the k combine weights to sum to 1.
        load_balancing: ``"quantile"`` (a gradient-free router bias set after every step so that each
            expert gets its share; see ``_balancing.py``), ``"aux_loss"`` (classic Switch/GShard auxiliary
            loss), or ``"none"``.
        aux_loss_weight: weight of the auxiliary load-balancing loss (used when ``load_balancing="aux_loss"``).
        router_z_loss_weight: weight of the router z-loss (mean squared logsumexp of router logits).
        router_bias_rate: in (0, 1], or None (the default): 0.5 with the re-solve, 1 without
            (``resolved_router_bias_rate``). With the re-solve: the weight of the last batch's solution in the
            new bias, the rest the previous bias carried along by the step's change of the solution, so the
            bias follows the training at once and averages the data's sampling noise over about
            ``2 / rate - 1`` batches (at least ``1 / (step + 1)``, so the first steps average every batch so
            far). Without the re-solve: the fraction of each batch's balancing shift applied to the bias (below
            1 the bias also lags the router's drift: 1 is best there). 1 moves the bias to the one that
            balanced the last batch exactly.
        router_bias_resolve: with ``load_balancing="quantile"``, after each optimizer step solve the
            balancing shift again on the batch just trained on, under the UPDATED parameters (one more
            forward pass per step and the solver again, no backward: 1.38x the step time on the toy MoE of
            ``benchmarks/moe_balance.py``), so the bias follows the drift of the router's inputs as the other
            layers train instead of lagging it by a step. True (the default) holds max/mean expert load <= 1.3
            from step 2 on that benchmark (without: up to 1.56 in the first 30 steps). False sets the bias
            from the statistics of the step's own forward pass only. A runtime setting: it changes no
            parameter.
        router_bias_resolve_tokens: the re-solve reads the batch's first rows holding at least this many
            tokens (rounded up to whole rows, a multiple of the data shards and, past one microbatch, whole
            microbatches; so it can read more), or the whole batch if that is fewer; None (the default): the
            whole batch. Ignored without the re-solve. The first rows are a fair sample when the loader
            shuffles rows (the trainer's mixtures do); a loader that orders rows (by source, by length) would
            bias it. A trade of balance for speed: the pass over a whole 16 x 2048 batch is 29% of a MoE step
            on a TPU v5e, and with 16384 the train step runs 11% more tokens/s; but a smaller sample carries
            its noise into the bias: on ``schooner-train``'s toy with 8k-token batches, re-solving on a quarter
            of each batch still followed the early drift far better than no re-solve, but after the warm-up
            the busiest expert averaged 1.17x its share (max 1.40): a higher maximum than the whole batch's
            1.30 and a higher mean than no re-solve's 1.14 (whose maximum was 1.55). A runtime setting: it changes no parameter.
        grouped_matmul: the experts' dropless grouped matmuls: ``"auto"`` (the default: ``"triton"`` on the XLA
            kernel path on a GPU, ``"ragged_dot"`` elsewhere), ``"ragged_dot"`` (``jax.lax.ragged_dot``, every
            backend; 7.5% faster per step than megablox on the TPU benchmark's MoE; on a GPU, jax 0.10-0.11
            lower it to zero-padded dense products, about E/k times the experts' FLOPs), ``"triton"`` (the Pallas
            Triton grouped matmul of ``_gmm.py``: only the groups' own rows, padded to 128-row tiles; GPU, or
            interpreted on the CPU; refused on a TPU) or ``"megablox"`` (jax's Pallas ``gmm`` kernel on the TPU
            kernel path, where ``hidden_dim`` and ``intermediate_dim`` are multiples of 128; ``ragged_dot``
            elsewhere). A runtime setting.
        capacity_factor: ``None`` dispatches every token (dropless, sorted grouped matmuls). A float caps
            each expert at ``capacity_factor * tokens * k / num_experts`` tokens and drops the overflow.
    """

    num_experts: int = 8
    num_experts_per_token: int = 2
    num_shared_experts: int = 0
    shared_intermediate_dim: int | None = None
    router_activation: str = "softmax"
    normalize_topk: bool = True
    load_balancing: str = "quantile"
    aux_loss_weight: float = 0.01
    router_z_loss_weight: float = 0.001
    router_bias_rate: float | None = None
    router_bias_resolve: bool = True
    router_bias_resolve_tokens: int | None = None
    grouped_matmul: str = "auto"
    capacity_factor: float | None = None
    type: str = "moe"

    config_type: ClassVar[str] = "moe"

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("num_experts", self.num_experts)
        _positive("num_experts_per_token", self.num_experts_per_token)
        if self.num_experts_per_token > self.num_experts:
            raise ValueError(
                f"num_experts_per_token must be <= num_experts; got {self.num_experts_per_token=}, "
                f"{self.num_experts=}."
            )
        if not isinstance(self.num_shared_experts, int) or self.num_shared_experts < 0:
            raise ValueError(f"num_shared_experts must be an int >= 0; got {self.num_shared_experts=}.")
        if self.shared_intermediate_dim is not None:
            _positive("shared_intermediate_dim", self.shared_intermediate_dim)
        if self.router_activation not in ("softmax", "sigmoid"):
            raise ValueError(
                f"router_activation must be 'softmax' or 'sigmoid'; got {self.router_activation=!r}."
            )
        if self.load_balancing not in ("quantile", "aux_loss", "none"):
            raise ValueError(
                f"load_balancing must be 'quantile', 'aux_loss' or 'none'; got {self.load_balancing=!r}."
            )
        _flag("normalize_topk", self.normalize_topk)
        _number("aux_loss_weight", self.aux_loss_weight, ">= 0")
        _number("router_z_loss_weight", self.router_z_loss_weight, ">= 0")
        if self.router_bias_rate is not None:
            _number("router_bias_rate", self.router_bias_rate, "in (0, 1], or None for the default")
        if self.capacity_factor is not None:
            _number("capacity_factor", self.capacity_factor, "> 0, or None for dropless dispatch")
        if self.aux_loss_weight < 0 or self.router_z_loss_weight < 0:
            raise ValueError(
                f"loss weights must be >= 0; got {self.aux_loss_weight=}, {self.router_z_loss_weight=}."
            )
        if self.router_bias_rate is not None and not 0 < self.router_bias_rate <= 1:
            raise ValueError(
                f"router_bias_rate must be in (0, 1], or None for the default; got {self.router_bias_rate=}."
            )
        if not isinstance(self.router_bias_resolve, bool):
            raise ValueError(f"router_bias_resolve must be True or False; got {self.router_bias_resolve=!r}.")
        if self.router_bias_resolve_tokens is not None:
            _positive("router_bias_resolve_tokens", self.router_bias_resolve_tokens)
        if self.grouped_matmul not in GROUPED_MATMULS:
            raise ValueError(
                f"grouped_matmul must be one of {GROUPED_MATMULS}; got {self.grouped_matmul=!r}."
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"capacity_factor must be > 0, or None for dropless dispatch; got {self.capacity_factor=}."
            )

    @property
    def moe(self) -> MoEConfig:
        return self

    @property
    def resolves_router_bias(self) -> bool:
        return self.load_balancing == "quantile" and self.router_bias_resolve

    @property
    def resolved_router_bias_rate(self) -> float:
        """``router_bias_rate``, or its default: 0.5 with the re-solve (it averages the sampling noise and follows
        the drift at any rate), 1 without (a rate below 1 would also lag the drift)."""
        if self.router_bias_rate is not None:
            return self.router_bias_rate
        return 0.5 if self.router_bias_resolve else 1.0

    @property
    def resolved_shared_dim(self) -> int:
        """Width of the shared-expert MLP (all shared experts fused into one SwiGLU)."""
        per = (
            self.shared_intermediate_dim
            if self.shared_intermediate_dim is not None
            else self.intermediate_dim
        )
        return per * self.num_shared_experts


ModelConfig = LlamaConfig
_REGISTRY: dict[str, type[LlamaConfig]] = {"llama": LlamaConfig, "moe": MoEConfig}


def register_config(cls: type[LlamaConfig]) -> type[LlamaConfig]:
    """Register a config class under its ``config_type`` so ``config_from_dict`` can build it."""
    key = cls.config_type
    if key in _REGISTRY and _REGISTRY[key] is not cls:
        raise ValueError(f"config type {key!r} is already registered to {_REGISTRY[key].__name__}.")
    _REGISTRY[key] = cls
    return cls


def config_to_dict(config: LlamaConfig) -> dict[str, Any]:
    """A JSON-able dict of ``config`` (nested dataclasses become dicts), including its ``"type"``."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"config_to_dict needs a config dataclass instance; got {config!r}.")
    return dataclasses.asdict(config)


def config_from_dict(data: Mapping[str, Any]) -> LlamaConfig:
    """Build the registered config class named by ``data["type"]`` (default ``"llama"``).

    Raises:
        ValueError: unknown type or unknown fields (the message lists the valid ones).
    """
    data = dict(data)
    kind = data.get("type", "llama")
    if kind not in _REGISTRY:
        raise ValueError(f"unknown model config type {kind!r}; registered: {sorted(_REGISTRY)}.")
    cls = _REGISTRY[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for {cls.__name__}; valid fields: {sorted(names)}.")
    if isinstance(data.get("rope"), Mapping):
        data["rope"] = rope_from_dict(data["rope"])
    data["type"] = kind
    return cls(**data)


def rope_from_dict(data: Mapping[str, Any]) -> RopeConfig:
    """A :class:`RopeConfig` from a dict of its fields (a config's ``"rope"`` in JSON).

    Raises:
        ValueError: unknown keys (the message lists the valid ones) or invalid values.
    """
    names = {f.name for f in dataclasses.fields(RopeConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown rope field(s) {unknown}; valid fields: {sorted(names)}.")
    return RopeConfig(**data)


def resolve_compute_dtype(config: LlamaConfig) -> Any:
    """The jnp dtype activations use: ``compute_dtype``, with ``"auto"`` = bf16 on GPU/TPU, fp32 on CPU."""
    import jax.numpy as jnp

    name = config.compute_dtype
    if name == "auto":
        name = "float32" if platform() == "cpu" else "bfloat16"
    return jnp.dtype(name)


CheckpointPolicy = Literal["none", "dots", "save_carries", "full", "offload", "nested"]
