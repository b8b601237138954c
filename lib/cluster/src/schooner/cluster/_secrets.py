"""Recognise secret-looking environment variables and keep their values out of logs and records."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|SESSION_?KEY|_KEY$|^KEY$)",
    re.IGNORECASE,
)
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name looks like it holds a token, key or password."""
    return bool(_SECRET_NAME.search(name))


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
