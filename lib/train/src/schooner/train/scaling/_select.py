"""`recipe(budget)`: the run a compute budget buys, under today's rules (`ScalingRecipe`, AdamW) or the
token-horizon rules (`HorizonRecipe`, AdamH), chosen by name or by the rules passed."""

from __future__ import annotations

from ._horizon import HorizonRecipe
from ._recipe import Recipe, ScalingRecipe

__all__ = ["RULES", "recipe"]

RULES = ("default", "horizon")
"""The recipes `recipe(rule=...)` selects: "default" (`ScalingRecipe`, AdamW) and "horizon" (`HorizonRecipe`,
AdamH with the token-horizon rule)."""


def recipe(
    compute_budget: float,
    tokens_per_param: float | None = None,
    *,
    params: float | None = None,
    rules: ScalingRecipe | None = None,
    rule: str | None = None,
) -> Recipe:
    """The run a compute budget buys under `rules` (default `ScalingRecipe()`, or `HorizonRecipe()` with
    `rule="horizon"`): model, batch, steps, optimizer. See `ScalingRecipe.__call__`.

    `rule` names the recipe when `rules` is not given; given both, they must agree."""
    if rule is not None and rule not in RULES:
        raise ValueError(f"recipe rule must be one of {RULES}; got rule={rule!r}")
    if rules is None:
        rules = HorizonRecipe() if rule == "horizon" else ScalingRecipe()
    elif rule is not None and isinstance(rules, HorizonRecipe) != (rule == "horizon"):
        raise ValueError(
            f"recipe: rule={rule!r} but rules is a {type(rules).__name__}; pass one of them (rule='horizon' goes "
            "with a HorizonRecipe, rule='default' with a ScalingRecipe)"
        )
    return rules(compute_budget, tokens_per_param, params=params)
