"""Counter-based random numbers in numpy: every value is a pure function of integer keys.

A batch of examples draws all its randomness at once, and example `i` of epoch `e` gets the
same masks whichever batch, host or worker process computes it: its numbers depend only on
`derive_key(seed, stream, epoch, i)` and a counter (a token position). The generator is
splitmix64 (Steele et al., 2014): the output function `mix64` applied to `key + counter * phi`.

`permute(j, n, key)` is a keyed bijection of [0, n) (a Feistel network with cycle walking),
evaluated for any positions without building the permutation: the epoch shuffle of a stream of
any length in O(1) memory, the same in every process.
"""

from __future__ import annotations

import numpy as np

_PHI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: splitmix64's increment
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SALT = 0x6A09E667F3BCC909
_MASK64 = (1 << 64) - 1
_FEISTEL_ROUNDS = 6  # alternating halves: three rounds each


def _u64(x) -> np.ndarray:
    """x as a uint64 array of at least one dimension (integer scalars wrap modulo 2^64)."""
    return np.atleast_1d(np.asarray(x)).astype(np.uint64)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64; every input bit moves every output bit.

    Args:
      x: uint64 array of any shape (at least 1-d: numpy wraps array arithmetic silently
        but warns on scalar overflow).
    """
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _mix64_int(x: int) -> int:
    """`mix64` of one Python int (no numpy call overhead; the same values)."""
    x = ((x ^ (x >> 30)) * int(_M1)) & _MASK64
    x = ((x ^ (x >> 27)) * int(_M2)) & _MASK64
    return x ^ (x >> 31)


def derive_key(*fields) -> np.ndarray:
    """One uint64 key per element of the broadcast integer `fields` (e.g. seed, epoch, index).

    Returns:
      uint64 array of the fields' broadcast shape (at least 1-d).
    """
    if all(np.ndim(f) == 0 for f in fields):  # one key: Python ints are ~50x faster
        key = _SALT
        for field in fields:
            key = _mix64_int(key ^ _mix64_int((int(field) + int(_PHI)) & _MASK64))
        return np.array([key], np.uint64)
    key = _u64(_SALT)
    for field in fields:
        key = mix64(key ^ mix64(_u64(field) + _PHI))
    return key


def random_bits(key: np.ndarray, counter) -> np.ndarray:
    """64 random bits per (key, counter) pair, broadcast: uint64 of the broadcast shape."""
    return mix64(_u64(key) + _u64(counter) * _PHI)


def uniform(key: np.ndarray, counter) -> np.ndarray:
    """Uniform float64 in [0, 1) per (key, counter) pair, broadcast (53 random bits each)."""
    return (random_bits(key, counter) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def permute(j, n: int, key) -> np.ndarray:
    """The images of positions `j` under a keyed random permutation of [0, n).

    An alternating Feistel network (the high and the low half of the bits updated in turn by
    a keyed hash of the other) is a bijection of [0, 2^b), b the bits of n - 1; cycle walking
    (re-applying it to images >= n) restricts it to [0, n). Since 2^b < 2n, a position needs
    fewer than 2 passes on average.

    Args:
      j: int array of positions in [0, n).
      n: size of the permuted range (>= 1).
      key: one uint64 key (a scalar or a one-element array; one permutation per key).

    Returns:
      int64 array shaped like `j`.
    """
    bits = max(2, int(n - 1).bit_length())
    key = int(np.asarray(key).reshape(-1)[0])
    round_keys = [np.uint64(_mix64_int(key ^ _mix64_int(r + 1))) for r in range(_FEISTEL_ROUNDS)]
    out = _feistel(_u64(j), bits // 2, bits - bits // 2, round_keys)
    outside = np.flatnonzero(out >= np.uint64(n))
    while len(outside):
        out[outside] = _feistel(out[outside], bits // 2, bits - bits // 2, round_keys)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64).reshape(np.shape(j))


def _feistel(x: np.ndarray, low: int, high: int, round_keys: list) -> np.ndarray:
    """One pass of the network on [0, 2^(low + high)): uint64 [k] -> uint64 [k]."""
    low_mask, high_mask = np.uint64((1 << low) - 1), np.uint64((1 << high) - 1)
    upper, lower = x >> np.uint64(low), x & low_mask
    for r, round_key in enumerate(round_keys):
        if r % 2 == 0:
            upper = upper ^ (mix64(lower ^ round_key) & high_mask)
        else:
            lower = lower ^ (mix64(upper ^ round_key) & low_mask)
    return (upper << np.uint64(low)) | lower
