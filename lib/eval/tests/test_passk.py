"""pass@k against a brute-force count over every k-subset of the samples, the exact binomial ratio in rational
arithmetic, and Chen et al.'s numpy estimator; and pass@k of sampled completions scored by a reward."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from schooner.eval.passk import mean_pass_at_k, pass_at_k, pass_at_k_scores
from schooner.eval.rewards import exact_answer


def _brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of k-subsets of n samples (the first c correct) holding at least one correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def _numpy_chen(n: int, c: int, k: int) -> float:
    """Chen et al. 2021, the paper's code (Figure 3) verbatim."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@pytest.mark.parametrize("n", range(1, 11))
def test_equals_the_brute_force_count_over_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = _brute_force(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(expected), rel=1e-12, abs=1e-15), (n, c, k)


@pytest.mark.parametrize("n", [20, 100, 200, 1000])
def test_equals_numpy_and_the_exact_ratio_for_large_n(n: int) -> None:
    for c in sorted({0, 1, 2, n // 10, n // 2, n - 1, n}):
        for k in sorted({1, 2, 5, 10, n // 2, n}):
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15), (n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(_numpy_chen(n, c, k), rel=1e-12, abs=1e-15)


def test_pass_at_1_is_the_fraction_correct_and_edges() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, rel=1e-15)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # only 2 wrong samples: any 3 hold a correct one
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)


def test_mean_and_standard_error() -> None:
    counts = [(4, 0), (4, 1), (4, 4), (4, 2)]
    mean, stderr = mean_pass_at_k(counts, 1)
    values = np.array([0.0, 0.25, 1.0, 0.5])
    assert mean == pytest.approx(values.mean(), rel=1e-15)
    assert stderr == pytest.approx(values.std(ddof=1) / 2, rel=1e-12)
    assert mean_pass_at_k([(4, 1)], 2) == (pass_at_k(4, 1, 2), 0.0)


def test_pass_at_k_scores_counts_correct_samples_and_errors() -> None:
    samples = [["#### 7", "#### 8", "7"], ["#### 1", "#### 2", "#### 3"], ["x", "#### 4", "y"]]
    fields = [{"answer": 7}, {"answer": 5}, {}]  # the last problem has no answer: 3 named errors
    result = pass_at_k_scores(
        exact_answer(), ["a", "b", "c"], samples, fields, ks=(1, 2), problem_ids=["p", "q", "r"]
    )
    assert result.correct == [2, 0, 0] and result.samples == [3, 3, 3]
    assert [e.row for e in result.errors] == ["r/0", "r/1", "r/2"]
    assert result.scores["pass@1"] == pytest.approx((2 / 3) / 3, rel=1e-12)
    assert result.scores["pass@2"] == pytest.approx(1 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="k=4 needs as many samples"):
        pass_at_k_scores(exact_answer(), ["a"], [["1", "2"]], [{"answer": 1}], ks=(4,))
