"""`Tokenizer`: a Hugging Face `tokenizers` tokenizer with the facts the rest of Schooner needs.

A tokenizer is identified by its `fingerprint` (sha256 of its canonical JSON). The fingerprint follows the
tokenizer into every token cache and checkpoint, so a cache read with a different tokenizer is caught.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from ._byte_alphabet import byte_decoder
from ._fast import FastEncoder
from ._panics import is_panic, panic_error
from ._templates import CHAT_TEMPLATES, jinja_chat_template

logger = logging.getLogger("schooner.tokenize")
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"

# Names tried, in order, when a tokenizer does not say which tokens are bos/eos/pad.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|bos|>", "[BOS]", "<bos>", "<|endoftext|>")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<|eos|>", "[EOS]", "<eos>", "<|endoftext|>")
_PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]", "<|padding|>")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def canonical_json(tokenizer_json: str) -> str:
    """The tokenizer JSON with sorted keys and no whitespace, so equal tokenizers hash equal."""
    return json.dumps(json.loads(tokenizer_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(tokenizer_json: str) -> str:
    """sha256 (hex) of the canonical tokenizer JSON."""
    return hashlib.sha256(canonical_json(tokenizer_json).encode("utf-8")).hexdigest()


class Tokenizer:
    """A `tokenizers.Tokenizer` plus its special-token ids, fingerprint and per-token byte lengths.

    Example:
        >>> tok = load_tokenizer("path/to/tokenizer.json")  # doctest: +SKIP
        >>> ids = tok.encode("hello world")                  # doctest: +SKIP
        >>> tok.decode(ids)                                  # doctest: +SKIP
        'hello world'
    """

    def __init__(
        self,
        hf: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        source: str = "<memory>",
        encoder: str | None = None,
    ) -> None:
        self.hf = hf
        self._encoder_request = encoder
        self._fast: Any = None
        self._choice: Any = None
        # A second instance that reads special-token strings in text as plain text, so a document that
        # merely mentions "<|end_of_text|>" cannot inject an EOS (and split itself) in the cache.
        self._hf_plain = tokenizers.Tokenizer.from_str(hf.to_str())
        self._hf_plain.encode_special_tokens = True
        self.source = source
        """Where the tokenizer was loaded from (for error messages)."""
        self.chat_template = chat_template
        """Name of the chat template this tokenizer was trained for (see `schooner.tokenize.CHAT_TEMPLATES`)."""
        self._json = hf.to_str()
        self.fingerprint: str = fingerprint_of(self._json)
        """sha256 of the canonical tokenizer JSON; recorded in caches and checkpoints."""
        self.bos_token = self._pick("bos_token", bos_token, _BOS_NAMES)
        self.eos_token = self._pick("eos_token", eos_token, _EOS_NAMES)
        self.pad_token = self._pick("pad_token", pad_token, _PAD_NAMES)
        self._byte_lengths: np.ndarray | None = None

    def _pick(self, what: str, given: str | None, names: Sequence[str]) -> str | None:
        if given is not None:
            if self.hf.token_to_id(given) is None:
                raise ValueError(
                    f"tokenizer {self.source}: {what}={given!r} is not in its vocabulary; "
                    f"pass a token the tokenizer has (special tokens: {self.special_tokens[:12]})"
                )
            return given
        return next((n for n in names if self.hf.token_to_id(n) is not None), None)

    # -- facts ---------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of token ids, added (special) tokens included."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None if the tokenizer has none."""
        return None if self.bos_token is None else self.hf.token_to_id(self.bos_token)

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-sequence token (appended to every cached document), or None."""
        return None if self.eos_token is None else self.hf.token_to_id(self.eos_token)

    @property
    def pad_id(self) -> int | None:
        """Id of the padding token, or None."""
        return None if self.pad_token is None else self.hf.token_to_id(self.pad_token)

    @property
    def special_tokens(self) -> list[str]:
        """The added tokens marked special, in id order."""
        dec = self.hf.get_added_tokens_decoder()
        return [dec[i].content for i in sorted(dec) if dec[i].special]

    def token_to_id(self, token: str) -> int | None:
        """Id of `token`, or None when it is not in the vocabulary."""
        return self.hf.token_to_id(token)

    def to_json(self) -> str:
        """The tokenizer JSON (as `tokenizers` writes it)."""
        return self._json

    # -- encode / decode -----------------------------------------------------------------------------
    @property
    def encoder_choice(self) -> Any:
        """Which encoder `encode` / `encode_batch` use (`.encoder`: "tiktoken" or "hf") and why (`.reason`).

        The tiktoken fast path is taken only where it provably gives HF's ids (see `schooner.tokenize._fast`);
        force either with `encoder=` at load or `$SCHOONER_TOKENIZER_ENCODER` (`hf`, `tiktoken`, `auto`).
        """
        if self._choice is None:
            self._fast, self._choice = FastEncoder.for_tokenizer(
                self.hf, self._encoder_request, fingerprint=self.fingerprint
            )
            logger.info(
                "tokenizer %s: encoder %s (%s)", self.source, self._choice.encoder, self._choice.reason
            )
        return self._choice

    def encode(
        self, text: str, *, add_special_tokens: bool = False, parse_special: bool = False
    ) -> list[int]:
        """Token ids of `text`.

        Args:
            add_special_tokens: apply the tokenizer's post-processor (e.g. the BOS some tokenizers add).
            parse_special: read special-token strings in `text` (e.g. "<|user|>") as the special tokens;
                by default they are ordinary text, so untrusted documents cannot forge control tokens.
        """
        if not add_special_tokens and self.encoder_choice.encoder == "tiktoken":
            return self._fast.encode(text, parse_special=parse_special)
        hf = self.hf if parse_special else self._hf_plain
        try:
            return hf.encode(text, add_special_tokens=add_special_tokens).ids
        except BaseException as e:  # a Rust panic is a BaseException
            if not is_panic(e):
                raise
            raise panic_error(self.source, hf.encode, [text], e) from None

    def encode_batch(
        self, texts: Sequence[str], *, add_special_tokens: bool = False, parse_special: bool = False
    ) -> list[list[int]]:
        """Token ids of each text (parallel inside `tokenizers`); arguments as for `encode`."""
        if not add_special_tokens and self.encoder_choice.encoder == "tiktoken":
            return self._fast.encode_batch(texts, parse_special=parse_special)
        hf = self.hf if parse_special else self._hf_plain
        try:
            return [e.ids for e in hf.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)]
        except BaseException as e:  # a Rust panic is a BaseException
            if not is_panic(e):
                raise
            raise panic_error(self.source, hf.encode, texts, e) from None

    def _encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode_batch(texts)` as integer arrays (uint32 on the fast path: no Python int per token)."""
        if self.encoder_choice.encoder == "tiktoken":
            return self._fast.encode_arrays(texts)
        return [np.array(ids, dtype=np.int64) for ids in self.encode_batch(texts)]

    def _with_encoder(self, encoder: str | None) -> Tokenizer:
        """This tokenizer with another encoder request (sharing everything else; this one is unchanged)."""
        other = object.__new__(Tokenizer)
        other.__dict__.update(self.__dict__)
        other._encoder_request, other._fast, other._choice = encoder, None, None
        return other

    def _use_checked_fast_path(self) -> None:
        """Take the fast path without re-running its checks: only for a tokenizer whose fingerprint a build
        has checked (`_encode` does, for the file a build wrote and its workers load)."""
        self._fast, self._choice = FastEncoder.for_tokenizer(
            self.hf, "tiktoken", fingerprint=self.fingerprint, checked=True
        )

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """The text of `ids`."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each token id stands for (int32, length `vocab_size`); 0 for special tokens.

        Summing these over the targets of a text gives its byte count, the denominator of bits-per-byte.
        Byte-level BPE tokens are mapped through the byte alphabet; SentencePiece-style `<0xNN>` byte
        fallback tokens count 1 and `▁` counts as a space.

        Exact only where the tokens spell the text: byte-level BPE without a normalizer (or with NFC on
        NFC text). A SentencePiece-style tokenizer that prepends `▁` (Llama 2, T5) counts one byte more
        per encoded text than it has; normalizers that change the text (NFKC, lowercasing of some
        letters) count the normalized bytes; WordPiece counts its `##` prefixes and none of the spaces
        between words, so its sums are not byte counts at all.
        """
        if self._byte_lengths is None:
            self._byte_lengths = self._compute_byte_lengths()
        return self._byte_lengths.copy()

    def _compute_byte_lengths(self) -> np.ndarray:
        spec = json.loads(self._json)
        byte_level = _uses(spec.get("decoder"), "ByteLevel") or _uses(spec.get("pre_tokenizer"), "ByteLevel")
        alphabet = byte_decoder() if byte_level else {}
        special = {t.content for t in self.hf.get_added_tokens_decoder().values() if t.special}
        out = np.zeros(self.vocab_size, dtype=np.int32)
        for i in range(self.vocab_size):
            tok = self.hf.id_to_token(i)
            if tok is None or tok in special:
                continue
            if byte_level and all(c in alphabet for c in tok):
                out[i] = len(tok)
            elif _BYTE_FALLBACK.match(tok):
                out[i] = 1
            elif "▁" in tok:
                out[i] = len(tok.replace("▁", " ").encode("utf-8"))
            else:
                out[i] = len(self.hf.decode([i], skip_special_tokens=False).encode("utf-8"))
        return out

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike[str]) -> str:
        """Write `tokenizer.json` and `tokenizer_config.json` (HF layout) into `folder` (a local path or an
        fsspec URL), each atomically; return the folder. A tokenizer trained for a chat template gets its
        Jinja `chat_template` too (`jinja_chat_template`), so `transformers` renders chats as Schooner does."""
        from schooner.cluster import storage

        folder = os.fspath(folder)
        storage.write_bytes(storage.join(folder, TOKENIZER_FILE), self._json)
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "schooner_fingerprint": self.fingerprint,
        }
        if self.chat_template is not None:
            template = CHAT_TEMPLATES.get(self.chat_template)
            if template is None:
                cfg["schooner_chat_template"] = self.chat_template
            elif all(self.token_to_id(t) is not None for t in template.required_tokens):
                cfg["schooner_chat_template"] = self.chat_template
                cfg["chat_template"] = jinja_chat_template(template)  # for transformers' apply_chat_template
        storage.write_json(storage.join(folder, CONFIG_FILE), cfg, indent=2, sort_keys=False)
        return folder

    def __repr__(self) -> str:
        return (
            f"Tokenizer(source={self.source!r}, vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
            f"eos={self.eos_token!r}, pad={self.pad_token!r}, fingerprint={self.fingerprint[:12]})"
        )

    def __reduce__(self):  # pickled by JSON: `tokenizers.Tokenizer` pickles, but this keeps it explicit
        return (
            _from_json,
            (
                self._json, self.bos_token, self.eos_token, self.pad_token, self.chat_template, self.source,
                self._encoder_request,
            ),
        )  # fmt: skip


def _from_json(
    js: str,
    bos: str | None,
    eos: str | None,
    pad: str | None,
    chat: str | None,
    source: str,
    encoder: str | None = None,
) -> Tokenizer:
    return Tokenizer(
        tokenizers.Tokenizer.from_str(js),
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        chat_template=chat,
        source=source,
        encoder=encoder,
    )


def _special_from(hf: tokenizers.Tokenizer, cfg: dict, given: dict[str, str | None]) -> dict[str, str | None]:
    """bos/eos/pad: the arguments, else the folder's tokenizer_config.json, whose tokens must exist (an
    error names that file: the fix is there, not in an argument the user never passed)."""
    out = {}
    for key, value in given.items():
        if value is None and cfg.get(key) is not None:
            value = cfg[key]
            if hf.token_to_id(value) is None:
                raise ValueError(
                    f"{cfg['config_path']}: {key}={value!r} is not in the tokenizer's vocabulary (a config from "
                    f"another tokenizer?); fix the file, or pass {key}='...' to load_tokenizer naming one of its "
                    "tokens"
                )
        out[key] = value
    return out


def _uses(component: dict | None, type_name: str) -> bool:
    """Whether a tokenizers component (possibly a Sequence of them) includes `type_name`."""
    if not component:
        return False
    if component.get("type") == type_name:
        return True
    return any(
        _uses(c, type_name) for c in component.get("pretokenizers", component.get("decoders", [])) or []
    )


def _read_config(folder: Path | str) -> dict:
    cfg_path = f"{folder}/{CONFIG_FILE}"
    if isinstance(folder, Path):
        if not (folder / CONFIG_FILE).is_file():
            return {}
        text = (folder / CONFIG_FILE).read_text(encoding="utf-8")
    else:  # a URL: through the storage layer
        from schooner.cluster import storage

        if not storage.exists(cfg_path):
            return {}
        text = storage.read_text(cfg_path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e}); fix or delete the file") from e
    out = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        v = cfg.get(key)
        if isinstance(v, dict):  # HF AddedToken serialisation
            v = v.get("content")
        if isinstance(v, str):
            out[key] = v
        elif v is not None:
            raise ValueError(
                f"{cfg_path}: {key}={cfg.get(key)!r} is not a token string (nor {{'content': ...}}); fix the file, "
                f"or pass {key}='...' to load_tokenizer"
            )
    out["config_path"] = cfg_path
    if isinstance(cfg.get("schooner_chat_template"), str):
        out["chat_template"] = cfg["schooner_chat_template"]
    return out


def load_tokenizer(
    path_or_hub_id: str | os.PathLike[str],
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
    encoder: str | None = None,
) -> Tokenizer:
    """Load a tokenizer from a `tokenizer.json` file, a folder holding one, or a Hugging Face Hub id.

    A folder's `tokenizer_config.json` (HF layout) names the bos/eos/pad tokens; explicit arguments win.
    A hub id (`org/name`, used only when no such local path exists) is fetched with
    `huggingface_hub.hf_hub_download` (honouring `HF_HUB_OFFLINE`, `HF_HUB_CACHE` and `cache_dir`), so a
    pre-populated hub cache works without network.

    Args:
        path_or_hub_id: a file, a folder, or a hub repository id such as `"meta-llama/Llama-3.1-8B"`.
        revision: hub branch, tag or commit (hub ids only).
        cache_dir: hub cache folder (hub ids only; default: the huggingface_hub default).
        bos_token / eos_token / pad_token: override the special tokens.
        encoder: "auto" (default; also `$SCHOONER_TOKENIZER_ENCODER`): tiktoken where it provably gives
            HF's ids, else HF `tokenizers`; "hf" or "tiktoken" force one (see `Tokenizer.encoder_choice`).

    Raises:
        FileNotFoundError: the path does not exist and is not a hub id, or the folder has no tokenizer.json.
        ValueError: the file is not a tokenizers JSON.
    """
    raw = os.fspath(path_or_hub_id)
    if "://" in raw and not raw.startswith("file://"):
        tok = _from_url(raw, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token)
        tok._encoder_request = encoder
        return tok
    path = Path(raw.removeprefix("file://")).expanduser()
    if path.is_dir():
        cfg = _read_config(path)
        path = path / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path.parent}: no {TOKENIZER_FILE} in this folder; point at a folder written by "
                "Tokenizer.save / a Hugging Face model folder, or at the tokenizer JSON file itself"
            )
    elif path.is_file():
        cfg = _read_config(path.parent)
    elif _HUB_ID.match(raw) and not raw.startswith((".", "/", "~")):
        path, cfg = _from_hub(raw, revision=revision, cache_dir=cache_dir)
    else:
        raise FileNotFoundError(
            f"tokenizer {raw!r}: no such file or folder, and not a hub id of the form 'org/name'"
        )
    try:
        hf = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with a serde message
        raise ValueError(f"{path}: not a Hugging Face tokenizers JSON file ({e})") from e
    special = _special_from(hf, cfg, {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token})
    return Tokenizer(hf, **special, chat_template=cfg.get("chat_template"), source=raw, encoder=encoder)


def _from_url(url: str, **special: str | None) -> Tokenizer:
    """A tokenizer file or folder on an object store (`gs://`, `s3://`, ...), read through the storage layer."""
    from schooner.cluster import storage

    folder_file = f"{url.rstrip('/')}/{TOKENIZER_FILE}"
    if storage.exists(folder_file):
        file, cfg = folder_file, _read_config(url.rstrip("/"))
    elif storage.exists(url) and not storage.isdir(url):
        file, cfg = url, _read_config(url.rsplit("/", 1)[0])
    else:
        raise FileNotFoundError(f"tokenizer {url!r}: no such file, and no {TOKENIZER_FILE} in such a folder")
    try:
        hf = tokenizers.Tokenizer.from_str(storage.read_text(file))
    except Exception as e:  # tokenizers raises a bare Exception with a serde message
        raise ValueError(f"{file}: not a Hugging Face tokenizers JSON file ({e})") from e
    return Tokenizer(
        hf, **_special_from(hf, cfg, special), chat_template=cfg.get("chat_template"), source=url
    )


def _from_hub(repo_id: str, *, revision: str | None, cache_dir: str | None) -> tuple[Path, dict]:
    """Fetch tokenizer.json (and tokenizer_config.json when the repo has one) from the hub or its cache."""
    import huggingface_hub  # lazy: only hub ids need it
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        tok_path = huggingface_hub.hf_hub_download(
            repo_id, TOKENIZER_FILE, revision=revision, cache_dir=cache_dir
        )
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"tokenizer {repo_id!r}: not in the local hub cache and the hub is unreachable or offline "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')!r}); download it where there is network "
            "or pass a local path"
        ) from e
    except EntryNotFoundError as e:
        raise FileNotFoundError(f"hub repo {repo_id!r} has no {TOKENIZER_FILE}") from e
    cfg: dict = {}
    try:
        cfg_path = huggingface_hub.hf_hub_download(
            repo_id, CONFIG_FILE, revision=revision, cache_dir=cache_dir
        )
        cfg = _read_config(Path(cfg_path).parent)
    except (EntryNotFoundError, LocalEntryNotFoundError):
        pass  # tokenizer_config.json is optional; the special tokens are then guessed by name
    return Path(tok_path), cfg
