"""Recognise secret-looking environment variables and keep their values out of logs and records."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET_NAME = re.compile(
    r"password|passwd|secret|api_?key|access_?key|private_?key|session_?key|signing_?key|credential|"
    r"auth_?token|authorization|bearer|(^|_)auth$|(^|_)token$|"
    r"(?-i:(^|_)KEY$)",  # MY_KEY in the environment; not `sort_key` or `key` fields of a config
    re.IGNORECASE,
)
# `*_token` names that name a vocabulary item, not a credential.
_VOCAB_TOKEN = re.compile(
    r"^(eos|bos|pad|unk|mask|sep|cls|start|end|special|image|audio|think|begin|stop|default|sentinel)_token$",
    re.IGNORECASE,
)
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """True when a name (an environment variable or a config field) looks like it holds a credential.

    The one secret pattern of Schooner: `HF_TOKEN`, `WANDB_API_KEY`, `MY_KEY`, `hf_token`, `password`,
    `api_key` are secrets; vocabulary items (`eos_token`, `pad_token`), `max_tokens`, `tokenizer`,
    `sort_key` or `author` are not. Secret values are scrubbed from logs and records, and config fields
    with such names are runtime-only (never part of a step's identity).

    Example:
        >>> is_secret_name("HF_TOKEN"), is_secret_name("eos_token"), is_secret_name("sort_key")
        (True, False, False)
    """
    return bool(_SECRET_NAME.search(name)) and not _VOCAB_TOKEN.match(name)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-looking names replaced by '***'."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str] | None = None, *, min_length: int = 6) -> list[str]:
    """The values of secret-looking variables (in `env`, default `os.environ`), longest first."""
    import os

    env = os.environ if env is None else env
    vals = {v for k, v in env.items() if is_secret_name(k) and len(v) >= min_length}
    return sorted(vals, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """Replace every occurrence of a secret value in `text` by '***'."""
    for s in secret_values() if secrets is None else secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text
