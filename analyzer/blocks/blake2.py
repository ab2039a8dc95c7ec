"""Keyed BLAKE2b-64 of many KV blocks in one compiled call (RFC 7693), in numba.

Why not ``hashlib``: it computes the same function, and it is the oracle of the tests,
but one block costs five Python calls (copy, update x2, digest, append), which made
block hashing a third of ``kvpool convert``. Here a prompt's blocks are hashed in one
call, chained and content hashes together, bit for bit what ``hashlib.blake2b(prev ||
block tokens || extra, digest_size=8, key=salt)`` gives.

Layout of the work: the key block is compressed once per salt (:func:`keyed_state`);
each block's message is assembled in a zeroed scratch buffer and compressed in 128-byte
pieces; the 8-byte digest is the first state word, read little-endian, which is also
what the next block's message starts with. The code assumes a little-endian machine
(x86-64, arm64); :func:`available` says whether it may be used.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import literal_unroll, njit

IV = np.array(
    [
        0x6A09E667F3BCC908,
        0xBB67AE8584CAA73B,
        0x3C6EF372FE94F82B,
        0xA54FF53A5F1D36F1,
        0x510E527FADE682D1,
        0x9B05688C2B3E6C1F,
        0x1F83D9ABFB41BD6B,
        0x5BE0CD19137E2179,
    ],
    dtype=np.uint64,
)
# Message word schedule; rounds 10 and 11 repeat rows 0 and 1.
SIGMA = np.array(
    [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
        [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
        [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
        [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
        [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
        [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
        [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
        [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
        [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    ],
    dtype=np.int64,
)
# The schedule as constants: unrolled, every message index is known at compile time
# (198 -> 153 ns a compression, against indexing SIGMA in a loop).
_ROUNDS = tuple(tuple(int(i) for i in row) for row in SIGMA)
DIGEST_BYTES = 8
BLOCK = 128


def available() -> bool:
    """The compiled path reads message words in native order: little-endian only."""
    return sys.byteorder == "little"


@njit(cache=True, inline="always")
def _rotr(x: np.uint64, n: int) -> np.uint64:
    return (x >> np.uint64(n)) | (x << np.uint64(64 - n))


@njit(cache=True, inline="always")
def _g(a, b, c, d, x, y):  # type: ignore[no-untyped-def]
    a = a + b + x
    d = _rotr(d ^ a, 32)
    c = c + d
    b = _rotr(b ^ c, 24)
    a = a + b + y
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 63)
    return a, b, c, d


@njit(cache=True)
def _compress(h: np.ndarray, m: np.ndarray, t: int, last: bool) -> None:
    """One 128-byte piece ``m`` (16 words) into state ``h``; ``t`` bytes hashed so far."""
    v0, v1, v2, v3, v4, v5, v6, v7 = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    v8, v9, v10, v11 = IV[0], IV[1], IV[2], IV[3]
    v12 = IV[4] ^ np.uint64(t)  # the counter's high word is zero for any real message
    v13 = IV[5]
    v14 = IV[6] ^ np.uint64(0xFFFFFFFFFFFFFFFF) if last else IV[6]
    v15 = IV[7]
    for s in literal_unroll(_ROUNDS):
        v0, v4, v8, v12 = _g(v0, v4, v8, v12, m[s[0]], m[s[1]])
        v1, v5, v9, v13 = _g(v1, v5, v9, v13, m[s[2]], m[s[3]])
        v2, v6, v10, v14 = _g(v2, v6, v10, v14, m[s[4]], m[s[5]])
        v3, v7, v11, v15 = _g(v3, v7, v11, v15, m[s[6]], m[s[7]])
        v0, v5, v10, v15 = _g(v0, v5, v10, v15, m[s[8]], m[s[9]])
        v1, v6, v11, v12 = _g(v1, v6, v11, v12, m[s[10]], m[s[11]])
        v2, v7, v8, v13 = _g(v2, v7, v8, v13, m[s[12]], m[s[13]])
        v3, v4, v9, v14 = _g(v3, v4, v9, v14, m[s[14]], m[s[15]])
    h[0] ^= v0 ^ v8
    h[1] ^= v1 ^ v9
    h[2] ^= v2 ^ v10
    h[3] ^= v3 ^ v11
    h[4] ^= v4 ^ v12
    h[5] ^= v5 ^ v13
    h[6] ^= v6 ^ v14
    h[7] ^= v7 ^ v15


@njit(cache=True)
def _keyed(key: np.ndarray) -> np.ndarray:
    h = IV.copy()
    h[0] ^= np.uint64(0x01010000 | (key.size << 8) | DIGEST_BYTES)
    if key.size:
        buf = np.zeros(BLOCK, dtype=np.uint8)
        buf[: key.size] = key
        # The key piece is never the last: every message hashed here is non-empty.
        _compress(h, buf.view(np.uint64), BLOCK, False)
    return h


def keyed_state(salt: bytes) -> tuple[np.ndarray, int]:
    """(state after the key piece, bytes it counts): shared by every hash under ``salt``."""
    assert len(salt) <= 64, len(salt)
    return _keyed(np.frombuffer(salt, dtype=np.uint8).copy()), BLOCK if salt else 0


@njit(cache=True, inline="always")
def _digest(
    start: np.ndarray, counted: int, h: np.ndarray, words: np.ndarray, length: int
) -> np.uint64:
    """BLAKE2b of the first ``length`` bytes under ``words`` (zero beyond them)."""
    h[:] = start
    n = max(1, (length + BLOCK - 1) // BLOCK)
    for j in range(n):
        t = min(length, (j + 1) * BLOCK)
        _compress(h, words[16 * j : 16 * j + 16], counted + t, j == n - 1)
    first: np.uint64 = h[0]
    return first


@njit(cache=True)
def extend_chain(
    start: np.ndarray,
    counted: int,
    old_hashes: np.ndarray,
    old_contents: np.ndarray,
    tokens: np.ndarray,
    k1: int,
    block_size: int,
    num: int,
    den: int,
    prev: np.uint64,
    extra: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.uint64]:
    """Blocks ``k0 = old_hashes.size`` to ``k1 - 1`` of ``tokens``, appended to the old.

    ``tokens`` (uint32) start at block ``k0``'s first token; block ``k`` covers tokens
    ``[bound(k), bound(k + 1))`` with ``bound(k) = k * block_size * den // num`` (the
    token ratio ``num / den``). Block ``k``'s message is ``chain || its tokens as
    little-endian uint32 || extra``, with ``chain`` the previous chained digest
    (``prev`` before block ``k0``) and eight zero bytes for its content hash. Returns
    (all chained hashes, all content hashes, last chained digest).
    """
    k0 = old_hashes.size
    base = (k0 * block_size * den) // num
    hashes = np.empty(k1, dtype=np.uint64)
    contents = np.empty(k1, dtype=np.uint64)
    hashes[:k0] = old_hashes
    contents[:k0] = old_contents
    data = tokens.view(np.uint8)
    longest = ((block_size * den + num - 1) // num) * 4
    cap = ((8 + longest + extra.size + BLOCK - 1) // BLOCK) * BLOCK
    scratch = np.zeros(cap, dtype=np.uint8)
    words = scratch.view(np.uint64)
    h = np.empty(8, dtype=np.uint64)
    for k in range(k0, k1):
        a = 4 * ((k * block_size * den) // num - base)
        b = 4 * (((k + 1) * block_size * den) // num - base)
        n = b - a
        scratch[8 : 8 + n] = data[a:b]
        scratch[8 + n : 8 + n + extra.size] = extra
        length = 8 + n + extra.size
        scratch[length:] = 0
        words[0] = np.uint64(0)
        contents[k] = _digest(start, counted, h, words, length)
        words[0] = prev
        prev = _digest(start, counted, h, words, length)
        hashes[k] = prev
    return hashes, contents, prev


@njit(cache=True)
def id_digests(start: np.ndarray, counted: int, prefix: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``blake2b(prefix || id as little-endian int64)`` (keyed, 8-byte digest) of each id."""
    length = prefix.size + 8
    cap = ((length + BLOCK - 1) // BLOCK) * BLOCK
    scratch = np.zeros(cap, dtype=np.uint8)
    scratch[: prefix.size] = prefix
    words = scratch.view(np.uint64)
    value = np.zeros(1, dtype=np.int64)
    value_bytes = value.view(np.uint8)
    h = np.empty(8, dtype=np.uint64)
    out = np.empty(ids.size, dtype=np.uint64)
    for i in range(ids.size):
        value[0] = ids[i]
        scratch[prefix.size : length] = value_bytes
        out[i] = _digest(start, counted, h, words, length)
    return out
