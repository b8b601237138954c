"""The recipe: budgets to runs with exact FLOPs, each hyperparameter rule by its documented formula."""

from __future__ import annotations

import dataclasses
import logging
import math
import re

import numpy as np
import pytest

from schooner.model import LlamaConfig, flops_per_token, num_parameters
from schooner.train import AdamConfig
from schooner.train.scaling import (
    AdamRule,
    BatchRule,
    LearningRateRule,
    ModelFamily,
    Recipe,
    ScalingRecipe,
    ScheduleRule,
    recipe,
)

FAMILY = ModelFamily(vocab_size=512, min_width=16)
RULES = ScalingRecipe(family=FAMILY)


@pytest.mark.parametrize("budget", [3e11, 1e13, 1e14])
def test_a_recipe_spends_its_budget_exactly_as_the_model_package_counts_it(budget: float) -> None:
    r = recipe(budget, rules=RULES)
    assert r.tokens == r.batch_size * r.seq_len * r.num_train_steps
    assert r.flops == flops_per_token(r.model, r.seq_len) * r.tokens
    assert r.params == num_parameters(r.model)
    # Only the rounding of the step count separates the FLOPs from the budget: at most half a step.
    half_step = flops_per_token(r.model, r.seq_len) * r.batch_size * r.seq_len / 2
    assert abs(r.flops - budget) <= half_step


def test_the_width_is_the_one_closest_to_the_tokens_per_parameter_target() -> None:
    for ratio in (5.0, 20.0, 80.0):
        chosen = recipe(1e13, ratio, rules=RULES)
        others = RULES.candidates(1e13)
        best = min(others, key=lambda c: abs(math.log(c.tokens / c.params / ratio)))
        assert chosen.width == best.width
    assert recipe(1e13, 80.0, rules=RULES).params < recipe(1e13, 5.0, rules=RULES).params
    assert abs(math.log(recipe(1e13, params=3e5, rules=RULES).params / 3e5)) < math.log(2.5)


def test_family_shapes_follow_the_documented_formulas() -> None:
    for width in FAMILY.widths():
        cfg = FAMILY.config(width, max_seq_len=128)
        assert isinstance(cfg, LlamaConfig)
        assert cfg.num_heads * cfg.resolved_head_dim == width and cfg.resolved_head_dim == 16
        assert cfg.num_layers == max(1, math.floor(width / 32 + 0.5))
        assert cfg.intermediate_dim % 16 == 0 and 0 <= cfg.intermediate_dim - width * 8 / 3 < 16
    with pytest.raises(ValueError, match="multiples of head_dim"):
        ModelFamily(min_width=24)


def test_learning_rate_rule_scales_with_width_batch_and_token_horizon() -> None:
    rule = LearningRateRule(base=1e-3, base_width=128, base_batch_tokens=4096, base_horizon=1e6, maximum=1.0)
    base = rule(width=128, batch_tokens=4096, tokens=1e6)
    assert base == pytest.approx(1e-3)
    assert rule(width=256, batch_tokens=4096, tokens=1e6) == pytest.approx(base / 2)  # 1 / width
    assert rule(width=128, batch_tokens=4 * 4096, tokens=1e6) == pytest.approx(base * 2)  # sqrt(batch)
    assert rule(width=128, batch_tokens=4096, tokens=32e6) == pytest.approx(
        base * (1 / 32) ** 0.3
    )  # (T0/T)^0.3
    assert LearningRateRule(maximum=1e-3)(width=16, batch_tokens=4096, tokens=1e3) == 1e-3


def test_beta2_keeps_its_half_life_in_tokens_and_eps_scales_with_inverse_sqrt_batch() -> None:
    rule = AdamRule(beta2=0.99, eps=1e-8, base_batch_tokens=4096)
    for batch_tokens in (1024, 4096, 65536):
        beta2 = rule.beta2_for(batch_tokens)
        half_life_tokens = math.log(0.5) / math.log(beta2) * batch_tokens
        assert half_life_tokens == pytest.approx(math.log(0.5) / math.log(0.99) * 4096)
        assert rule.eps_for(batch_tokens) == pytest.approx(1e-8 * math.sqrt(4096 / batch_tokens))


def test_batch_rule_is_a_clamped_power_of_two_growing_with_sqrt_tokens() -> None:
    rule = BatchRule(base_sequences=32, base_tokens=2e6, exponent=0.5, minimum=8, maximum=256)
    assert rule(tokens=2e6) == 32
    assert rule(tokens=8e6) == 64
    assert rule(tokens=2e9) == 256 and rule(tokens=1e3) == 8
    for tokens in (3e5, 7e6, 5e7):
        b = rule(tokens=tokens)
        assert b & (b - 1) == 0


def test_the_optimizer_carries_every_rule() -> None:
    r = RULES(1e13)
    batch_tokens = r.batch_size * r.seq_len
    assert isinstance(r.optimizer, AdamConfig)
    assert r.optimizer.learning_rate == RULES.learning_rate(
        width=r.width, batch_tokens=batch_tokens, tokens=r.tokens
    )
    assert r.optimizer.beta2 == RULES.adam.beta2_for(batch_tokens)
    assert (r.optimizer.schedule, r.optimizer.warmup, r.optimizer.decay) == ("wsd", 0.1, 0.2)


def test_each_rule_is_swappable() -> None:
    @dataclasses.dataclass(frozen=True)
    class ConstantLr:
        value: float = 1e-3

        def __call__(self, *, width: int, batch_tokens: int, tokens: float) -> float:
            return self.value

    swapped = dataclasses.replace(
        RULES,
        learning_rate=ConstantLr(),
        batch=BatchRule(base_sequences=8, minimum=8, maximum=8),
        schedule=ScheduleRule(kind="cosine", warmup=0.05, decay=None, min_lr_ratio=0.1),
    )
    r = swapped(1e13)
    assert r.optimizer.learning_rate == 1e-3 and r.batch_size == 8 and r.optimizer.schedule == "cosine"


def test_a_recipe_unpacks_into_train_lm(tmp_path) -> None:
    from schooner.train.steps import train_lm

    r = RULES(1e12)
    assert isinstance(r, Recipe) and set(r) == {
        "model",
        "optimizer",
        "batch_size",
        "seq_len",
        "num_train_steps",
    }
    handle = train_lm("runs/recipe", **r, datasets={str(tmp_path): 1.0})
    assert handle.config.num_train_steps == r.num_train_steps and handle.config.model == r.model


def test_isoflop_grid_has_distinct_sizes_around_the_prior_optimum() -> None:
    grid = RULES.isoflop_grid(1e13, sizes=5, spread=2.0)
    widths = [g.width for g in grid]
    assert len(set(widths)) == 5 and widths == sorted(widths)
    assert RULES(1e13).width in widths
    assert all(g.budget == 1e13 for g in grid)
    assert [g.params for g in grid] == sorted(g.params for g in grid)


def test_budgets_too_small_for_the_family_are_errors() -> None:
    with pytest.raises(ValueError, match="no member of the family"):
        RULES.candidates(1e5)
    with pytest.raises(ValueError, match="budget"):
        recipe(-1.0, rules=RULES)


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((0.0,), {}, "budget=0.0"),
        ((-1e12,), {}, "budget=-1000000000000.0"),
        ((float("nan"),), {}, "budget=nan"),
        ((float("inf"),), {}, "budget=inf"),
        ((1e12, 0.0), {}, "tokens_per_param=0.0"),
        ((1e12, -5.0), {}, "tokens_per_param=-5.0"),
        ((1e12, float("nan")), {}, "tokens_per_param=nan"),
        ((1e12,), {"params": 0}, "params=0"),
        ((1e12,), {"params": -3}, "params=-3"),
        ((1e12, 20.0), {"params": 1e5}, "params=100000.0 and tokens_per_param=20.0"),
    ],
)
def test_bad_recipe_arguments_are_refused_naming_the_argument_and_value(args, kwargs, named) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        recipe(*args, **kwargs, rules=RULES)


def test_candidates_only_stop_at_the_budget_and_pass_other_errors_through() -> None:
    # An odd head size: the model package refuses rotary embeddings on it; that must not read as "no member
    # fits the budget".
    odd = ScalingRecipe(family=ModelFamily(vocab_size=512, head_dim=5, min_width=10, width_step=5))
    with pytest.raises(ValueError, match="even") as info:
        odd.candidates(1e12)
    assert "no member" not in str(info.value)
    with pytest.raises(ValueError, match="budget=nan"):
        RULES.candidates(float("nan"))


def test_batch_rule_keeps_to_powers_of_two_inside_bounds_that_are_not() -> None:
    rule = BatchRule(minimum=12, maximum=100)
    sizes = {rule(tokens=t) for t in np.geomspace(1e3, 1e12, 40)}
    assert sizes == {16, 32, 64}
    with pytest.raises(ValueError, match="power of two"):
        BatchRule(minimum=65, maximum=100)
    r = recipe(3e11, rules=dataclasses.replace(RULES, batch=BatchRule(minimum=12, maximum=100)))
    assert r.batch_size in (16, 32, 64)


def test_a_target_beyond_the_family_is_logged_not_silently_dropped(caplog) -> None:
    small = ScalingRecipe(family=ModelFamily(vocab_size=512, min_width=16, max_width=64))
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._recipe"):
        r = small(1e15, 5.0)  # wants a model far wider than 64
    assert r.width == 64 and r.tokens_per_param > 50
    assert "largest" in caplog.text and "max_width=64" in caplog.text and "tokens_per_param=5" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._recipe"):
        small(1e15, params=1e3)  # far below the smallest member (11,568 parameters)
        assert "smallest" in caplog.text and "min_width=16" in caplog.text
        caplog.clear()
        inside = small(1e12, 20.0)
    assert 16 < inside.width < 64 and caplog.text == ""


def test_isoflop_grid_refuses_to_shrink_and_logs_a_one_sided_grid_and_short_runs(caplog) -> None:
    three = ScalingRecipe(family=ModelFamily(min_width=32, max_width=64))
    with pytest.raises(ValueError, match=r"5 sizes asked but only 3 .*\[32, 48, 64\]"):
        three.isoflop_grid(1e13, sizes=5)
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._recipe"):
        grid = ScalingRecipe().isoflop_grid(3e11, 5, spread=4)
    assert grid[0].width == 32 and "smallest" in caplog.text and "one side" in caplog.text
    short = [g for g in grid if g.num_train_steps < 50]
    assert short and f"{[g.width for g in short]}" in caplog.text and "min_steps=50" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="schooner.train.scaling._recipe"):
        RULES.isoflop_grid(1e13, sizes=5, spread=2.0)
    assert caplog.text == ""
