"""pass@k: the chance that at least one of k samples is correct, estimated without bias from n >= k samples.

Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1): with `n` samples of a problem of
which `c` are correct, the unbiased estimate of pass@k is `1 - C(n - c, k) / C(n, k)`. The binomials overflow
floats for large n, so it is computed as the product `1 - prod_{i = n-c+1}^{n} (1 - k / i)` (the paper's
numpy code), which is exact in rational arithmetic and stable in floats. A task's pass@k is the mean over its
problems, reported with its standard error.

`pass_at_k_scores` scores sampled completions with a reward function (`schooner.eval.rewards`) and reports
pass@k for several k, with the reward errors counted and named.

    >>> pass_at_k(n=10, c=3, k=1)
    0.3
    >>> round(pass_at_k(n=10, c=3, k=5), 6)
    0.916667
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .rewards import RewardError, RewardFn, score_batch


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `c` are correct (Chen et al. 2021).

    Raises:
        ValueError: not `0 <= c <= n` and `1 <= k <= n`.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"pass_at_k: {name} must be an int, got {name}={value!r}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n (k samples drawn from the n taken), got n={n}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k samples holds a correct one
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> tuple[float, float]:
    """The mean of `pass_at_k` over problems given as `(n, c)` pairs, and its standard error.

    The standard error is the sample standard deviation of the per-problem estimates over sqrt(problems)
    (0.0 for a single problem).
    """
    if not counts:
        raise ValueError("mean_pass_at_k: no problems")
    values = [pass_at_k(n, c, k) for n, c in counts]
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


@dataclasses.dataclass(frozen=True)
class PassAtK:
    """pass@k of sampled completions.

    Attributes:
        scores: `{"pass@1": mean, "pass@1_stderr": standard error, ...}` for each k asked.
        correct: per problem, how many of its samples were correct.
        samples: per problem, how many samples it had.
        errors: samples whose reward function failed (counted as incorrect), named by `{problem}/{sample}`.
    """

    scores: dict[str, float]
    correct: list[int]
    samples: list[int]
    errors: list[RewardError]


def pass_at_k_scores(
    reward_fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[Sequence[str]],
    fields: Sequence[Mapping[str, Any]],
    *,
    ks: Sequence[int] = (1,),
    threshold: float = 1.0,
    problem_ids: Sequence[str] | None = None,
) -> PassAtK:
    """pass@k of `completions[i]` (the samples for `prompts[i]`), a sample being correct when its reward >= `threshold`.

    Raises:
        ValueError: the sequences differ in length, or a problem has fewer samples than the largest k.
    """
    if not len(prompts) == len(completions) == len(fields):
        raise ValueError(
            f"pass_at_k_scores: one entry per problem, got {len(prompts)} prompts, {len(completions)} "
            f"completion lists and {len(fields)} field rows"
        )
    ids = [str(i) for i in range(len(prompts))] if problem_ids is None else [str(p) for p in problem_ids]
    short = [(ids[i], len(c)) for i, c in enumerate(completions) if len(c) < max(ks)]
    if short:
        raise ValueError(
            f"pass_at_k_scores: k={max(ks)} needs as many samples per problem; short: {short[:5]}"
        )
    flat = [(i, j) for i, samples in enumerate(completions) for j in range(len(samples))]
    batch = score_batch(
        reward_fn,
        [prompts[i] for i, _ in flat],
        [completions[i][j] for i, j in flat],
        [fields[i] for i, _ in flat],
        row_ids=[f"{ids[i]}/{j}" for i, j in flat],
        on_error=-math.inf,
    )
    correct = [0] * len(prompts)
    for (i, _), reward in zip(flat, batch.rewards, strict=True):
        correct[i] += reward >= threshold
    samples = [len(c) for c in completions]
    scores: dict[str, float] = {}
    for k in ks:
        mean, stderr = mean_pass_at_k(list(zip(samples, correct, strict=True)), k)
        scores[f"pass@{k}"], scores[f"pass@{k}_stderr"] = mean, stderr
    return PassAtK(scores, correct, samples, batch.errors)
