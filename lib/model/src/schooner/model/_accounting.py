"""Exact parameter counts and training FLOPs per token as functions of the config."""

from __future__ import annotations

from ._config import LlamaConfig


def _attention_params(config: LlamaConfig) -> int:
    d, h = config.hidden_dim, config.resolved_head_dim
    n, k = config.num_heads, config.num_kv_heads
    return 2 * n * h * d + 2 * k * h * d


def _mlp_params(config: LlamaConfig) -> tuple[int, int]:
    """(stored, active per token) matmul parameters of one layer's MLP (router included for MoE)."""
    d, f = config.hidden_dim, config.intermediate_dim
    moe = config.moe
    if moe is None:
        return 3 * d * f, 3 * d * f
    shared = 3 * d * moe.resolved_shared_dim
    router = moe.num_experts * d
    stored = router + 3 * d * f * moe.num_experts + shared
    active = router + 3 * d * f * moe.num_experts_per_token + shared
    return stored, active


def num_parameters(config: LlamaConfig) -> int:
    """Number of scalars in the model's arrays (embeddings, norms, projections, experts, router bias).

    Equals the total size of the leaves of ``init(config, key=...)``. The MoE ``router_bias`` (one value
    per expert and layer) is included although it is not trained by gradients.
    """
    d, v, layers = config.hidden_dim, config.vocab_size, config.num_layers
    per_layer = _attention_params(config) + _mlp_params(config)[0] + 2 * d
    if config.qk_norm:
        per_layer += 2 * config.resolved_head_dim
    if (moe := config.moe) is not None:
        per_layer += moe.num_experts  # router_bias
    embeddings = v * d * (1 if config.tie_embeddings else 2)
    return embeddings + layers * per_layer + d


def num_active_parameters(config: LlamaConfig) -> int:
    """Matmul parameters a token passes through (attention, active experts, router, output head).

    Excludes the input embedding (a lookup, not a matmul) and norms; includes the output projection
    whether or not it is tied. This is the ``N`` in the ``6N`` training-FLOPs rule.
    """
    per_layer = _attention_params(config) + _mlp_params(config)[1]
    return config.num_layers * per_layer + config.vocab_size * config.hidden_dim


def forward_flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """Forward-pass matmul FLOPs per token: ``2 N_active + 4 L n_heads head_dim T``.

    The attention term counts the full T x T score and value products, as dense attention kernels compute
    them (the causal half is masked, not skipped) -- the PaLM/Chinchilla MFU convention.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0; got {seq_len=}.")
    attn = 4 * config.num_layers * config.num_heads * config.resolved_head_dim * seq_len
    return float(2 * num_active_parameters(config) + attn)


def flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """TRAINING FLOPs per token (forward + backward = 3x forward): ``6 N_active + 12 L n_heads head_dim T``.

    Counts matmuls only (elementwise work, norms, softmax and RoPE are not counted). For MoE models the
    experts counted are the ``k`` routed ones per token plus shared experts and the router; in capacity
    mode the padded capacity slots are not counted (this is model FLOPs, the MFU numerator).

    Example:
        >>> from schooner.model import presets, flops_per_token
        >>> flops_per_token(presets.llama_nano, 256) > 0
        True
    """
    return 3.0 * forward_flops_per_token(config, seq_len)
