"""Greedy and beam search with the incremental decoder, each one jitted `lax.while_loop`.

The source is encoded once; every decoder layer's cross-attention keys/values are computed
once per source and shared by its beams (the beams' queries attend to one [src] copy, no
per-beam copies); self-attention keys/values are cached per beam, written once and never
moved: when beams reorder only a table of each hypothesis' ancestors moves
(`ln_jax.nn.attention.BeamCache`). Each step takes each hypothesis' top 2 x beam + 2 tokens
from the raw logits and the softmax's normaliser from one more pass (`_top_tokens`), then
the top 2 x beam of a sentence's candidates. A hypothesis' score is its summed
log-probability divided by a length penalty: fairseq's len^lenpen, or GNMT's
((5 + len) / 6)^alpha, len counting the tokens generated with EOS.
`max_len = a * src_len + b` per sentence (capped by `max_length`): there EOS is forced.
With `stop="bound"` (default) every EOS among a step's top 2 x beam continuations finishes a
hypothesis, and a sentence stops when `beam` hypotheses are finished and no live one
can still beat the worst of them (with a beam as wide as the live hypotheses, the search is
exact). `stop="first"` is fairseq's rule: an EOS finishes a hypothesis only from the top `beam`
continuations, and a sentence stops at its first `beam` finished (beam 1 is greedy search).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.models.translation.options import Specials
from ln_jax.nn.attention import Attention, beam_cache, reorder_beams
from ln_jax.nn.stack import init_decoding

Array = jax.Array
NEG = -1e9  # a dead hypothesis' score (finite: keeps arithmetic NaN-free)
STOPS = ("bound", "first")


@dataclasses.dataclass(frozen=True)
class Search:
    """How to decode (static: each setting compiles its own program).

    Attributes:
      beam: hypotheses kept per sentence (1 with `greedy=True`: argmax decoding).
      max_length: the most tokens generated (EOS included): the cache's length.
      lenpen: fairseq's length penalty exponent (score / len^lenpen); ignored if `alpha`.
      alpha: GNMT's length penalty ((5 + len) / 6)^alpha, or None.
      max_len_a, max_len_b: per-sentence limit a * src_len + b (fairseq's default a=0, b=200).
      stop: "bound" or "first" (module docstring).
      greedy: argmax decoding (beam must be 1).
      cache: decode incrementally with the caches (False: recompute the whole prefix at
        every step, the baseline `bench/speed/bench_translate.py` measures the caches against).
    """

    beam: int = 5
    max_length: int = 64
    lenpen: float = 1.0
    alpha: float | None = None
    max_len_a: float = 0.0
    max_len_b: int = 200
    stop: str = "bound"
    greedy: bool = False
    cache: bool = True

    def check(self, vocab_size: int) -> None:
        if self.stop not in STOPS:
            raise ValueError(f"stop={self.stop!r}: give one of {', '.join(STOPS)}.")
        if not 1 <= self.beam <= vocab_size:
            raise ValueError(
                f"beam={self.beam} is wider than the vocabulary ({vocab_size} tokens); use a "
                "beam between 1 and the vocabulary size."
            )
        if self.greedy and self.beam != 1:
            raise ValueError("greedy search has beam 1.")
        if self.max_length < 1:
            raise ValueError(f"max_length={self.max_length} must be >= 1.")

    def penalty(self, length: Array) -> Array:
        """The length penalty of hypotheses of `length` generated tokens (float32)."""
        n = jnp.asarray(length, jnp.float32)
        if self.alpha is not None:
            return ((5.0 + n) / 6.0) ** self.alpha
        return n**self.lenpen


def limits(src_mask: Array, search: Search) -> Array:
    """[batch] the most tokens each sentence may generate: a * src_len + b, within
    [1, max_length]."""
    src_len = src_mask.sum(-1).astype(jnp.float32)
    limit = jnp.floor(search.max_len_a * src_len + search.max_len_b).astype(jnp.int32)
    return jnp.clip(limit, 1, search.max_length)


def translate(model: Any, src: Array, src_mask: Array, search: Search) -> dict[str, Array]:
    """Decodes a batch of sources with `model` (a `Translator`; it is not changed).

    src, src_mask [batch, src_len] -> {"tokens": [batch, max_length] int32 (the best
    hypothesis, EOS then PAD after it), "scores": [batch] its length-normalised score,
    "lengths": [batch] tokens generated with EOS}.
    """
    search.check(model.vocab_size)
    graphdef, state = nnx.split(model)
    return _translate(graphdef, state, src, src_mask, search, model.options.specials)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _translate(graphdef, state, src, src_mask, search: Search, ids: Specials) -> dict[str, Array]:
    model = nnx.merge(graphdef, state)  # a copy inside the trace: caches never leak out
    memory, _ = model.encode(src, src_mask)
    rows = src.shape[0] * search.beam
    if search.cache:
        init_decoding(model.decoder, rows, search.max_length, memory, src_mask)
        if not search.greedy:
            for attention in _self_attentions(model):
                attention.set_cache(beam_cache(attention.cache, search.beam))
        graphdef, caches, rest = nnx.split(model, nnx.Cache, ...)
        carry = {"caches": caches, "rest": rest}  # through the loop: its variables, its trace
        step = functools.partial(_next_logits, graphdef)
    else:
        graphdef, state = nnx.split(model)
        carry = {"state": state, "memory": memory, "src_mask": src_mask}
        step = functools.partial(_recomputed_logits, graphdef, search.beam)
    if search.greedy:
        return _greedy(step, carry, limits(src_mask, search), search, ids)
    return _beam(step, carry, limits(src_mask, search), search, graphdef, ids)


def _next_logits(graphdef, carry: dict, tokens: Array, t: Array):
    """tokens [rows, max_length + 1] (position t is the newest) -> (float32 logits of
    position t + 1 [rows, vocab_padded], the carry with the advanced caches): the cached
    decoder reads one position."""
    model = nnx.merge(graphdef, carry["caches"], carry["rest"])
    logits, _ = model.decode(tokens[:, t][:, None], None, None, offset=t)
    return logits[:, 0], {**carry, "caches": nnx.state(model, nnx.Cache)}


def _recomputed_logits(graphdef, beam: int, carry: dict, tokens: Array, t):
    """As `_next_logits`, recomputing the decoder over the whole (fixed-length) prefix with
    the memory copied per hypothesis: the work a decoder without caches does."""
    model = nnx.merge(graphdef, carry["state"])
    memory = jnp.repeat(carry["memory"], beam, 0)
    src_mask = jnp.repeat(carry["src_mask"], beam, 0)
    logits, _ = model.decode(tokens[:, :-1], memory, src_mask)
    return jnp.take(logits, t, axis=1), carry


def _top_tokens(logits: Array, n: int, at_limit: Array, ids: Specials) -> tuple[Array, Array]:
    """Candidates holding each row's `n` best next tokens: logits [rows, V], at_limit [rows]
    (the sentence reaches its limit with this token: only EOS) -> (log-probabilities [rows,
    m], tokens [rows, m] int32), m = min(n + 2, V). PAD and BOS are never generated (their
    log-probability is NEG, as every token's but EOS at the limit); the softmax's normaliser
    counts the whole vocabulary (HuggingFace's and fairseq's).

    The candidates of a top-n over the full log_softmax, without writing it: the top n + 2
    raw logits hold the n best allowed tokens and the row's maximum; one more pass sums
    exp(logit - max). (A full log_softmax let XLA:CPU fuse its maximum into the output
    projection's matmul, a fusion 3x slower than the matmul alone: 12 of 44 ms a step.)"""
    top, token = jax.lax.top_k(logits, min(n + 2, logits.shape[-1]))
    # (top.max, not top[:, 0]: a slice of top_k's output turns XLA's TopK into a full sort)
    peak = jnp.maximum(top.max(-1), jnp.maximum(logits[:, ids.pad], logits[:, ids.bos]))
    norm = jnp.log(jnp.sum(jnp.exp(logits - peak[:, None]), axis=-1))
    logp = (top - peak[:, None]) - norm[:, None]
    eos = (logits[:, ids.eos] - peak) - norm
    first = jnp.arange(top.shape[-1]) == 0
    banned = (token == ids.pad) | (token == ids.bos)
    limited = at_limit[:, None]
    logp = jnp.where(limited, jnp.where(first, eos[:, None], NEG), jnp.where(banned, NEG, logp))
    token = jnp.where(limited & first, ids.eos, token).astype(jnp.int32)
    return logp, token


def _greedy(step, caches, limit: Array, search: Search, ids: Specials) -> dict[str, Array]:
    b, n = limit.shape[0], search.max_length
    state = {
        "t": jnp.int32(0),
        "tokens": jnp.full((b, n + 1), ids.pad, jnp.int32).at[:, 0].set(ids.bos),
        "score": jnp.zeros((b,), jnp.float32),
        "done": jnp.zeros((b,), bool),
        "caches": caches,
    }

    def body(s):
        logits, caches = step(s["caches"], s["tokens"], s["t"])
        logp, top = _top_tokens(logits, 1, s["t"] + 1 >= limit, ids)
        pick = logp.argmax(-1)[:, None]
        best = jnp.take_along_axis(logp, pick, -1)[:, 0]
        token = jnp.where(s["done"], ids.pad, jnp.take_along_axis(top, pick, -1)[:, 0])
        score = s["score"] + jnp.where(s["done"], 0.0, best)
        tokens = s["tokens"].at[:, s["t"] + 1].set(token)
        done = s["done"] | (token == ids.eos)
        return {"t": s["t"] + 1, "tokens": tokens, "score": score, "done": done, "caches": caches}

    cond = lambda s: (s["t"] < n) & ~jnp.all(s["done"])
    s = jax.lax.while_loop(cond, body, state)
    return _result(s["tokens"][:, 1:], s["score"], search, ids.eos)


def _result(tokens: Array, raw: Array | None, search: Search, eos: int, scores=None):
    """{"tokens", "scores", "lengths"} from tokens [batch, max_length] (EOS, then PAD)."""
    lengths = jnp.argmax(tokens == eos, axis=-1).astype(jnp.int32) + 1
    if scores is None:
        scores = raw / search.penalty(lengths)
    return {"tokens": tokens, "scores": scores, "lengths": lengths}


def _beam(step, caches, limit: Array, search: Search, graphdef, ids: Specials) -> dict:
    b, k, n = limit.shape[0], search.beam, search.max_length
    start = jnp.full((b, k, n + 1), ids.pad, jnp.int32).at[:, :, 0].set(ids.bos)
    state = {
        "t": jnp.int32(0),
        "tokens": start,
        "live": jnp.full((b, k), NEG, jnp.float32).at[:, 0].set(0.0),  # one start hypothesis
        "fin_tokens": start,
        "fin": jnp.full((b, k), NEG, jnp.float32),  # normalised scores of finished ones
        "caches": caches,
    }
    advance = functools.partial(_beam_step, step, limit, search, graphdef, ids)
    cond = lambda s: (s["t"] < n) & ~jnp.all(_finished(s, limit, search))
    s = jax.lax.while_loop(cond, lambda s: advance(s), state)
    best = jnp.argmax(s["fin"], axis=-1)
    tokens = jnp.take_along_axis(s["fin_tokens"], best[:, None, None], 1)[:, 0, 1:]
    scores = jnp.take_along_axis(s["fin"], best[:, None], 1)[:, 0]
    return _result(tokens, None, search, ids.eos, scores)


def _finished(s: dict, limit: Array, search: Search) -> Array:
    """[batch] whether a sentence's search is over: `beam` finished hypotheses and (stop
    "bound") no live one that can still beat the worst of them."""
    full = s["fin"].min(-1) > NEG / 2
    if search.stop == "first":
        return full
    # Log-probabilities only fall; the penalty is monotone in length: a live hypothesis'
    # best normalised score is its score over the larger penalty of the lengths still open.
    bound = jnp.maximum(search.penalty(s["t"] + 1), search.penalty(limit))
    best_live = s["live"].max(-1) / bound
    dead = s["live"].max(-1) <= NEG / 2
    return full & ((s["fin"].min(-1) >= best_live) | dead)


def _beam_step(step, limit, search: Search, graphdef, ids: Specials, s: dict) -> dict:
    """One token for every live hypothesis: the top 2*beam continuations, EOS ones to the
    finished set (kept top `beam` by normalised score), the others the new live beams."""
    b, k = s["live"].shape
    t = s["t"]
    logits, caches = step(s["caches"], s["tokens"].reshape(b * k, -1), t)
    at_limit = jnp.repeat(t + 1 >= limit, k)
    logp, tokens = _top_tokens(logits, 2 * k, at_limit, ids)
    m = logp.shape[-1]  # per hypothesis: its candidates hold its best 2k continuations
    cand = (s["live"][:, :, None] + logp.reshape(b, k, m)).reshape(b, k * m)
    top, index = jax.lax.top_k(cand, 2 * k)
    origin = index // m
    token = jnp.take_along_axis(tokens.reshape(b, k * m), index, 1)
    grown = jnp.take_along_axis(s["tokens"], origin[:, :, None], 1).at[:, :, t + 1].set(token)
    is_eos = (token == ids.eos) & (top > NEG / 2)
    # fairseq ("first"): an EOS finishes a hypothesis only from the top `beam` candidates.
    within = (jnp.arange(2 * k) < k)[None, :] if search.stop == "first" else True
    finishing = is_eos & within
    normalised = jnp.where(finishing, top / search.penalty(t + 1), NEG)
    fin_all = jnp.concatenate([s["fin"], normalised], 1)
    fin, pick = jax.lax.top_k(fin_all, k)
    fin_tokens = jnp.take_along_axis(
        jnp.concatenate([s["fin_tokens"], grown], 1), pick[..., None], 1
    )
    live, keep = jax.lax.top_k(jnp.where(is_eos, NEG, top), k)
    parents = jnp.take_along_axis(origin, keep, 1)
    return {
        "t": t + 1,
        "tokens": jnp.take_along_axis(grown, keep[:, :, None], 1),
        "live": live,
        "fin_tokens": fin_tokens,
        "fin": fin,
        "caches": _reorder(graphdef, caches, parents) if "caches" in caches else caches,
    }


def _self_attentions(model) -> list[Attention]:
    """The decoder's causal self-attention modules (one stacked module per sub-layer when
    its layers are scanned)."""
    stack = model.decoder
    layers = [stack.layers] if stack.cfg.scan_layers else stack.layers
    return [
        sublayer.branch
        for layer in layers
        for _, sublayer in layer.sublayers()
        if isinstance(sublayer.branch, Attention) and sublayer.branch.kind == "causal"
    ]


def _reorder(graphdef, carry: dict, parents: Array) -> dict:
    """The self-attention caches' hypotheses reordered: each continues parents [batch, beam]
    (of its sentence). A `BeamCache` moves only its slots table, no keys or values."""
    model = nnx.merge(graphdef, carry["caches"], carry["rest"])
    for attention in _self_attentions(model):
        reorder_beams(attention.cache, parents)
    return {**carry, "caches": nnx.state(model, nnx.Cache)}
