"""The embedding of a token sequence: token + position (+ type) tables, optional LayerNorm,
dropout; the one embedding module of every family (BERT's, the translation model's).

Parameters (each with its logical axes): `word` [padded vocab, embed] ("vocab", "embed"),
`position` [max positions, embed] ("position", "embed") when positions are learned (none for
sinusoidal ones), `segment` [types, embed] ("segment", "embed") when the model has token types
(BERT's sentence A/B), and `norm` (a LayerNorm in the residual dtype) when configured. The
output starts the residual stream, in the residual dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import dropout
from ln_jax.nn.norms import LayerNorm
from ln_jax.sharding import ACT, constrain

Array = jax.Array
POSITIONS = ("learned", "sinusoidal")


def sinusoidal(length: int, dim: int, offset: Array | int = 0) -> Array:
    """Positions offset..offset+length-1 -> [length, dim] float32: sin of position / 10000^(2i
    / dim) in the first half, cos in the second (Vaswani et al.; HF Marian's layout)."""
    pos = (jnp.arange(length) + offset).astype(jnp.float32)[:, None]
    inv = 1.0 / np.power(10000.0, 2.0 * np.arange(dim // 2) / dim)
    angles = pos * jnp.asarray(inv, jnp.float32)[None, :]
    out = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(out, ((0, 0), (0, dim % 2)))


class Embed(nnx.Module):
    """ids -> word[ids] * scale + positions (+ segment[types]), LayerNorm if configured,
    dropout.

    Args:
      cfg: the model's config (hidden_size, padded_vocab_size, max_position_embeddings,
        init, embedding_layernorm, layer_norm_eps, hidden_dropout, residual_dtype).
      types: rows of the token-type table (0: no table).
      positions: "learned" (a table of `cfg.max_position_embeddings` rows) or "sinusoidal".
      scale: what the token vectors are multiplied by (sqrt(d) in Vaswani et al.; 1: none).
      pad_id: a token whose row starts at zero (None: none).
    """

    def __init__(
        self,
        cfg: Any,
        *,
        rngs: nnx.Rngs,
        types: int = 0,
        positions: str = "learned",
        scale: float = 1.0,
        pad_id: int | None = None,
    ):
        if positions not in POSITIONS:
            raise ValueError(f"positions={positions!r}: use one of {POSITIONS}.")
        init = init_scheme(cfg).embed()
        d = cfg.hidden_size
        table = init(rngs.params(), (cfg.padded_vocab_size, d))
        if pad_id is not None:
            table = table.at[pad_id].set(0.0)
        self.word = nnx.Param(table, out_sharding=("vocab", "embed"))
        learned = positions == "learned"
        self.position = (
            nnx.Param(
                init(rngs.params(), (cfg.max_position_embeddings, d)),
                out_sharding=("position", "embed"),
            )
            if learned
            else None
        )
        self.segment = (
            nnx.Param(init(rngs.params(), (types, d)), out_sharding=("segment", "embed"))
            if types
            else None
        )
        # The embedding output starts the residual stream: in the residual dtype.
        self.norm = (
            LayerNorm(d, eps=cfg.layer_norm_eps, dtype=cfg.residual_dtype)
            if cfg.embedding_layernorm
            else None
        )
        self.scale = float(scale)
        self.dropout_rate = cfg.hidden_dropout
        self.max_len = cfg.max_position_embeddings
        self.dtype = cfg.residual_dtype

    def __call__(
        self,
        ids: Array,
        types: Array | None = None,
        *,
        dropout_key: Array | None = None,
        offset: Array | int = 0,
    ) -> Array:
        """ids [batch, length] int (positions offset..offset+length-1), types [batch, length]
        int or None (type 0; ignored without a type table) -> [batch, length, embed]."""
        length = ids.shape[1]
        x = lookup(self.word[...], "vocab", ids)
        if self.scale != 1.0:
            x = x * self.scale
        x = x + self._positions(length, x.shape[-1], offset)[None]
        if self.segment is not None:
            types = jnp.zeros_like(ids) if types is None else types
            x = x + _type_rows(self.segment[...], types)
        x = constrain(x.astype(self.dtype), ACT)
        if self.norm is not None:
            x = self.norm(x)
        return dropout(x, self.dropout_rate, dropout_key)

    def _positions(self, length: int, dim: int, offset: Array | int) -> Array:
        """[length, dim]: the position vectors of offset..offset+length-1."""
        if self.position is None:
            return sinusoidal(length, dim, offset)
        if length > self.max_len:
            raise ValueError(
                f"sequence length {length} exceeds model.max_position_embeddings={self.max_len}."
            )
        if isinstance(offset, int) and offset == 0:
            return self.position[...][:length]
        return jax.lax.dynamic_slice_in_dim(self.position[...], offset, length)


def _type_rows(table: Array, ids: Array) -> Array:
    """table [rows, embed], ids [batch, length] -> [batch, length, embed]. A table of a few
    rows (BERT's 2 segments) by selects, not a gather: the gather's backward is a scatter-add
    of every token into those rows (on a GPU, atomics on the same 2 x embed addresses), a
    select's is a masked sum. Same values (ids outside the table give zeros)."""
    if table.shape[0] > 8:
        return lookup(table, "segment", ids)
    table = constrain(table, ("segment", "act_embed"))
    out = jnp.zeros((), table.dtype)
    for row in range(table.shape[0]):
        out = jnp.where((ids == row)[..., None], table[row], out)
    return out


def lookup(table: Array, rows: str, ids: Array) -> Array:
    """table [rows, embed], ids [batch, length] -> [batch, length, embed].

    The table's fsdp-sharded embed dim is gathered first (FSDP-style): a lookup in a table
    sharded on its embed dim makes XLA rematerialise the whole table on every device.
    """
    return jnp.take(constrain(table, (rows, "act_embed")), ids, axis=0)
