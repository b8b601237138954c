"""The decoder: embedding, a ``Stacked`` run of pre-norm blocks, final norm, output projection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
from haliax import NamedArray, ScanCheckpointPolicy

from ._attention import ATTENTION_OUTPUT, ATTENTION_QKV, Attention
from ._config import LlamaConfig, resolve_compute_dtype
from ._kernels import resolve_kernels
from ._layers import (
    BATCH,
    EMBED,
    LAYERS,
    MLP,
    MLP_GATE_UP,
    POSITION,
    VOCAB,
    ParamFactory,
    SwiGLU,
    axes_for,
    ones,
    rms_norm,
    rope_cos_sin,
)
from ._matmul import named_dot
from ._moe import MOE_ROUTING, MoE
from ._sharding import constrain
from ._splash import RESIDUALS as SPLASH_RESIDUALS

_POLICIES: dict[str, Any] = {
    "none": False,
    "full": "full",
    "offload": "offload",
    "save_carries": True,
    "nested": "nested",
    "dots": False,  # haliax's scan saves everything; the block itself is checkpointed (`_dots_remat`)
}


def _dots_remat(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under the "dots" policy: the backward keeps the block's input, the queries, keys and values
    after RoPE, the attention's output (with "splash" also the kernel's output and log-sum-exp; with
    "cudnn" the kernel's saved values, named like the attention's output), the MLPs' gate and up products
    and the experts' routing (chosen experts and sort orders), and recomputes the rest from them: the norms, RoPE, the SwiGLU gate, the dispatch gathers, and three matrix products per
    layer (pinned by ``tests/test_remat.py``):

    - the attention's output projection: the residual stream ``x + h`` between attention and MLP is not
      kept, and the MLP norm's backward needs it;
    - in a MoE layer, the router logits (the router softmax's backward needs them) and the experts' down
      projection (the combine weights' gradient needs the experts' outputs).

    The attention's forward is also computed again where the implementation keeps no statistics (any but
    "splash" and "cudnn"). The dense SwiGLU's down projection is not recomputed (its output is only added)."""
    names = (ATTENTION_QKV, ATTENTION_OUTPUT, SPLASH_RESIDUALS, MLP_GATE_UP, MOE_ROUTING)
    return eqx.filter_checkpoint(fn, policy=jax.checkpoint_policies.save_only_these_names(*names))


class Block(eqx.Module):
    """A pre-norm decoder block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (mlp dense or MoE)."""

    attn_norm: NamedArray
    attn: Attention
    mlp_norm: NamedArray
    mlp: SwiGLU | MoE
    norm_eps: float = eqx.field(static=True)

    @staticmethod
    def init(config: LlamaConfig, params: ParamFactory, *, lead: tuple[hax.Axis, ...] = ()) -> Block:
        """A block's parameters, each with the ``lead`` axes in front (``(layers,)`` for the stack)."""
        ax = axes_for(config)
        attn = Attention.init(config, params, lead=lead)
        moe = config.moe
        if moe is not None:
            mlp: SwiGLU | MoE = MoE.init(moe, params, lead=lead)
        else:
            std = config.initializer_range
            out_std = std / (2 * config.num_layers) ** 0.5
            mlp = SwiGLU.init(ax[EMBED], ax[MLP], params, std=std, out_std=out_std, lead=lead)
        return Block(
            attn_norm=ones((*lead, ax[EMBED])),
            attn=attn,
            mlp_norm=ones((*lead, ax[EMBED])),
            mlp=mlp,
            norm_eps=config.norm_eps,
        )

    def __call__(
        self,
        x: NamedArray,
        cos: jax.Array,
        sin: jax.Array,
        segment_ids: jax.Array | None,
        *,
        kernels: str,
        reference: bool = False,
        rebalance: jax.Array | None = None,
    ) -> tuple[NamedArray, dict[str, jax.Array]]:
        recompute = kernels != "cpu"
        normed = rms_norm(x, self.attn_norm, EMBED, self.norm_eps, recompute=recompute)
        h = self.attn(normed, cos, sin, segment_ids, kernels=kernels, reference=reference)
        x = constrain(x + h)
        normed = rms_norm(x, self.mlp_norm, EMBED, self.norm_eps, recompute=recompute)
        if isinstance(self.mlp, MoE):
            h, stats = self.mlp(normed, kernels=kernels, rebalance=rebalance)
        else:
            h, stats = self.mlp(normed, kernels=kernels), {}
        return constrain(x + h), stats


class Transformer(eqx.Module):
    """A Llama-family decoder. Build with :func:`init`; call with int tokens to get float32 logits.

    Parameters (all float32, named axes): ``embed`` (vocab, embed); ``layers`` a haliax ``Stacked`` of
    :class:`Block` (every leaf has a leading ``layers`` axis); ``final_norm`` (embed); ``lm_head`` (vocab,
    embed) or ``None`` when embeddings are tied.
    """

    embed: NamedArray
    layers: hnn.Stacked
    final_norm: NamedArray
    lm_head: NamedArray | None
    config: LlamaConfig = eqx.field(static=True)

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array:
        """Logits float32[B, T, V] for int tokens [B, T] (attention causal and within segments)."""
        logits, _ = self.forward(tokens, segment_ids=segment_ids)
        return logits

    def forward(
        self, tokens: jax.Array, *, segment_ids: jax.Array | None = None
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Logits float32[B, T, V] and the per-layer aux arrays (MoE router stats; empty for dense)."""
        h, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        head = self.output_embedding().astype(h.dtype)
        kernels = resolve_kernels(self.config.kernels)
        logits = named_dot(h, head, EMBED, kernels=kernels, out_dtype=jnp.float32)
        return logits.rearrange((BATCH, POSITION, VOCAB)).array, aux

    def output_embedding(self) -> NamedArray:
        """The (vocab, embed) output projection (the input embedding when tied)."""
        return self.embed if self.lm_head is None else self.lm_head

    def hidden_states(
        self,
        tokens: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        reference_attention: bool = False,
        rebalance: jax.Array | None = None,
    ) -> tuple[NamedArray, dict[str, jax.Array]]:
        """Final-normed hidden states (batch, position, embed) in the compute dtype, and the aux arrays.

        ``rebalance``, float32[layers, experts]: quantile balancing's re-solve pass
        (:func:`schooner.model.balance_stats`): every MoE layer solves its balancing shift on these tokens and
        routes them with it, less its row of ``rebalance`` (the rate's take-back), before the next layer runs.
        """
        cfg = self.config
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"tokens must be an int array [batch, seq_len]; got {tokens.dtype}{list(tokens.shape)}."
            )
        if segment_ids is not None:
            segment_ids = jnp.asarray(segment_ids)
            if segment_ids.shape != tokens.shape:
                raise ValueError(
                    f"segment_ids must have the tokens' shape {tuple(tokens.shape)}; got {tuple(segment_ids.shape)}."
                )
        dtype = resolve_compute_dtype(cfg)
        b, t = tokens.shape
        batch, position = hax.Axis(BATCH, b), hax.Axis(POSITION, t)
        x = self.embed.array.astype(dtype)[tokens]
        x = constrain(hax.named(x, (batch, position, self.embed.axes[1])))
        cos, sin = rope_cos_sin(t, cfg.resolved_head_dim, cfg.rope)

        kernels = resolve_kernels(cfg.kernels)  # the one backend decision of this trace

        def run_block(
            block: Block, carry: NamedArray, *take_back: jax.Array
        ) -> tuple[NamedArray, dict[str, jax.Array]]:
            return block(
                carry,
                cos,
                sin,
                segment_ids,
                kernels=kernels,
                reference=reference_attention,
                rebalance=take_back[0] if take_back else None,
            )

        if cfg.gradient_checkpointing == "dots":
            run_block = _dots_remat(run_block)
        per_layer: tuple[jax.Array, ...] = ()  # scanned with the layers
        if rebalance is not None:
            want = (cfg.num_layers, cfg.moe.num_experts if cfg.moe is not None else None)
            if jnp.shape(rebalance) != want:
                raise ValueError(
                    f"rebalance must be float32[layers, experts] = {want}, a MoE model's take-back per layer; "
                    f"got shape {jnp.shape(rebalance)}."
                )
            per_layer = (jnp.asarray(rebalance, jnp.float32),)
        if cfg.scan_layers:
            x, aux = self.layers.scan_via(run_block)(x, *per_layer)
        else:
            x, aux = self._unrolled(run_block, x, *per_layer)
        return rms_norm(x, self.final_norm, EMBED, cfg.norm_eps, recompute=kernels != "cpu"), aux

    def _unrolled(
        self,
        run_block: Callable[..., tuple[NamedArray, dict[str, jax.Array]]],
        x: NamedArray,
        *per_layer: jax.Array,
    ) -> tuple[NamedArray, dict[str, jax.Array]]:
        policy = self.config.gradient_checkpointing
        fn = run_block if policy in ("none", "dots") else eqx.filter_checkpoint(run_block)
        outs = []
        for i in range(self.config.num_layers):
            x, stats = fn(self.layers.get_layer(i), x, *(a[i] for a in per_layer))
            outs.append(stats)
        aux = {k: jnp.stack([o[k] for o in outs]) for k in outs[0]} if outs and outs[0] else {}
        return x, aux


def init(config: LlamaConfig, *, key: jax.Array) -> Transformer:
    """Build a randomly initialised model for ``config`` (deterministic in ``key``; jitted).

    Weights are truncated normals (std ``initializer_range``; residual output projections scaled by
    ``1/sqrt(2 num_layers)``), norms are ones. Wrap in ``jax.jit(..., out_shardings=model_shardings(...))``
    to initialise a large model directly sharded.

    Example:
        >>> import jax
        >>> from schooner.model import init, presets
        >>> model = init(presets.llama_nano, key=jax.random.PRNGKey(0))
        >>> model(jax.numpy.zeros((1, 8), jax.numpy.int32)).shape
        (1, 8, 512)
    """
    if not isinstance(config, LlamaConfig):
        raise TypeError(f"init needs a LlamaConfig/MoEConfig; got {type(config).__name__}.")
    return _init_jit(config, key)


def _build(config: LlamaConfig, params: ParamFactory) -> Transformer:
    ax = axes_for(config)
    std = config.initializer_range
    embed = params.normal((ax[VOCAB], ax[EMBED]), std)
    lm_head = None if config.tie_embeddings else params.normal((ax[VOCAB], ax[EMBED]), std)
    block = Block.init(config, params, lead=(ax[LAYERS],))
    policy = ScanCheckpointPolicy.from_bool_or_str(_POLICIES[config.gradient_checkpointing])
    return Transformer(
        embed=embed,
        layers=hnn.Stacked(block, ax[LAYERS], policy),
        final_norm=ones((ax[EMBED],)),
        lm_head=lm_head,
        config=config,
    )


@eqx.filter_jit
def _init_jit(config: LlamaConfig, key: jax.Array) -> Transformer:
    counter = ParamFactory()
    _build(config, counter)  # sizes only; its zeros are dead code
    buffer = jax.random.truncated_normal(key, -3.0, 3.0, (counter.offset,), jnp.float32)
    return _build(config, ParamFactory(buffer))
