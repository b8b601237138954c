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
- added tokens are split off as HF does, in two passes: the non-normalized ones on the raw text, then the
  normalized ones (their content normalized) on each normalized stretch between, leftmost-longest each
  time; special ones only with `parse_special` (HF's `encode_special_tokens`: a special match skipped
  still consumes its text in that pass); lstrip / rstrip widen a match over Unicode White_Space (the
  `\\s` of HF's Rust regex); what is left between goes to tiktoken. Refused: single_word (HF's word
  characters come from its Rust regex crate's Unicode tables, which no Python table here matches exactly),
  two added tokens matching the same text in one pass, and an added token the model's vocabulary also
  has where the BPE model has `ignore_merges` (HF would find it by whole-word lookup; tiktoken never sees
  added tokens). At load (unless the fingerprint was checked already) `probe_added_tokens` compares both
  libraries on each added token alone, doubled, inside words, between spaces, next to the others, cut,
  and in NFD.

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
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._byte_alphabet import byte_decoder
from ._panics import first_panicking, is_panic

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


def _added(spec: dict) -> list[dict]:
    added = [t for t in spec.get("added_tokens") or [] if t.get("content")]  # HF ignores empty ones
    for t in added:
        if t.get("single_word"):
            raise FastPathRefused(
                f"added token {t['content']!r} has single_word (HF's word characters are its regex crate's "
                "Unicode tables, not reproduced here)"
            )
    model = spec.get("model") or {}
    if model.get("ignore_merges"):
        vocab = model.get("vocab") or {}
        for t in added:
            if len(t["content"]) > 1 and t["content"] in vocab:
                raise FastPathRefused(
                    f"added token {t['content']!r} is also in the model's vocabulary and the BPE model has "
                    "ignore_merges (HF finds it by whole-word lookup where it is not split off)"
                )
    return added


def _ranks(model: dict, added: list[dict]) -> tuple[dict[bytes, int], list[tuple[str, str]]]:
    alphabet = byte_decoder()
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
    added = _added(spec)
    ranks, merges = _ranks(model, added)
    if checks:
        _check_merges(model, merges, added)
        if not _merge_closed(model, merges, added):
            _check_merges_build_up(model, merges)
        _check_tokens_encode_to_themselves(spec, added)
    if norm is not None:
        layout += "+nfc"
    return {"pat_str": PATTERNS[layout.split("+")[0]], "mergeable_ranks": ranks, "added": added}, layout


# Rust regex's `\s` (HF's lstrip / rstrip): Unicode White_Space, 25 characters (not Python's `str.isspace`,
# which adds \x1c-\x1f).
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True)
class _AddedToken:
    pattern: str
    """The text it matches: its content, normalized for a normalized token where there is a normalizer."""
    id: int
    special: bool
    lstrip: bool
    rstrip: bool


class _AddedPass:
    """One of HF's two added-token passes (`AddedVocabulary::find_matches` over one trie): non-overlapping
    leftmost-longest matches (an alternation longest first, tried at each position from the left, finds
    the same), a special token skipped unless `parse_special` (its text still consumed by the match),
    lstrip / rstrip widening a match over white space."""

    def __init__(self, tokens: list[_AddedToken], which: str) -> None:
        self.tokens: dict[str, _AddedToken] = {}
        for t in tokens:
            other = self.tokens.setdefault(t.pattern, t)
            if other.id != t.id:
                raise FastPathRefused(
                    f"added tokens {other.id} and {t.id} both match {t.pattern!r} in the {which} pass"
                )
        ordered = sorted(self.tokens, key=len, reverse=True)
        self.regex = re.compile("|".join(re.escape(p) for p in ordered))
        self.plain = any(not t.special for t in self.tokens.values())
        """Whether it can match with `parse_special=False`."""

    def split(self, text: str, parse_special: bool) -> list[tuple[int | None, int, int]]:
        """(added token id or None, start, stop) covering `text`, as HF's `find_matches`."""
        splits: list[tuple[int | None, int, int]] = []
        offset = 0
        for m in self.regex.finditer(text):
            t = self.tokens[m.group()]
            if t.special and not parse_special:
                continue
            start, stop = m.span()
            if t.lstrip:
                while start > 0 and text[start - 1] in _WHITE_SPACE:
                    start -= 1
                start = max(start, offset)  # spaces an earlier match took stay with it
            if t.rstrip:
                while stop < len(text) and text[stop] in _WHITE_SPACE:
                    stop += 1
            if offset < start:
                splits.append((None, offset, start))
            splits.append((t.id, start, stop))
            offset = stop
        if offset != len(text):
            splits.append((None, offset, len(text)))
        return splits


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
        raw: list[_AddedToken] = []
        normalized: list[_AddedToken] = []
        for t in args["added"]:
            content, is_normalized = t["content"], bool(t.get("normalized", True))
            if is_normalized and self._normalize is not None:
                content = self._normalize(content)
            token = _AddedToken(content, int(t["id"]), bool(t.get("special")), bool(t.get("lstrip")),
                                bool(t.get("rstrip")))  # fmt: skip
            (normalized if is_normalized else raw).append(token)
        self._raw = _AddedPass(raw, "raw-text") if raw else None
        self._normalized = _AddedPass(normalized, "normalized-text") if normalized else None
        # Whether text with special tokens read as text can contain an added token: if not, it is one
        # stretch of ordinary text (the common case, and the one `encode_arrays` keeps free of Python ints).
        self._plain_split = any(p is not None and p.plain for p in (self._raw, self._normalized))

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
                if not checked:
                    probe_added_tokens(hf, verdict)
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

    def _ordinary(self, text: str, *, normalized: bool = False) -> list[int]:
        """Ids of a stretch with no added token in it (`normalized`: the normalizer has been applied)."""
        if not text:
            return []
        try:
            if not normalized and self._normalize is not None and not text.isascii():
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
        with `encode_special_tokens = not parse_special`: HF's `extract_and_normalize`, then tiktoken on
        what lies between the added tokens."""
        if not (parse_special or self._plain_split):
            return self._ordinary(text)
        raw, norm = self._raw, self._normalized
        out: list[int] = []
        stretches = raw.split(text, parse_special) if raw is not None else [(None, 0, len(text))]
        for tid, start, stop in stretches:
            if tid is not None:
                out.append(tid)
                continue
            piece = text[start:stop]
            if norm is None:
                out += self._ordinary(piece)
                continue
            if self._normalize is not None and not piece.isascii():
                try:
                    piece = self._normalize(piece)
                except UnicodeEncodeError:
                    raise TypeError("TextInputSequence must be str") from None
            for tid2, start2, stop2 in norm.split(piece, parse_special):
                if tid2 is not None:
                    out.append(tid2)
                else:
                    out += self._ordinary(piece[start2:stop2], normalized=True)
        return out

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` of each text (`parse_special=False`) as a uint32 array: no Python object per token."""
        try:
            if not self._plain_split:
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


_PROBE_LIMIT = 4096
"""At most this many added tokens are probed (each with a dozen strings, both ways), so a tokenizer with a
huge added vocabulary does not spend minutes at load; the rest are covered by the same code path."""


def _probe_texts(contents: list[str]) -> list[str]:
    out: list[str] = []
    for i, c in enumerate(contents[:_PROBE_LIMIT]):
        other = contents[(i + 1) % len(contents)]
        out += [c, c + c, f"a{c}b", f" {c} ", f"  {c}\n\n x", f"word{c}word", f"1{c}_", c + other, other + c]
        out += [
            c + " " + other,
            c[1:] + other,
            c + other[:-1],
            c[:-1],
            c[1:],
            unicodedata.normalize("NFD", f"é{c}Å"),
        ]
    return out


def probe_added_tokens(hf: Any, encoder: FastEncoder) -> None:
    """Compare `encoder` with HF itself on strings around every added token (alone, doubled, inside words,
    between spaces and newlines, next to the following one, cut, in NFD), special tokens both read and
    not; raise `FastPathRefused` naming the first string on which they differ."""
    import tokenizers

    contents = [t.content for _, t in sorted(hf.get_added_tokens_decoder().items()) if t.content]
    if not contents:
        return
    texts = _probe_texts(contents)
    reference = tokenizers.Tokenizer.from_str(hf.to_str())
    for parse_special in (False, True):
        reference.encode_special_tokens = not parse_special
        try:
            expected = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
        except BaseException as e:  # a Rust panic is a BaseException: the tokenizer must still load
            if not is_panic(e):
                raise
            bad = first_panicking(reference.encode, texts)
            raise FastPathRefused(
                f"HF tokenizers panics on added-token probe {bad!r} (parse_special={parse_special}: {e}), so "
                "the fast path cannot be checked against it"
            ) from None
        for text, want in zip(texts, expected):
            got = encoder.encode(text, parse_special=parse_special)
            if got != want:
                raise FastPathRefused(
                    f"added-token probe {text!r} (parse_special={parse_special}) gives {got[:12]} here and "
                    f"{want[:12]} in HF tokenizers"
                )
