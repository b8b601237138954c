"""What the tokenize steps run: their configs, the functions that run them, and what the builders in
`schooner.tokenize.steps` share (the record inputs, the tokenizer reference checked by fingerprint)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from schooner.cluster import StepHandle, runtime_field
from schooner.data.steps import as_step_inputs, input_locations

from ._build import build_cache, resolve_shards
from ._templates import CHAT_TEMPLATES, ChatTemplate
from ._tokenizer import load_tokenizer
from ._train import BPEConfig, train_bpe


def record_inputs(source: str | None, paths: Any, what: str) -> list[Any]:
    """The record inputs of a step: an embedded source's records step, or the given paths/handles."""
    if (source is None) == (paths is None):
        raise ValueError(
            f"{what}: pass exactly one of source= (an embedded source name) or paths=, got {source=}, {paths=}"
        )
    if source is not None:
        from schooner.data.steps import source_records

        return [source_records(source)]
    return as_step_inputs(paths, what=f"{what}: paths=")


@dataclass(frozen=True)
class TrainTokenizerConfig:
    """Config of the `train_tokenizer` step."""

    inputs: list
    """Step handles (paths when the step runs) and `InputFiles` (user files keyed by content)."""
    bpe: BPEConfig
    """Vocabulary size, special tokens and merge limits."""
    max_documents: int | None = None
    """Train on at most this many documents (in input order); None: all."""
    max_chars: int | None = None
    """Train on at most this many characters (the document that crosses it is cut); None: all."""
    text_field: str = "text"
    """The record field holding the text."""

    def __post_init__(self) -> None:
        for name in ("max_documents", "max_chars"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(
                    f"TrainTokenizerConfig.{name} must be a positive int or None, got {name}={v!r}"
                )


def _training_texts(config: TrainTokenizerConfig, counts: dict) -> Iterator[str]:
    from schooner.data import read_records

    chars = 0
    for shard in resolve_shards(input_locations(config.inputs)):
        for rec in read_records(shard, text_field=config.text_field):
            if config.max_documents is not None and counts["documents"] >= config.max_documents:
                return
            text = rec["text"]
            if config.max_chars is not None and chars + len(text) > config.max_chars:
                text = text[: config.max_chars - chars]
            counts["documents"] += 1
            counts["chars"] += len(text)
            chars += len(text)
            yield text
            if config.max_chars is not None and chars >= config.max_chars:
                return


def _run_train_tokenizer(config: TrainTokenizerConfig, output_path: str) -> dict:
    counts = {"documents": 0, "chars": 0}
    tok = train_bpe(_training_texts(config, counts), config.bpe)
    tok.source = output_path
    tok.save(output_path)  # local folders and object-store URLs alike, each file written atomically
    return {"fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size, **counts}


@dataclass(frozen=True)
class TokenizeConfig:
    """Config of the `tokenized` step."""

    inputs: list
    """Step handles (paths when the step runs) and `InputFiles` (user files keyed by content)."""
    tokenizer: Any
    """A tokenizer step handle (its folder), a tokenizer file/folder path, or a hub id."""
    tokenizer_fingerprint: str | None = None
    """For a path or hub id: its fingerprint when the step was built, so the identity follows content."""
    tokenizer_special_tokens: dict | None = None
    """For a path or hub id: its bos/eos/pad tokens when the step was built (its tokenizer_config.json,
    which the fingerprint does not cover), so the identity follows them too."""
    validation_fraction: float = 0.02
    """Fraction of documents (by id hash) in the validation cache."""
    split_seed: int = 0
    """Seed of the split hash."""
    prepend_bos: bool = False
    """Start every document with BOS (EOS is always appended)."""
    text_field: str = "text"
    """The record field holding the text."""
    on_error: str = "raise"
    """Bad records: 'raise' (naming file and line) or 'skip' (counted, with examples, in the manifests)."""
    encoder: str | None = runtime_field(None)
    """"auto", "hf" or "tiktoken" (None: the tokenizer's setting); not part of the identity: the ids are
    the same either way."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"TokenizeConfig.validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        if self.on_error not in ("raise", "skip"):
            raise ValueError(
                f"TokenizeConfig.on_error must be 'raise' or 'skip', got on_error={self.on_error!r}"
            )


def _special_tokens(tok: Any, chat_template: bool = False) -> dict:
    """What a tokenizer folder's tokenizer_config.json decides and the fingerprint does not cover: the
    bos/eos/pad tokens, and (for chat steps that use it) the tokenizer's own chat template."""
    out = {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "pad_token": tok.pad_token}
    return out | {"chat_template": tok.chat_template} if chat_template else out


def _load_checked(tokenizer: Any, fingerprint: str | None, special: dict | None = None) -> Any:
    tok = load_tokenizer(tokenizer)
    if fingerprint is not None and tok.fingerprint != fingerprint:
        raise ValueError(
            f"tokenizer {tokenizer!r} changed since the step was defined (fingerprint "
            f"{tok.fingerprint[:12]}, was {fingerprint[:12]}); rebuild the experiment graph"
        )
    now = None if special is None else _special_tokens(tok, "chat_template" in special)
    if special is not None and now != special:
        raise ValueError(
            f"tokenizer {tokenizer!r}: its special tokens changed since the step was defined "
            f"({now}, was {special}: its tokenizer_config.json was edited); rebuild the experiment graph"
        )
    return tok


def _run_tokenize(config: TokenizeConfig, output_path: str) -> dict:
    tok = _load_checked(config.tokenizer, config.tokenizer_fingerprint, config.tokenizer_special_tokens)
    return build_cache(
        input_locations(config.inputs),
        output_path,
        tok,
        validation_fraction=config.validation_fraction,
        split_seed=config.split_seed,
        prepend_bos=config.prepend_bos,
        text_field=config.text_field,
        on_error=config.on_error,
        encoder=config.encoder,
    )


@dataclass(frozen=True)
class ChatTokenizeConfig:
    """Config of the `tokenized_chat` and `tokenized_preferences` steps."""

    inputs: list
    """Step handles (paths when the step runs) and `InputFiles` (user files keyed by content)."""
    tokenizer: Any
    """A tokenizer step handle (its folder), a tokenizer file/folder path, or a hub id."""
    kind: str
    """`"chat"` (records with `messages`) or `"preference"` (records with prompt/chosen/rejected)."""
    tokenizer_fingerprint: str | None = None
    """For a path or hub id: its fingerprint when the step was built, so the identity follows content."""
    tokenizer_special_tokens: dict | None = None
    """For a path or hub id: its bos/eos/pad tokens when the step was built (its tokenizer_config.json,
    which the fingerprint does not cover), so the identity follows them too."""
    chat_template: ChatTemplate | str | None = None
    """A `ChatTemplate` or its name; None: the tokenizer's own (else "schooner")."""
    max_length: int | None = None
    """Cut every document to this many tokens (one left with no target token is a bad record)."""
    prepend_bos: bool = True
    """Preference records of plain strings: start each sequence with BOS (when the tokenizer has one)."""
    validation_fraction: float = 0.02
    """Fraction of records (by id hash) in the validation cache; a pair's two sequences stay together."""
    split_seed: int = 0
    """Seed of the split hash."""
    on_error: str = "raise"
    """Bad records (no target, bad messages): 'raise' naming file and line, or 'skip' (counted)."""

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "preference"):
            raise ValueError(f"ChatTokenizeConfig.kind must be 'chat' or 'preference', got {self.kind!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"ChatTokenizeConfig.validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"ChatTokenizeConfig.on_error must be 'raise' or 'skip', got {self.on_error!r}")
        m = self.max_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ValueError(f"ChatTokenizeConfig.max_length must be an int >= 2 or None, got {m!r}")
        if isinstance(self.chat_template, str) and self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"ChatTokenizeConfig.chat_template {self.chat_template!r} is not one of {sorted(CHAT_TEMPLATES)}; "
                "pass a ChatTemplate for another layout"
            )


def _run_tokenize_chat(config: ChatTokenizeConfig, output_path: str) -> dict:
    tok = _load_checked(config.tokenizer, config.tokenizer_fingerprint, config.tokenizer_special_tokens)
    return build_cache(
        input_locations(config.inputs),
        output_path,
        tok,
        kind=config.kind,
        chat_template=config.chat_template,
        max_length=config.max_length,
        validation_fraction=config.validation_fraction,
        split_seed=config.split_seed,
        prepend_bos=config.prepend_bos if config.kind == "preference" else False,
        on_error=config.on_error,
    )


def tokenizer_ref(
    tokenizer: Any, what: str, chat_template: bool = False
) -> tuple[Any, str | None, dict | None]:
    """(the tokenizer as a step input, and when it is a path or hub id its fingerprint and special tokens,
    with its own chat template when `chat_template`)."""
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = os.fspath(tokenizer)
        tok = load_tokenizer(tokenizer)
        return tokenizer, tok.fingerprint, _special_tokens(tok, chat_template)
    if not isinstance(tokenizer, StepHandle) and not hasattr(tokenizer, "__schooner_ref__"):
        raise TypeError(
            f"{what}: tokenizer must be a train_tokenizer step handle, a path or a hub id, got "
            f"{type(tokenizer).__name__}; save a Tokenizer with .save(folder) and pass the folder"
        )
    return tokenizer, None, None
