"""Step builders: tokenizer training and token caches as cached, versioned steps of an experiment.

Example:
    >>> from schooner.cluster import StepRunner
    >>> from schooner.tokenize.steps import tokenized, train_tokenizer
    >>> tok = train_tokenizer("tokenizers/python-4k", source="python-docs", vocab_size=4096)
    >>> docs = tokenized("tokenized/python-docs", source="python-docs", tokenizer=tok)
    >>> StepRunner(prefix="/tmp/schooner").run([docs])  # doctest: +SKIP

    The output of `docs` holds `train/` and `validation/` token caches (`TokenCache.open(f"{out}/train")`)
    and the tokenizer (`load_tokenizer(out)`); the output of `tok` holds `tokenizer.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, step
from schooner.data.steps import as_step_inputs

from ._step_runs import (
    ChatTokenizeConfig,
    TokenizeConfig,
    TrainTokenizerConfig,
    _run_tokenize,
    _run_tokenize_chat,
    _run_train_tokenizer,
    record_inputs,
    tokenizer_ref,
)
from ._templates import ChatTemplate
from ._train import BOS_TOKEN, DEFAULT_SPECIAL_TOKENS, EOS_TOKEN, PAD_TOKEN, BPEConfig


def train_tokenizer(
    name: str,
    *,
    source: str | None = None,
    paths: Any = None,
    vocab_size: int = 4096,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    bos_token: str = BOS_TOKEN,
    eos_token: str = EOS_TOKEN,
    pad_token: str = PAD_TOKEN,
    chat_template: str | None = "schooner",
    max_token_length: int | None = 32,
    max_documents: int | None = None,
    max_chars: int | None = None,
    text_field: str = "text",
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step training a byte-level BPE tokenizer; its output folder holds `tokenizer.json`.

    Args:
        name: step name (and output folder name).
        source: an embedded source ("python-docs", "python-code") to train on, or
        paths: record folders / files / globs / step handles to train on.
        vocab_size, min_frequency, special_tokens, max_token_length: see `BPEConfig`.
        bos_token, eos_token, pad_token, chat_template: see `BPEConfig` (bos/eos/pad must be among
            `special_tokens`; e.g. all three `"<|endoftext|>"` with `special_tokens=["<|endoftext|>"]`).
        max_documents, max_chars: cap the training text (deterministically: the first ones in order).
        resources: run on the cluster with these resources (default: in the runner process).
    """
    bpe = BPEConfig(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=tuple(special_tokens),
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        chat_template=chat_template,
        max_token_length=max_token_length,
    )
    config = TrainTokenizerConfig(
        inputs=record_inputs(source, paths, "train_tokenizer"),
        bpe=bpe,
        max_documents=max_documents,
        max_chars=max_chars,
        text_field=text_field,
    )
    return step(
        name,
        _run_train_tokenizer,
        config,
        version="train-bpe-v1",
        resources=resources,
        description=f"byte-level BPE, vocab {vocab_size}",
    )


# -- tokenized -------------------------------------------------------------------------------------


def tokenized(
    name: str,
    *,
    source: str | None = None,
    paths: Any = None,
    tokenizer: Any,
    validation_fraction: float = 0.02,
    split_seed: int = 0,
    prepend_bos: bool = False,
    text_field: str = "text",
    on_error: str = "raise",
    encoder: str | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step tokenizing records into `train/` and `validation/` token caches (its output folder).

    Each input shard is one task on the current cluster client; the build resumes after a crash.

    Args:
        name: step name (and output folder name).
        source: an embedded source name ("python-docs", "python-code"), or
        paths: record folders / files / globs / step handles (e.g. a data step's output).
        tokenizer: a `train_tokenizer` step handle, a tokenizer file or folder, or a hub id.
        validation_fraction: share of documents routed to `validation/` by a hash of their id.
        split_seed: seed of that hash.
        prepend_bos: start every document with BOS (EOS always ends it).
        text_field: the record field holding the text.
        on_error: bad records raise ("raise", naming file and line) or are skipped and counted ("skip").
        encoder: force "hf" or "tiktoken" (default: tiktoken where it provably gives HF's ids); the
            caches are the same either way, so this is not part of the step's identity.
        resources: where the driver runs (default: the runner process; the shard tasks always go to the
            current client).

    Example:
        >>> docs = tokenized("tokenized/python-docs", source="python-docs", tokenizer=tok)  # doctest: +SKIP
        >>> train_lm(..., datasets={docs: 0.7, code: 0.3})                                  # doctest: +SKIP
    """
    inputs = record_inputs(source, paths, "tokenized")
    tokenizer, fingerprint, special = tokenizer_ref(tokenizer, "tokenized")
    config = TokenizeConfig(
        inputs=inputs,
        tokenizer=tokenizer,
        tokenizer_fingerprint=fingerprint,
        tokenizer_special_tokens=special,
        validation_fraction=validation_fraction,
        split_seed=split_seed,
        prepend_bos=prepend_bos,
        text_field=text_field,
        on_error=on_error,
        encoder=encoder,
    )
    return step(
        name,
        _run_tokenize,
        config,
        version="tokenize-v1",
        resources=resources,
        description=f"token cache of {source or paths!r}",
        resumable=True,  # the cache's ledger of finished shards: a rerun builds only the rest
    )


# -- tokenized_chat / tokenized_preferences --------------------------------------------------------


def _documents_step(
    name: str, kind: str, source: Any, tokenizer: Any, resources: Any, **options: Any
) -> StepHandle:
    what = "tokenized_chat" if kind == "chat" else "tokenized_preferences"
    if source is None:
        raise ValueError(f"{what}: source= is required (record folders, files, globs or step handles)")
    # with no chat_template= the tokenizer's own renders the chats: part of the identity
    tok, fingerprint, special = tokenizer_ref(tokenizer, what, options.get("chat_template") is None)
    config = ChatTokenizeConfig(
        inputs=as_step_inputs(source, what=f"{what}: source="),
        tokenizer=tok,
        kind=kind,
        tokenizer_fingerprint=fingerprint,
        tokenizer_special_tokens=special,
        **options,
    )
    return step(
        name,
        _run_tokenize_chat,
        config,
        version=f"tokenize-{kind}-v2",  # v2: the EOS after a final assistant turn is a target
        resources=resources,
        description=f"{kind} token cache of {source!r}",
        resumable=True,  # the cache's ledger of finished shards: a rerun builds only the rest
    )


def tokenized_chat(
    name: str,
    *,
    source: Any,
    tokenizer: Any,
    chat_template: ChatTemplate | str | None = None,
    max_length: int | None = None,
    validation_fraction: float = 0.02,
    split_seed: int = 0,
    on_error: str = "raise",
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step rendering chat records into `train/` and `validation/` caches with assistant-only loss masks.

    Records hold `messages` (`[{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]`, top
    level or in `metadata`; `schooner.tokenize.chat_record` builds them). Each conversation is one
    document, rendered with `chat_template` and ended with EOS (a target when the conversation ends with an
    assistant turn, so the model learns to stop). Resumable like `tokenized`.
    Read it for SFT with `MixtureDataset({out: w, ...}, seq_len)`, which packs whole conversations per row.

    Args:
        name: step name (and output folder name).
        source: record folders / files / globs / step handles holding chat records.
        tokenizer: a `train_tokenizer` step handle, a tokenizer file or folder, or a hub id.
        chat_template: a `ChatTemplate` or name ("schooner", "chatml"); default: the tokenizer's.
        max_length: cut each conversation to this many tokens (None: keep whole).
        validation_fraction, split_seed: the validation split, by a hash of the record id.
        on_error: a conversation with no assistant token (within `max_length`) or bad messages raises
            naming file and line ("raise"), or is skipped and counted in the manifest ("skip").
        resources: where the driver runs (the shard tasks go to the current client).
    """
    return _documents_step(
        name, "chat", source, tokenizer, resources, chat_template=chat_template, max_length=max_length,
        validation_fraction=validation_fraction, split_seed=split_seed, on_error=on_error,
    )  # fmt: skip


def tokenized_preferences(
    name: str,
    *,
    source: Any,
    tokenizer: Any,
    chat_template: ChatTemplate | str | None = None,
    max_length: int | None = None,
    prepend_bos: bool = True,
    validation_fraction: float = 0.02,
    split_seed: int = 0,
    on_error: str = "raise",
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step tokenizing preference records into `train/` and `validation/` preference caches for DPO.

    Records hold `prompt`, `chosen`, `rejected` (strings; or message lists, `prompt` optional when
    `chosen` and `rejected` share their first messages; `schooner.tokenize.preference_record` builds
    them). Each becomes two documents, chosen then rejected, with the loss mask on the answer only; prompt
    and answer are encoded apart, so no token spans the boundary and both sequences share the prompt's
    tokens. Read it with `PreferenceDataset(out, seq_len)`. Arguments as for `tokenized_chat`;
    `prepend_bos` starts plain-string pairs with BOS.
    """
    return _documents_step(
        name, "preference", source, tokenizer, resources, chat_template=chat_template, max_length=max_length,
        prepend_bos=prepend_bos, validation_fraction=validation_fraction, split_seed=split_seed,
        on_error=on_error,
    )  # fmt: skip
