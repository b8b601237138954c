"""The token-horizon recipe (Marin's Delphi, issue 38): AdamH with hyperparameters that follow the batch B
and the training horizon T from one tuned reference run, beside today's AdamW recipe (`ScalingRecipe`).

Select it with `recipe(budget, rule="horizon")` or pass `HorizonRecipe(...)` wherever a `ScalingRecipe` goes
(`recipe(rules=...)`, `isoflop_sweep(recipe=...)`). With B in tokens per step, T the run's tokens, W the width
and (B0, T0, W0) the reference run's:

| quantity | rule | why |
|---|---|---|
| projections' lr (AdamH, relative step) | eta0 (B/B0)^0.5 (T0/T)^0.3 | square-root batch scaling of adaptive optimizers (Malladi et al. 2022); the token-horizon correction Delphi needed to extrapolate (longer runs want smaller steps). No width factor: AdamH's step is relative to the matrix's norm |
| Adam group's lr (embeddings, norms) | eta0_adam (B/B0)^0.5 (T0/T)^0.3 (W0/W) | the same, times muP's 1/width for Adam (Marin's AdamH recipe) |
| beta2 | clip(beta2_0^(B/B0), 0.9, 0.9999) | the second moment's half-life stays constant in tokens (Marek et al. 2025); T does not enter by default (`beta2_horizon_exponent`) |
| epsilon | eps0 (B0/B)^0.5 (T/T0)^0.3 | the inverse of the learning rate's factor: eps scales as 1/sqrt(B) in the SDE rule, and Marin's recipe moves it against the horizon like the lr |
| gradient clip | 0.1 (global norm) | small, as Marin's AdamH runs (0.102) |
| depth | max(2, round(W / (64 + 4 log2 W - 9))) | Delphi's depth-from-width formula (640 -> 7, 896 -> 10, 1280 -> 13 layers), at least 2 layers |
| heads | W / head_dim | fixed head size (32 here, 128 in Delphi) |
| initialisation | std = gain / sqrt(W) | fan-in init for every projection whose fan-in is W; AdamH then keeps each matrix at that norm |
| schedule | WSD: 10% warmup, 20% linear decay to 0 | Delphi's |

The reference constants (eta0, eta0_adam, B0, T0, W0) come from the project's own search: `reference_search`
trains the reference run at a grid of learning rates as cached steps and `pick_learning_rate` picks eta0 from
a parabola in log lr; `HorizonRule.from_reference` reads the result.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schooner.cluster import ResourceConfig, StepHandle, step

from ._recipe import ScalingRecipe
from ._rules import AdamRule, LearningRateRule, ScheduleRule

if TYPE_CHECKING:
    from schooner.model import LlamaConfig

__all__ = [
    "HorizonFamily",
    "HorizonRecipe",
    "HorizonRule",
    "LearningRateChoice",
    "pick_learning_rate",
    "read_reference",
    "reference_search",
]

VERSION = "horizon-reference-v1"
_CPU = ResourceConfig.with_cpu()
logger = logging.getLogger(__name__)


def _number(owner: str, name: str, value: Any, rule: str = "> 0") -> float:
    """`value` as a float, or a ValueError naming `owner.name`, the value and the rule."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and rule == "> 0":
        ok = value > 0
    elif ok and rule == ">= 0":
        ok = value >= 0
    elif ok and rule == "in (0, 1)":
        ok = 0 < value < 1
    elif ok and rule == "in [0, 1)":
        ok = 0 <= value < 1
    if not ok:
        raise ValueError(f"{owner}.{name} must be a finite number {rule}; got {name}={value!r}")
    return float(value)


@dataclass(frozen=True)
class HorizonFamily:
    """Llama decoders indexed by width with Delphi's shape rules: depth from width by formula (at least
    `min_layers`), heads of `head_dim`, SwiGLU of `mlp_ratio` x width, QK-norm, and fan-in initialisation.

    Initialisation: `schooner.model` draws every projection and the embedding from one std,
    `initializer_range`, and scales the residual outputs (o_proj, down) by 1/sqrt(2 layers). The family sets
    `initializer_range = init_gain / sqrt(width)`: fan-in init for q, k, v, o, gate and up (their fan-in is
    the width). `down`'s fan-in is `mlp_ratio` x width, so it starts sqrt(mlp_ratio) above fan-in (before the
    residual scaling); an exact fan-in init for it needs a per-matrix std in `schooner.model`.
    """

    vocab_size: int = 2048
    """The tokenizer's vocabulary (FLOPs and parameters are counted with it)."""
    head_dim: int = 32
    """Width of every attention head; heads = width / head_dim."""
    mlp_ratio: float = 4.0
    """SwiGLU hidden width over model width (Delphi: 4)."""
    multiple_of: int = 16
    """The MLP width is rounded up to a multiple of this."""
    min_width: int = 32
    max_width: int = 1024
    width_step: int = 32
    min_layers: int = 2
    """At least this many layers (one layer is not much of a transformer)."""
    layer_base: float = 64.0
    layer_growth: float = 4.0
    layer_offset: float = 9.0
    """layers = round(width / (layer_base + layer_growth log2(width) - layer_offset)), Delphi's formula."""
    init_gain: float = 1.0
    """initializer_range = init_gain / sqrt(width)."""
    qk_norm: bool = True
    """RMS-normalise queries and keys (Delphi's Qwen3 architecture)."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head (Delphi unties them; at these sizes the embedding
    is most of the model)."""

    def __post_init__(self) -> None:
        own = "HorizonFamily"
        for f in (
            "vocab_size",
            "head_dim",
            "multiple_of",
            "min_width",
            "max_width",
            "width_step",
            "min_layers",
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{own}.{f} must be an int >= 1; got {f}={v!r}")
        for f in ("mlp_ratio", "layer_base", "init_gain"):
            _number(own, f, getattr(self, f))
        _number(own, "layer_growth", self.layer_growth, ">= 0")
        _number(own, "layer_offset", self.layer_offset, ">= 0")
        if self.width_step % self.head_dim or self.min_width % self.head_dim:
            raise ValueError(
                f"{own} widths must be multiples of head_dim={self.head_dim}; got min_width={self.min_width}, "
                f"width_step={self.width_step}"
            )
        if self.min_width > self.max_width:
            raise ValueError(f"{own} needs min_width <= max_width; got {self.min_width}, {self.max_width}")
        for w in (self.min_width, self.max_width):
            if self.layer_base + self.layer_growth * math.log2(w) - self.layer_offset <= 0:
                raise ValueError(
                    f"{own}: layer_base + layer_growth log2(width) - layer_offset must be > 0 (width per layer); "
                    f"got {self.layer_base} + {self.layer_growth} log2({w}) - {self.layer_offset}"
                )

    def widths(self) -> list[int]:
        """Every width of the family, ascending."""
        return list(range(self.min_width, self.max_width + 1, self.width_step))

    def layers(self, width: int) -> int:
        """Depth from width: max(min_layers, round(width / (base + growth log2(width) - offset)))."""
        per_layer = self.layer_base + self.layer_growth * math.log2(width) - self.layer_offset
        return max(self.min_layers, math.floor(width / per_layer + 0.5))

    def config(self, width: int, max_seq_len: int) -> LlamaConfig:
        """The `schooner.model.LlamaConfig` of the family member of this width."""
        from schooner.model import LlamaConfig

        if width % self.head_dim:
            raise ValueError(f"width {width} is not a multiple of head_dim={self.head_dim}")
        heads = width // self.head_dim
        mlp = math.ceil(width * self.mlp_ratio / self.multiple_of) * self.multiple_of
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_dim=width,
            intermediate_dim=mlp,
            num_layers=self.layers(width),
            num_heads=heads,
            num_kv_heads=heads,
            max_seq_len=max_seq_len,
            tie_embeddings=self.tie_embeddings,
            qk_norm=self.qk_norm,
            initializer_range=self.init_gain / math.sqrt(width),
        )


@dataclass(frozen=True)
class HorizonRule:
    """AdamH's hyperparameters from the batch B (tokens per step), the horizon T (training tokens) and the
    width W, relative to a reference run (B0, T0, W0) whose learning rates were tuned (see the module
    docstring's table; `from_reference` takes them from `reference_search`'s result).

    The default constants are placeholders of the right order for this project's CPU-sized runs, not a
    tuned reference: run `reference_search` on your data and use `from_reference`.
    """

    base_learning_rate: float = 0.02
    """eta0: the projections' AdamH step (relative to ||W||) at the reference run."""
    base_adam_learning_rate: float = 5e-3
    """The Adam group's learning rate at the reference run (width `base_width`)."""
    base_batch_tokens: int = 4096
    """B0: tokens per step of the reference run."""
    base_horizon: float = 2e6
    """T0: training tokens of the reference run."""
    base_width: int = 128
    """W0: width of the reference run."""
    batch_exponent: float = 0.5
    horizon_exponent: float = 0.3
    """The token-horizon correction (T0/T)^0.3 of both learning rates."""
    adam_width_exponent: float = 1.0
    """The Adam group's learning rate goes as (W0/W)^this (muP: 1)."""
    beta1: float = 0.9
    base_beta2: float = 0.99
    """beta2 at B0 (and T0)."""
    min_beta2: float = 0.9
    max_beta2: float = 0.9999
    beta2_horizon_exponent: float = 0.0
    """Scales the second moment's token half-life by (T/T0)^this; 0 keeps it constant in tokens."""
    base_eps: float = 1e-8
    """epsilon at (B0, T0)."""
    eps_batch_exponent: float = 0.5
    eps_horizon_exponent: float = 0.3
    """eps = base_eps (B0/B)^eps_batch_exponent (T/T0)^eps_horizon_exponent."""
    max_grad_norm: float = 0.1
    max_learning_rate: float = 0.2
    """Cap of the projections' relative step (short runs at large batches would otherwise get huge ones)."""
    max_adam_learning_rate: float = 0.03
    """Cap of the Adam group's learning rate."""
    sphere_kinds: tuple[str, ...] = ("matrix",)
    """Parameter groups on spheres (`AdamHConfig.sphere_kinds`)."""

    def __post_init__(self) -> None:
        own = "HorizonRule"
        for f in (
            "base_learning_rate", "base_adam_learning_rate", "base_batch_tokens", "base_horizon", "base_width",
            "base_eps", "max_grad_norm", "max_learning_rate", "max_adam_learning_rate",
        ):  # fmt: skip
            _number(own, f, getattr(self, f))
        for f in (
            "batch_exponent", "horizon_exponent", "adam_width_exponent", "eps_batch_exponent",
            "eps_horizon_exponent", "beta2_horizon_exponent",
        ):  # fmt: skip
            _number(own, f, getattr(self, f), ">= 0")
        _number(own, "beta1", self.beta1, "in [0, 1)")
        for f in ("base_beta2", "min_beta2", "max_beta2"):
            _number(own, f, getattr(self, f), "in (0, 1)")
        if not self.min_beta2 <= self.max_beta2:
            raise ValueError(
                f"{own} needs min_beta2 <= max_beta2; got min_beta2={self.min_beta2}, max_beta2={self.max_beta2}"
            )
        if isinstance(self.sphere_kinds, list):
            object.__setattr__(self, "sphere_kinds", tuple(self.sphere_kinds))

    @classmethod
    def from_reference(cls, reference: str | Mapping[str, Any], **overrides: Any) -> HorizonRule:
        """The rule whose constants come from a `reference_search` result (its folder, its
        `reference.json`, or the dict): B0, T0, W0 and the learning rate(s) it picked."""
        ref = read_reference(reference) if isinstance(reference, str) else dict(reference)
        base = cls(**overrides)
        chosen = ref["chosen"]
        values = {
            "base_batch_tokens": ref["batch_tokens"],
            "base_horizon": ref["tokens"],
            "base_width": ref["width"],
            "base_learning_rate": chosen["learning_rate"],
            "base_adam_learning_rate": chosen["adam_learning_rate"],
        }
        return dataclasses.replace(base, **values)

    def _check_run(self, batch_tokens: float, tokens: float, width: float | None = None) -> None:
        _number("HorizonRule", "batch_tokens", batch_tokens)
        _number("HorizonRule", "tokens", tokens)
        if width is not None:
            _number("HorizonRule", "width", width)

    def learning_rate(self, *, batch_tokens: float, tokens: float) -> float:
        """The projections' peak AdamH step: eta0 (B/B0)^0.5 (T0/T)^0.3, at most `max_learning_rate`."""
        self._check_run(batch_tokens, tokens)
        lr = (
            self.base_learning_rate
            * (batch_tokens / self.base_batch_tokens) ** self.batch_exponent
            * (self.base_horizon / tokens) ** self.horizon_exponent
        )
        return min(lr, self.max_learning_rate)

    def adam_learning_rate(self, *, width: int, batch_tokens: float, tokens: float) -> float:
        """The Adam group's peak: eta0_adam (B/B0)^0.5 (T0/T)^0.3 (W0/W), at most `max_adam_learning_rate`."""
        self._check_run(batch_tokens, tokens, width)
        lr = (
            self.base_adam_learning_rate
            * (batch_tokens / self.base_batch_tokens) ** self.batch_exponent
            * (self.base_horizon / tokens) ** self.horizon_exponent
            * (self.base_width / width) ** self.adam_width_exponent
        )
        return min(lr, self.max_adam_learning_rate)

    def beta2(self, *, batch_tokens: float, tokens: float) -> float:
        """beta2_0^((B/B0) (T0/T)^k), clipped to [min_beta2, max_beta2]: with k = 0 (the default) the second
        moment's half-life, ln(1/2)/ln(beta2) steps of B tokens, is the same number of tokens at every batch."""
        self._check_run(batch_tokens, tokens)
        power = (batch_tokens / self.base_batch_tokens) * (
            self.base_horizon / tokens
        ) ** self.beta2_horizon_exponent
        return min(self.max_beta2, max(self.min_beta2, self.base_beta2**power))

    def eps(self, *, batch_tokens: float, tokens: float) -> float:
        """eps0 (B0/B)^0.5 (T/T0)^0.3: against the learning rate's batch and horizon factors."""
        self._check_run(batch_tokens, tokens)
        return (
            self.base_eps
            * (self.base_batch_tokens / batch_tokens) ** self.eps_batch_exponent
            * (tokens / self.base_horizon) ** self.eps_horizon_exponent
        )

    def optimizer(self, *, width: int, batch_tokens: float, tokens: float, schedule: ScheduleRule) -> Any:
        """The `AdamHConfig` of a run of this width, batch and horizon, on `schedule`."""
        from schooner.train._adamh import AdamHConfig

        return AdamHConfig(
            learning_rate=self.learning_rate(batch_tokens=batch_tokens, tokens=tokens),
            adam_learning_rate=self.adam_learning_rate(width=width, batch_tokens=batch_tokens, tokens=tokens),
            max_grad_norm=self.max_grad_norm,
            schedule=schedule.kind,
            warmup=schedule.warmup,
            decay=schedule.decay,
            min_lr_ratio=schedule.min_lr_ratio,
            beta1=self.beta1,
            beta2=self.beta2(batch_tokens=batch_tokens, tokens=tokens),
            eps=self.eps(batch_tokens=batch_tokens, tokens=tokens),
            sphere_kinds=self.sphere_kinds,
        )


@dataclass(frozen=True)
class HorizonRecipe(ScalingRecipe):
    """Today's recipe machinery (widths that spend the budget, batch rule, isoFLOP grids) with Delphi's
    family and the token-horizon AdamH rule. The AdamW fields `learning_rate` and `adam` of
    `ScalingRecipe` do not apply and must stay at their defaults (set `horizon` instead)."""

    family: Any = field(default_factory=HorizonFamily)
    horizon: HorizonRule = field(default_factory=HorizonRule)
    """The optimizer's rule."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, default in (("learning_rate", LearningRateRule()), ("adam", AdamRule())):
            if getattr(self, name) != default:
                raise ValueError(
                    f"HorizonRecipe.{name} is today's AdamW rule and does not apply to the horizon recipe; got "
                    f"{name}={getattr(self, name)!r}: set horizon=HorizonRule(...) instead"
                )
        if not isinstance(self.horizon, HorizonRule):
            raise ValueError(
                f"HorizonRecipe.horizon must be a HorizonRule; got {type(self.horizon).__name__}"
            )

    def optimizer_for(self, *, width: int, batch_tokens: int, tokens: int) -> Any:
        return self.horizon.optimizer(
            width=width, batch_tokens=batch_tokens, tokens=tokens, schedule=self.schedule
        )


# -- the reference search -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LearningRateChoice:
    """The learning rate a search picked: the vertex of a parabola of loss in ln(lr) through the best run
    and its neighbours on the grid."""

    learning_rate: float
    loss: float
    """The parabola's value at its vertex."""
    coefficients: tuple[float, float, float]
    """(a, b, c) of loss = a x^2 + b x + c, x = ln(lr)."""
    used: tuple[tuple[float, float], ...]
    """The (lr, loss) points the parabola went through."""
    best: tuple[float, float]
    """The best run of the grid (lr, loss)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "learning_rate": self.learning_rate,
            "loss": self.loss,
            "coefficients": list(self.coefficients),
            "used": [list(p) for p in self.used],
            "best": list(self.best),
        }


def pick_learning_rate(results: Iterable[Any], *, neighbours: int = 2) -> LearningRateChoice:
    """The learning rate at the minimum of a least-squares parabola of loss in ln(lr), fitted through the
    grid's best run and up to `neighbours` runs on each side of it (loss against ln lr is steeper above the
    optimum than below, so far points would tilt a parabola through all of them).

    Args:
        results: (lr, loss) pairs, or mappings with "learning_rate" (or "lr") and "loss".

    Raises:
        ValueError: fewer than 3 runs or distinct learning rates, a non-positive or non-finite value (named by
            its index), the best run at the grid's edge (extend the grid that way), or a parabola that does
            not open upwards.
    """
    import numpy as np

    points: list[tuple[float, float]] = []
    for i, r in enumerate(results):
        if isinstance(r, Mapping):
            lr = r.get("learning_rate", r.get("lr"))
            loss = r.get("loss")
        else:
            try:
                lr, loss = r
            except (TypeError, ValueError):
                raise ValueError(
                    f"pick_learning_rate: result {i} must be (lr, loss) or a mapping with learning_rate and "
                    f"loss; got {r!r}"
                ) from None
        for name, v in (("learning_rate", lr), ("loss", loss)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(
                    f"pick_learning_rate: result {i} has {name}={v!r}; it must be a finite number"
                    + (" (a diverged run: lower the grid or leave it out)" if name == "loss" else "")
                )
        assert isinstance(lr, int | float) and isinstance(loss, int | float)  # checked just above
        if not lr > 0:
            raise ValueError(f"pick_learning_rate: result {i} has learning_rate={lr!r}; it must be > 0")
        points.append((float(lr), float(loss)))
    lrs = sorted({p[0] for p in points})
    if len(lrs) < 3:
        raise ValueError(
            f"pick_learning_rate needs runs at 3 or more distinct learning rates; got {len(lrs)}: {lrs}"
        )
    # Several seeds at one learning rate: the parabola goes through each run; the best rate is by mean loss.
    mean = {lr: float(np.mean([loss for x, loss in points if x == lr])) for lr in lrs}
    k = min(range(len(lrs)), key=lambda j: mean[lrs[j]])
    if k in (0, len(lrs) - 1):
        edge, way = ("smallest", "downwards") if k == 0 else ("largest", "upwards")
        raise ValueError(
            f"pick_learning_rate: the best run is at the grid's {edge} learning rate ({lrs[k]:.4g}, loss "
            f"{mean[lrs[k]]:.5g}): the minimum may lie beyond it; extend the grid {way}"
        )
    window = lrs[max(0, k - neighbours) : k + neighbours + 1]
    used = tuple(sorted(p for p in points if p[0] in window))
    x = np.log([p[0] for p in used])
    y = np.array([p[1] for p in used])
    a, b, c = np.polyfit(x, y, 2)
    if not a > 0:
        raise ValueError(
            f"pick_learning_rate: the parabola through {len(used)} runs around lr={lrs[k]:.4g} opens downwards "
            f"(a={a:.3g}); the losses are too noisy to place a minimum: add seeds or a finer grid"
        )
    x_star = -b / (2 * a)
    return LearningRateChoice(
        learning_rate=float(math.exp(x_star)),
        loss=float(c - b * b / (4 * a)),
        coefficients=(float(a), float(b), float(c)),
        used=used,
        best=(lrs[k], mean[lrs[k]]),
    )


VARY = ("both", "projections", "adam")


@dataclass(frozen=True)
class ReferenceResultsConfig:
    """Config of the reference-search results step."""

    runs: list
    """`[{"learning_rate": x, "adam_learning_rate": y, "train": handle, "steps": n}, ...]`."""
    vary: str
    width: int
    batch_tokens: int
    tokens: int
    neighbours: int = 2
    metric: str = "eval/loss"


def reference_search(
    name: str,
    *,
    data: Mapping[Any, float],
    learning_rates: Sequence[float],
    rules: HorizonRecipe | None = None,
    vary: str = "both",
    seeds: Sequence[int] = (0,),
    neighbours: int = 2,
    resources: ResourceConfig | None = _CPU,
    **train_kwargs: Any,
) -> StepHandle:
    """The reference run's learning-rate search as steps: a `train_lm` step per (learning rate, seed) of the
    rule's reference run (width W0, B0 tokens per step, T0 tokens, the recipe's schedule), then a results
    step that picks eta0 with `pick_learning_rate` and writes `reference.json` (read it with
    `HorizonRule.from_reference`). Each run is an ordinary cached step: adding a learning rate reruns none.

    Args:
        learning_rates: the grid of the varied learning rate (e.g. 8 values 2x apart around the guess).
        vary: "projections" (AdamH's eta0; the Adam group keeps the rule's), "adam" (the Adam group's; the
            projections keep theirs) or "both" (eta0 takes the grid's value and the Adam group moves with it,
            at the rule's ratio base_adam_learning_rate / base_learning_rate).
        seeds: one run per learning rate and seed.
        resources: where each training run goes (None: in the runner's process).
        train_kwargs: more `train_lm` arguments (validation, tokenizer, eval_max_tokens, ...). Validation is
            needed: the loss read is the final `eval/loss`.
    """
    from schooner.train.steps import train_lm

    rules = rules if rules is not None else HorizonRecipe()
    if not isinstance(rules, HorizonRecipe):
        raise ValueError(f"reference_search needs a HorizonRecipe; got rules={type(rules).__name__}")
    if vary not in VARY:
        raise ValueError(f"reference_search vary must be one of {VARY}; got vary={vary!r}")
    grid = list(learning_rates)
    for i, lr in enumerate(grid):
        _number("reference_search", f"learning_rates[{i}]", lr)
    if len(set(grid)) < 3:
        raise ValueError(f"reference_search needs 3 or more distinct learning_rates; got {grid}")
    h = rules.horizon
    width, seq_len = h.base_width, rules.seq_len
    if h.base_batch_tokens % seq_len:
        raise ValueError(
            f"reference_search: HorizonRule.base_batch_tokens={h.base_batch_tokens} is not a multiple of the "
            f"recipe's seq_len={seq_len}; make B0 a whole number of sequences"
        )
    batch = h.base_batch_tokens // seq_len
    steps = round(h.base_horizon / h.base_batch_tokens)
    if steps < 1:
        raise ValueError(f"reference_search: T0={h.base_horizon:g} tokens is less than one step of B0")
    tokens = steps * h.base_batch_tokens
    model = rules.family.config(width, seq_len)
    base = h.optimizer(width=width, batch_tokens=h.base_batch_tokens, tokens=tokens, schedule=rules.schedule)
    ratio = h.base_adam_learning_rate / h.base_learning_rate
    train_kwargs.setdefault("checkpoint_every", None)
    runs = []
    for lr in grid:
        if vary == "projections":
            opt = dataclasses.replace(base, learning_rate=float(lr))
        elif vary == "adam":
            opt = dataclasses.replace(base, adam_learning_rate=float(lr))
        else:
            opt = dataclasses.replace(base, learning_rate=float(lr), adam_learning_rate=float(lr) * ratio)
        for seed in seeds:
            run_name = f"{name}/lr{lr:.3g}" + (f"-s{seed}" if len(seeds) > 1 else "")
            train = train_lm(
                run_name, model=model, optimizer=opt, batch_size=batch, seq_len=seq_len, num_train_steps=steps,
                datasets=dict(data), seed=seed, resources=resources, **train_kwargs,
            )  # fmt: skip
            runs.append(
                {
                    "learning_rate": opt.learning_rate,
                    "adam_learning_rate": opt.adam_learning_rate,
                    "seed": seed,
                    "train": train,
                    "steps": steps,
                }
            )
    config = ReferenceResultsConfig(
        runs=runs,
        vary=vary,
        width=width,
        batch_tokens=h.base_batch_tokens,
        tokens=tokens,
        neighbours=neighbours,
    )
    return step(
        name, _reference_results, config, version=VERSION,
        description=f"horizon reference search: {len(runs)} runs of width {width} over {len(set(grid))} rates",
    )  # fmt: skip


def _reference_results(config: ReferenceResultsConfig, output_path: str) -> dict[str, Any]:
    from ._sweep import run_loss

    rows = []
    for r in config.runs:
        scores = run_loss(r["train"], None, config.metric, final_step=r["steps"])
        rows.append(
            {k: v for k, v in r.items() if k != "train"} | {"loss": scores["loss"], "path": r["train"]}
        )
    key = {"projections": "learning_rate", "adam": "adam_learning_rate", "both": "learning_rate"}[config.vary]
    choice = pick_learning_rate([(row[key], row["loss"]) for row in rows], neighbours=config.neighbours)
    by_lr = {row[key]: row for row in rows}
    near = by_lr[choice.best[0]]
    chosen = {"learning_rate": near["learning_rate"], "adam_learning_rate": near["adam_learning_rate"]}
    if config.vary in ("projections", "both"):
        chosen["learning_rate"] = choice.learning_rate
    if config.vary in ("adam", "both"):
        scale = choice.learning_rate / choice.best[0]  # "both": the Adam group keeps its ratio
        chosen["adam_learning_rate"] = (
            choice.learning_rate if config.vary == "adam" else near["adam_learning_rate"] * scale
        )
    record = {
        "vary": config.vary,
        "width": config.width,
        "batch_tokens": config.batch_tokens,
        "tokens": config.tokens,
        "chosen": chosen,
        "fit": choice.to_dict(),
        "runs": rows,
    }
    from schooner.cluster import storage

    storage.write_json(f"{output_path}/reference.json", record)
    return {"chosen": chosen, "best_loss": choice.best[1], "runs": len(rows)}


def read_reference(path: str) -> dict[str, Any]:
    """A `reference_search` result: its folder or its `reference.json`."""
    from schooner.cluster import storage

    file = path if path.endswith(".json") else f"{path.rstrip('/')}/reference.json"
    record: dict[str, Any] = storage.read_json(file)
    return record
