"""Multi-head attention: self-attention, causal self-attention and cross-attention, with the
incremental-decoding caches a decoder needs.

`Attention(cfg, kind=...)` is the branch of an attention sub-layer (`ln_jax.nn.blocks`):
  "self"    keys and values from the sub-layer input, padded keys masked (the encoder's);
  "causal"  the same with query t seeing keys <= t (a decoder's self-attention);
  "cross"   keys and values from `memory` (an encoder output), padded memory masked.
A branch declares the inputs it reads (`reads`), so a layer hands each sub-layer what it needs.

Decoding: while a module holds a `KVCache` (`set_cache`), a "causal" module takes the next
tokens [batch, t, embed], writes their keys/values at the cache's count and attends to every
key so far, and a "cross" module attends to the memory's keys/values computed once per source
(`decoding_cache(memory, memory_mask)`), not per step, and shared by the rows decoded from
one source (a beam's hypotheses: rows = sources x beam, a source's rows adjacent).
`set_cache(None)`: training form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ln_jax.nn import flash
from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import Dense, dropout, float32_einsum
from ln_jax.nn.norms import LayerNorm, RMSNorm
from ln_jax.nn.spec import StackConfig
from ln_jax.sharding import constrain

Array = jax.Array
KINDS = ("self", "causal", "cross")
HEADS = ("act_batch", "act_length", "act_heads", "act_kv")
_NEG = float(jnp.finfo(jnp.float32).min)


def attention_mask(mask: Array | None) -> Array | None:
    """[batch, length] 1/0 padding mask -> [batch, 1, 1, length] boolean key mask."""
    return None if mask is None else (mask > 0)[:, None, None, :]


def sequence_lengths(mask: Array | None) -> Array | None:
    """[batch, length] right-padded 1/0 mask (tokens first, then padding) -> [batch] int32
    token counts: the form both attention implementations take (cuDNN has no [B,1,1,S] mask)."""
    return None if mask is None else (mask > 0).sum(-1).astype(jnp.int32)


def key_mask(lengths: Array | None, length: int) -> Array | None:
    """[batch] token counts -> [batch, 1, 1, length] boolean mask of the keys < count."""
    if lengths is None:
        return None
    return (jnp.arange(length)[None, :] < lengths[:, None])[:, None, None, :]


def allowed(lengths: Array | None, q_len: int, k_len: int, causal: bool, offset=0) -> Array:
    """Which keys each query may see: [batch or 1, 1, q_len, k_len] bool; keys < lengths (None
    = all) and, if causal, keys <= the query's position (`offset` + its index)."""
    ok = jnp.ones((1, 1, q_len, k_len), bool)
    if lengths is not None:
        ok = ok & key_mask(lengths, k_len)
    if causal:
        q_pos = offset + jnp.arange(q_len)
        ok = ok & (jnp.arange(k_len)[None, :] <= q_pos[:, None])[None, None]
    return ok


def head_norm(cfg: StackConfig) -> LayerNorm | RMSNorm | None:
    """QK-norm's normaliser over head_dim (`cfg.norm`, parameters [kv]), or None if off."""
    if not cfg.qk_norm:
        return None
    norm = RMSNorm if cfg.norm == "rmsnorm" else LayerNorm
    return norm(cfg.head_dim, eps=cfg.layer_norm_eps, dtype=cfg.compute_dtype, name="kv")


# [batch, length, heads, kv] -> the decoding cache's key and value layouts (`KVCache`).
KEY_LAYOUT = (0, 2, 3, 1)
VALUE_LAYOUT = (0, 2, 1, 3)


def attention_logits(q: Array, k: Array) -> Array:
    """q [B, T, N, H] . k [B, S, N, H] -> float32 logits [B, N, T, S], accumulated in float32
    and never rounded (the softmax sees them whole). Their backward multiplies in q's dtype
    (`float32_einsum`), as the Pallas kernel (`ln_jax.nn.flash`) does: in a bf16 model dq and dk
    are bf16 GEMMs, not float32 ones (24 of them, 155 GFLOP, in BERT-base's step lowered for a
    GPU before)."""
    return float32_einsum("btnh,bsnh->bnts", q, k)


def masked_attention(
    q: Array, k: Array, v: Array, ok: Array | None, rate: float = 0.0, key: Array | None = None
) -> Array:
    """Softmax attention in XLA ops, dropout on the probabilities (as BERT). q [B, T, N, H],
    k/v [B, S, N, H], ok [B or 1, 1, T, S] bool (None = all) -> [B, T, N, H]."""
    scale = q.shape[-1] ** -0.5
    logits = attention_logits(q, k) * scale
    if ok is not None:
        logits = jnp.where(ok, logits, _NEG)
    probs = dropout(jax.nn.softmax(logits, axis=-1), rate, key).astype(v.dtype)
    return checkpoint_name(jnp.einsum("bnts,bsnh->btnh", probs, v), flash.RESIDUALS)


class Attention(nnx.Module):
    """Multi-head attention with separate q/k/v projections (see the module docstring).

    Kernels: q/k/v [embed, heads, kv]; output [heads, kv, embed]. With `cfg.qk_norm`, queries
    and keys are normalised over head_dim (`query_norm`, `key_norm`) before the dot product.
    """

    def __init__(self, cfg: StackConfig, *, kind: str = "self", rngs: nnx.Rngs):
        if kind not in KINDS:
            raise ValueError(f"attention kind {kind!r}: give one of {', '.join(KINDS)}.")
        d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        qkv_names = ("embed", "heads", "kv")
        scheme = init_scheme(cfg)
        kw = dict(dtype=cfg.compute_dtype, rngs=rngs)
        self.query = Dense((d,), (n, h), qkv_names, init=scheme.qkv(), **kw)
        self.key = Dense((d,), (n, h), qkv_names, init=scheme.qkv(), **kw)
        self.value = Dense((d,), (n, h), qkv_names, init=scheme.qkv(), **kw)
        self.out = Dense((n, h), (d,), ("heads", "kv", "embed"), init=scheme, **kw)
        self.query_norm, self.key_norm = head_norm(cfg), head_norm(cfg)
        self.dropout_rate = cfg.attention_dropout
        self.impl = cfg.attention_impl
        self.kind = kind
        self.reads = ("memory", "memory_mask") if kind == "cross" else ("mask",)
        self.cache: KVCache | None = nnx.data(None)  # set while decoding

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        memory: Array | None = None,
        memory_mask: Array | None = None,
        dropout_key: Array | None = None,
    ) -> Array:
        """x [batch, length, embed] -> [batch, length, embed].

        mask [batch, length] (1 = token, right-padded) masks x's padded keys ("self",
        "causal"); memory [batch, src, embed] with memory_mask [batch, src] are the keys' and
        values' source of "cross". Attention dropout (keyed by `dropout_key`) runs on the XLA
        and Pallas paths; the config keeps it off cuDNN's (`StackConfig.cudnn_problem`).
        While a cache is set (decoding; see the module docstring) there is no dropout.
        """
        if self.cache is not None:
            return self._decode(x)
        if self.kind == "cross" and memory is None:
            raise ValueError("cross-attention needs `memory` (the encoder output).")
        source, valid = (memory, memory_mask) if self.kind == "cross" else (x, mask)
        if self._kernel_adds_biases():
            q, k, v = (
                constrain(proj(y, add_bias=False), HEADS)
                for proj, y in ((self.query, x), (self.key, source), (self.value, source))
            )
            biases = tuple(p.bias[...] for p in (self.query, self.key, self.value))
            return self.out(constrain(self._attend(q, k, v, valid, dropout_key, biases), HEADS))
        q = self.queries(x)
        k, v = self.keys_values(source)
        return self.out(constrain(self._attend(q, k, v, valid, dropout_key), HEADS))

    def _kernel_adds_biases(self) -> bool:
        """Whether the Pallas kernel adds the q/k/v biases as it loads q, k, v: on a GPU whose
        GEMMs take no bias epilogue (Triton GEMMs on: the H200's compile of 2026-11-28 had 36
        bias-add passes a step, docs/results/gpu/journal.md) that saves a pass over each. Not with
        QK-norm (the bias comes before the norm)."""
        projections = (self.query, self.key, self.value)
        return (
            self.impl == "pallas"
            and self.query_norm is None
            and self.key_norm is None
            and all(p.bias is not None for p in projections)
        )

    def queries(self, x: Array) -> Array:
        """x [batch, length, embed] -> q [batch, length, heads, kv] (QK-normed if on)."""
        q = constrain(self.query(x), HEADS)
        return q if self.query_norm is None else self.query_norm(q)

    def keys_values(self, x: Array) -> tuple[Array, Array]:
        """x [batch, length, embed] -> (k, v), each [batch, length, heads, kv]."""
        k = constrain(self.key(x), HEADS)
        if self.key_norm is not None:
            k = self.key_norm(k)
        return k, constrain(self.value(x), HEADS)

    def probabilities(self, x: Array, mask: Array | None = None, memory=None, memory_mask=None):
        """The attention probabilities this module computes, without dropout, in float32:
        [batch, heads, length, keys] (what the monitor's entropy reads). The logits are
        accumulated in float32 from q and k as computed (bf16 in a bf16 model: casting them
        to float32 first adds no digit, and made this a float32 GEMM)."""
        q = self.queries(x)
        source, valid = (memory, memory_mask) if self.kind == "cross" else (x, mask)
        k, _ = self.keys_values(source)
        ok = allowed(sequence_lengths(valid), q.shape[1], k.shape[1], self.kind == "causal")
        logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
        logits = logits * q.shape[-1] ** -0.5
        return jax.nn.softmax(jnp.where(ok, logits, _NEG), axis=-1)

    def _attend(self, q: Array, k: Array, v: Array, valid: Array | None, key, biases=None) -> Array:
        """q [B, T, N, H], k/v [B, S, N, H], valid [B, S] 1/0 keys -> [B, T, N, H];
        `biases` (Pallas only): the q/k/v biases [N, H] the kernel adds."""
        causal = self.kind == "causal"
        drop = key is not None and self.dropout_rate > 0.0
        if self.impl == "pallas":
            v_ok = None if valid is None else valid > 0
            rate = self.dropout_rate
            return flash.flash_attention(
                q, k, v, v_ok, causal=causal, dropout_rate=rate, dropout_key=key, biases=biases
            )
        lengths = sequence_lengths(valid)
        # XLA's attention in half precision is ours too: its backward multiplies in bf16
        # (`attention_logits`); jax.nn's would multiply its float32 logits' gradient.
        if drop or (self.impl == "xla" and q.dtype != jnp.float32):
            ok = allowed(lengths, q.shape[1], k.shape[1], causal)
            return masked_attention(q, k, v, ok, self.dropout_rate if drop else 0.0, key)
        return jax.nn.dot_product_attention(
            q, k, v, key_value_seq_lengths=lengths, is_causal=causal, implementation=self.impl
        )

    # ------------------------------------------------------------------ decoding

    def decoding_cache(
        self,
        memory: Array | None = None,
        memory_mask: Array | None = None,
        *,
        batch: int = 0,
        max_length: int = 0,
    ) -> KVCache:
        """This module's empty decoding cache ("causal": room for max_length keys/values in
        the compute dtype, count 0) or the keys/values of memory [batch, src, embed] with count
        = its lengths from memory_mask [batch, src] ("cross"), in `KVCache`'s layout. Set it
        with `set_cache`; `ln_jax.nn.stack.init_decoding` does both for a whole stack."""
        if self.kind == "cross":
            k, v = self.keys_values(memory)
            count = sequence_lengths(memory_mask)
            if count is None:
                count = jnp.full((memory.shape[0],), memory.shape[1], jnp.int32)
            return KVCache(k.transpose(KEY_LAYOUT), v.transpose(VALUE_LAYOUT), count)
        if self.kind != "causal":
            raise ValueError("an encoder's self-attention has no decoding cache.")
        n, h = self.query.kernel.shape[-2:]
        keys = jnp.zeros((batch, n, h, max_length), self.query.dtype)
        values = jnp.zeros((batch, n, max_length, h), self.query.dtype)
        return KVCache(keys, values, jnp.zeros((), jnp.int32))

    def set_cache(self, cache: KVCache | None) -> None:
        """Decoding form with `cache` (see `decoding_cache`), or back to training form (None)."""
        self.cache = cache

    def _decode(self, x: Array) -> Array:
        """x [batch, t, embed], the next t tokens -> [batch, t, embed]; advances the cache."""
        q = self.queries(x)
        c = self.cache
        if self.kind == "cross":
            return self.out(_shared_source(q, c))
        k_new, v_new = self.keys_values(x)
        if isinstance(c, BeamCache):
            return self.out(_beam_attention(q, k_new, v_new, c))
        k_new = k_new.transpose(KEY_LAYOUT).astype(c.key.dtype)
        v_new = v_new.transpose(VALUE_LAYOUT).astype(c.value.dtype)
        index = c.count[...]
        c.key[...] = jax.lax.dynamic_update_slice(c.key[...], k_new, (0, 0, 0, index))
        c.value[...] = jax.lax.dynamic_update_slice(c.value[...], v_new, (0, 0, index, 0))
        c.count[...] = index + x.shape[1]
        ok = allowed(None, q.shape[1], c.key.shape[-1], True, offset=index)
        return self.out(cached_attention(q, c.key[...], c.value[...], ok))


def _shared_source(q: Array, c: KVCache) -> Array:
    """Cross-attention of q [rows, t, heads, kv] to cached keys/values of `sources` memories,
    rows = sources x group (a beam search's hypotheses, a source's rows adjacent): each
    group's queries attend to their one copy of the keys/values -> [rows, t, heads, kv]."""
    rows, t, n, h = q.shape
    sources = c.key.shape[0]
    group = rows // sources
    grouped = q.reshape(sources, group * t, n, h)
    ok = allowed(c.count[...], group * t, c.key.shape[-1], False)
    out = cached_attention(grouped, c.key[...], c.value[...], ok)
    return out.reshape(rows, t, n, h)


def cached_attention(q: Array, keys: Array, values: Array, ok: Array) -> Array:
    """Softmax attention of q [B, T, N, H] to a cache's keys [B, N, H, S] and values
    [B, N, S, H] (`KEY_LAYOUT`, `VALUE_LAYOUT`), ok [B or 1, 1, T, S] -> [B, T, N, H]: both
    products read the cache as stored (no per-step transpose of the cache)."""
    scale = q.shape[-1] ** -0.5
    keys, values = keys.astype(q.dtype), values.astype(q.dtype)
    logits = jnp.einsum("btnh,bnhs->bnts", q, keys, preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(jnp.where(ok, logits, _NEG), axis=-1).astype(values.dtype)
    return jnp.einsum("bnts,bnsh->btnh", probs, values)


def _beam_attention(q: Array, k_new: Array, v_new: Array, c: BeamCache) -> Array:
    """Causal self-attention of one new position of every hypothesis, q/k_new/v_new [rows, 1,
    heads, kv] (rows = sources x group, a source's rows adjacent), through a `BeamCache`:
    writes the keys/values at the cache's count into each hypothesis' own slot, then each
    query attends to all of its source's slots and positions, masked to its own history (the
    slot holding each of its positions, `slots`) -> [rows, 1, heads, kv]. The same softmax as
    `cached_attention` over the hypothesis' keys; masked keys weigh exactly 0."""
    rows, t, n, h = q.shape
    if t != 1:
        raise ValueError(f"a beam cache decodes one position at a time, not {t}.")
    sources, group, length = c.slots.shape[-3:]
    index = c.count[...]

    def grouped(a: Array) -> Array:  # [rows, 1, heads, kv] -> [sources, heads, group, kv]
        return a.reshape(sources, group, n, h).transpose(0, 2, 1, 3)

    k_new = grouped(k_new).transpose(0, 1, 3, 2).astype(c.key.dtype)
    v_new = grouped(v_new).astype(c.value.dtype)
    c.key[...] = jax.lax.dynamic_update_slice(c.key[...], k_new, (0, 0, 0, index * group))
    c.value[...] = jax.lax.dynamic_update_slice(c.value[...], v_new, (0, 0, index * group, 0))
    own = jnp.broadcast_to(jnp.arange(group, dtype=jnp.int32)[None, :, None], (sources, group, 1))
    c.slots[...] = jax.lax.dynamic_update_slice(c.slots[...], own, (0, 0, index))
    c.count[...] = index + 1
    # ok [sources, 1, group, length x group]: query j sees position s <= index of slot slots[s]
    mine = c.slots[...][..., None] == jnp.arange(group)
    ok = (mine & (jnp.arange(length) <= index)[:, None]).reshape(sources, 1, group, -1)
    keys, values = c.key[...].astype(q.dtype), c.value[...].astype(q.dtype)
    logits = jnp.einsum("injh,inhp->injp", grouped(q), keys, preferred_element_type=jnp.float32)
    logits = jnp.where(ok, logits * h**-0.5, _NEG)
    probs = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
    out = jnp.einsum("injp,inph->injh", probs, values)
    return out.transpose(0, 2, 1, 3).reshape(rows, 1, n, h)


def beam_cache(cache: KVCache, group: int) -> BeamCache:
    """An empty causal `decoding_cache` (rows = sources x group; a leading [layers] axis
    too when scanned) laid out for a search of `group` hypotheses per source: a `BeamCache`.
    The search then reorders its hypotheses by `reorder_beams`, moving no keys or values."""
    *lead, rows, n, h, length = cache.key.shape
    sources = rows // group
    key = jnp.zeros((*lead, sources, n, h, length * group), cache.key.dtype)
    value = jnp.zeros((*lead, sources, n, length * group, h), cache.value.dtype)
    slots = jnp.zeros((*lead, sources, group, length), jnp.int32)
    return BeamCache(key, value, cache.count[...], slots)


def reorder_beams(cache: BeamCache, parents: Array) -> None:
    """The hypotheses of a `BeamCache` reordered: hypothesis j of source i continues
    parents [sources, group]'s hypothesis (of the same source). Only `slots` moves."""
    slots = cache.slots[...]
    index = jnp.broadcast_to(parents[..., None], slots.shape[-3:])
    index = jnp.broadcast_to(index, slots.shape)  # a leading [layers] axis, if any
    cache.slots[...] = jnp.take_along_axis(slots, index, axis=-2)


class KVCache(nnx.Module):
    """An attention module's decoding state: keys [batch, heads, kv, length] and values
    [batch, heads, length, kv] (the layouts the two products read without a transpose; a
    [batch, length, heads, kv] array becomes them by `KEY_LAYOUT` / `VALUE_LAYOUT`) and
    `count`: the keys written so far ([] int32, causal self-attention) or each memory's length
    ([batch] int32, cross-attention). A stack's caches carry a leading [layers] axis when
    scanned; the batch is the first other axis."""

    def __init__(self, key: Array, value: Array, count: Array):
        self.key = nnx.Cache(key)
        self.value = nnx.Cache(value)
        self.count = nnx.Cache(count)


class BeamCache(KVCache):
    """A causal self-attention cache shared by each source's `group` hypotheses (a beam
    search; `beam_cache`): keys [sources, heads, kv, length x group] and values [sources,
    heads, length x group, kv] (position s of slot j at s x group + j), written once per
    position in the slot of the hypothesis that computed them, never moved; `slots`
    [sources, group, length] int32: the slot holding each position of each hypothesis'
    history (its ancestors'); `count` [] int32. Reordering the hypotheses gathers `slots`
    only, not the keys/values (`reorder_beams`); each query attends to its source's
    [length x group] keys masked to its own history."""

    def __init__(self, key: Array, value: Array, count: Array, slots: Array):
        super().__init__(key, value, count)
        self.slots = nnx.Cache(slots)
