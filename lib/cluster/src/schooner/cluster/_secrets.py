"""Secrets: credentials in configs (marked explicitly) and in the environment (recognised by name).

A config marks a credential explicitly, never by its name: wrap the value in `Secret("hf_...")`, or
declare the dataclass field with `secret_field()` (`dataclasses.field(metadata={"secret": True})` is the
same marker). Marked values never enter a step's key (rotating a token reruns nothing) nor its record, and
their values are scrubbed from logs, errors and results like secret environment variables. Guessing from
names is wrong both ways: `num_experts_per_token` or `eot_token` are model settings that must stay in the
key, while a credential may be called anything.

Environment variables carry no marker, so for them (and only them) the name decides: `HF_TOKEN`,
`WANDB_API_KEY`, `DB_PASSWORD`... (`is_secret_name`), and only values of 6 characters or more are scrubbed
(a name guessed wrong must not blank out every `1234` of the output). A marked secret is scrubbed at any
length from 4 characters; a shorter one (`Secret("pw1")`) is refused: scrubbing it would replace ordinary
text everywhere, and it protects nothing. Each value is also scrubbed in its escaped forms (as `repr` and
JSON write it, for a value holding a quote or a backslash).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

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
MIN_MARKED_CHARS = 4
"""The shortest value `Secret(...)` and `secret_field()` accept (a non-empty shorter one is refused)."""
MIN_ENV_CHARS = 6
"""The shortest value of a secret-looking environment variable that is scrubbed."""


SECRET_META = "secret"
"""Dataclass field metadata flag marking a credential: `dataclasses.field(metadata={"secret": True})`."""

_registered: set[str] = set()
_registered_lock = threading.Lock()


class Secret:
    """A credential held in a config: kept out of step keys, records and logs.

    `Secret("hf_...")` in a config field, dict or list is left out of the step's key (a field or dict
    entry holding one is omitted, elsewhere it counts as a fixed placeholder) and its value is scrubbed
    from everything the runner records or prints. The step reads it with `.get()`. Its `repr` and `str`
    never show the value.

    Example:
        >>> s = Secret("hf_abcdef123")
        >>> s, str(s), s.get()
        (Secret('***'), '***', 'hf_abcdef123')
    """

    __slots__ = ("_value",)

    def __init__(self, value: str | Secret) -> None:
        if isinstance(value, Secret):
            value = value.get()
        if not isinstance(value, str):
            raise TypeError(f"Secret(...) holds a string (a token, a password), got a {type(value).__name__}")
        check_secret_length(value, "Secret(...)")
        self._value = value
        register_secret(value)

    def get(self) -> str:
        """The secret value itself (give it to the client library; never print or return it)."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Secret, (self._value,))  # rebuilt (and registered) in the worker process too


def secret_field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field holding a credential: not part of the step's key, never recorded, scrubbed from logs.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Download:
        ...     repo: str
        ...     hf_token: str | None = secret_field(None)
    """
    return marked_field(SECRET_META, default, default_factory)


def marked_field(marker: str, default: Any, default_factory: Any) -> Any:
    """A dataclass field with `metadata={marker: True}` and the default (or factory) given, if any."""
    kw: dict[str, Any] = {"metadata": {marker: True}}
    if default is not dataclasses.MISSING:
        kw["default"] = default
    if default_factory is not dataclasses.MISSING:
        kw["default_factory"] = default_factory
    return dataclasses.field(**kw)


def is_secret_field(field: dataclasses.Field) -> bool:
    """True for a dataclass field marked as a credential (`secret_field()` or `metadata={"secret": True}`)."""
    return bool(field.metadata.get(SECRET_META))


def check_secret_length(value: str, what: str) -> None:
    """Refuse a marked secret of 1 to 3 characters (see the module's doc): `what` names where it was given."""
    if 0 < len(value) < MIN_MARKED_CHARS:
        raise ValueError(
            f"{what}: a secret of {len(value)} characters cannot be scrubbed from logs and records without "
            f"blanking out ordinary text; secrets need at least {MIN_MARKED_CHARS} "
            "characters: use the real credential, or pass None for no secret"
        )


def register_secret(value: Any) -> None:
    """Scrub `value` (a string, or a `Secret`) from logs and records of this process from now on."""
    if isinstance(value, Secret):
        value = value.get()
    if isinstance(value, str) and len(value) >= MIN_MARKED_CHARS:
        with _registered_lock:
            _registered.add(value)


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name looks like it holds a credential.

    For environment variables only, which carry no other marker: `HF_TOKEN`, `WANDB_API_KEY`, `MY_KEY`,
    `DB_PASSWORD` are secrets; `PATH`, `KEYBOARD_LAYOUT` are not. Their values are scrubbed from logs and
    records. Config fields are never judged by name: mark them with `Secret` or `secret_field()`.

    Example:
        >>> is_secret_name("HF_TOKEN"), is_secret_name("eos_token"), is_secret_name("sort_key")
        (True, False, False)
    """
    return bool(_SECRET_NAME.search(name)) and not _VOCAB_TOKEN.match(name)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with the values of secret-looking names replaced by '***'."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str] | None = None, *, min_length: int = MIN_ENV_CHARS) -> list[str]:
    """The values of secret-looking variables (in `env`, default `os.environ`) of `min_length` characters or
    more, each with its escaped forms (`repr`, JSON), longest first.

    Without `env`, the values of the `Secret`s and `secret_field`s this process has seen are included (from
    4 characters on: they are marked, not guessed).
    """
    import os

    vals = set()
    if env is None:
        env = os.environ
        with _registered_lock:
            vals |= set(_registered)
    vals |= {v for k, v in env.items() if is_secret_name(k) and len(v) >= min_length}
    return sorted({f for v in vals for f in escaped_forms(v)}, key=len, reverse=True)


def escaped_forms(value: str) -> set[str]:
    """`value` as printed raw, by `repr` (without its quotes) and inside a JSON string."""
    import json

    forms = {value, repr(value)[1:-1], json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms |= {value.encode("unicode_escape").decode("ascii")}
    return {f for f in forms if f}


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """Replace every occurrence of a secret value in `text` by '***'."""
    for s in secret_values() if secrets is None else secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text


class StreamScrubber:
    """Scrubs a stream written in pieces: a secret split over two writes is still replaced.

    `feed(piece)` returns what may be passed on now: everything scrubbed, less a tail that could be the
    start of a secret (held until the next piece shows whether it is); `close()` returns the held tail,
    scrubbed. Works on `str` or on `bytes` (give `secrets` of the same type).

    Example:
        >>> s = StreamScrubber(["hunter22"])
        >>> s.feed("pass: hunt"), s.feed("er22 ok\\n"), s.close()
        ('pass: ', '*** ok\\n', '')
    """

    def __init__(self, secrets: Iterable[Any]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._redacted: Any = REDACTED
        self._pending: Any = None

    def feed(self, piece: Any) -> Any:
        if self._pending is None:
            self._pending = piece[:0]
            self._redacted = REDACTED.encode() if isinstance(piece, bytes) else REDACTED
        text = self._pending + piece
        for s in self._secrets:
            text = text.replace(s, self._redacted)
        hold = 0
        for s in self._secrets:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self._pending = text[len(text) - hold :] if hold else text[:0]
        return text[: len(text) - hold]

    def close(self) -> Any:
        rest, self._pending = self._pending, None
        if not rest:
            return rest if rest is not None else ""
        for s in self._secrets:
            rest = rest.replace(s, self._redacted)
        return rest
