"""Fused softmax attention with dropout keyed by the step's PRNG key (Pallas, Triton on GPUs).

`flash_attention(q, k, v, ...)` computes softmax(q k^T / sqrt(H) + mask) with inverted dropout
on the probabilities, times v, without materialising the [B, N, T, S] probabilities in memory:
the forward keeps a running max and sum per query row (the online softmax), and the backward
recomputes the probabilities from q, k and the saved log-sum-exp.

Dropout that can be reproduced: the mask is a function of the step's key alone. The key draws
one 32-bit seed per (batch, head, query row) with `jax.random.bits` (threefry on GPUs; a
[B, N, T] array, 1.5 MB at BERT-base batch 256), and the kernel expands each row's seed over
the key positions with a counter hash (`keep_mask`): entry (row, s) is kept when
`lowbias32(seed_row + s * golden) >> 8 >= rate * 2**24` (`ln_jax.nn.random`). The seeds are
drawn for the global batch, so the masks do not depend on the mesh. The backward recomputes the same
mask, a resumed run redraws the same masks, and `reference_attention` computes the same
function with plain XLA ops (the tests compare the kernel with it).

Layout: q [B, T, N, H], k/v [B, S, N, H], as the projections produce them, so no transpose
runs around the kernel. Lengths and head sizes are padded up to the kernel's blocks (powers of
two) inside the call. On CPU the kernel runs in Pallas's interpreter (for tests: slow); on
NVIDIA GPUs it compiles with Triton. TPUs need a Mosaic kernel, which this is not (the config
refuses `attention_impl="pallas"` there).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ln_jax.nn.random import keep_mask
from ln_jax.runtime import platforms
from ln_jax.sharding import per_shard

Array = jax.Array

_NEG = -1e30  # logit of a masked key (finite: a row with no valid key stays finite)
MAX_BLOCK = 128


def row_seeds(key: Array, batch: int, heads: int, length: int) -> Array:
    """The step key -> [batch, heads, length] int32 seeds, one per query row."""
    bits = jax.random.bits(key, (batch, heads, length), jnp.uint32)
    return jax.lax.bitcast_convert_type(bits, jnp.int32)


def reference_attention(
    q: Array,
    k: Array,
    v: Array,
    key_valid: Array | None = None,
    *,
    causal: bool = False,
    dropout_rate: float = 0.0,
    dropout_key: Array | None = None,
) -> Array:
    """The function `flash_attention` computes, in plain XLA ops (probabilities materialised).

    q [B, T, N, H], k/v [B, S, N, H], key_valid [B, S] bool -> [B, T, N, H] in q's dtype."""
    b, t, n, h = q.shape
    s = k.shape[1]
    logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(_valid(key_valid, causal, b, t, s), logits * h**-0.5, _NEG)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_key is not None and dropout_rate > 0.0:
        seeds = row_seeds(dropout_key, b, n, t)[..., None]
        keep = keep_mask(seeds, jnp.arange(s, dtype=jnp.int32)[None, :], dropout_rate)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v).astype(q.dtype)


def _valid(key_valid: Array | None, causal: bool, b: int, t: int, s: int) -> Array:
    """[B, 1, T, S] (or broadcastable) bool: which (query, key) pairs attend."""
    valid = jnp.ones((b, 1, 1, s), bool) if key_valid is None else key_valid[:, None, None, :]
    if causal:
        valid = valid & (jnp.arange(t)[:, None] >= jnp.arange(s)[None, :])
    return valid


def triton_missing() -> str | None:
    """Why Pallas's Triton backend is unusable in this JAX (None if usable). JAX 0.11.2 warns
    that it is deprecated (Mosaic GPU is its successor)."""
    if not hasattr(plgpu, "CompilerParams") or not hasattr(plgpu, "dot"):
        return "this JAX's Pallas has no Triton backend (jax.experimental.pallas.triton)"
    return None


def supported_reason(head_dim: int) -> str | None:
    """Why the kernel cannot take this shape, or None."""
    if head_dim > 256:
        return f"head_dim {head_dim} > 256 (one head must fit the kernel's block)"
    return None


def flash_attention(
    q: Array,
    k: Array,
    v: Array,
    key_valid: Array | None = None,
    *,
    causal: bool = False,
    dropout_rate: float = 0.0,
    dropout_key: Array | None = None,
    biases: tuple[Array, Array, Array] | None = None,
    interpret: bool | None = None,
    tuning: Tuning | None = None,
) -> Array:
    """Fused attention. q [B, T, N, H], k/v [B, S, N, H] (any float dtype; bf16 on GPUs),
    key_valid [B, S] bool (None = all keys), causal: query t sees keys <= t (T == S).
    biases: (bq, bk, bv), each [N, H] (the float32 parameters; rounded to q's dtype), added
    to q, k and v as the kernel loads them (the projections' biases: on a GPU whose GEMM has
    no bias epilogue, each would be a pass over its [B, T, N, H] of its own); their
    gradients are the sums of dq, dk, dv.
    Dropout on the probabilities is keyed by `dropout_key` (None or rate 0: no dropout).
    interpret: run Pallas's interpreter (default: when the platform built for,
    `ln_jax.runtime.platforms.current()`, is the CPU). tuning: Triton settings (`Tuning`;
    default `default_tuning()`).

    Inside a mesh context the kernel runs on each device's shard (batch over the batch axes,
    heads over the tensor axis; lengths whole), as `ln_jax.sharding.per_shard` maps it."""
    b, t, n, _ = q.shape
    s = k.shape[1]
    drop = dropout_key is not None and dropout_rate > 0.0
    seeds = row_seeds(dropout_key, b, n, t) if drop else jnp.zeros((b, n, t), jnp.int32)
    valid = jnp.ones((b, s), bool) if key_valid is None else key_valid
    if biases is None:
        biases = tuple(jnp.zeros((n, x.shape[-1]), x.dtype) for x in (q, k, v))
    if interpret is None:
        interpret = platforms.current() == "cpu"
    local = functools.partial(
        _local_attention,
        causal=causal,
        rate=float(dropout_rate) if drop else 0.0,
        interpret=bool(interpret),
        tuning=tuning or default_tuning(),
    )
    qkv = ("act_batch", None, "act_heads", None)
    bias = ("act_heads", None)
    names = (qkv, qkv, qkv, ("act_batch", None), ("act_batch", "act_heads", None))
    return per_shard(local, (*names, bias, bias, bias), qkv)(q, k, v, valid, seeds, *biases)


def _local_attention(q, k, v, valid, seeds, q_bias, k_bias, v_bias, *, causal, rate, interpret,
                     tuning):  # fmt: skip
    """The kernel on one shard: pads lengths and head size to its blocks, then crops."""
    _, t, _, h = q.shape
    s = k.shape[1]
    bq, bk, hp = _block(t), _block(s), max(16, pl.next_power_of_2(h))
    tp, sp = _round_up(t, bq), _round_up(s, bk)
    qp, kp, vp = _pad(q, tp, hp), _pad(k, sp, hp), _pad(v, sp, hp)
    valid = jnp.pad(valid.astype(jnp.int32), ((0, 0), (0, sp - s)))
    seeds = jnp.pad(seeds, ((0, 0), (0, 0), (0, tp - t)))
    biases = tuple(jnp.pad(x, ((0, 0), (0, hp - h))) for x in (q_bias, k_bias, v_bias))
    static = _Static(h**-0.5, causal, rate, bq, bk, interpret, tuning)
    return _flash(qp, kp, vp, valid, seeds, biases, static)[:, :t, :, :h]


def _block(length: int) -> int:
    return min(MAX_BLOCK, max(16, pl.next_power_of_2(length)))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pad(x: Array, length: int, head: int) -> Array:
    return jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, head - x.shape[3])))


class Tuning(NamedTuple):
    """Triton launch settings (GPU only): warps per program of the forward and backward
    kernels, software-pipeline stages (defaults: the fastest of bench/speed/bench_flash.py's on one
    H100 at BERT-base shapes: 1.08 ms a layer against 2.12 with 4 warps), and whether a
    query/key pair of single blocks (lengths up to 128: BERT) takes one backward kernel for dq,
    dk and dv (the probabilities recomputed once; 1.43 ms with two) instead of two."""

    warps_fwd: int = 8
    warps_bwd: int = 8
    stages: int = 3
    fused_backward: bool = True


TUNING_ENV = "LN_JAX_FLASH_TUNING"


def default_tuning() -> Tuning:
    """`Tuning()`, or the settings in $LN_JAX_FLASH_TUNING ("warps_fwd,warps_bwd,stages,fused",
    e.g. "4,8,2,1"; bench/speed/bench_flash.py prints the fastest), read when a step is traced."""
    text = os.environ.get(TUNING_ENV, "").strip()
    if not text:
        return Tuning()
    try:
        wf, wb, st, fused = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(
            f"{TUNING_ENV}={text!r}: give four integers warps_fwd,warps_bwd,stages,fused "
            "(e.g. 4,8,2,1), or unset it"
        ) from None
    return Tuning(wf, wb, st, bool(fused))


class _Static(NamedTuple):
    """The kernel's static settings (hashable: custom_vjp's nondiff argument)."""

    scale: float
    causal: bool
    rate: float
    block_q: int
    block_k: int
    interpret: bool
    tuning: Tuning


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, valid, seeds, biases, st):
    return _forward(q, k, v, valid, seeds, biases, st)[0]


# The name (`jax.ad_checkpoint.checkpoint_name`) of what an attention's backward reads besides
# its inputs: this kernel's output and log-sum-exp, XLA's attention output
# (`ln_jax.nn.attention.masked_attention`). The "dots" remat policy (`ln_jax.nn.stack`) saves
# it, so the backward does not run the attention's forward again.
RESIDUALS = "attention_residuals"


def _flash_fwd(q, k, v, valid, seeds, biases, st):
    out, lse = (checkpoint_name(x, RESIDUALS) for x in _forward(q, k, v, valid, seeds, biases, st))
    return out, (q, k, v, valid, seeds, biases, out, lse)


def _flash_bwd(st, res, d_out):
    q, k, v, valid, seeds, biases, out, lse = res
    one_block = q.shape[1] == st.block_q and k.shape[1] == st.block_k
    if one_block and st.tuning.fused_backward:  # delta from `out` inside the kernel
        dq, dk, dv, *sums = _backward_fused(q, k, v, valid, seeds, biases, d_out, lse, out, st)
    else:
        args = (q, k, v, valid, seeds, biases, d_out, lse, _delta(d_out, out), st)
        dq, dq_sum = _backward_dq(*args)
        dk, dv, dk_sum, dv_sum = _backward_dkdv(*args)
        sums = (dq_sum, dk_sum, dv_sum)
    # A bias is added to every row of its head: its gradient is the sum over batch and length
    # of its input's gradient. Each program wrote its block's column sums (float32, before
    # rounding): 3 x [B, N, blocks, H] -> [N, H] each, in one reduction, without reading dq,
    # dk, dv again.
    totals = jnp.stack(sums).sum((1, 3))
    d_biases = tuple(x.astype(b.dtype) for x, b in zip(totals, biases, strict=True))
    return dq, dk, dv, None, None, d_biases


def _delta(d_out: jax.Array, out: jax.Array) -> jax.Array:
    """rowsum(dO * O) [b, n, t] in float32 (`d_out`, `out`: [b, t, n, h]): the softmax
    backward's correction, dL/dlogits = P * (dP - delta)."""
    return jnp.einsum("btnh,btnh->bnt", d_out.astype(jnp.float32), out.astype(jnp.float32))


_flash.defvjp(_flash_fwd, _flash_bwd)


def _row(bias_ref, dtype) -> Array:
    """A bias block [H] (float32 parameters) -> [1, H] in the dtype of what it is added to."""
    return bias_ref[...].astype(dtype)[None, :]


def _bias_spec(h: int, head) -> pl.BlockSpec:
    """The [N, H] bias rows of the grid's head; `head` maps the grid indices to it."""
    return pl.BlockSpec((None, h), lambda *ids: (head(*ids), 0))


def _compiler_params(st: _Static, warps: int):
    if st.interpret:
        return None
    return plgpu.CompilerParams(num_warps=warps, num_stages=st.tuning.stages)


def _scores(q, k, valid_k, q_pos, k_pos, st):
    """q [bq, H], k [bk, H] -> float32 logits [bq, bk] with invalid pairs at _NEG."""
    logits = plgpu.dot(q, k, trans_b=True) * st.scale
    ok = valid_k[None, :] != 0
    if st.causal:
        ok = ok & (q_pos[:, None] >= k_pos[None, :])
    return jnp.where(ok, logits, _NEG)


def _dropped(p, seeds, k_pos, st):
    """p [bq, bk] -> (p with dropout applied and rescaled, keep mask or None)."""
    if st.rate == 0.0:
        return p, None
    keep = keep_mask(seeds[:, None], k_pos[None, :], st.rate)
    return jnp.where(keep, p * (1.0 / (1.0 - st.rate)), 0.0), keep


def _forward(q, k, v, valid, seeds, biases, st):
    """q [B, T, N, H] ... -> out [B, T, N, H], lse [B, N, T] float32."""
    b, t, n, h = q.shape
    s = k.shape[1]
    bq, bk = st.block_q, st.block_k

    def kernel(q_ref, k_ref, v_ref, valid_ref, seeds_ref, qb_ref, kb_ref, vb_ref, o_ref, lse_ref):
        iq = pl.program_id(2)
        q_blk = q_ref[...] + _row(qb_ref, q_ref.dtype)
        k_bias, v_bias = _row(kb_ref, k_ref.dtype), _row(vb_ref, v_ref.dtype)
        q_pos = iq * bq + jnp.arange(bq, dtype=jnp.int32)
        row_seed = seeds_ref[...]

        def body(j, carry):
            acc, m, total = carry
            ks = pl.ds(j * bk, bk)
            k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)
            logits = _scores(q_blk, k_ref[ks, :] + k_bias, valid_ref[ks], q_pos, k_pos, st)
            m_new = jnp.maximum(m, logits.max(-1))
            p = jnp.exp(logits - m_new[:, None])
            corr = jnp.exp(m - m_new)
            l_new = corr * total + p.sum(-1)
            p_d, _ = _dropped(p, row_seed, k_pos, st)
            v_blk = v_ref[ks, :] + v_bias
            acc = corr[:, None] * acc + plgpu.dot(p_d.astype(v_blk.dtype), v_blk)
            return acc, m_new, l_new

        init = (
            jnp.zeros((bq, h), jnp.float32),
            jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32),
        )
        acc, m, total = jax.lax.fori_loop(0, _k_blocks(iq, st, s), body, init)
        o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)
        lse_ref[...] = m + jnp.log(total)

    return pl.pallas_call(
        kernel,
        grid=(b, n, t // bq),
        in_specs=[
            pl.BlockSpec((None, bq, None, h), lambda i, j, r: (i, r, j, 0)),
            pl.BlockSpec((None, s, None, h), lambda i, j, r: (i, 0, j, 0)),
            pl.BlockSpec((None, s, None, h), lambda i, j, r: (i, 0, j, 0)),
            pl.BlockSpec((None, s), lambda i, j, r: (i, 0)),
            pl.BlockSpec((None, None, bq), lambda i, j, r: (i, j, r)),
            *[_bias_spec(h, lambda i, j, r: j)] * 3,
        ],
        out_specs=[
            pl.BlockSpec((None, bq, None, h), lambda i, j, r: (i, r, j, 0)),
            pl.BlockSpec((None, None, bq), lambda i, j, r: (i, j, r)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, n, t), jnp.float32),
        ],
        interpret=st.interpret,
        compiler_params=_compiler_params(st, st.tuning.warps_fwd),
        name="ln_jax_flash_fwd",
    )(q, k, v, valid, seeds, *biases)


def _k_blocks(iq, st, s):
    """How many key blocks query block `iq` visits (all, or up to the diagonal if causal)."""
    if not st.causal:
        return s // st.block_k
    return jax.lax.div((iq + 1) * st.block_q + st.block_k - 1, st.block_k)


def _probs(q_blk, k_blk, valid_k, lse, q_pos, k_pos, st):
    """Recomputed softmax probabilities [bq, bk] from the saved log-sum-exp."""
    return jnp.exp(_scores(q_blk, k_blk, valid_k, q_pos, k_pos, st) - lse[:, None])


def _d_logits(p, keep, do_blk, v_blk, delta, st):
    """dL/dlogits [bq, bk] (without the scale) = p * (dP - delta), dP through the dropout."""
    dp = plgpu.dot(do_blk, v_blk, trans_b=True)
    if keep is not None:
        dp = jnp.where(keep, dp * (1.0 / (1.0 - st.rate)), 0.0)
    return p * (dp - delta[:, None])


def _column_sums(b: int, n: int, blocks: int, h: int, index) -> tuple:
    """The out spec and shape of a backward's bias partials: each program's column sums of the
    [rows, H] gradient block it writes, float32 [B, N, blocks, H]; `index` maps the grid's
    indices to (batch, head, block)."""
    spec = pl.BlockSpec((None, None, None, h), lambda *ids: (*index(*ids), 0))
    return spec, jax.ShapeDtypeStruct((b, n, blocks, h), jnp.float32)


def _backward_dq(q, k, v, valid, seeds, biases, d_out, lse, delta, st):
    """dq [B, T, N, H] and its column sums per query block, float32 [B, N, T/bq, H]."""
    b, t, n, h = q.shape
    s = k.shape[1]
    bq, bk = st.block_q, st.block_k

    def kernel(q_ref, k_ref, v_ref, valid_ref, seeds_ref, qb_ref, kb_ref, vb_ref, do_ref, lse_ref,
               delta_ref, dq_ref, dq_sum_ref):  # fmt: skip
        iq = pl.program_id(2)
        q_blk, do_blk = q_ref[...] + _row(qb_ref, q_ref.dtype), do_ref[...]
        k_bias, v_bias = _row(kb_ref, k_ref.dtype), _row(vb_ref, v_ref.dtype)
        lse, dlt, row_seed = lse_ref[...], delta_ref[...], seeds_ref[...]
        q_pos = iq * bq + jnp.arange(bq, dtype=jnp.int32)

        def body(j, dq):
            ks = pl.ds(j * bk, bk)
            k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)
            k_blk = k_ref[ks, :] + k_bias
            p = _probs(q_blk, k_blk, valid_ref[ks], lse, q_pos, k_pos, st)
            _, keep = _dropped(p, row_seed, k_pos, st)
            ds = _d_logits(p, keep, do_blk, v_ref[ks, :] + v_bias, dlt, st)
            return dq + plgpu.dot(ds.astype(k_blk.dtype), k_blk)

        dq = jax.lax.fori_loop(0, _k_blocks(iq, st, s), body, jnp.zeros((bq, h), jnp.float32))
        dq = dq * st.scale
        dq_ref[...] = dq.astype(dq_ref.dtype)
        dq_sum_ref[...] = dq.sum(0)

    row = pl.BlockSpec((None, None, bq), lambda i, j, r: (i, j, r))
    q_spec = pl.BlockSpec((None, bq, None, h), lambda i, j, r: (i, r, j, 0))
    kv_spec = pl.BlockSpec((None, s, None, h), lambda i, j, r: (i, 0, j, 0))
    sum_spec, sum_shape = _column_sums(b, n, t // bq, h, lambda i, j, r: (i, j, r))
    return pl.pallas_call(
        kernel,
        grid=(b, n, t // bq),
        in_specs=[
            q_spec,
            kv_spec,
            kv_spec,
            pl.BlockSpec((None, s), lambda i, j, r: (i, 0)),
            row,
            *[_bias_spec(h, lambda i, j, r: j)] * 3,
            q_spec,
            row,
            row,
        ],
        out_specs=[q_spec, sum_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), sum_shape],
        interpret=st.interpret,
        compiler_params=_compiler_params(st, st.tuning.warps_bwd),
        name="ln_jax_flash_dq",
    )(q, k, v, valid, seeds, *biases, d_out, lse, delta)


def _backward_dkdv(q, k, v, valid, seeds, biases, d_out, lse, delta, st):
    """dk, dv [B, S, N, H] and their column sums per key block, float32 [B, N, S/bk, H]."""
    b, t, n, h = q.shape
    s = k.shape[1]
    bq, bk = st.block_q, st.block_k

    def kernel(q_ref, k_ref, v_ref, valid_ref, seeds_ref, qb_ref, kb_ref, vb_ref, do_ref, lse_ref,
               delta_ref, dk_ref, dv_ref, dk_sum_ref, dv_sum_ref):  # fmt: skip
        ik = pl.program_id(2)
        k_blk, v_blk = (
            k_ref[...] + _row(kb_ref, k_ref.dtype),
            v_ref[...] + _row(vb_ref, v_ref.dtype),
        )
        valid_k, q_bias = valid_ref[...], _row(qb_ref, q_ref.dtype)
        k_pos = ik * bk + jnp.arange(bk, dtype=jnp.int32)

        def body(i, carry):
            dk, dv = carry
            qs = pl.ds(i * bq, bq)
            q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
            q_blk, do_blk = q_ref[qs, :] + q_bias, do_ref[qs, :]
            p = _probs(q_blk, k_blk, valid_k, lse_ref[qs], q_pos, k_pos, st)
            p_d, keep = _dropped(p, seeds_ref[qs], k_pos, st)
            dv = dv + plgpu.dot(p_d.astype(do_blk.dtype), do_blk, trans_a=True)
            ds = _d_logits(p, keep, do_blk, v_blk, delta_ref[qs], st)
            return dk + plgpu.dot(ds.astype(q_blk.dtype), q_blk, trans_a=True), dv

        first = (ik * bk) // bq if st.causal else 0
        zeros = jnp.zeros((bk, h), jnp.float32)
        dk, dv = jax.lax.fori_loop(first, t // bq, body, (zeros, zeros))
        dk = dk * st.scale
        dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)
        dk_sum_ref[...], dv_sum_ref[...] = dk.sum(0), dv.sum(0)

    full_row = pl.BlockSpec((None, None, t), lambda i, j, c: (i, j, 0))
    q_spec = pl.BlockSpec((None, t, None, h), lambda i, j, c: (i, 0, j, 0))
    kv_spec = pl.BlockSpec((None, bk, None, h), lambda i, j, c: (i, c, j, 0))
    sum_spec, sum_shape = _column_sums(b, n, s // bk, h, lambda i, j, c: (i, j, c))
    return pl.pallas_call(
        kernel,
        grid=(b, n, s // bk),
        in_specs=[
            q_spec,
            kv_spec,
            kv_spec,
            pl.BlockSpec((None, bk), lambda i, j, c: (i, c)),
            full_row,
            *[_bias_spec(h, lambda i, j, c: j)] * 3,
            q_spec,
            full_row,
            full_row,
        ],
        out_specs=[kv_spec, kv_spec, sum_spec, sum_spec],
        out_shape=[
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            sum_shape,
            sum_shape,
        ],
        interpret=st.interpret,
        compiler_params=_compiler_params(st, st.tuning.warps_bwd),
        name="ln_jax_flash_dkdv",
    )(q, k, v, valid, seeds, *biases, d_out, lse, delta)


def _backward_fused(q, k, v, valid, seeds, biases, d_out, lse, out, st):
    """dq, dk, dv of a single query block against a single key block: one program per
    (batch, head) recomputes the probabilities once for all three, and the softmax
    correction (`_delta`) from its blocks of dO and O (no separate pass over both); with each
    gradient's column sums, float32 [B, N, 1, H] (the biases' gradients before the batch sum)."""
    b, t, n, h = q.shape
    s = k.shape[1]

    def kernel(q_ref, k_ref, v_ref, valid_ref, seeds_ref, qb_ref, kb_ref, vb_ref, do_ref, lse_ref,
               out_ref, dq_ref, dk_ref, dv_ref, dq_sum_ref, dk_sum_ref, dv_sum_ref):  # fmt: skip
        q_blk = q_ref[...] + _row(qb_ref, q_ref.dtype)
        k_blk = k_ref[...] + _row(kb_ref, k_ref.dtype)
        v_blk, do_blk = v_ref[...] + _row(vb_ref, v_ref.dtype), do_ref[...]
        delta = jnp.sum(do_blk.astype(jnp.float32) * out_ref[...].astype(jnp.float32), axis=1)
        q_pos = jnp.arange(t, dtype=jnp.int32)
        k_pos = jnp.arange(s, dtype=jnp.int32)
        p = _probs(q_blk, k_blk, valid_ref[...], lse_ref[...], q_pos, k_pos, st)
        p_d, keep = _dropped(p, seeds_ref[...], k_pos, st)
        dv = plgpu.dot(p_d.astype(do_blk.dtype), do_blk, trans_a=True)
        ds = _d_logits(p, keep, do_blk, v_blk, delta, st).astype(q_blk.dtype)
        dq = plgpu.dot(ds, k_blk) * st.scale
        dk = plgpu.dot(ds, q_blk, trans_a=True) * st.scale
        for ref, x in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv)):
            ref[...] = x.astype(ref.dtype)
        dq_sum_ref[...], dk_sum_ref[...], dv_sum_ref[...] = dq.sum(0), dk.sum(0), dv.sum(0)

    row = pl.BlockSpec((None, None, t), lambda i, j: (i, j, 0))
    q_spec = pl.BlockSpec((None, t, None, h), lambda i, j: (i, 0, j, 0))
    kv_spec = pl.BlockSpec((None, s, None, h), lambda i, j: (i, 0, j, 0))
    sum_spec, sum_shape = _column_sums(b, n, 1, h, lambda i, j: (i, j, 0))
    return pl.pallas_call(
        kernel,
        grid=(b, n),
        in_specs=[
            q_spec,
            kv_spec,
            kv_spec,
            pl.BlockSpec((None, s), lambda i, j: (i, 0)),
            row,
            *[_bias_spec(h, lambda i, j: j)] * 3,
            q_spec,
            row,
            q_spec,
        ],
        out_specs=[q_spec, kv_spec, kv_spec, *[sum_spec] * 3],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            *[sum_shape] * 3,
        ],
        interpret=st.interpret,
        compiler_params=_compiler_params(st, st.tuning.warps_bwd),
        name="ln_jax_flash_bwd",
    )(q, k, v, valid, seeds, *biases, d_out, lse, out)
