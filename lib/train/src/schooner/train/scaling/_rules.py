"""The rules a scaling recipe follows: model shapes from one width, and hyperparameters from width, batch and
token horizon. Each rule is a frozen dataclass with one job; swap one with `dataclasses.replace(recipe,
learning_rate=MyRule(...))` (any frozen dataclass with the same call signature will do, and it becomes part of
the steps' keys like any config).

Sources:
- Shapes: a Llama family with a fixed width-per-layer aspect ratio, SwiGLU at 8/3 of the width, and fixed
  head size, as in Kaplan et al. (2020) (loss is insensitive to the aspect ratio over a wide range) and
  Marin's recipe (depth from width by formula).
- Learning rate: proportional to 1/width for Adam on hidden matrices (muP, Yang et al. 2022), to the square
  root of the batch (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
  Algorithms"; Marin's recipe uses lr = c sqrt(B) / width), times the token-horizon correction (T0 / T)^0.3
  that Marin's Delphi notes found necessary to extrapolate past 30x (longer runs want smaller rates).
- beta2 and epsilon: the same square-root rule scales 1 - beta2 with the batch and epsilon with
  1 / sqrt(batch) (Malladi et al. 2022); beta2 = beta2_0^(B / B0) keeps the second moment's half-life
  constant in tokens (Marek et al. 2025, "Small Batch Size Training for Language Models").
- Batch: grows with the square root of the training tokens (the critical batch grows with data, Zhang et
  al. 2024, "How Does Critical Batch Size Scale in Pre-training?"), rounded to a power of two.
- Schedule: warmup, stable, decay (WSD; Delphi uses 10% warmup and a 20% linear decay to zero). The decay
  always ends at the run's last step: Hoffmann et al. (2022) showed a schedule longer than the run
  overestimates the loss of small runs and biases the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schooner.model import LlamaConfig

__all__ = ["AdamRule", "BatchRule", "LearningRateRule", "ModelFamily", "ScheduleRule"]


def _positive(owner: str, **values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ValueError(f"{owner}.{name} must be a finite number > 0; got {name}={v!r}")


@dataclass(frozen=True)
class ModelFamily:
    """Llama-style dense decoders indexed by width: depth = round(width / width_per_layer), heads of
    `head_dim`, SwiGLU of `mlp_ratio` x width rounded up to `multiple_of`, tied embeddings."""

    vocab_size: int = 2048
    """The tokenizer's vocabulary (FLOPs and parameters are counted with it)."""
    head_dim: int = 16
    """Width of every attention head; the width must be a multiple of it."""
    width_per_layer: int = 32
    """Aspect ratio: layers = max(1, round(width / width_per_layer))."""
    mlp_ratio: float = 8 / 3
    """SwiGLU hidden width over model width (8/3 keeps the MLP at 8 width^2 parameters, like 4x GELU)."""
    multiple_of: int = 16
    """The MLP width is rounded up to a multiple of this."""
    min_width: int = 32
    """Smallest width of the family."""
    max_width: int = 512
    """Largest width of the family."""
    width_step: int = 16
    """Spacing of the family's widths."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head (usual at small scale)."""

    def __post_init__(self) -> None:
        _positive(
            "ModelFamily", vocab_size=self.vocab_size, head_dim=self.head_dim, mlp_ratio=self.mlp_ratio,
            width_per_layer=self.width_per_layer, multiple_of=self.multiple_of, width_step=self.width_step,
        )  # fmt: skip
        if self.width_step % self.head_dim or self.min_width % self.head_dim:
            raise ValueError(
                f"ModelFamily widths must be multiples of head_dim={self.head_dim}; got min_width={self.min_width}, "
                f"width_step={self.width_step}"
            )
        if not 0 < self.min_width <= self.max_width:
            raise ValueError(
                f"ModelFamily needs 0 < min_width <= max_width; got {self.min_width}, {self.max_width}"
            )

    def widths(self) -> list[int]:
        """Every width of the family, ascending."""
        return list(range(self.min_width, self.max_width + 1, self.width_step))

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
            num_layers=max(1, math.floor(width / self.width_per_layer + 0.5)),
            num_heads=heads,
            num_kv_heads=heads,
            max_seq_len=max_seq_len,
            tie_embeddings=self.tie_embeddings,
        )


@dataclass(frozen=True)
class LearningRateRule:
    """lr = base (base_width / width)^w (batch_tokens / base_batch_tokens)^b (T0 / T)^h, at most `maximum`."""

    base: float = 6e-3
    """The learning rate at the reference width, batch and horizon."""
    base_width: int = 128
    base_batch_tokens: int = 4096
    base_horizon: float = 2e6
    """T0: the training tokens at which `base` was chosen."""
    width_exponent: float = 1.0
    batch_exponent: float = 0.5
    horizon_exponent: float = 0.3
    """The token-horizon correction of Marin's Delphi recipe; 0 switches it off."""
    maximum: float = 0.02
    """A cap (tiny widths at short horizons would otherwise get rates that diverge)."""

    def __post_init__(self) -> None:
        _positive("LearningRateRule", base=self.base, base_width=self.base_width, maximum=self.maximum,
                  base_batch_tokens=self.base_batch_tokens, base_horizon=self.base_horizon)  # fmt: skip

    def __call__(self, *, width: int, batch_tokens: int, tokens: float) -> float:
        lr = (
            self.base
            * (self.base_width / width) ** self.width_exponent
            * (batch_tokens / self.base_batch_tokens) ** self.batch_exponent
            * (self.base_horizon / tokens) ** self.horizon_exponent
        )
        return min(lr, self.maximum)


@dataclass(frozen=True)
class BatchRule:
    """batch (sequences) = base_sequences (tokens / base_tokens)^exponent, rounded to a power of two and
    clamped to the powers of two in [minimum, maximum] (minimum=12, maximum=100 gives 16 to 64)."""

    base_sequences: int = 32
    base_tokens: float = 2e6
    exponent: float = 0.5
    minimum: int = 8
    maximum: int = 256

    def __post_init__(self) -> None:
        _positive("BatchRule", base_sequences=self.base_sequences, base_tokens=self.base_tokens,
                  minimum=self.minimum, maximum=self.maximum)  # fmt: skip
        if self.lowest > self.maximum:
            raise ValueError(
                f"BatchRule needs a power of two in [minimum, maximum]; got minimum={self.minimum}, "
                f"maximum={self.maximum}"
            )

    @property
    def lowest(self) -> int:
        """The smallest power of two >= `minimum`."""
        return 1 << max(0, math.ceil(math.log2(self.minimum)))

    @property
    def highest(self) -> int:
        """The largest power of two <= `maximum`."""
        return 1 << max(0, math.floor(math.log2(self.maximum)))

    def __call__(self, *, tokens: float) -> int:
        exact = self.base_sequences * (tokens / self.base_tokens) ** self.exponent
        return int(min(self.highest, max(self.lowest, 2 ** round(math.log2(exact)))))


@dataclass(frozen=True)
class AdamRule:
    """AdamW: beta2 = beta2_0^(B / B0) and eps = eps_0 sqrt(B0 / B) with B in tokens per step."""

    beta1: float = 0.9
    beta2: float = 0.99
    """beta2 at `base_batch_tokens`."""
    eps: float = 1e-8
    """epsilon at `base_batch_tokens`."""
    base_batch_tokens: int = 4096
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if not (0 <= self.beta1 < 1 and 0 < self.beta2 < 1):
            raise ValueError(
                f"AdamRule needs beta1 in [0, 1) and beta2 in (0, 1); got {self.beta1}, {self.beta2}"
            )
        _positive("AdamRule", eps=self.eps, base_batch_tokens=self.base_batch_tokens)

    def beta2_for(self, batch_tokens: int) -> float:
        return self.beta2 ** (batch_tokens / self.base_batch_tokens)

    def eps_for(self, batch_tokens: int) -> float:
        return self.eps * math.sqrt(self.base_batch_tokens / batch_tokens)


@dataclass(frozen=True)
class ScheduleRule:
    """The learning-rate schedule as fractions of the run (see `schooner.train.AdamConfig`)."""

    kind: str = "wsd"
    warmup: float = 0.1
    decay: float | None = 0.2
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.warmup < 1 or (self.decay is not None and not 0 < self.decay < 1):
            raise ValueError(
                f"ScheduleRule needs warmup in [0, 1) and decay in (0, 1) or None; got {self.warmup}, {self.decay}"
            )
