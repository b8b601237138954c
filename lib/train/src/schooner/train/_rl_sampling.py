"""Which prompts and groups a GRPO rollout batch holds: the prompt stream, and DAPO's dynamic sampling.

A rollout group's prompts are `prompt_indices(group, P, rows, seed)`: positions of an endless stream that
visits every row once per epoch, a pure function of `(seed, group)`. With dynamic sampling
(`Grpo(dynamic_sampling=True)`), a group whose rewards all agree gives no gradient (its advantages are all 0:
`has_signal` is False), so the batch source samples further rounds (`round_prompt_indices`: round 0 is the
group's own prompts, round `r >= 1` the next P of a second stream) until P groups with signal are found or the
rounds are spent, and `select_groups` picks the batch: the first P with signal in sampling order, a shortfall
filled with the first groups without. Everything here is numpy and a pure function of its arguments, so a
resumed run picks what the uninterrupted one did.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def prompt_indices(group: int, per_group: int, num_rows: int, seed: int, stream: int = 0) -> np.ndarray:
    """The rows of rollout group `group`: positions `[group * P, (group + 1) * P)` of an endless stream that
    visits every row once per epoch in an order drawn from `(seed, epoch)` (`stream` > 0: from `(seed, epoch,
    stream)`, another stream of the same rows)."""
    out = np.empty(per_group, np.int64)
    orders: dict[int, np.ndarray] = {}
    for j in range(per_group):
        epoch, pos = divmod(group * per_group + j, num_rows)
        if epoch not in orders:
            entropy = [seed, epoch] if stream == 0 else [seed, epoch, stream]
            orders[epoch] = np.random.default_rng(entropy).permutation(num_rows)
        out[j] = orders[epoch][pos]
    return out


def round_prompt_indices(
    group: int, sampling_round: int, per_group: int, num_rows: int, seed: int, rounds: int
) -> np.ndarray:
    """The prompts of round `sampling_round` of rollout group `group` under dynamic sampling: round 0's are
    the group's own (`prompt_indices`, as without dynamic sampling); round `r >= 1` takes the next P of a
    second stream (`stream=1`), `rounds - 1` slots of P per group, so every round's prompts are a pure
    function of `(seed, group, round)` whatever other groups used."""
    if sampling_round == 0:
        return prompt_indices(group, per_group, num_rows, seed)
    slot = group * (rounds - 1) + sampling_round - 1
    return prompt_indices(slot, per_group, num_rows, seed, stream=1)


def has_signal(rewards: np.ndarray) -> np.ndarray:
    """Per group of `(P, G)` rewards: True when it holds at least two finite rewards that are not all equal,
    so its group-relative advantages are not all 0 (`nan` marks a reward that failed)."""
    rewards = np.asarray(rewards, np.float64)
    finite = np.isfinite(rewards)
    high = np.where(finite, rewards, -np.inf).max(axis=1)
    low = np.where(finite, rewards, np.inf).min(axis=1)
    return (finite.sum(axis=1) >= 2) & (high > low)


def select_groups(signal: Sequence[np.ndarray], per_batch: int) -> tuple[np.ndarray, int]:
    """Dynamic sampling's choice of a rollout batch's groups from the rounds sampled (`signal`: `has_signal`
    of each round's groups, in sampling order): the first `per_batch` groups with signal; when there are fewer,
    the first groups without signal fill the rest (advantage 0, the groups plain GRPO trains on). Returns the
    chosen groups' positions in the rounds' concatenation, in sampling order, and how many have signal."""
    flat = np.concatenate([np.asarray(s, bool) for s in signal])
    if len(flat) < per_batch:
        raise ValueError(f"select_groups: {len(flat)} groups sampled, fewer than the batch's {per_batch}")
    with_signal = np.flatnonzero(flat)[:per_batch]
    fill = np.flatnonzero(~flat)[: per_batch - len(with_signal)]
    return np.sort(np.concatenate([with_signal, fill])), len(with_signal)
