"""Chat templates: a list of messages -> token ids and a per-token loss mask for supervised fine-tuning.

Each piece (role header, content, turn end) is encoded separately and concatenated, so the mask is exact
at token level and message content can never forge role tokens (content is encoded with special-token
strings as plain text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ._tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatTemplate:
    """How messages are laid out. `{role}` in `header` is replaced by the message's role.

    The text of `header`, `footer` and `generation_header` is encoded with special tokens recognised;
    message content is encoded with them as plain text.
    """

    name: str
    """Name (recorded with a tokenizer trained for it)."""
    header: Mapping[str, str]
    """Text before a message's content, per role."""
    footer: str
    """Text after every message's content (the end-of-turn marker the model learns to emit)."""
    bos: bool = True
    """Start the conversation with the tokenizer's BOS token."""
    train_on_footer: bool = True
    """Count the assistant footer in the loss (so the model learns to end its turn)."""
    required_tokens: tuple[str, ...] = field(default=())
    """Special tokens the tokenizer must have for this template."""

    def __post_init__(self) -> None:
        missing = [r for r in ROLES if r not in self.header]
        if missing:
            raise ValueError(f"ChatTemplate {self.name!r}: header has no entry for roles {missing}")


SCHOONER_CHAT = ChatTemplate(
    name="schooner",
    header={r: f"<|{r}|>" for r in ROLES},
    footer="<|end_of_turn|>",
    required_tokens=("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end_of_turn|>"),
)
"""Role token, content, `<|end_of_turn|>`: the layout `train_bpe`'s default special tokens serve."""

CHATML = ChatTemplate(
    name="chatml",
    header={r: f"<|im_start|>{r}\n" for r in ROLES},
    footer="<|im_end|>\n",
    bos=False,
    required_tokens=("<|im_start|>", "<|im_end|>"),
)
"""ChatML (`<|im_start|>role\\n...<|im_end|>\\n`), as used by many open chat models."""

CHAT_TEMPLATES: dict[str, ChatTemplate] = {t.name: t for t in (SCHOONER_CHAT, CHATML)}


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


def chat_template_of(template: ChatTemplate | str | dict) -> ChatTemplate:
    """The `ChatTemplate` named by `template` (a name, a template, or its `asdict` as cache manifests hold)."""
    if isinstance(template, dict):
        template = ChatTemplate(**{**template, "required_tokens": tuple(template.get("required_tokens", ()))})
    if isinstance(template, str):
        if template not in CHAT_TEMPLATES:
            raise ValueError(
                f"unknown chat template {template!r}; use one of {sorted(CHAT_TEMPLATES)} or a ChatTemplate"
            )
        template = CHAT_TEMPLATES[template]
    return template


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


def jinja_chat_template(template: ChatTemplate | str | dict) -> str:
    """`template` as a Hugging Face Jinja `chat_template` (for `tokenizer_config.json`), so that
    `transformers`' `apply_chat_template(messages, add_generation_prompt=...)` gives `render_chat`'s ids.

    Rendered text, tokenized with special tokens parsed (as `apply_chat_template` does): equal ids as long as
    message content holds no special-token strings (`render_chat` keeps those as plain text; a Jinja string
    cannot) and the tokenizer splits text at a header's end the same as between separately encoded pieces.
    For the `"schooner"` template that always holds with byte-level BPE (its headers end in a special
    token). ChatML's headers end in `"\n"`: content that starts with white space (an indented code line,
    a blank line) is merged with that newline by byte-level BPE when the whole string is tokenized
    (`"\n\n   "` one token), while `render_chat` keeps the content's own tokens, the ones a model emits
    generating after the `"<|im_start|>assistant\n"` prompt. A role outside the template's is refused with
    `raise_exception`.
    """
    template = chat_template_of(template)
    headers = ", ".join(f"{json.dumps(r)}: {json.dumps(template.header[r])}" for r in ROLES)
    bos = "{{- bos_token -}}\n" if template.bos else ""
    return (
        "{#- a Schooner chat template (schooner.tokenize.render_chat) -#}\n"
        f"{{%- set headers = {{{headers}}} -%}}\n"
        f"{bos}"
        "{%- for message in messages -%}\n"
        "{%- if message['role'] not in headers -%}\n"
        f"{{{{- raise_exception('role ' ~ message['role'] ~ ' is not one of {', '.join(ROLES)}') -}}}}\n"
        "{%- endif -%}\n"
        f"{{{{- headers[message['role']] ~ message['content'] ~ {json.dumps(template.footer)} -}}}}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "{{- headers['assistant'] -}}\n"
        "{%- endif -%}\n"
    )


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
