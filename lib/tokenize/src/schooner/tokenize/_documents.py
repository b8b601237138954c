"""Chat and preference records, and how each becomes documents of a token cache (ids + loss mask).

A chat record is a schooner record whose `messages` (top level in the file, or in `metadata`) is a list of
`{"role", "content"}` turns; `chat_record` builds one, with a plain transcript as its `text` so text tools
(dedup, decontamination, browsing) see the conversation. A preference record holds `prompt`, `chosen` and
`rejected`: three strings, or message lists (`prompt` may then be left out when `chosen` and `rejected`
share their first messages). Every document is rendered by `render_chat`, which encodes each piece on its
own, so no token ever spans the prompt/answer boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._chat import check_messages, render_chat
from ._templates import ChatTemplate
from ._tokenizer import Tokenizer


class BadDocument(ValueError):
    """A record cannot become a training document; the message says why (the caller adds file and line)."""


@dataclass(frozen=True)
class Document:
    """One cache document: token ids, the per-token loss mask (1: target) and what to call it in errors."""

    ids: np.ndarray
    mask: np.ndarray
    info: dict


def _transcript(messages: Sequence[Mapping[str, str]]) -> str:
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def chat_record(
    messages: Sequence[Mapping[str, str]],
    *,
    source: str,
    id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A record holding a conversation (`metadata["messages"]`), its `text` a plain transcript.

    Example:
        >>> rec = chat_record([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        ...                   source="greetings")
        >>> rec["text"]
        'user: hi\\n\\nassistant: hello'
    """
    from schooner.data import make_record

    check_messages(messages, "chat_record")
    msgs = [dict(m) for m in messages]
    return make_record(
        _transcript(msgs), source=source, id=id, metadata={**(metadata or {}), "messages": msgs}
    )


def preference_record(
    *,
    chosen: str | Sequence[Mapping[str, str]],
    rejected: str | Sequence[Mapping[str, str]],
    prompt: str | Sequence[Mapping[str, str]] | None = None,
    source: str,
    id: str | None = None,
) -> dict[str, Any]:
    """A record holding one preference: `prompt` with a `chosen` and a `rejected` answer (strings, or message
    lists; with message lists `prompt` may be omitted when `chosen` and `rejected` share a prefix)."""
    from schooner.data import make_record

    def text(x: Any) -> str:
        return x if isinstance(x, str) else _transcript(x)

    parts = [] if prompt is None else [text(prompt)]
    meta: dict[str, Any] = {"chosen": _plain(chosen), "rejected": _plain(rejected)}
    if prompt is not None:
        meta["prompt"] = _plain(prompt)
    return make_record(
        "\n\n".join([*parts, text(chosen), text(rejected)]), source=source, id=id, metadata=meta
    )


def _plain(x: Any) -> Any:
    return x if isinstance(x, str) else [dict(m) for m in x]


def _field(rec: dict, name: str) -> Any:
    """A field at the top level of the row or (as `normalize` moves extra fields) in `metadata`."""
    if name in rec:
        return rec[name]
    meta = rec.get("metadata")
    return meta.get(name) if isinstance(meta, dict) else None


def _info(rec: dict, **extra: str) -> dict:
    return {"id": rec.get("id"), "source": rec.get("source"), **extra}


def _messages(value: Any, what: str) -> list[dict]:
    if not isinstance(value, list):
        raise BadDocument(
            f"field {what!r} must be a list of {{'role', 'content'}} messages, got {type(value).__name__}"
        )
    try:
        check_messages(value, f"field {what!r}")
    except ValueError as e:
        raise BadDocument(str(e)) from None
    return value


def _finish(ids: np.ndarray, mask: np.ndarray, tok: Tokenizer, max_length: int | None, what: str) -> tuple:
    """Append EOS, cut to `max_length`, and insist on a target token left.

    The EOS is a target exactly when the token before it is (the conversation ends with an assistant
    turn's trained end-of-turn): the model learns to close its answer, end-of-turn then EOS, so generation
    stops whichever of the two a runtime waits for."""
    ids = np.concatenate([ids, np.array([tok.eos_id], dtype=np.int32)])
    mask = np.concatenate([mask, np.asarray(mask[-1:] if mask.size else [0], dtype=np.int32)])
    if max_length is not None and ids.size > max_length:
        ids, mask = ids[:max_length], mask[:max_length]
    if not mask[1:].any():
        cut = f" within max_length={max_length} tokens" if max_length is not None else ""
        raise BadDocument(
            f"{what} has no token to train on{cut} (no assistant content, or only after the cut); add an "
            "assistant turn, raise max_length, or pass on_error='skip' to leave such records out (counted)"
        )
    return ids, mask.astype(np.uint8)


def chat_documents(
    rec: dict, tok: Tokenizer, template: ChatTemplate | str | None, max_length: int | None
) -> list[Document]:
    """The one document of a chat record: its rendered conversation, assistant tokens as targets."""
    value = _field(rec, "messages")
    if value is None:
        fields = sorted({*rec, *(rec.get("metadata") or {})} - {"id", "text", "source", "metadata"})
        raise BadDocument(
            f"no 'messages' field (fields: {', '.join(map(str, fields)) or 'none'}); a chat record holds "
            "`messages`: [{'role': ..., 'content': ...}, ...] (`schooner.tokenize.chat_record` builds one)"
        )
    msgs = _messages(value, "messages")
    r = render_chat(tok, msgs, template)
    ids, mask = _finish(r.ids, r.loss_mask, tok, max_length, "the conversation")
    return [Document(ids, mask, _info(rec))]


def preference_documents(
    rec: dict,
    tok: Tokenizer,
    template: ChatTemplate | str | None,
    max_length: int | None,
    prepend_bos: bool,
) -> list[Document]:
    """The chosen and the rejected document of a preference record, targets only on each answer."""
    prompt, chosen, rejected = (_field(rec, k) for k in ("prompt", "chosen", "rejected"))
    if chosen is None or rejected is None:
        raise BadDocument(
            "a preference record needs 'chosen' and 'rejected' (and 'prompt', or messages sharing one)"
        )
    if isinstance(chosen, str) and isinstance(rejected, str):
        if not isinstance(prompt, str):
            raise BadDocument(
                f"'chosen' and 'rejected' are strings, so 'prompt' must be one too, got {type(prompt).__name__}"
            )
        head = [tok.bos_id] if prepend_bos and tok.bos_id is not None else []
        p = np.array(head + tok.encode(prompt), dtype=np.int32)
        pairs = [(p, np.array(tok.encode(a) + [tok.eos_id], dtype=np.int32)) for a in (chosen, rejected)]
        docs = []
        for role, (pi, ai) in zip(("chosen", "rejected"), pairs):
            if ai.size == 1:
                raise BadDocument(f"the {role} answer is empty; every answer needs text to train on")
            ids = np.concatenate([pi, ai])
            mask = np.concatenate([np.zeros(pi.size, np.uint8), np.ones(ai.size, np.uint8)])
            if max_length is not None and ids.size > max_length:
                ids, mask = ids[:max_length], mask[:max_length]
                if not mask[1:].any():
                    raise BadDocument(
                        f"the prompt fills max_length={max_length} tokens, leaving none of the {role} answer; "
                        "raise max_length or pass on_error='skip' (counted)"
                    )
            docs.append(Document(ids, mask, _info(rec, role=role)))
        return docs
    chosen_m, rejected_m = _messages(chosen, "chosen"), _messages(rejected, "rejected")
    if prompt is None:
        k = 0
        while k < min(len(chosen_m), len(rejected_m)) and dict(chosen_m[k]) == dict(rejected_m[k]):
            k += 1
        if k == 0:
            raise BadDocument("'chosen' and 'rejected' share no first message and there is no 'prompt'")
        prompt_m, chosen_m, rejected_m = chosen_m[:k], chosen_m[k:], rejected_m[k:]
    else:
        prompt_m = _messages(prompt, "prompt")
    boundary = render_chat(tok, prompt_m, template).ids.size
    docs = []
    for role, answer in (("chosen", chosen_m), ("rejected", rejected_m)):
        if not any(m["role"] == "assistant" for m in answer):
            raise BadDocument(f"the {role} answer has no assistant message after the shared prompt")
        r = render_chat(tok, [*prompt_m, *answer], template)
        mask = r.loss_mask.copy()
        mask[:boundary] = 0  # earlier assistant turns belong to the prompt
        ids, m = _finish(r.ids, mask, tok, max_length, f"the {role} answer")
        docs.append(Document(ids, m, _info(rec, role=role)))
    return docs
