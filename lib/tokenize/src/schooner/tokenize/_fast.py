"""A tiktoken-backed encoder for byte-level BPE tokenizers, used only where it is provably HF's tokenizer.

HF `tokenizers` and tiktoken run the same algorithm on byte-level BPE: split the text with a regex, then
merge adjacent byte sequences, lowest rank first. tiktoken does it several times faster. `analyse` reads
a `tokenizer.json` and accepts it only when each step is the same in both:

- the normalizer is none or NFC (applied with HF's own normalizer, per stretch between added tokens, as
  HF does); the pre-tokenizer is ByteLevel with GPT-2's regex, or a Split with GPT-2's, Llama 3's or
  Qwen 2's regex (`PATTERNS`, compared character for character, all covering every character) followed
  by ByteLevel without its regex; never a prefix space;
- the model is BPE without dropout, byte fallback, unknown-token fusion, subword prefixes or suffixes; all
  256 bytes are tokens and every vocabulary string is in the byte alphabet;
- merges are consistent with ranks: each merge's result has an id no lower than any earlier merge's
  (so "lowest merge index first" and "lowest rank first" pick the same pair), and where two merges make
  the same token and can overlap (`x+y == y+z`), HF's order prefers the left one, as tiktoken does, or HF
  never reaches `[x, y, z]` (its states on `x+y+z` alone are enumerated);
- every vocabulary token encodes to itself through HF's merges (tiktoken returns a piece that is a token
  as that token without merging);
- tiktoken merges any two adjacent tokens whose concatenation is a token, HF only listed merges: either
  every such split is a merge (tokenizers converted from tiktoken, like Llama 3's and Qwen's), or every
  merge makes a token ranked after both its parts (BPE-trained, like Schooner's); then HF merges in
  non-decreasing rank, a token's bytes (as long as nothing outside merges with them) pass through the same
  states as when encoded alone, which end in the token by its one listed merge, so two tokens forming
  another without being its merge are never adjacent in HF's state, and tiktoken never sees them either;
- added tokens have no lstrip / rstrip / single_word (and are not normalized when there is a
  normalizer); they are matched here leftmost-longest, as HF's matcher does, special ones only with
  `parse_special` (HF's `encode_special_tokens`), and never given to tiktoken.

Anything else, or `SCHOONER_TOKENIZER_ENCODER=hf`, keeps HF `tokenizers`; the choice and its reason are
logged and recorded in each cache's manifest.

The checks are a pure function of the tokenizer JSON, so their verdict is kept per fingerprint for the
life of the process (`for_tokenizer(..., fingerprint=)`), and a process that loaded a file whose
fingerprint a build has already checked skips them (`checked=True`: for a Llama-3-sized vocabulary they
take seconds, in every worker).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger("schooner.tokenize")

ENV = "SCHOONER_TOKENIZER_ENCODER"
"""Environment variable forcing the encoder: `hf`, `tiktoken` (an error where it does not apply) or `auto`."""
ENCODERS = ("auto", "hf", "tiktoken")

_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)
_QWEN2 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)
PATTERNS: dict[str, str] = {"gpt2": _GPT2, "llama3": _LLAMA3, "qwen2": _QWEN2}
"""Pre-tokenizer regexes the fast path accepts (each matches every character, so no text falls between
matches)."""

# tiktoken's `encode_to_tiktoken_buffer` (ids as one uint32 buffer, no Python int per token) runs its
# `encode`, which first looks for special tokens: with none it would search an empty pattern at every
# position. One special token that is never allowed makes that a single search; text containing it is
# still encoded as ordinary text, exactly as `encode_ordinary` does.
_SENTINEL = "\x00<|schooner: no special tokens here|>\x00"
_NO_SPECIAL: frozenset[str] = frozenset()
_EMPTY_IDS = np.zeros(0, np.uint32)
_VERDICTS: dict[str, Any] = {}  # fingerprint -> its FastEncoder, or the FastPathRefused saying why not
_MAX_VERDICTS = 8


class FastPathRefused(ValueError):
    """The tokenizer is not one the fast path provably reproduces (the message says why)."""


@dataclass(frozen=True)
class EncoderChoice:
    """Which encoder a tokenizer uses, and why."""

    encoder: str
    """`"tiktoken"` or `"hf"`."""
    reason: str
    """Why (the layout accepted, or the first check that failed, or the user's choice)."""

    def to_dict(self) -> dict[str, str]:
        return {"encoder": self.encoder, "reason": self.reason}


def _byte_decoder() -> dict[str, int]:
    from ._tokenizer import _bytes_to_unicode

    return _bytes_to_unicode()


def _pattern(spec: dict) -> str:
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise FastPathRefused("ByteLevel pre-tokenizer with add_prefix_space or without its regex")
        return "gpt2"
    parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not parts or len(parts) != 2 or parts[0].get("type") != "Split" or parts[1].get("type") != "ByteLevel":
        raise FastPathRefused(f"pre-tokenizer {json.dumps(pre)[:120]} is not ByteLevel or Split + ByteLevel")
    split, byte_level = parts
    if byte_level.get("add_prefix_space") or byte_level.get("use_regex", True):
        raise FastPathRefused("the ByteLevel after the Split adds a prefix space or splits again")
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("behavior") != "Isolated" or split.get("invert") or regex is None:
        raise FastPathRefused(
            f"Split pre-tokenizer {json.dumps(split)[:120]} is not an isolating regex split"
        )
    name = next((n for n, p in PATTERNS.items() if p == regex), None)
    if name is None:
        raise FastPathRefused(
            f"Split regex {regex[:80]!r} is not one of the known patterns {sorted(PATTERNS)}"
        )
    return name


def _check_model(model: dict) -> None:
    if model.get("type") != "BPE":
        raise FastPathRefused(f"model type {model.get('type')!r} is not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise FastPathRefused(f"BPE {key}={model[key]!r}")
    if model.get("byte_fallback"):
        raise FastPathRefused("BPE byte_fallback (SentencePiece style)")


def _added(spec: dict, normalizer: bool) -> list[dict]:
    added = spec.get("added_tokens") or []
    for t in added:
        flags = [f for f in ("lstrip", "rstrip", "single_word") if t.get(f)]
        if normalizer and t.get("normalized"):
            flags.append("normalized")
        if flags:
            raise FastPathRefused(f"added token {t['content']!r} has {flags}")
    return added


def _ranks(model: dict, added: list[dict]) -> tuple[dict[bytes, int], list[tuple[str, str]]]:
    alphabet = _byte_decoder()
    added_contents = {t["content"] for t in added}
    ranks: dict[bytes, int] = {}
    for s, i in model["vocab"].items():
        if s in added_contents:
            continue
        try:
            ranks[bytes(alphabet[c] for c in s)] = int(i)
        except KeyError:
            raise FastPathRefused(f"vocabulary entry {s!r} is not in the byte-level alphabet") from None
    if len(ranks) != len(set(ranks.values())):
        raise FastPathRefused("two vocabulary entries share an id")
    if sum(1 for b in ranks if len(b) == 1) != 256:
        raise FastPathRefused("not every one of the 256 bytes is a token")
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    return ranks, merges  # type: ignore[return-value]


def _check_merges(model: dict, merges: list[tuple[str, str]], added: list[dict]) -> None:
    vocab = model["vocab"]
    added_contents = {t["content"] for t in added}
    last = -1
    index: dict[tuple[str, str], int] = {}
    by_result: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for i, (a, b) in enumerate(merges):
        r = vocab.get(a + b)
        if r is None or a + b in added_contents:
            raise FastPathRefused(
                f"merge {i} ({a!r}, {b!r}) makes {a + b!r}, not an ordinary vocabulary token"
            )
        if r < last:
            raise FastPathRefused(
                f"merges are not in rank order: merge {i} ({a!r}, {b!r}) makes id {r} after a merge made id {last}"
            )
        last = r
        index[(a, b)] = i
        by_result[a + b].append((a, b))
    for t, pairs in by_result.items():
        if len(pairs) < 2:
            continue
        for x, y in pairs:  # [x, y, z] with x+y == y+z == t: tiktoken merges the left pair first
            z = t[len(y) :]
            prefers_right = (
                t.startswith(y) and (y, z) in index and (y, z) != (x, y) and index[(y, z)] < index[(x, y)]
            )
            if prefers_right and (x, y, z) in _hf_states(x + y + z, index):
                raise FastPathRefused(
                    f"merges ({x!r}, {y!r}) and ({y!r}, {z!r}) both make {t!r}, HF prefers the right one and "
                    f"reaches [{x!r}, {y!r}, {z!r}] encoding {x + y + z!r}, where tiktoken merges the left one"
                )


def _hf_states(word: str, index: dict[tuple[str, str], int]) -> set[tuple[str, ...]]:
    """Every state HF's BPE passes through encoding `word` alone (lowest merge index first, then leftmost).
    Symbols covering exactly `word` can only be adjacent somewhere in a longer text in one of these states:
    until something outside merges with its ends, its bytes evolve as they do alone."""
    symbols = list(word)
    seen = {tuple(symbols)}
    while len(symbols) > 1:
        best = min(
            ((index[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in index), default=None
        )
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        seen.add(tuple(symbols))
    return seen


def _merge_closed(model: dict, merges: list[tuple[str, str]], added: list[dict]) -> bool:
    """Whether every split of a token into two tokens is a merge (as in tokenizers converted from tiktoken:
    then both libraries may merge exactly the same pairs)."""
    vocab, pairs = model["vocab"], set(merges)
    added_contents = {t["content"] for t in added}
    for s in vocab:
        if s in added_contents:
            continue
        for k in range(1, len(s)):
            if s[:k] in vocab and s[k:] in vocab and (s[:k], s[k:]) not in pairs:
                return False
    return True


def _check_merges_build_up(model: dict, merges: list[tuple[str, str]]) -> None:
    """Each merge makes a token ranked after both its parts (as BPE training does): HF then merges in
    non-decreasing rank, and two tokens whose concatenation is a token but not a merge of them are never
    adjacent in HF's state (that concatenation, encoded alone, passes through only its own merge)."""
    vocab = model["vocab"]
    for i, (a, b) in enumerate(merges):
        if not vocab[a + b] > max(vocab[a], vocab[b]):
            raise FastPathRefused(
                f"merge {i} ({a!r}, {b!r}) makes id {vocab[a + b]} from ids {vocab[a]}, {vocab[b]}, and not every "
                "split of a token is a merge, so tiktoken could merge a pair HF does not"
            )


def _check_tokens_encode_to_themselves(spec: dict, added: list[dict]) -> None:
    """Every token, encoded alone by HF's merges (never by whole-word lookup), is itself."""
    import tokenizers

    model = spec["model"]
    hf = tokenizers.Tokenizer.from_str(json.dumps({**spec, "model": {**model, "ignore_merges": False}}))
    added_contents = {t["content"] for t in added}
    for s, i in model["vocab"].items():
        if len(s) > 1 and s not in added_contents:
            got = [t.id for t in hf.model.tokenize(s)]
            if got != [i]:
                raise FastPathRefused(f"token {s!r} ({i}) encodes to {got} by its merges, not to itself")


def analyse(hf: Any, *, checks: bool = True) -> tuple[dict, str]:
    """(tiktoken construction arguments, layout name) for a `tokenizers.Tokenizer`, or raise
    `FastPathRefused` naming the first thing that differs (see the module docstring).

    `checks=False` skips the checks of merges and tokens (the costly part), for a tokenizer whose exact
    JSON (same fingerprint) has passed them already; its structure is still read and checked."""
    spec = json.loads(hf.to_str())
    norm = spec.get("normalizer")
    if norm is not None and norm.get("type") != "NFC":
        raise FastPathRefused(f"normalizer {norm.get('type')!r} (only none or NFC are reproduced)")
    layout = _pattern(spec)
    model = spec.get("model") or {}
    _check_model(model)
    added = _added(spec, norm is not None)
    ranks, merges = _ranks(model, added)
    if checks:
        _check_merges(model, merges, added)
        if not _merge_closed(model, merges, added):
            _check_merges_build_up(model, merges)
        _check_tokens_encode_to_themselves(spec, added)
    if norm is not None:
        layout += "+nfc"
    return {"pat_str": PATTERNS[layout.split("+")[0]], "mergeable_ranks": ranks, "added": added}, layout


class FastEncoder:
    """tiktoken with HF's added-token handling and normalizer; build with `FastEncoder.for_tokenizer`."""

    def __init__(self, hf: Any, args: dict, layout: str) -> None:
        import tiktoken

        self.layout = layout
        ranks = args["mergeable_ranks"]
        self._core = tiktoken.Encoding(
            f"schooner-{layout}",
            pat_str=args["pat_str"],
            mergeable_ranks=ranks,
            special_tokens={_SENTINEL: max(ranks.values()) + 1},  # never allowed, never emitted
        )._core_bpe
        self._normalize = hf.normalizer.normalize_str if "+nfc" in layout else None
        added = sorted(args["added"], key=lambda t: -len(t["content"]))  # leftmost-longest, as HF matches
        self._added = {t["content"]: (int(t["id"]), bool(t.get("special"))) for t in added}
        self._regex = re.compile("|".join(re.escape(t["content"]) for t in added)) if added else None
        self._plain_split = any(not special for _, special in self._added.values())

    @classmethod
    def for_tokenizer(
        cls, hf: Any, force: str | None = None, *, fingerprint: str | None = None, checked: bool = False
    ) -> tuple[FastEncoder | None, EncoderChoice]:
        """The fast encoder for `hf` (or None) and the choice made; `force` (else `$SCHOONER_TOKENIZER_ENCODER`,
        else "auto") may demand "hf" or "tiktoken" (an error where the fast path does not apply).

        With `fingerprint` (of `hf`'s JSON) the verdict is kept for this process and reused (the encoder is
        immutable and safe to share between threads). `checked=True` says that a tokenizer with this exact
        JSON passed the checks already (in the process that planned a cache build), so they are skipped.
        """
        force = force or os.environ.get(ENV) or "auto"
        if force not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {force!r} (argument or ${ENV})")
        if force == "hf":
            return None, EncoderChoice("hf", "forced")
        verdict = _VERDICTS.get(fingerprint) if fingerprint is not None else None
        if verdict is None:
            try:
                args, layout = analyse(hf, checks=not checked)
                verdict = cls(hf, args, layout)
            except FastPathRefused as e:
                verdict = e
            if fingerprint is not None:
                if len(_VERDICTS) >= _MAX_VERDICTS:
                    _VERDICTS.pop(next(iter(_VERDICTS)))
                _VERDICTS[fingerprint] = verdict
        if isinstance(verdict, FastPathRefused):
            if force == "tiktoken":
                raise FastPathRefused(
                    f"encoder='tiktoken' was forced but this tokenizer is not supported: {verdict}"
                ) from verdict
            return None, EncoderChoice("hf", f"fast path refused: {verdict}")
        return verdict, EncoderChoice("tiktoken", f"byte-level BPE, {verdict.layout} layout, checked")

    def _ordinary(self, text: str) -> list[int]:
        if not text:
            return []
        try:
            if self._normalize is not None and not text.isascii():
                text = self._normalize(text)
            return self._core.encode_ordinary(text)
        except UnicodeEncodeError:
            raise TypeError("TextInputSequence must be str") from None  # what HF raises for lone surrogates

    def _ordinary_array(self, text: str) -> np.ndarray:
        """`_ordinary` as a uint32 array, straight from tiktoken's buffer."""
        if not text:
            return _EMPTY_IDS
        try:
            if self._normalize is not None and not text.isascii():
                text = self._normalize(text)
            return np.frombuffer(self._core.encode_to_tiktoken_buffer(text, _NO_SPECIAL), dtype=np.uint32)
        except UnicodeEncodeError:
            raise TypeError("TextInputSequence must be str") from None

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Ids of `text` (no post-processor), identical to HF's `encode(text, add_special_tokens=False)`
        with `encode_special_tokens = not parse_special`."""
        if self._regex is None or not (parse_special or self._plain_split):
            return self._ordinary(text)
        out: list[int] = []
        pos = 0
        for m in self._regex.finditer(text):
            tid, special = self._added[m.group()]
            if special and not parse_special:
                continue  # HF's matcher consumed it, and left it in the surrounding text
            out += self._ordinary(text[pos : m.start()])
            out.append(tid)
            pos = m.end()
        out += self._ordinary(text[pos:])
        return out

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` of each text (`parse_special=False`) as a uint32 array: no Python object per token."""
        plain = self._regex is None or not self._plain_split
        try:
            if plain:
                return [self._ordinary_array(t) for t in texts]
            return [np.array(self.encode(t), dtype=np.uint32) for t in texts]
        except TypeError:  # a lone surrogate: as `encode_batch` words it
            raise TypeError(
                "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"
            ) from None

    def encode_batch(self, texts: Sequence[str], *, parse_special: bool = False) -> list[list[int]]:
        """`encode` of each text (on this thread: parallelism comes from the caller's processes)."""
        try:
            return [self.encode(t, parse_special=parse_special) for t in texts]
        except TypeError:  # a lone surrogate: HF's batch call words it so
            raise TypeError(
                "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"
            ) from None
