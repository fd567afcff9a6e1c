"""Position-wise work on the real tokens only: a padded batch's tokens compacted, in chunks
that are skipped once they hold only padding.

A right-padded batch [batch, length] wastes every position-wise matmul (a feed-forward, the
output projection) on its padding: 40% of the positions of a typical translation batch. The
shapes must stay static, so nothing is cut; instead:

  layout = TokenLayout.of(mask, groups)          # once per batch
  y = layout.apply(fn, x)                        # x [batch, length, d] -> [batch, length, d']

`apply` gathers each group's real tokens to the front of a [groups, tokens] row (a stable
permutation: real tokens keep their order) and cuts the row into chunks of `chunk` tokens. The
first half of the chunks runs as one call of `fn` (a batch is rarely less than half real);
the later ones run in one `lax.while_loop` that stops after the last chunk holding a real
token of the largest group. Its custom VJP (`_ragged`) runs the same loop backwards: each
chunk's forward recomputed for its VJP, the parameters' gradients (`fn`'s closed-over arrays,
made explicit by `jax.closure_convert`) accumulated in the loop's carry. The result is
scattered back to [batch, length, d']. Real tokens get exactly fn(x) (float round-off aside:
the matmuls are cut differently); padded positions get fn(x) or zeros, which no real token
reads (attention masks padded keys, the loss weights them 0).

Measured on one core (the `small` train step, 64 x 32 batch, 43% padding; `python
bench/speed/bench_translate_hf.py --mode=skip`): the feed-forward layers and the output projection
this way take the step to 0.84 of its time. Slower, each interleaved with the unskipped step
in one process: one `lax.cond` per later chunk (0.885; an executed `cond` copies its weights
in and returns a whole weight gradient), every chunk under a `cond` (0.92), one `lax.switch`
over prefix lengths (0.93); skipping the attention's projections too gained nothing
(docs/translation.md).

`groups` is the number of batch shards (`ln_jax.sharding.batch_shards`): each group is one
shard's rows, so the gathers stay on their device under a data-parallel mesh. On the CPU the
loop's bound costs nothing to read; XLA:GPU and TPU read a while loop's predicate on the host,
which is why `TranslationOptions.skip_padding` resolves to on for the CPU only (unmeasured
there).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
CHUNK = 256  # tokens a chunk: [256, 256] x [256, 1024] still runs at the CPU's matmul rate


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["order", "inverse", "count"],
    meta_fields=["chunk"],
)
@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """Where a batch's real tokens are.

    Attributes:
      order: [groups, n] int32, for each group (n = its rows x length positions, flattened)
        the positions of its real tokens first, in order, then its padded positions.
      inverse: [groups, n] int32, the inverse permutation.
      count: [] int32, the most real tokens in any group.
      chunk: tokens a chunk (static).
    """

    order: Array
    inverse: Array
    count: Array
    chunk: int = CHUNK

    @classmethod
    def of(cls, mask: Array, groups: int = 1, chunk: int = CHUNK) -> TokenLayout:
        """mask [batch, length] (nonzero = real token); batch divisible by groups."""
        b, length = mask.shape
        if b % groups:
            raise ValueError(f"a batch of {b} rows does not split into {groups} groups.")
        real = (mask != 0).reshape(groups, b // groups * length)
        order = jnp.argsort(~real, axis=1, stable=True).astype(jnp.int32)
        inverse = jnp.argsort(order, axis=1).astype(jnp.int32)
        count = real.sum(axis=1).max().astype(jnp.int32)
        return cls(order, inverse, count, chunk)

    def apply(self, fn: Callable[..., Array], *xs: Array) -> Array:
        """fn on the real tokens of xs (each [batch, length, ...], same batch and length) ->
        [batch, length, ...fn's trailing shape]; fn maps [tokens, ...] to [tokens, ...]."""
        b, length = xs[0].shape[:2]
        packed = [self._pack(x) for x in xs]  # each [chunks, groups, chunk, ...]
        k, g = packed[0].shape[:2]
        flat = [p.reshape(k, g * self.chunk, *p.shape[3:]) for p in packed]
        out = jax.eval_shape(fn, *[f[0] for f in flat])
        first = k // 2  # computed as one call, without conditions (see the module docstring)
        parts = [fn(*[f[:first].reshape(-1, *f.shape[2:]) for f in flat])] if first else []
        if first < k:
            needed = (self.count + self.chunk - 1) // self.chunk - first
            converted, consts = jax.closure_convert(fn, *[f[0] for f in flat])
            tail = _ragged(converted, needed, consts, [f[first:] for f in flat])
            parts.append(tail.reshape(-1, *out.shape[1:]))
        ys = jnp.concatenate(parts, axis=0)
        ys = ys.reshape(k, g, self.chunk, *out.shape[1:]).swapaxes(0, 1)
        ys = ys.reshape(g, k * self.chunk, *out.shape[1:])[:, : self.order.shape[1]]
        idx = self.inverse.reshape(*self.inverse.shape, *([1] * (ys.ndim - 2)))
        return jnp.take_along_axis(ys, idx, axis=1).reshape(b, length, *out.shape[1:])

    def _pack(self, x: Array) -> Array:
        """x [batch, length, ...] -> [chunks, groups, chunk, ...], real tokens first."""
        g, n = self.order.shape
        rows = x.reshape(g, n, *x.shape[2:])
        idx = self.order.reshape(g, n, *([1] * (x.ndim - 2)))
        packed = jnp.take_along_axis(rows, idx, axis=1)
        k = -(-n // self.chunk)
        pad = [(0, 0), (0, k * self.chunk - n)] + [(0, 0)] * (x.ndim - 2)
        packed = jnp.pad(packed, pad).reshape(g, k, self.chunk, *x.shape[2:])
        return packed.swapaxes(0, 1)


def _zero_cotangent(x: Array) -> Array:
    """A zero cotangent of x: float0 for integer arrays."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(fn: Callable[..., Array], n: Array, consts: list, chunks: list) -> Array:
    """fn(*chunk_i, *consts) for the chunks i < n (each of chunks [m, ...]) -> [m, ...out],
    zeros after; a while loop, so only the first n chunks cost anything."""
    return _ragged_fwd(fn, n, consts, chunks)[0]


def _ragged_fwd(fn, n, consts, chunks):
    out = jax.eval_shape(fn, *[c[0] for c in chunks], *consts)
    ys = jnp.zeros((chunks[0].shape[0], *out.shape), out.dtype)

    def body(i, ys):
        return ys.at[i].set(fn(*[c[i] for c in chunks], *consts))

    return jax.lax.fori_loop(0, n, body, ys), (n, consts, chunks)


def _ragged_bwd(fn, residuals, dys):
    """Per computed chunk: fn's vjp (its forward recomputed), the chunk's cotangents written,
    the consts' (the parameters') accumulated."""
    n, consts, chunks = residuals
    inexact = [jnp.issubdtype(c.dtype, jnp.inexact) for c in consts]
    d_consts = [jnp.zeros_like(c) for c, f in zip(consts, inexact, strict=True) if f]
    d_chunks = [jnp.zeros_like(c) for c in chunks if jnp.issubdtype(c.dtype, jnp.inexact)]

    def body(i, carry):
        dc, dx = carry
        xs = [c[i] for c in chunks]
        _, vjp = jax.vjp(fn, *xs, *consts)
        grads = vjp(dys[i])
        gx = [
            g
            for g, x in zip(grads[: len(xs)], xs, strict=True)
            if jnp.issubdtype(x.dtype, jnp.inexact)
        ]
        gc = [g for g, f in zip(grads[len(xs) :], inexact, strict=True) if f]
        dx = [d.at[i].set(g) for d, g in zip(dx, gx, strict=True)]
        dc = [a + g for a, g in zip(dc, gc, strict=True)]
        return dc, dx

    d_consts, d_chunks = jax.lax.fori_loop(0, n, body, (d_consts, d_chunks))
    it_c, it_x = iter(d_consts), iter(d_chunks)
    out_c = [next(it_c) if f else _zero_cotangent(c) for c, f in zip(consts, inexact, strict=True)]
    out_x = [
        next(it_x) if jnp.issubdtype(c.dtype, jnp.inexact) else _zero_cotangent(c) for c in chunks
    ]
    return _zero_cotangent(n), out_c, out_x


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
