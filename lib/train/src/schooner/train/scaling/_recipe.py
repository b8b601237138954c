"""The recipe: from a compute budget to a training run (model shape, batch, steps, optimizer).

`recipe(1e13)` picks the family member whose tokens-per-parameter ratio at that budget is closest to the
target (20, Hoffmann et al. 2022, by default), the batch from the tokens, the steps that spend the budget
(counted exactly with `schooner.model.flops_per_token`, attention included, not 6ND), and the optimizer from
the rules (see `_rules`). The result unpacks into `train_lm`:

    >>> from schooner.train.scaling import recipe
    >>> r = recipe(1e13)
    >>> r.width, r.batch_size, r.num_train_steps   # doctest: +SKIP
    >>> model = train_lm("runs/1e13", **r, datasets={docs: 1.0})   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._rules import AdamRule, BatchRule, LearningRateRule, ModelFamily, ScheduleRule

__all__ = ["Recipe", "ScalingRecipe"]

logger = logging.getLogger(__name__)

_TRAIN_LM_KEYS = ("model", "optimizer", "batch_size", "seq_len", "num_train_steps")


class _LessThanOneStep(ValueError):
    """The budget does not pay for one step of a family member (wider members need even more)."""


def _positive_number(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return float(value)


def _beyond(cands: list[Recipe], chosen: Recipe, target: float, value: Callable[[Recipe], float]) -> bool:
    """Whether `chosen`, an edge member, misses `target` by more than half the log-distance to its neighbour
    (the most an interior member can miss by): the target then lies beyond the family."""
    if chosen is not cands[0] and chosen is not cands[-1]:
        return False
    miss = abs(math.log(value(chosen) / target))
    if len(cands) == 1:
        return miss > 0
    neighbour = cands[1] if chosen is cands[0] else cands[-2]
    outward = (target - value(chosen)) * (value(chosen) - value(neighbour)) > 0
    return outward and miss > 0.5 * abs(math.log(value(chosen) / value(neighbour)))


@dataclass(frozen=True)
class Recipe(Mapping):
    """One planned run. A mapping of `train_lm`'s arguments (`train_lm(name, **r, datasets=...)`), with the
    counts the scaling fits use as attributes."""

    budget: float
    """The compute budget asked for (FLOPs)."""
    width: int
    model: Any
    """A `schooner.model.LlamaConfig`."""
    optimizer: Any
    """A `schooner.train.AdamConfig` (today's rules) or an AdamH config (`HorizonRecipe`)."""
    batch_size: int
    seq_len: int
    num_train_steps: int
    tokens: int
    """D: batch_size x seq_len x num_train_steps."""
    params: int
    """N: `schooner.model.num_parameters(model)`."""
    flops: float
    """Exact training FLOPs: flops_per_token(model, seq_len) x tokens (differs from `budget` by rounding)."""

    def __getitem__(self, key: str) -> Any:
        if key not in _TRAIN_LM_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_TRAIN_LM_KEYS)

    def __len__(self) -> int:
        return len(_TRAIN_LM_KEYS)

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    def summary(self) -> dict[str, Any]:
        """The run's numbers as a JSON-able dict (the docs' table, the sweep's records)."""
        m = self.model
        return {
            "budget": self.budget,
            "flops": self.flops,
            "width": self.width,
            "layers": m.num_layers,
            "heads": m.num_heads,
            "kv_heads": m.num_kv_heads,
            "intermediate": m.intermediate_dim,
            "params": self.params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "steps": self.num_train_steps,
            "optimizer": type(self.optimizer).__name__,
            "learning_rate": self.optimizer.learning_rate,
            **(
                {"adam_learning_rate": self.optimizer.adam_learning_rate}
                if getattr(self.optimizer, "adam_learning_rate", None) is not None
                else {}
            ),
            "max_grad_norm": self.optimizer.max_grad_norm,
            "beta2": self.optimizer.beta2,
            "eps": self.optimizer.eps,
            "warmup": self.optimizer.warmup,
            "decay": self.optimizer.decay,
        }


@dataclass(frozen=True)
class ScalingRecipe:
    """The rules that turn a compute budget into a run; every rule is swappable (`dataclasses.replace`)."""

    family: ModelFamily = field(default_factory=ModelFamily)
    learning_rate: LearningRateRule = field(default_factory=LearningRateRule)
    batch: BatchRule = field(default_factory=BatchRule)
    adam: AdamRule = field(default_factory=AdamRule)
    schedule: ScheduleRule = field(default_factory=ScheduleRule)
    seq_len: int = 128
    """Tokens per sequence."""
    tokens_per_param: float = 20.0
    """The default D/N target when no width is given (Hoffmann et al. 2022: about 20)."""
    min_steps: int = 50
    """Fewer steps than this halves the batch (down to the batch rule's minimum)."""

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.min_steps < 1 or not self.tokens_per_param > 0:
            raise ValueError(
                f"ScalingRecipe needs seq_len >= 2, min_steps >= 1, tokens_per_param > 0; got {self.seq_len=}, "
                f"{self.min_steps=}, {self.tokens_per_param=}"
            )

    def run(self, budget: float, width: int) -> Recipe:
        """The run of the family member of `width` that spends `budget` FLOPs."""
        from schooner.model import flops_per_token, num_parameters

        budget = _positive_number("budget", budget)
        model = self.family.config(width, self.seq_len)
        fpt = flops_per_token(model, self.seq_len)
        target_tokens = budget / fpt
        batch = self.batch(tokens=target_tokens)
        steps = round(target_tokens / (batch * self.seq_len))
        while steps < self.min_steps and batch // 2 >= self.batch.minimum:
            batch //= 2
            steps = round(target_tokens / (batch * self.seq_len))
        if steps < 1:
            raise _LessThanOneStep(
                f"budget {budget:.3g} is less than one step of width {width} (batch {batch} x {self.seq_len} "
                f"tokens at {fpt:.3g} FLOPs/token); pick a smaller width or a larger budget"
            )
        tokens = steps * batch * self.seq_len
        optimizer = self.optimizer_for(width=width, batch_tokens=batch * self.seq_len, tokens=tokens)
        return Recipe(
            budget=float(budget),
            width=width,
            model=model,
            optimizer=optimizer,
            batch_size=batch,
            seq_len=self.seq_len,
            num_train_steps=steps,
            tokens=tokens,
            params=num_parameters(model),
            flops=fpt * tokens,
        )

    def optimizer_for(self, *, width: int, batch_tokens: int, tokens: int) -> Any:
        """The optimizer config of a run of this width, batch (tokens per step) and horizon (tokens): AdamW
        from the `learning_rate`, `adam` and `schedule` rules (`HorizonRecipe` gives AdamH instead)."""
        from schooner.train import AdamConfig

        s = self.schedule
        return AdamConfig(
            learning_rate=self.learning_rate(width=width, batch_tokens=batch_tokens, tokens=tokens),
            weight_decay=self.adam.weight_decay,
            max_grad_norm=self.adam.max_grad_norm,
            schedule=s.kind,
            warmup=s.warmup,
            decay=s.decay,
            min_lr_ratio=s.min_lr_ratio,
            beta1=self.adam.beta1,
            beta2=self.adam.beta2_for(batch_tokens),
            eps=self.adam.eps_for(batch_tokens),
        )

    def candidates(self, budget: float) -> list[Recipe]:
        """A run per family width that fits the budget (at least one step), ascending in width. Only "less
        than one step" ends the list; any other error (a bad budget, a member the model package refuses)
        propagates."""
        budget = _positive_number("budget", budget)
        out = []
        for w in self.family.widths():
            try:
                out.append(self.run(budget, w))
            except _LessThanOneStep:
                break  # wider members need even more FLOPs per token
        if not out:
            raise ValueError(
                f"no member of the family fits a budget of {budget:.3g} FLOPs (the smallest, width "
                f"{self.family.min_width}, needs more than that for one step); raise the budget or shrink the family"
            )
        return out

    def _choose(
        self, budget: float, tokens_per_param: float | None, params: float | None
    ) -> tuple[Recipe, list[Recipe], str | None]:
        """(the chosen run, the candidates, a warning when the target lies beyond the family's edge)."""
        budget = _positive_number("budget", budget)
        if params is not None and tokens_per_param is not None:
            raise ValueError(
                f"give params or tokens_per_param, not both; got params={params!r} and "
                f"tokens_per_param={tokens_per_param!r}"
            )
        cands = self.candidates(budget)
        if params is not None:
            n = _positive_number("params", params)
            chosen = min(cands, key=lambda r: abs(math.log(r.params / n)))
            beyond = _beyond(cands, chosen, n, lambda r: r.params)
            what = f"params={n:.4g}; got N={chosen.params:,}"
        else:
            ratio = _positive_number(
                "tokens_per_param",
                tokens_per_param if tokens_per_param is not None else self.tokens_per_param,
            )
            chosen = min(cands, key=lambda r: abs(math.log(r.tokens_per_param / ratio)))
            beyond = _beyond(cands, chosen, ratio, lambda r: r.tokens_per_param)
            what = f"tokens_per_param={ratio:.4g}; got D/N={chosen.tokens_per_param:.4g}"
        warning = None
        if beyond:
            edge = "largest" if chosen is cands[-1] else "smallest"
            if edge == "smallest":
                limit = f"min_width={self.family.min_width}"
            elif chosen.width == self.family.max_width:
                limit = f"max_width={self.family.max_width}"
            else:
                limit = "wider members do not get one step"
            warning = (
                f"recipe at budget {budget:.3g}: the target lies beyond the family's {edge} member "
                f"(width {chosen.width}, {limit}): asked {what}; widen the family to honour it"
            )
        return chosen, cands, warning

    def __call__(
        self, budget: float, tokens_per_param: float | None = None, *, params: float | None = None
    ) -> Recipe:
        """The run for `budget`: the width closest to `params` parameters if given, else the width whose
        D/N is closest to `tokens_per_param` (default: the recipe's), in log space (not both).

        When the target lies beyond the family's largest (or smallest) member, that member is returned and a
        warning is logged: its D/N (or N) is then not the one asked for. A run whose steps stay below
        `min_steps` at the batch rule's minimum batch is logged too.
        """
        chosen, _, warning = self._choose(budget, tokens_per_param, params)
        for message in (warning, self._short_warning([chosen])):
            if message:
                logger.warning(message)
        return chosen

    def _short_warning(self, runs: list[Recipe]) -> str | None:
        """The warning for the runs that train fewer than `min_steps` steps, or None."""
        short = [r for r in runs if r.num_train_steps < self.min_steps]
        if not short:
            return None
        return (
            f"budget {short[0].budget:.3g}: width(s) {[r.width for r in short]} train "
            f"{[r.num_train_steps for r in short]} steps, fewer than min_steps={self.min_steps} even at the "
            f"batch rule's minimum batch ({self.batch.minimum}); such runs barely leave warmup"
        )

    def isoflop_grid(self, budget: float, sizes: int = 5, spread: float = 2.0) -> list[Recipe]:
        """`sizes` runs at one budget around the prior optimum (`tokens_per_param`), with parameter counts
        as close as the family allows to a geometric grid of ratio `spread` (distinct widths).

        Raises when the family has fewer members that fit the budget than `sizes` (the grid would silently
        shrink). Logs a warning when the prior optimum is the family's smallest or largest member that fits
        (the grid is one-sided, so approach 2 may find no bracketed minimum at this budget), and when a run
        has fewer than `min_steps` steps (`isoflop_sweep` also records these warnings in its results).
        """
        grid, warnings = self._isoflop_grid(budget, sizes, spread)
        for message in warnings:
            logger.warning(message)
        return grid

    def _isoflop_grid(self, budget: float, sizes: int, spread: float) -> tuple[list[Recipe], list[str]]:
        """`isoflop_grid`'s runs and its warnings, not logged."""
        if sizes < 1 or spread <= 1:
            raise ValueError(f"isoflop_grid needs sizes >= 1 and spread > 1; got {sizes=}, {spread=}")
        centre, cands, _ = self._choose(budget, None, None)
        if len(cands) < sizes:
            raise ValueError(
                f"isoflop_grid at budget {budget:.3g}: {sizes} sizes asked but only {len(cands)} family members "
                f"fit it (widths {[r.width for r in cands]}); ask for fewer sizes, or widen the family "
                "(max_width, width_step)"
            )
        chosen: dict[int, Recipe] = {}
        for k in range(sizes):
            target = centre.params * spread ** (k - (sizes - 1) / 2)
            free = [r for r in cands if r.width not in chosen]
            best = min(free, key=lambda r: abs(math.log(r.params / target)))
            chosen[best.width] = best
        grid = sorted(chosen.values(), key=lambda r: r.params)
        warnings = []
        if sizes > 1 and centre.width in (cands[0].width, cands[-1].width):
            edge = "smallest" if centre.width == cands[0].width else "largest"
            warnings.append(
                f"isoflop_grid at budget {budget:.3g}: the prior optimum (width {centre.width}, "
                f"tokens_per_param={self.tokens_per_param:g}) is the {edge} family member that fits, so the grid "
                f"(widths {[r.width for r in grid]}) lies on one side of it; widen the family or change "
                "tokens_per_param"
            )
        short = self._short_warning(grid)
        return grid, warnings + ([short] if short else [])
