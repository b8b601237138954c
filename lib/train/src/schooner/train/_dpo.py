"""Direct preference optimisation's loss: sequence log-probs, the pairwise losses, and a pair scorer.

A preference cache (`schooner.tokenize.steps.tokenized_preferences`) holds, for pair `i`, the prompt +
chosen answer and the prompt + rejected answer, each with a loss mask over the answer. A sequence's
log-prob is the sum of the log-probs of its answer tokens. `reference_logprobs` scores every pair of the
train and validation caches with the reference model once and stores the sums (`train.npz`,
`validation.npz`): the trainer reads them by pair index and never holds a second model. Or `dpo` takes the
reference model itself and scores it inside the train step (`_dpo_run.LiveReference`).

With `pc, pr` the policy's and `rc, rr` the reference's log-probs of chosen and rejected answers and
`z = (pc - rc) - (pr - rr)`, the per-pair losses are TRL's:

    sigmoid (default)  -(1 - eps) * log sigmoid(beta * z) - eps * log sigmoid(-beta * z)
    hinge              relu(1 - beta * z)
    ipo                (z - 1 / (2 * beta))^2   with per-token mean log-probs (as in the IPO paper and TRL)

and the metrics have TRL's names: `rewards/chosen` = mean of `beta * (pc - rc)`, `rewards/rejected` = mean
of `beta * (pr - rr)`, `rewards/accuracies` = the share of pairs whose chosen reward is the larger,
`rewards/margins` = mean reward difference, `logps/chosen`, `logps/rejected` = the policy's mean summed
log-probs. With the policy equal to the reference, `z = 0` and the sigmoid loss is log 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LOSS_TYPES = ("sigmoid", "hinge", "ipo")
ROLES = ("chosen", "rejected")


# -- the losses ----------------------------------------------------------------------------------------
def dpo_loss(
    policy_chosen: Any,
    policy_rejected: Any,
    reference_chosen: Any,
    reference_rejected: Any,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[Any, Any, Any]:
    """Per-pair losses and the implicit rewards `(losses, chosen_rewards, rejected_rewards)`, all [B].

    Inputs are the sequences' log-probs (per-token means for `"ipo"`); see the module docstring.
    """
    import jax
    import jax.numpy as jnp

    z = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * jax.nn.log_sigmoid(beta * z) - label_smoothing * jax.nn.log_sigmoid(
            -beta * z
        )
    elif loss_type == "hinge":
        losses = jax.nn.relu(1 - beta * z)
    elif loss_type == "ipo":
        losses = (z - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"dpo loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    chosen = beta * jax.lax.stop_gradient(policy_chosen - reference_chosen)
    rejected = beta * jax.lax.stop_gradient(policy_rejected - reference_rejected)
    return losses, jnp.asarray(chosen), jnp.asarray(rejected)


def sequence_logps(model: Any, tokens: Any, segment_ids: Any, loss_mask: Any) -> tuple[Any, Any]:
    """`(sum, count)` [B]: the summed log-probs of each row's target tokens (`loss_mask` = 1 where a token
    is a target, as the data loader gives it) and how many there are. Differentiable in `model`."""
    import jax.numpy as jnp

    from schooner.model import target_mask_to_loss_mask, target_weights, token_losses

    w = target_weights(tokens, segment_ids, target_mask_to_loss_mask(loss_mask))
    nll = token_losses(model, tokens, segment_ids)
    return -jnp.sum(w * nll, axis=1), jnp.sum(w, axis=1)


def make_dpo_loss(*, beta: float, loss_type: str, label_smoothing: float) -> Any:
    """`loss(model, batch, key) -> (loss, (metrics, None))` for `make_train_step`: the batch holds a
    `PreferenceDataset` batch and the reference's `ref_{chosen,rejected}_logps` (and `_count`s).

    A batch may also hold `ref_is_policy` (bool [B]): True where the policy being trained is the reference
    itself (the first step of a run that starts from the reference). There the reference's log-probs are
    the policy's own, the same numbers, not a second computation of them (in another program, or a forward
    pass outside the gradient's) that differs in the last bits: the rewards are exactly 0, the strict
    accuracy `chosen > rejected` exactly 0.0 as in TRL (float noise gave values like 0.375), the loss
    exactly log 2, and the gradient is unchanged (the reference's terms carry none)."""
    import jax
    import jax.numpy as jnp

    def loss(model: Any, b: dict, key: Any) -> tuple[Any, tuple]:
        del key
        both = {
            k: jnp.concatenate([b[f"chosen_{k}"], b[f"rejected_{k}"]])
            for k in ("tokens", "segment_ids", "loss_mask")
        }
        logps, counts = sequence_logps(model, both["tokens"], both["segment_ids"], both["loss_mask"])
        n = b["chosen_tokens"].shape[0]
        pc, pr = logps[:n], logps[n:]
        rc, rr = b["ref_chosen_logps"], b["ref_rejected_logps"]
        if "ref_is_policy" in b:
            same = b["ref_is_policy"]
            rc = jnp.where(same, jax.lax.stop_gradient(pc), rc)
            rr = jnp.where(same, jax.lax.stop_gradient(pr), rr)
        if loss_type == "ipo":  # per-token means, for the policy and the reference alike
            cc, cr = jnp.maximum(counts[:n], 1), jnp.maximum(counts[n:], 1)
            pc, pr, rc, rr = pc / cc, pr / cr, rc / cc, rr / cr
        losses, chosen, rejected = dpo_loss(
            pc, pr, rc, rr, beta=beta, loss_type=loss_type, label_smoothing=label_smoothing
        )
        total = jnp.mean(losses)
        metrics = {
            "loss": total,
            "token_count": jnp.asarray(n, jnp.float32),  # the microbatch weight: pairs
            "rewards/chosen": jnp.mean(chosen),
            "rewards/rejected": jnp.mean(rejected),
            "rewards/accuracies": jnp.mean((chosen > rejected).astype(jnp.float32)),
            "rewards/margins": jnp.mean(chosen - rejected),
            "logps/chosen": jnp.mean(logps[:n]),
            "logps/rejected": jnp.mean(logps[n:]),
        }
        return total, (metrics, None)

    return loss


def score_pairs(model: Any, dataset: Any, batch_size: int) -> dict[str, np.ndarray]:
    """Every pair's `{chosen,rejected}_{logps,count}` (float64 [num_pairs]) under `model`, in cache order."""
    import equinox as eqx

    fn = eqx.filter_jit(sequence_logps)
    out = {f"{r}_{k}": np.zeros(dataset.num_pairs) for r in ROLES for k in ("logps", "count")}
    for start in range(0, dataset.num_pairs, batch_size):
        idx = np.arange(start, min(start + batch_size, dataset.num_pairs))
        b = dataset.pairs(np.concatenate([idx, np.repeat(idx[:1], batch_size - idx.size)]))  # fixed shape
        for r in ROLES:
            s, c = fn(model, b[f"{r}_tokens"], b[f"{r}_segment_ids"], b[f"{r}_loss_mask"])
            out[f"{r}_logps"][idx] = np.asarray(s, np.float64)[: idx.size]
            out[f"{r}_count"][idx] = np.asarray(c, np.float64)[: idx.size]
    return out
