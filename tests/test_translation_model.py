"""The encoder-decoder: incremental decoding = the full decoder, causality, greedy and beam
search (beam 1 = greedy; exhaustive on a toy model), the search's errors."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.config.run import ModelConfig
from ln_jax.models.translation.model import Translator
from ln_jax.models.translation.options import BOS, EOS, TranslationOptions
from ln_jax.models.translation.search import Search, translate
from ln_jax.nn.placements import PLACEMENTS
from ln_jax.nn.stack import end_decoding, init_decoding


@pytest.fixture(autouse=True)
def _one_device_mesh():
    with sharding.use_mesh(sharding.single_device_mesh()):
        yield


def make(vocab=13, layers=2, seed=0, scale=1.0, **kw) -> Translator:
    options = kw.pop("options", {})
    defaults = dict(
        size="custom",
        vocab_size=vocab,
        hidden_size=16,
        num_heads=2,
        mlp_dim=32,
        num_layers=layers,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init="xavier",
        activation="relu",
        max_position_embeddings=32,
        embedding_layernorm=False,
    )
    cfg = ModelConfig(**{**defaults, **kw})
    opts = TranslationOptions.from_mapping(
        {"max_source_length": 8, "max_target_length": 8, **options}, cfg
    )
    model = Translator(cfg, opts, rngs=nnx.Rngs(params=seed))
    if scale != 1.0:  # sharper distributions: searches differ where they should
        for _, var in nnx.iter_graph(model):
            if isinstance(var, nnx.Param) and var[...].ndim >= 2:
                var[...] = var[...] * scale
    return model


def batch(vocab=13, b=2, s=5, t=6, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, vocab, (b, s)).astype(np.int32)
    src_mask = np.ones((b, s), np.int32)
    src_mask[1:, 3:] = 0
    src[1:, 3:] = 0
    tgt = rng.integers(4, vocab, (b, t)).astype(np.int32)
    tgt[:, 0] = BOS
    return jnp.asarray(src), jnp.asarray(src_mask), jnp.asarray(tgt)


@jax.jit
def _full_and_stepwise(state, src, src_mask, tgt):
    """(teacher-forced logits, the same from the cached decoder one position at a time)."""
    model = nnx.merge(*state)
    full = model(src, src_mask, tgt)["logits"]
    memory, _ = model.encode(src, src_mask)
    init_decoding(model.decoder, tgt.shape[0], tgt.shape[1], memory, src_mask)
    steps = [model.decode(tgt[:, t : t + 1], None, None, offset=t)[0] for t in range(tgt.shape[1])]
    end_decoding(model.decoder)
    return full, jnp.concatenate(steps, 1)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("scan", [False, True])
def test_cached_decoding_gives_the_full_decoders_logits(placement, scan):
    """Four target positions: the decoder is compiled once per position (6 took 1.7x the CPU
    time of 3, most of this test's 22 cases)."""
    model = make(placement=placement, scan_layers=scan)
    full, stepwise = _full_and_stepwise(nnx.split(model), *batch(t=4))
    np.testing.assert_allclose(stepwise, full, atol=1e-5, rtol=1e-5)


def test_a_target_token_changes_no_logit_before_it():
    model = make(placement="post")
    src, src_mask, tgt = batch()
    a = model(src, src_mask, tgt)["logits"]
    b = model(src, src_mask, tgt.at[:, 3].set(5))["logits"]
    np.testing.assert_array_equal(a[:, :3], b[:, :3])
    assert float(jnp.abs(a[:, 3:] - b[:, 3:]).max()) > 1e-4


def _sequence_logprobs(model, src, src_mask, seqs) -> list[float]:
    """Summed log-probability of generating each of `seqs` (ending in EOS) by teacher forcing:
    one call, the sequences padded to the longest (a position sees none after it)."""
    width = max(map(len, seqs))
    tgt_in = np.zeros((len(seqs), width), np.int32)
    for row, seq in zip(tgt_in, seqs, strict=True):
        row[: len(seq)] = (BOS, *seq[:-1])
    src, src_mask = (np.repeat(np.asarray(x), len(seqs), axis=0) for x in (src, src_mask))
    logits = model(src, src_mask, jnp.asarray(tgt_in))["logits"]
    logp = np.asarray(jax.nn.log_softmax(logits, -1))  # indexed on the host
    return [
        float(sum(lp[i, tok] for i, tok in enumerate(seq)))
        for lp, seq in zip(logp, seqs, strict=True)
    ]


@pytest.mark.parametrize("lenpen", [0.0, 1.0, 2.5])
def test_beam_search_finds_the_best_sequence_of_a_toy_model(lenpen):
    """vocab 5 (PAD UNK BOS EOS w): at most 3 tokens, so 7 sequences; a beam of 4 keeps
    every live one, so the search must return the best under the length penalty."""
    model = make(vocab=5, layers=1, seed=3, scale=3.0, options={"max_target_length": 4})
    src, src_mask, _ = batch(vocab=5, b=1)
    search = Search(beam=4, max_length=3, lenpen=lenpen)
    out = translate(model, src, src_mask, search)
    words = (1, 4)  # UNK and w can be generated; PAD and BOS cannot
    seqs = [(*w, EOS) for n in range(3) for w in itertools.product(words, repeat=n)]
    logprobs = _sequence_logprobs(model, src, src_mask, seqs)
    scored = {s: lp / len(s) ** lenpen for s, lp in zip(seqs, logprobs, strict=True)}
    best = max(scored, key=scored.get)
    n = int(out["lengths"][0])
    assert tuple(np.asarray(out["tokens"][0, :n])) == best, (scored, out)
    np.testing.assert_allclose(float(out["scores"][0]), scored[best], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lenpen", [0.0, 1.0])
def test_beam_one_is_greedy(lenpen):
    """fairseq's rule (stop="first") with beam 1 is greedy search under any length penalty;
    the exact search (stop="bound") may find a better-scoring sentence than greedy."""
    model = make(seed=4, scale=2.0)
    src, src_mask, _ = batch()
    greedy = translate(model, src, src_mask, Search(1, 7, lenpen, greedy=True))
    first = Search(beam=1, max_length=7, lenpen=lenpen, stop="first")
    beam = translate(model, src, src_mask, first)
    np.testing.assert_array_equal(beam["tokens"], greedy["tokens"])
    np.testing.assert_array_equal(beam["lengths"], greedy["lengths"])
    np.testing.assert_allclose(beam["scores"], greedy["scores"], rtol=1e-5)
    exact = translate(model, src, src_mask, Search(beam=1, max_length=7, lenpen=lenpen))
    assert np.all(np.asarray(exact["scores"]) >= np.asarray(greedy["scores"]) - 1e-5)


def test_limits_force_eos_and_the_model_is_left_as_it_was():
    model = make(seed=5, scale=2.0)
    src, src_mask, tgt = batch()
    before = model(src, src_mask, tgt)["logits"]
    search = Search(beam=3, max_length=7, max_len_a=0.0, max_len_b=2)
    out = translate(model, src, src_mask, search)
    assert np.all(np.asarray(out["lengths"]) <= 2)
    for row, n in zip(np.asarray(out["tokens"]), np.asarray(out["lengths"]), strict=True):
        assert row[n - 1] == EOS and np.all(row[n:] == 0)
    np.testing.assert_array_equal(model(src, src_mask, tgt)["logits"], before)


def test_search_errors_are_one_clear_line():
    model = make(vocab=5)
    src, src_mask, _ = batch(vocab=5)
    with pytest.raises(ValueError, match="wider than the vocabulary"):
        translate(model, src, src_mask, Search(beam=6))
    with pytest.raises(ValueError, match="translation.positions"):
        make(options={"positions": "rotary"})
    with pytest.raises(ValueError, match="exceed model.max_position_embeddings"):
        make(options={"max_source_length": 40})


@pytest.mark.parametrize("greedy", [True, False])
def test_the_cached_search_equals_recomputing_the_prefix(greedy):
    """The caches change the work, not the result: the search without them (the benchmark's
    baseline) decodes the same tokens with the same scores."""
    model = make(seed=6, scale=2.0, scan_layers=True)
    src, src_mask, _ = batch()
    beam = 1 if greedy else 3
    cached = translate(model, src, src_mask, Search(beam, 7, greedy=greedy))
    again = translate(model, src, src_mask, Search(beam, 7, greedy=greedy, cache=False))
    np.testing.assert_array_equal(again["tokens"], cached["tokens"])
    np.testing.assert_allclose(again["scores"], cached["scores"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_search_sharded_over_data_equals_one_device(beam):
    """Sources sharded over 4 data x 2 fsdp devices decode to the single device's tokens, and
    the result stays sharded by rows (each device searches its own sentences)."""
    src, mask, _ = batch(b=8, s=6)
    search = Search(beam=beam, max_length=7, greedy=beam == 1, max_len_a=0, max_len_b=7)
    one = translate(make(scale=3.0), src, mask, search)
    mesh = sharding.make_mesh(4, 2, 1)
    with sharding.use_mesh(mesh):
        model = make(scale=3.0)
        where = sharding.batch_sharding(mesh)
        out = translate(model, jax.device_put(src, where), jax.device_put(mask, where), search)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), np.asarray(one["tokens"]))
    np.testing.assert_allclose(np.asarray(out["scores"]), np.asarray(one["scores"]), atol=1e-5)
    assert out["tokens"].sharding.spec[0] == sharding.batch_spec()[0]
    assert len({str(s.index) for s in out["tokens"].addressable_shards}) == 8


def test_fairseq_init_halves_the_qkv_variance_and_keeps_the_rest_xavier():
    """init="fairseq": q, k, v as slices of fairseq's packed [3d, d] in-projection (uniform,
    bound sqrt(6 / 4d), Var 1/(2d)), every other kernel Xavier (Var 2 / (fan_in + fan_out))."""
    d, ffn = 64, 256
    kw = dict(hidden_size=d, num_heads=4, mlp_dim=ffn)
    fair, xav = make(vocab=40, init="fairseq", **kw), make(vocab=40, **kw)
    attn = fair.encoder.layers[0].attention.branch
    cross = fair.decoder.layers[0].cross_attention.branch
    for dense in (attn.query, attn.key, attn.value, cross.key, cross.value):
        w = np.asarray(dense.kernel[...])
        assert np.abs(w).max() <= math.sqrt(6 / (4 * d)) + 1e-7
        assert w.var() == pytest.approx(1 / (2 * d), rel=0.1)
    assert np.asarray(attn.out.kernel[...]).var() == pytest.approx(1 / d, rel=0.1)
    ffn_in = np.asarray(fair.encoder.layers[0].ffn.branch.wi.kernel[...])
    assert ffn_in.var() == pytest.approx(2 / (d + ffn), rel=0.1)
    # "xavier" keeps Var 1/d on q, k and v
    q = np.asarray(xav.encoder.layers[0].attention.branch.query.kernel[...])
    assert q.var() == pytest.approx(1 / d, rel=0.1)
