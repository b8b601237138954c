"""Rendering chats: a list of messages -> token ids and a per-token loss mask for supervised fine-tuning.

Each piece (role header, content, turn end) is encoded separately and concatenated, so the mask is exact
at token level and message content can never forge role tokens (content is encoded with special-token
strings as plain text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._templates import ROLES, ChatTemplate, chat_template_of
from ._tokenizer import Tokenizer


@dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation: `ids` and `loss_mask` have the same length.

    `loss_mask[t] == 1` means token `t` is a training target (predicted from tokens `< t`): the tokens of
    assistant turns (content and, by default, the footer). Everything else is 0.
    """

    ids: np.ndarray
    loss_mask: np.ndarray


def check_messages(messages: Sequence[Mapping[str, str]], what: str = "render_chat") -> None:
    """Raise `ValueError` (prefixed with `what`) unless `messages` is a non-empty list of role/content turns."""
    if not messages:
        raise ValueError(f"{what}: messages is empty; pass at least one {{'role': ..., 'content': ...}}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(
                f"{what}: messages[{i}] must be a mapping with 'role' and 'content', got {m!r:.120}"
            )
        if m["role"] not in ROLES:
            raise ValueError(f"{what}: messages[{i}] has role {m['role']!r}; use one of {ROLES}")
        if not isinstance(m["content"], str):
            raise ValueError(f"{what}: messages[{i}] content is {type(m['content']).__name__}, not str")


def resolve_template(tokenizer: Tokenizer, template: ChatTemplate | str | dict | None) -> ChatTemplate:
    """The `ChatTemplate` named by `template` (a name, a template, its `asdict`, or None: the tokenizer's own,
    else "schooner"), checked to have every token it needs in `tokenizer`."""
    template = chat_template_of((tokenizer.chat_template or "schooner") if template is None else template)
    missing = [t for t in template.required_tokens if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(
            f"chat template {template.name!r} needs tokens {missing} that tokenizer {tokenizer.source} lacks; "
            "train one with those special tokens or choose another template"
        )
    return template


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, str]],
    template: ChatTemplate | str | None = None,
    *,
    add_generation_prompt: bool = False,
    max_length: int | None = None,
) -> RenderedChat:
    """Render `messages` (`[{"role": ..., "content": ...}, ...]`) to token ids and an assistant-only mask.

    Args:
        tokenizer: the tokenizer (must have the template's special tokens).
        messages: the conversation; roles are system, user, assistant, tool.
        template: a `ChatTemplate` or its name; default: the one the tokenizer was trained for, else
            "schooner".
        add_generation_prompt: end with the assistant header, ready for generation.
        max_length: keep only the first `max_length` tokens (the end of a long conversation is dropped).

    Example:
        >>> r = render_chat(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])  # doctest: +SKIP
        >>> tok.decode(r.ids[r.loss_mask == 1])                                                          # doctest: +SKIP
        'hello<|end_of_turn|>'
    """
    template = resolve_template(tokenizer, template)
    check_messages(messages)
    ids: list[int] = []
    mask: list[int] = []

    def put(tokens: list[int], target: bool) -> None:
        ids.extend(tokens)
        mask.extend([int(target)] * len(tokens))

    if template.bos:
        if tokenizer.bos_id is None:
            raise ValueError(
                f"chat template {template.name!r} starts with BOS but tokenizer {tokenizer.source} has none"
            )
        put([tokenizer.bos_id], False)
    for m in messages:
        is_assistant = m["role"] == "assistant"
        put(tokenizer.encode(template.header[m["role"]], parse_special=True), False)
        put(tokenizer.encode(m["content"]), is_assistant)
        put(tokenizer.encode(template.footer, parse_special=True), is_assistant and template.train_on_footer)
    if add_generation_prompt:
        put(tokenizer.encode(template.header["assistant"], parse_special=True), False)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return RenderedChat(ids=np.array(ids, dtype=np.int32), loss_mask=np.array(mask, dtype=np.int32))


def pack_chats(chats: Sequence[RenderedChat], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Pack rendered conversations, in order, into rows of `seq_len` tokens for SFT batches.

    Conversations are placed whole, first-fit in order (a conversation that does not fit starts a new
    row; one longer than `seq_len` is truncated to it). Each conversation gets its own segment id in the
    row; padding gets the segment after the last and a 0 mask, so it attends and is scored nowhere.

    Returns:
        `{"tokens", "loss_mask", "segment_ids"}`, int32 `[rows, seq_len]`.
    """
    if seq_len < 1:
        raise ValueError(f"pack_chats: seq_len must be >= 1, got {seq_len!r}")
    rows: list[list[RenderedChat]] = []
    used = seq_len  # forces a new first row
    for chat in chats:
        n = min(len(chat.ids), seq_len)
        if n == 0:
            continue
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(chat)
        used += n
    tokens = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    mask = np.zeros_like(tokens)
    segs = np.zeros_like(tokens)
    for r, row in enumerate(rows):
        pos = 0
        for seg, chat in enumerate(row):
            n = min(len(chat.ids), seq_len)
            tokens[r, pos : pos + n] = chat.ids[:n]
            mask[r, pos : pos + n] = chat.loss_mask[:n]
            segs[r, pos : pos + n] = seg
            pos += n
        segs[r, pos:] = len(row)
    return {"tokens": tokens, "loss_mask": mask, "segment_ids": segs}
