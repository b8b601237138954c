"""Train a deterministic byte-level BPE tokenizer with the special tokens Schooner's pipeline expects."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from ._templates import CHAT_TEMPLATES
from ._tokenizer import Tokenizer

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
CHAT_TOKENS: tuple[str, ...] = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end_of_turn|>")
"""Role markers and the end-of-turn token used by the `"schooner"` chat template."""
DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, *CHAT_TOKENS)


@dataclass(frozen=True)
class BPEConfig:
    """How to train a byte-level BPE tokenizer."""

    vocab_size: int = 4096
    """Final vocabulary size, special tokens and the 256 byte symbols included."""
    min_frequency: int = 2
    """A pair must occur at least this often to be merged."""
    special_tokens: tuple[str, ...] = DEFAULT_SPECIAL_TOKENS
    """Added special tokens, given the first ids in this order."""
    bos_token: str = BOS_TOKEN
    """Beginning-of-sequence token (must be in `special_tokens`)."""
    eos_token: str = EOS_TOKEN
    """End-of-sequence token appended to every cached document (must be in `special_tokens`)."""
    pad_token: str = PAD_TOKEN
    """Padding token (must be in `special_tokens`)."""
    max_token_length: int | None = 32
    """Longest merged token in characters (None: unlimited); keeps rare long merges out of small vocabs."""
    chat_template: str | None = "schooner"
    """Name of the chat template the special tokens serve (recorded with the tokenizer, and written as Jinja
    by `Tokenizer.save`); not recorded where `special_tokens` lacks the template's tokens."""

    def __post_init__(self) -> None:
        if isinstance(self.special_tokens, list):
            object.__setattr__(self, "special_tokens", tuple(self.special_tokens))
        n_special = len(self.special_tokens)
        if len(set(self.special_tokens)) != n_special:
            raise ValueError(f"BPEConfig.special_tokens has duplicates: {self.special_tokens}")
        if (
            isinstance(self.vocab_size, bool)
            or not isinstance(self.vocab_size, int)
            or self.vocab_size < 256 + n_special
        ):
            raise ValueError(
                f"BPEConfig.vocab_size must be an int >= 256 bytes + {n_special} special tokens = "
                f"{256 + n_special}, got vocab_size={self.vocab_size!r}"
            )
        if self.min_frequency < 1:
            raise ValueError(f"BPEConfig.min_frequency must be >= 1, got {self.min_frequency!r}")
        for name in ("bos_token", "eos_token", "pad_token"):
            if getattr(self, name) not in self.special_tokens:
                raise ValueError(
                    f"BPEConfig.{name}={getattr(self, name)!r} is not one of special_tokens={self.special_tokens}; "
                    "add it there"
                )
        if self.max_token_length is not None and self.max_token_length < 2:
            raise ValueError(
                f"BPEConfig.max_token_length must be >= 2 or None, got {self.max_token_length!r}"
            )


def train_bpe(
    texts: Iterable[str] | Iterable[dict], config: BPEConfig | None = None, **overrides: Any
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on `texts`: strings, or records (their `"text"`), e.g. a
    `schooner.data.Dataset`; read once, streaming.

    Lossless on any input (every byte has a symbol), the same merges for the same texts in the same
    order (the `tokenizers` trainer breaks count ties by the pair itself, not by hash order).

    Args:
        texts: the training texts.
        config: a `BPEConfig`; keyword `overrides` replace its fields (e.g. `vocab_size=8192`).

    Example:
        >>> tok = train_bpe(["def f(x):\\n    return x\\n"] * 100, vocab_size=300)
        >>> tok.decode(tok.encode("def f(x):")) == "def f(x):"
        True
    """
    if config is None:
        config = BPEConfig(**overrides)
    elif overrides:
        config = replace(config, **overrides)
    hf = tokenizers.Tokenizer(models.BPE())
    # use_regex: GPT-2 style pre-splitting, so merges never cross word/space/punctuation boundaries.
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=config.max_token_length,
        show_progress=False,
    )
    counted = _Counter(texts)
    hf.train_from_iterator(counted, trainer=trainer)
    if counted.n == 0:
        raise ValueError("train_bpe: got no texts; pass a non-empty iterable of strings")
    return Tokenizer(
        hf,
        bos_token=config.bos_token,
        eos_token=config.eos_token,
        pad_token=config.pad_token,
        chat_template=_template_served(config),
        source="<trained>",
    )


def _template_served(config: BPEConfig) -> str | None:
    """`config.chat_template`, or None where it is a known template whose tokens are not among the special
    tokens (the default "schooner" on a tokenizer trained without role tokens: a base tokenizer, which must
    not ship a Jinja template that renders its role markers as plain text)."""
    template = CHAT_TEMPLATES.get(config.chat_template or "")
    if template is not None and not set(template.required_tokens) <= set(config.special_tokens):
        return None
    return config.chat_template


class _Counter:
    """Passes texts through, counting them and rejecting non-strings with their position."""

    def __init__(self, texts: Iterable[object]) -> None:  # any items: each is checked in __next__
        self._it: Iterator[object] = iter(texts)
        self.n = 0

    def __iter__(self) -> _Counter:
        return self

    def __next__(self) -> str:
        t = next(self._it)
        if isinstance(t, dict):  # a record (e.g. from a schooner.data.Dataset): train on its text
            t = t.get("text")
        if not isinstance(t, str):
            raise TypeError(f"train_bpe: text #{self.n} is {type(t).__name__}, not str: {t!r:.80}")
        self.n += 1
        return t
