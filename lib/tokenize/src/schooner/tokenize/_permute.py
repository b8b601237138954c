"""Seeded bijective permutations of [0, n): a Feistel network with cycle walking.

`Permutation(n, key)(i)` is the position `i` maps to. O(1) memory and O(1) time per index, pure in
(n, key, i), so a shuffled order over billions of sequences needs no stored index and any process
computes the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from seed-like parts (stable across processes and platforms, unlike `hash`)."""
    h = hashlib.blake2b(":".join(map(str, parts)).encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrap-around multiplication is intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class Permutation:
    """A pseudo-random bijection of `[0, n)` chosen by `key`.

    A balanced Feistel network permutes `[0, 4^h)` for the smallest `4^h >= n`; indices landing at or
    beyond `n` are fed through again (cycle walking), which stays a bijection on `[0, n)` and takes
    fewer than 4 rounds-trips on average because `4^h < 4n`.

    Example:
        >>> p = Permutation(10, key=derive_key(0, "demo"))
        >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
        True
    """

    def __init__(self, n: int, key: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"Permutation needs n >= 1 elements, got n={n!r}")
        self.n = int(n)
        self.key = int(key) & (2**64 - 1)
        half_bits = max(1, ((self.n - 1).bit_length() + 1) // 2)
        self._half_bits = np.uint64(half_bits)
        self._mask = np.uint64((1 << half_bits) - 1)
        self._round_keys = [np.uint64(derive_key(self.key, r)) for r in range(_ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left = x >> self._half_bits
        right = x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (_mix(right ^ rk) & self._mask)
        return (left << self._half_bits) | right

    def __call__(self, index: int | Sequence[int] | np.ndarray) -> np.ndarray:
        """The images of `index` (an int or an int array), as int64 with the same shape."""
        idx = np.asarray(index, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            bad = idx[(idx < 0) | (idx >= self.n)].ravel()[0]
            raise IndexError(f"Permutation of n={self.n}: index {int(bad)} is outside [0, {self.n})")
        if self.n == 1:
            return np.zeros(idx.shape, dtype=np.int64)
        x = idx.astype(np.uint64).reshape(-1)  # 1-D: numpy array ops wrap silently (scalars would warn)
        x = self._feistel(x)
        out_of_range = x >= np.uint64(self.n)
        while out_of_range.any():
            x[out_of_range] = self._feistel(x[out_of_range])
            out_of_range = x >= np.uint64(self.n)
        return x.astype(np.int64).reshape(idx.shape)

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, key={self.key:#x})"
