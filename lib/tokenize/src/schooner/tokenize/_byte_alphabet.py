"""The GPT-2 byte-level alphabet: the printable character that stands for each byte in byte-level BPE tokens.

Both the tokenizer's byte counts (`Tokenizer.token_byte_lengths`) and the fast path (`_fast`) read tokens
through it.
"""

from __future__ import annotations


def byte_decoder() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, inverted: printable character -> the byte it stands for."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}
