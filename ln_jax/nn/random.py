"""Counter-hash random bits: dropout masks that fuse into their consumers.

`lowbias32` is a 32-bit integer hash (two multiply-xorshift rounds, on int32 bits wrapping as
uint32). Two users:
- the fused attention kernel (`ln_jax.nn.flash`) expands one seed per query row over the key
  positions with `keep_mask`;
- `HASH_PRNG`, a JAX PRNG implementation (`dropout_rng="hash"`) whose keys are threefry keys
  (seeding, splitting and folding are threefry's) and whose bits are
  `lowbias32(lowbias32(index * golden + k0) ^ k1)` over the element index: elementwise integer
  arithmetic from an iota that XLA fuses into the op that uses the mask, so no mask or bit array
  is written to memory, where threefry's and rbg's bits are (see docs/results/gpu/journal.md).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend import random as jex_random

Array = jax.Array

GOLDEN = -1640531527  # 0x9E3779B9 as int32
_M1 = 0x7FEB352D
_M2 = -2073254261  # 0x846CA68B as int32


def _shr(x: Array, n: int) -> Array:
    return jax.lax.shift_right_logical(x, jnp.asarray(n, x.dtype))


def lowbias32(x: Array) -> Array:
    """A 32-bit integer hash of int32 or uint32 `x` (same bits either way)."""
    x = x ^ _shr(x, 16)
    x = x * jnp.asarray(_M1, x.dtype) if x.dtype == jnp.int32 else x * jnp.uint32(_M1)
    x = x ^ _shr(x, 15)
    x = x * (jnp.asarray(_M2, x.dtype) if x.dtype == jnp.int32 else jnp.uint32(_M2 & 0xFFFFFFFF))
    return x ^ _shr(x, 16)


def keep_mask(row_seeds: Array, cols: Array, rate: float) -> Array:
    """int32 row_seeds [..., T, 1] and key positions cols [..., 1, S] -> [..., T, S] bool: True
    where dropout keeps the entry (probability 1 - rate, resolution 2**-24)."""
    bits = _shr(lowbias32(row_seeds + cols * jnp.int32(GOLDEN)), 8)
    return bits >= jnp.int32(round(rate * (1 << 24)))


def _linear_index(shape: tuple[int, ...]) -> Array:
    """uint32 array of `shape` holding each element's row-major index (mod 2**32), built from
    broadcast iotas (no 1-D iota to reshape, so it shards like any elementwise op)."""
    idx = jnp.zeros((), jnp.uint32)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
        idx = idx + iota * jnp.uint32(stride % (1 << 32))
        stride *= shape[axis]
    return jnp.broadcast_to(idx, shape)


def _hash_bits(key: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
    """Raw key uint32[2] -> unsigned bits of `bit_width` and `shape`."""
    k0, k1 = key[0], key[1]
    idx = _linear_index(tuple(shape))
    bits = lowbias32(lowbias32(idx * jnp.uint32(GOLDEN & 0xFFFFFFFF) + k0) ^ k1)
    if bit_width == 64:
        high = lowbias32(bits ^ jnp.uint32(0x5BD1E995))
        return (high.astype(jnp.uint64) << 32) | bits.astype(jnp.uint64)
    dtype = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[bit_width]
    return _shr(bits, 32 - bit_width).astype(dtype) if bit_width < 32 else bits


_threefry = jex_random.threefry_prng_impl
HASH_PRNG = jex_random.define_prng_impl(
    key_shape=(2,),
    seed=_threefry.seed,
    split=_threefry.split,
    random_bits=_hash_bits,
    fold_in=_threefry.fold_in,
    name="ln_jax_hash",
    tag="ln_jax_hash",
)


def prng_impl(name: str):
    """A `dropout_rng` name -> what `jax.random.key(seed, impl=...)` takes."""
    return HASH_PRNG if name == "hash" else {"threefry": "threefry2x32"}.get(name, name)


def drop_fraction(mask: Array) -> float:
    """Share of False entries of a boolean mask (a check used by tests and benches)."""
    return 1.0 - float(jnp.mean(mask)) if mask.size else math.nan
