"""Chat templates as data: how messages are laid out (`ChatTemplate`), the built-in ones, and the same layout
as a Hugging Face Jinja `chat_template`.

Rendering a conversation with a tokenizer is `_chat.render_chat`; this module needs no tokenizer, so the
tokenizer itself can write a template into its `tokenizer_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

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
