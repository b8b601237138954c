"""Write `trl_grpo_reference.json`: TRL's own GRPO/RLOO numbers on fixed random inputs, for test_rl_objective.py.

Run with TRL and CPU torch installed OUTSIDE the project (they are not Schooner dependencies):

    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch trl
    /tmp/trl/bin/python lib/train/tests/data/make_trl_grpo_reference.py

Made with trl 1.16.0, torch 2.14.1, accelerate 1.16.0 (recorded in the file). What comes from where:

* the loss, its gradient and the loss metrics: TRL's own `GRPOTrainer._compute_loss`
  (trl/trainer/grpo_trainer.py, lines 3020-3297 in 1.16.0), called on a trainer object whose model forward
  (`_get_per_token_logps_and_entropies`) returns fixed log-probs and entropies; the log-probs are a leaf
  tensor, so `loss.backward()` gives TRL's gradient with respect to them. Everything else in the method
  runs as in training (a real single-process `accelerate.Accelerator` on CPU, gradient accumulation 1);
* per-token log-probs and entropies: TRL's `selective_log_softmax` and `entropy_from_logits`
  (trl/trainer/utils.py) on random logits divided by the sampling temperature, as `_get_per_token_logps_and_entropies`
  does;
* advantages: computed inline in `_generate_and_score_completions`, which needs a model to generate, so the
  lines are reproduced below verbatim with TRL's own `nanstd`: GRPO's "sum_then_normalize" branch
  (grpo_trainer.py lines 2761-2790 and 2810, one reward function of weight 1) and RLOO's
  (rloo_trainer.py lines 1675-1699, beta 0).
"""

from __future__ import annotations

import json
import os
import types
from collections import defaultdict

import accelerate
import numpy as np
import torch
import trl
from trl import GRPOTrainer
from trl.trainer.utils import entropy_from_logits, nanstd, selective_log_softmax

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, V, G = 8, 7, 11, 4  # completions, positions, vocabulary, samples per prompt
TEMPERATURE = 0.7


def trl_grpo_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """grpo_trainer.py 1.16.0 lines 2761-2790 and 2810 (sum_then_normalize, one reward function)."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        if rewards.numel() > 1:
            std_rewards = nanstd(rewards).expand_as(rewards)
        else:
            std_rewards = torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def trl_rloo_advantages(
    rewards: torch.Tensor, num_generations: int, normalize_advantages: bool
) -> torch.Tensor:
    """rloo_trainer.py 1.16.0 lines 1675-1699 (beta 0: no KL in the reward)."""
    grouped_rewards = rewards.view(-1, num_generations)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    if num_generations > 1:
        baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
        baselines = baselines.view(-1)
        advantages = rewards - baselines
    else:
        advantages = torch.zeros_like(rewards)
    if normalize_advantages:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def trl_loss(
    logps: torch.Tensor,
    entropies: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    loss_type: str,
    epsilon: float,
    epsilon_high: float | None,
    beta: float,
    delta: float | None,
    use_bias_correction_kl: bool,
    importance_sampling_level: str,
    max_completion_length: int,
    num_items_in_batch: float,
    accelerator: accelerate.Accelerator,
) -> dict:
    """TRL's `_compute_loss` on these log-probs: the loss, d loss / d logps, and the metrics it logs."""
    trainer = object.__new__(GRPOTrainer)  # no model, no dataset: only what _compute_loss reads
    leaf = logps.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (leaf, entropies, None)
    trainer.__dict__.update(
        model=types.SimpleNamespace(training=True),
        args=types.SimpleNamespace(
            delta=delta, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=1
        ),
        accelerator=accelerator,
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high if epsilon_high is not None else epsilon,  # as GRPOTrainer.__init__ sets it
        beta=beta,
        importance_sampling_level=importance_sampling_level,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logps,
        "num_items_in_batch": torch.tensor(num_items_in_batch, dtype=torch.float64),
    }
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logps
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return {"loss": loss.item(), "grad_logps": leaf.grad.tolist(), "metrics": metrics}


def main() -> None:
    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(39)
    lengths = np.array([7, 3, 5, 1, 6, 7, 2, 4])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
    tokens = rng.integers(0, V, size=(B, T))
    old_logits = rng.normal(0, 2, size=(B, T, V))
    # the policy moved a little since sampling, the reference a little more the other way: some ratios clip
    logits = old_logits + rng.normal(0, 0.5, size=(B, T, V))
    ref_logits = old_logits + rng.normal(0, 0.5, size=(B, T, V))
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])  # group 2: all equal (zero std)
    rewards_nan = np.array([1.0, np.nan, 0.0, 1.0, 0.25, 0.0, 1.0, 0.75])  # an unscorable completion

    def logps_of(x: np.ndarray) -> torch.Tensor:
        return selective_log_softmax(torch.tensor(x) / TEMPERATURE, torch.tensor(tokens))

    policy, old, ref = logps_of(logits), logps_of(old_logits), logps_of(ref_logits)
    entropies = entropy_from_logits(torch.tensor(logits) / TEMPERATURE)
    mask_t = torch.tensor(mask)

    advantages = {}
    for name, r in (("rewards", rewards), ("rewards_nan", rewards_nan)):
        rt = torch.tensor(r)
        for scale in ("group", "batch", "none"):
            advantages[f"grpo/{scale}/{name}"] = trl_grpo_advantages(rt, G, scale).tolist()
        for normalize in (False, True):
            advantages[f"rloo/{normalize}/{name}"] = trl_rloo_advantages(rt, G, normalize).tolist()

    accelerator = accelerate.Accelerator(cpu=True)
    base = {"epsilon": 0.2, "epsilon_high": None, "beta": 0.0, "delta": None, "use_bias_correction_kl": True}
    base |= {"importance_sampling_level": "token"}
    base |= {"max_completion_length": 10, "num_items_in_batch": float(mask.sum())}
    cases = {
        "grpo": {**base, "loss_type": "grpo", "advantages": "grpo/group/rewards"},
        "grpo_kl": {**base, "loss_type": "grpo", "beta": 0.04, "advantages": "grpo/group/rewards_nan"},
        "bnpo_kl_uncorrected": {
            **base,
            "loss_type": "bnpo",
            "beta": 0.04,
            "use_bias_correction_kl": False,
            "advantages": "grpo/batch/rewards",
        },
        "dr_grpo": {**base, "loss_type": "dr_grpo", "advantages": "grpo/none/rewards"},
        "dapo_clip_higher": {
            **base,
            "loss_type": "dapo",
            "epsilon_high": 0.28,
            "advantages": "grpo/group/rewards",
        },
        "dapo_global_tokens": {
            **base,
            "loss_type": "dapo",
            "epsilon_high": 0.28,
            "num_items_in_batch": 3.0 * float(mask.sum()),  # this batch is one of three in the step
            "advantages": "grpo/group/rewards_nan",
        },
        "dapo_delta_kl": {
            **base,
            "loss_type": "dapo",
            "delta": 1.4,
            "beta": 0.1,
            "epsilon": 0.1,
            "advantages": "rloo/True/rewards",
        },
        "bnpo_rloo": {**base, "loss_type": "bnpo", "advantages": "rloo/False/rewards_nan"},
        "gspo": {
            **base,
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 0.1,
            "advantages": "grpo/group/rewards_nan",
        },
        "gspo_kl": {
            **base,
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 0.05,
            "epsilon_high": 0.08,
            "beta": 0.04,
            "advantages": "grpo/group/rewards",
        },
    }
    results = {}
    for name, case in cases.items():
        settings = {k: v for k, v in case.items() if k != "advantages"}
        adv = torch.tensor(advantages[case["advantages"]])
        results[name] = {
            **trl_loss(policy, entropies, old, ref, mask_t, adv, accelerator=accelerator, **settings),
            "settings": case,
        }

    payload = {
        "made_with": {
            "trl": trl.__version__,
            "torch": torch.__version__,
            "accelerate": accelerate.__version__,
        },
        "shape": {"B": B, "T": T, "V": V, "G": G},
        "temperature": TEMPERATURE,
        "tokens": tokens.tolist(),
        "mask": mask.tolist(),
        "logits": logits.tolist(),
        "old_logits": old_logits.tolist(),
        "ref_logits": ref_logits.tolist(),
        "rewards": rewards.tolist(),
        "rewards_nan": [None if np.isnan(x) else x for x in rewards_nan],
        "logps": policy.tolist(),
        "old_logps": old.tolist(),
        "ref_logps": ref.tolist(),
        "entropies": entropies.tolist(),
        "advantages": advantages,
        "cases": results,
    }
    path = os.path.join(HERE, "trl_grpo_reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
