"""The GRPO-family objective against (a) numpy written out from TRL's documented formulas, looping over
completions and tokens, and (b) TRL itself: `data/trl_grpo_reference.json` holds TRL 1.16.0's own
`GRPOTrainer._compute_loss` loss, gradient and metrics, and its advantages, on fixed random log-probs
(`data/make_trl_grpo_reference.py` says how it was made). Compared in float64 at 1e-6."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.train._rl_objective import (
    PolicyLossConfig,
    aggregate,
    dr_grpo_advantages,
    entropy_from_logits,
    group_advantages,
    grpo_advantages,
    k3_kl,
    policy_loss,
    rloo_advantages,
    rollout_metrics,
    token_logprobs,
)

TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.fixture(scope="module")
def ref() -> dict:
    with open(
        os.path.join(os.path.dirname(__file__), "data", "trl_grpo_reference.json"), encoding="utf-8"
    ) as f:
        return json.load(f)


def _a(x) -> jax.Array:
    return jnp.asarray(np.asarray(x, dtype=np.float64))


def _rewards(ref: dict, name: str) -> np.ndarray:
    return np.array([np.nan if r is None else r for r in ref[name]], dtype=np.float64).reshape(
        -1, ref["shape"]["G"]
    )


# -- (b) TRL itself ------------------------------------------------------------------------------------
def test_logprobs_and_entropy_equal_trl(x64, ref: dict) -> None:
    tokens = jnp.asarray(ref["tokens"])
    for key, logits in (("logps", "logits"), ("old_logps", "old_logits"), ("ref_logps", "ref_logits")):
        got = token_logprobs(_a(ref[logits]), tokens, temperature=ref["temperature"])
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref[key]), **TOL)
    got = entropy_from_logits(_a(ref["logits"]), temperature=ref["temperature"])
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref["entropies"]), **TOL)


def test_advantages_equal_trl(x64, ref: dict) -> None:
    assert len(ref["advantages"]) == 10
    for key, expected in ref["advantages"].items():
        estimator, option, rewards_name = key.split("/")
        rewards = _rewards(ref, rewards_name)
        if estimator == "grpo":
            got = grpo_advantages(rewards, scale=option)
        else:
            got = rloo_advantages(rewards, normalize=option == "True")
        np.testing.assert_allclose(np.asarray(got).reshape(-1), np.asarray(expected), **TOL, err_msg=key)


def _config(settings: dict) -> PolicyLossConfig:
    return PolicyLossConfig(
        aggregation=settings["loss_type"],
        epsilon_low=settings["epsilon"],
        epsilon_high=settings["epsilon_high"],
        delta=settings["delta"],
        beta=settings["beta"],
        kl_importance_correction=settings["use_bias_correction_kl"],
        max_completion_length=settings["max_completion_length"],
        importance_sampling=settings["importance_sampling_level"],
    )


def test_loss_gradient_and_metrics_equal_trl_for_each_variant(x64, ref: dict) -> None:
    assert {s["settings"]["loss_type"] for s in ref["cases"].values()} == {"grpo", "bnpo", "dr_grpo", "dapo"}
    mask = _a(ref["mask"])
    old, reference, entropies = _a(ref["old_logps"]), _a(ref["ref_logps"]), _a(ref["entropies"])
    for name, case in ref["cases"].items():
        settings = case["settings"]
        config = _config(settings)
        advantages = _a(ref["advantages"][settings["advantages"]])

        def loss(logps, config=config, advantages=advantages, settings=settings):
            return policy_loss(
                logps,
                old,
                advantages,
                mask,
                config,
                ref_logprobs=reference if config.beta else None,
                num_items=settings["num_items_in_batch"],
            )

        (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(_a(ref["logps"]))
        assert float(value) == pytest.approx(case["loss"], rel=1e-6, abs=1e-6), name
        np.testing.assert_allclose(np.asarray(grad), np.asarray(case["grad_logps"]), **TOL, err_msg=name)
        metrics = {**metrics, **rollout_metrics(_rewards(ref, "rewards"), mask, entropies)}
        for key, expected in case["metrics"].items():
            assert float(metrics[key]) == pytest.approx(expected, rel=1e-6, abs=1e-6), (name, key)


# -- (a) numpy from TRL's documented formulas -----------------------------------------------------------
def _numpy_loss(
    logps, old, ref_lp, adv, mask, *, agg, eps_low, eps_high, beta, correction, max_len, num_items
):
    """GRPO's objective as TRL's docs write it, one token at a time."""
    per_token = np.zeros_like(logps)
    for i in range(logps.shape[0]):
        for t in range(logps.shape[1]):
            rho = math.exp(logps[i, t] - old[i, t])
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            loss = -min(rho * adv[i], clipped * adv[i])
            if beta:
                # D_KL = pi_ref / pi_theta - log(pi_ref / pi_theta) - 1
                kl = math.exp(ref_lp[i, t] - logps[i, t]) - (ref_lp[i, t] - logps[i, t]) - 1
                loss += beta * kl * (rho if correction else 1.0)
            per_token[i, t] = loss
    lengths = mask.sum(1)
    if agg == "grpo":  # 1/G sum_i 1/|o_i| sum_t
        return np.mean([(per_token[i] * mask[i]).sum() / lengths[i] for i in range(len(lengths))])
    if agg == "bnpo":  # over all tokens of the batch
        return (per_token * mask).sum() / lengths.sum()
    if agg == "dr_grpo":  # 1/(G * L_max)
        return (per_token * mask).sum() / (len(lengths) * max_len)
    return (per_token * mask).sum() / num_items  # dapo: over all tokens of the generation batch


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_equals_numpy_from_the_documented_formulas(x64, seed: int, agg: str) -> None:
    rng = np.random.default_rng(seed)
    b, t = 6, 9
    mask = (np.arange(t)[None] < rng.integers(1, t + 1, size=b)[:, None]).astype(np.float64)
    old = -rng.uniform(0.05, 4.0, size=(b, t))
    logps = old + rng.normal(0, 0.3, size=(b, t))
    ref_lp = old + rng.normal(0, 0.3, size=(b, t))
    adv = rng.normal(size=b)
    beta = [0.0, 0.04][seed % 2]
    eps_high = [0.2, 0.28][seed // 2]
    correction = seed in (1, 2)
    num_items = mask.sum() * (1 + seed)
    config = PolicyLossConfig(
        aggregation=agg,
        epsilon_high=eps_high,
        beta=beta,
        kl_importance_correction=correction,
        max_completion_length=12,
    )
    got, _ = policy_loss(
        _a(logps), _a(old), _a(adv), _a(mask), config, ref_logprobs=_a(ref_lp), num_items=num_items
    )
    expected = _numpy_loss(
        logps,
        old,
        ref_lp,
        adv,
        mask,
        agg=agg,
        eps_low=0.2,
        eps_high=eps_high,
        beta=beta,
        correction=correction,
        max_len=12,
        num_items=num_items,
    )
    assert float(got) == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_advantages_equal_numpy() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 3, size=(5, 6)).astype(np.float64)
    rewards[1] = 1.0  # a group whose rewards agree
    mean = rewards.mean(1, keepdims=True)
    std = rewards.std(1, ddof=1, keepdims=True)
    np.testing.assert_allclose(
        np.asarray(grpo_advantages(rewards)), (rewards - mean) / (std + 1e-4), rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(grpo_advantages(rewards))[1], 0.0)
    np.testing.assert_allclose(
        np.asarray(grpo_advantages(rewards, scale="batch")),
        (rewards - mean) / (rewards.std(ddof=1) + 1e-4),
        rtol=1e-6,
    )
    np.testing.assert_allclose(np.asarray(dr_grpo_advantages(rewards)), rewards - mean, rtol=1e-6, atol=1e-6)
    loo = np.array([[r[j] - np.delete(r, j).mean() for j in range(6)] for r in rewards])
    np.testing.assert_allclose(np.asarray(rloo_advantages(rewards)), loo, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(rewards, "rloo")), loo, rtol=1e-6, atol=1e-6)
    # RLOO's advantage is GRPO's centred one scaled by G / (G - 1)
    np.testing.assert_allclose(loo, (rewards - mean) * 6 / 5, rtol=1e-6, atol=1e-12)
    # one sample per prompt: no baseline, no signal
    assert np.all(np.asarray(grpo_advantages(rewards[:, :1])) == 0)
    assert np.all(np.asarray(rloo_advantages(rewards[:, :1])) == 0)


def test_on_policy_gradient_is_the_policy_gradient(x64) -> None:
    """One update per batch: ratio 1, loss = -mean advantage, d loss / d logp_t = -A_i / |o_i| / B (grpo)."""
    rng = np.random.default_rng(1)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float64)
    logps = -rng.uniform(0.1, 2, size=(3, 4))
    adv = np.array([0.7, -1.2, 0.3])
    config = PolicyLossConfig(aggregation="grpo")
    (value, metrics), grad = jax.value_and_grad(
        lambda lp: policy_loss(lp, jnp.asarray(logps), _a(adv), _a(mask), config), has_aux=True
    )(_a(logps))
    assert float(value) == pytest.approx(-adv.mean(), rel=1e-12)
    expected = -adv[:, None] * mask / mask.sum(1, keepdims=True) / 3
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-12, atol=1e-15)
    assert float(metrics["clip_ratio/region_mean"]) == 0.0


def test_clipped_tokens_get_no_gradient_and_clip_higher_widens_the_range(x64) -> None:
    old = np.log(np.full((1, 4), 0.5))
    # ratios 1.1, 1.25, 1.35, 0.7 with a positive advantage: the last is below 1 - eps but A > 0 (not clipped)
    logps = old + np.log(np.array([[1.1, 1.25, 1.35, 0.7]]))
    mask, adv = np.ones((1, 4)), np.array([1.0])
    for eps_high, free in ((0.2, [1, 0, 0, 1]), (0.28, [1, 1, 0, 1])):
        config = PolicyLossConfig(aggregation="bnpo", epsilon_high=eps_high)
        grad, metrics = jax.grad(
            lambda lp, c=config: policy_loss(lp, _a(old), _a(adv), _a(mask), c), has_aux=True
        )(_a(logps))
        ratios = np.array([1.1, 1.25, 1.35, 0.7])
        np.testing.assert_allclose(np.asarray(grad)[0], -ratios * np.array(free) / 4, rtol=1e-12)
        assert float(metrics["clip_ratio/high_mean"]) == (4 - sum(free)) / 4
        assert float(metrics["clip_ratio/low_mean"]) == 0.0


def test_k3_kl_is_nonnegative_and_zero_at_the_reference() -> None:
    x = jnp.linspace(-3.0, 0.0, 7)
    assert float(jnp.max(jnp.abs(k3_kl(x, x)))) == 0.0
    assert bool(jnp.all(k3_kl(x, x[::-1]) >= 0))


def test_k3_kl_keeps_its_value_for_a_policy_near_the_reference_in_float32() -> None:
    # After one small update the policy's log-probs differ from the reference's by 1e-5..1e-2: k3 is then about
    # diff**2 / 2 (5e-11..5e-5), below float32's spacing near 1, so `exp(diff) - diff - 1` cancels to 0 or to
    # rounding noise (a run's logged KL read 0.0 after an update). Against float64 numpy, 1% relative.
    ref = np.array([-1.0, -2.0, -0.5, -3.0, -1.5, -0.25], dtype=np.float32)
    diff = np.array([1e-5, -3e-5, 1e-4, -1e-3, 3e-3, 1e-2], dtype=np.float32)
    logp = ref - diff
    got = np.asarray(k3_kl(jnp.asarray(logp), jnp.asarray(ref)))
    d64 = ref.astype(np.float64) - logp.astype(np.float64)
    want = np.expm1(d64) - d64
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-2)


def test_rollout_metrics_equal_numpy() -> None:
    rewards = np.array([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5]])
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 0]], dtype=np.float32)
    ent = np.arange(18, dtype=np.float32).reshape(6, 3)
    m = rollout_metrics(jnp.asarray(rewards), jnp.asarray(mask), jnp.asarray(ent))
    assert float(m["reward"]) == pytest.approx(rewards.mean(), rel=1e-6)
    assert float(m["reward_std"]) == pytest.approx(rewards.std(ddof=1), rel=1e-6)
    assert float(m["frac_reward_zero_std"]) == 0.5
    assert float(m["completions/mean_length"]) == pytest.approx(mask.sum(1).mean(), rel=1e-6)
    assert (float(m["completions/min_length"]), float(m["completions/max_length"])) == (0.0, 3.0)
    assert float(m["entropy"]) == pytest.approx((ent * mask).sum() / mask.sum(), rel=1e-6)


def test_aggregate_by_hand() -> None:
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    by = {
        a: float(aggregate(per_token, mask, PolicyLossConfig(aggregation=a, max_completion_length=5)))
        for a in ("grpo", "bnpo", "dr_grpo", "dapo")
    }
    assert by == pytest.approx({"grpo": (1.5 + 5.0) / 2, "bnpo": 18 / 5, "dr_grpo": 18 / 10, "dapo": 18 / 5})
    assert float(aggregate(per_token, mask, PolicyLossConfig(), num_items=9)) == pytest.approx(2.0)


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of"):
        PolicyLossConfig(aggregation="ppo")
    with pytest.raises(ValueError, match="set it to the rollouts' length cap"):
        PolicyLossConfig(aggregation="dr_grpo")
    with pytest.raises(ValueError, match="delta must be None or > 1"):
        PolicyLossConfig(delta=0.5)
    with pytest.raises(ValueError, match="grouped as"):
        grpo_advantages(np.zeros(8))
    with pytest.raises(ValueError, match="estimator must be one of"):
        group_advantages(np.zeros((2, 4)), "ppo")
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        z = jnp.zeros((2, 3))
        policy_loss(z, z, jnp.zeros(2), jnp.ones((2, 3)), PolicyLossConfig(beta=0.1))
