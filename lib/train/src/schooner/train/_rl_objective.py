"""The GRPO family's objective as pure JAX functions: group-relative advantages, the clipped per-token loss
against the sampling policy, the KL penalty to a reference, TRL's loss aggregations, and the step's metrics.

Everything here equals TRL's `GRPOTrainer` and `RLOOTrainer` (TRL 1.16.0, `trl/trainer/grpo_trainer.py`
`_generate_and_score_completions` and `_compute_loss`; `trl/trainer/rloo_trainer.py`) on the same
log-probabilities, to 1e-6 in float64 (tested against TRL's own code, `tests/data/make_trl_grpo_reference.py`).
Shapes: `B` completions, `T` completion positions (right-padded; `mask` is 1 on a completion's tokens and 0
on padding and after its end); rewards come grouped, `(P, G)` for `P` prompts of `G` samples each.

**Advantages** (one per completion; `nan` rewards mark unscorable completions, left out of the statistics and
given advantage 0, as in TRL):

    grpo     (r - mean_g r) / (std_g r + 1e-4)   std with Bessel's correction (TRL's `nanstd`), per group
             (`scale="group"`, TRL's default), over the whole batch (`"batch"`) or not at all (`"none"`)
    dr_grpo  r - mean_g r                        (Dr. GRPO: no std; pair it with the `dr_grpo` aggregation)
    rloo     r - (sum_g r - r) / (G - 1)         the mean of the other samples of the prompt; with
             `normalize`, then (a - mean a) / (std a + 1e-4) over the batch (TRL's `normalize_advantages`)

**Per-token loss** with `ratio = exp(logp - old_logp)` (`old_logp`: the sampling policy's log-probs; equal
to `logp` with one policy update per batch of rollouts, where the ratio is 1 and only its gradient acts):

    loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * kl_t
    kl_t   = exp(ref - logp) - (ref - logp) - 1            (the k3 estimator, >= 0)
             times `ratio` when `kl_importance_correction` (TRL's `use_bias_correction_kl`, default on)

`eps_high > eps_low` is DAPO's clip-higher; `delta` caps the unclipped ratio as well (TRL's two-sided
clipping); `importance_sampling="sequence"` uses one ratio per completion, the exp of its mean per-token
log-ratio (GSPO; the clip fractions are then shares of completions). **Aggregation** (TRL's `loss_type`; `m` the mask):

    grpo     mean over sequences of (sum_t loss_t m_t / sum_t m_t)        each sequence weighs the same
    bnpo     sum loss_t m_t / sum m_t                                      tokens of this batch weigh the same
    dr_grpo  sum loss_t m_t / (B * max_completion_length)                  a constant divisor (Dr. GRPO)
    dapo     sum loss_t m_t / num_items                                    tokens of the whole generation batch
                                                                           weigh the same (TRL's default)

`num_items` is the count of completion tokens the whole step's loss is normalised by (every microbatch and
device together: TRL's `num_items_in_batch / num_processes * gradient_accumulation_steps /
steps_per_generation`); it defaults to this batch's `sum m`. The `grpo`, `bnpo` and `dr_grpo` values are per
microbatch: a trainer accumulating gradients divides them by its number of microbatches, as TRL does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

ADVANTAGES = ("grpo", "dr_grpo", "rloo")
AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")
STD_EPS = 1e-4
"""Added to the reward std before dividing (TRL's constant)."""


# -- advantages -----------------------------------------------------------------------------------------
def _nanstd(x: jax.Array, axis: int | None = None) -> jax.Array:
    """TRL's `nanstd`: the standard deviation with Bessel's correction, NaNs left out (NaN for one value)."""
    mean = jnp.nanmean(x, axis=axis, keepdims=True)
    var = jnp.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
    count = jnp.sum(~jnp.isnan(x), axis=axis, keepdims=True)
    var = var * jnp.where(count > 1, count / jnp.maximum(count - 1, 1), jnp.nan)
    std = jnp.sqrt(var)
    return std.reshape(()) if axis is None else jnp.squeeze(std, axis)


def _grouped(rewards: Any) -> jax.Array:
    rewards = jnp.asarray(rewards)
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards must be grouped as (prompts, samples per prompt), got shape {rewards.shape}; "
            "reshape a flat batch with rewards.reshape(-1, num_generations)"
        )
    return rewards


def grpo_advantages(rewards: Any, *, scale: str = "group", eps: float = STD_EPS) -> jax.Array:
    """GRPO's advantages of `(P, G)` rewards: each minus its group's mean, over a std (`scale`), shape `(P, G)`.

    `scale="group"` divides by the group's std (TRL's default), `"batch"` by the std of all rewards, `"none"`
    by nothing (Dr. GRPO). A group of one sample has std 0 (TRL's convention), so its advantage is 0.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    rewards = _grouped(rewards)
    num_generations = rewards.shape[1]
    centred = rewards - jnp.nanmean(rewards, axis=1, keepdims=True)
    if scale == "group":
        std = _nanstd(rewards, axis=1)[:, None] if num_generations > 1 else jnp.zeros_like(rewards)
        centred = centred / (std + eps)
    elif scale == "batch":
        std = _nanstd(rewards) if rewards.size > 1 else jnp.zeros_like(rewards)
        centred = centred / (std + eps)
    return jnp.nan_to_num(centred, nan=0.0)


def dr_grpo_advantages(rewards: Any) -> jax.Array:
    """Dr. GRPO's advantages of `(P, G)` rewards: each minus its group's mean, no std."""
    return grpo_advantages(rewards, scale="none")


def rloo_advantages(rewards: Any, *, normalize: bool = False, eps: float = STD_EPS) -> jax.Array:
    """RLOO's advantages of `(P, G)` rewards: each minus the mean of the other samples of its prompt.

    With `normalize`, the advantages are then centred and divided by their std over the whole batch (TRL's
    `normalize_advantages`). A prompt with one scorable sample has no baseline: advantage 0.
    """
    rewards = _grouped(rewards)
    if rewards.shape[1] == 1:
        return jnp.zeros_like(rewards)
    count = jnp.sum(~jnp.isnan(rewards), axis=1, keepdims=True)
    baseline = (jnp.nansum(rewards, axis=1, keepdims=True) - rewards) / (count - 1)
    advantages = rewards - baseline
    if normalize:
        advantages = (advantages - jnp.nanmean(advantages)) / (_nanstd(advantages) + eps)
    return jnp.nan_to_num(advantages, nan=0.0)


def group_advantages(rewards: Any, estimator: str = "grpo", **kwargs: Any) -> jax.Array:
    """The advantages of `(P, G)` rewards by `estimator` ("grpo", "dr_grpo" or "rloo"), shape `(P, G)`."""
    if estimator == "grpo":
        return grpo_advantages(rewards, **kwargs)
    if estimator == "dr_grpo":
        return dr_grpo_advantages(rewards, **kwargs)
    if estimator == "rloo":
        return rloo_advantages(rewards, **kwargs)
    raise ValueError(f"estimator must be one of {ADVANTAGES}, got {estimator!r}")


# -- the loss -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The clipped policy-gradient loss (TRL's `GRPOConfig` names in brackets).

    Attributes:
        aggregation: how per-token losses become one number, one of `AGGREGATIONS` [`loss_type`; TRL's
            default "dapo"].
        epsilon_low: the ratio is clipped below at `1 - epsilon_low` [`epsilon`].
        epsilon_high: clipped above at `1 + epsilon_high`; None: `epsilon_low` (symmetric). DAPO's
            clip-higher uses e.g. 0.28 with `epsilon_low=0.2` [`epsilon_high`].
        delta: when set, the unclipped ratio is capped at `delta` too (two-sided GRPO) [`delta`].
        beta: the weight of the k3 KL penalty to the reference; 0 needs no reference [`beta`].
        kl_importance_correction: multiply the KL term by the ratio [`use_bias_correction_kl`, default True].
        max_completion_length: the `dr_grpo` aggregation's divisor per sequence (required for it)
            [`max_completion_length`].
        importance_sampling: "token" (one ratio per token) or "sequence" (GSPO: one ratio per completion,
            `exp` of its mean per-token log-ratio, clipped as a whole; TRL recommends the `grpo` aggregation
            with it) [`importance_sampling_level`].
    """

    aggregation: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    beta: float = 0.0
    kl_importance_correction: bool = True
    max_completion_length: int | None = None
    importance_sampling: str = "token"

    def __post_init__(self) -> None:
        if self.importance_sampling not in ("token", "sequence"):
            raise ValueError(
                f"importance_sampling must be 'token' or 'sequence', got importance_sampling={self.importance_sampling!r}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {AGGREGATIONS}, got aggregation={self.aggregation!r}"
            )
        if not 0 <= self.epsilon_low < 1:
            raise ValueError(f"epsilon_low must be in [0, 1), got epsilon_low={self.epsilon_low!r}")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            raise ValueError(f"epsilon_high must be None or >= 0, got epsilon_high={self.epsilon_high!r}")
        if self.delta is not None and self.delta <= 1:
            raise ValueError(f"delta must be None or > 1 (a cap on the ratio), got delta={self.delta!r}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got beta={self.beta!r}")
        if self.aggregation == "dr_grpo" and (self.max_completion_length or 0) < 1:
            raise ValueError(
                "aggregation='dr_grpo' divides by max_completion_length: set it to the rollouts' length cap, "
                f"got max_completion_length={self.max_completion_length!r}"
            )

    @property
    def eps_high(self) -> float:
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high


def k3_kl(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """The per-token k3 estimator of KL(policy || reference): `exp(ref - logp) - (ref - logp) - 1` (>= 0).

    Computed as `expm1(diff) - diff`, the same value without the cancellation: near the reference (a diff of
    1e-3, k3 about 5e-7) `exp(diff) - diff - 1` in float32 is off by 5-25%, and below a diff of about 3e-4 it is 0.
    """
    diff = ref_logprobs - logprobs
    return jnp.expm1(diff) - diff


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    config: PolicyLossConfig,
    *,
    ref_logprobs: jax.Array | None = None,
    num_items: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped policy-gradient loss of a batch of completions, and its metrics (module docstring).

    Args:
        logprobs: `(B, T)` the policy's log-probs of the sampled tokens (differentiated).
        old_logprobs: `(B, T)` the sampling policy's log-probs of the same tokens (constants).
        advantages: `(B,)` one per completion, or `(B, T)` one per token.
        mask: `(B, T)` 1 on completion tokens, 0 elsewhere.
        config: the clipping, KL and aggregation settings.
        ref_logprobs: `(B, T)` the frozen reference's log-probs; required when `config.beta > 0`.
        num_items: the `dapo` aggregation's token count (default: `mask.sum()`).

    Returns:
        The loss, and metrics under TRL's names: `kl` (when beta > 0; mean over tokens),
        `clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean` (shares of tokens whose ratio
        is clipped below with a negative advantage, above with a positive one, either), `clip_ratio/low_min`
        and `clip_ratio/high_max` (the extremes over sequences of their own shares), `policy_loss`.
    """
    if logprobs.ndim != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            "logprobs, old_logprobs and mask must share one (completions, positions) shape, got "
            f"{logprobs.shape}, {old_logprobs.shape}, {mask.shape}"
        )
    if config.beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={config.beta} needs ref_logprobs (the reference's log-probs), got None")
    mask = mask.astype(logprobs.dtype)
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    old = jax.lax.stop_gradient(old_logprobs)
    log_ratio = logprobs - old
    if config.importance_sampling == "sequence":  # GSPO: one ratio per sequence, of its mean log-ratio
        log_ratio = (log_ratio * mask).sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1 - config.epsilon_low, 1 + config.eps_high)
    capped = ratio if config.delta is None else jnp.minimum(ratio, config.delta)
    per_token = -jnp.minimum(capped * adv, clipped * adv)
    metrics: dict[str, jax.Array] = {}
    tokens = jnp.maximum(mask.sum(), 1.0)
    if config.beta > 0:
        assert ref_logprobs is not None
        kl = k3_kl(logprobs, jax.lax.stop_gradient(ref_logprobs))
        if config.kl_importance_correction:
            kl = kl * ratio
        per_token = per_token + config.beta * kl
        metrics["kl"] = (kl * mask).sum() / tokens
    loss = aggregate(per_token, mask, config, num_items=num_items)
    # the shares clipped, of the ratio after the `delta` cap (as TRL counts them)
    low = ((capped < 1 - config.epsilon_low) & (adv < 0)).astype(mask.dtype)
    high = ((capped > 1 + config.eps_high) & (adv > 0)).astype(mask.dtype)
    region = jnp.maximum(low, high)
    if low.shape[1] == 1:  # one ratio per sequence: shares of sequences
        for name, x in (("low_mean", low), ("high_mean", high), ("region_mean", region)):
            metrics[f"clip_ratio/{name}"] = x.mean()
        metrics["clip_ratio/low_min"], metrics["clip_ratio/high_max"] = low.min(), high.max()
    else:
        for name, x in (("low_mean", low), ("high_mean", high), ("region_mean", region)):
            metrics[f"clip_ratio/{name}"] = (x * mask).sum() / tokens
        # per sequence: the lowest share clipped below, the highest clipped above (an empty one is left out)
        per_seq = mask.sum(-1)
        metrics["clip_ratio/low_min"] = jnp.nanmin((low * mask).sum(-1) / per_seq)
        metrics["clip_ratio/high_max"] = jnp.nanmax((high * mask).sum(-1) / per_seq)
    metrics["policy_loss"] = jax.lax.stop_gradient(loss)
    return loss, metrics


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    config: PolicyLossConfig,
    *,
    num_items: jax.Array | float | None = None,
) -> jax.Array:
    """`(B, T)` per-token losses -> one loss by `config.aggregation` (module docstring)."""
    mask = mask.astype(per_token.dtype)
    summed = per_token * mask
    if config.aggregation == "grpo":
        return (summed.sum(-1) / jnp.maximum(mask.sum(-1), 1.0)).mean()
    if config.aggregation == "bnpo":
        return summed.sum() / jnp.maximum(mask.sum(), 1.0)
    if config.aggregation == "dr_grpo":
        assert config.max_completion_length is not None
        return summed.sum() / (per_token.shape[0] * config.max_completion_length)
    items = mask.sum() if num_items is None else jnp.asarray(num_items, per_token.dtype)
    return summed.sum() / jnp.maximum(items, 1.0)


# -- per-token quantities and metrics -------------------------------------------------------------------
def token_logprobs(logits: jax.Array, tokens: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """`(B, T)` log-probs of `tokens` under `(B, T, V)` logits divided by the sampling temperature.

    The policy's log-probs are those of the distribution the tokens were sampled from: TRL divides the logits
    by the sampling temperature before the log-softmax, and so must the trainer here.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def entropy_from_logits(logits: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """The entropy (nats) of each position's next-token distribution, `(..., V)` -> `(...)`."""
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def rollout_metrics(
    rewards: jax.Array, mask: jax.Array, entropies: jax.Array | None = None
) -> dict[str, jax.Array]:
    """A batch of rollouts' metrics under TRL's names.

    `reward` and `reward_std` (NaN-free mean and Bessel std of `(P, G)` rewards), `frac_reward_zero_std` (share
    of groups whose rewards all agree: no learning signal), `completions/mean_length`, `min_length`,
    `max_length` (tokens under `mask`), and `entropy` (mean over completion tokens) when `entropies` is given.
    """
    rewards = _grouped(rewards)
    lengths = mask.astype(jnp.float32).sum(-1)
    group_std = _nanstd(rewards, axis=1) if rewards.shape[1] > 1 else jnp.zeros(rewards.shape[0])
    out = {
        "reward": jnp.nanmean(rewards),
        "reward_std": _nanstd(rewards),
        "frac_reward_zero_std": jnp.mean(jnp.isclose(group_std, 0.0).astype(jnp.float32)),
        "completions/mean_length": lengths.mean(),
        "completions/min_length": lengths.min(),
        "completions/max_length": lengths.max(),
    }
    if entropies is not None:
        m = mask.astype(entropies.dtype)
        out["entropy"] = (entropies * m).sum() / jnp.maximum(m.sum(), 1.0)
    return out
