"""The beam search's fast path equals the plain computation it replaces: the `BeamCache`
(keys/values never moved, an ancestry table reordered) equals per-hypothesis caches gathered
at every reorder, and `_top_tokens` holds the top 2k of the full log_softmax with PAD/BOS
banned and EOS forced at the limit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.config.run import ModelConfig
from ln_jax.models.translation import search as S
from ln_jax.models.translation.model import Translator
from ln_jax.models.translation.options import Specials, TranslationOptions
from ln_jax.nn.attention import BeamCache, beam_cache
from ln_jax.nn.stack import init_decoding


@pytest.fixture(autouse=True)
def _one_device_mesh():
    with sharding.use_mesh(sharding.single_device_mesh()):
        yield


def make(scan_layers: bool) -> Translator:
    cfg = ModelConfig(
        size="custom", vocab_size=13, hidden_size=16, num_heads=2, mlp_dim=32, num_layers=2,
        hidden_dropout=0.0, attention_dropout=0.0, init="xavier", activation="relu",
        max_position_embeddings=32, embedding_layernorm=False, scan_layers=scan_layers,
    )  # fmt: skip
    opts = TranslationOptions.from_mapping({"max_source_length": 8, "max_target_length": 8}, cfg)
    model = Translator(cfg, opts, rngs=nnx.Rngs(params=1))
    for _, var in nnx.iter_graph(model):  # sharper attention: differences show
        if isinstance(var, nnx.Param) and var[...].ndim >= 2:
            var[...] = var[...] * 2.0
    return model


@pytest.mark.parametrize("scan_layers", [False, True])
def test_beam_cache_equals_gathered_caches(scan_layers):
    """Random tokens and random reorders for 6 steps: the same logits both ways."""
    b, k, n = 3, 4, 6
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(4, 13, (b, 5)), jnp.int32)
    mask = jnp.asarray(np.arange(5)[None] < np.array([[5], [3], [4]]), jnp.int32)
    plain, beams = make(scan_layers), make(scan_layers)
    for model in (plain, beams):
        memory, _ = model.encode(src, mask)
        init_decoding(model.decoder, b * k, n, memory, mask)
    for attention in S._self_attentions(beams):
        attention.set_cache(beam_cache(attention.cache, k))
        assert isinstance(attention.cache, BeamCache)
    axis = 1 if scan_layers else 0
    for t in range(n):
        tokens = jnp.asarray(rng.integers(1, 13, (b * k, 1)), jnp.int32)
        want, _ = plain.decode(tokens, None, None, offset=t)
        got, _ = beams.decode(tokens, None, None, offset=t)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
        parents = jnp.asarray(rng.integers(0, k, (b, k)), jnp.int32)
        rows = (jnp.arange(b)[:, None] * k + parents).reshape(-1)
        for attention in S._self_attentions(plain):
            c = attention.cache
            c.key[...] = jnp.take(c.key[...], rows, axis=axis)
            c.value[...] = jnp.take(c.value[...], rows, axis=axis)
        graphdef, caches, rest = nnx.split(beams, nnx.Cache, ...)
        carry = S._reorder(graphdef, {"caches": caches, "rest": rest}, parents)
        nnx.update(beams, carry["caches"])


def test_top_tokens_hold_the_top_of_the_full_log_softmax():
    ids = Specials(pad=5, bos=2, eos=0)
    rows, v, n = 12, 50, 10
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(rows, v)) * 3.0, jnp.float32)
    logits = logits.at[:4, ids.pad].set(20.0).at[4:6, ids.bos].set(20.0)  # banned ones on top
    at_limit = jnp.asarray(np.arange(rows) % 5 == 4)
    logp = jax.nn.log_softmax(logits, -1)
    vocab = jnp.arange(v)
    logp = jnp.where((vocab == ids.pad) | (vocab == ids.bos), S.NEG, logp)
    logp = jnp.where(at_limit[:, None] & (vocab != ids.eos), S.NEG, logp)
    want, want_tokens = jax.lax.top_k(logp, n)
    cand, tokens = S._top_tokens(logits, n, at_limit, ids)
    got, pick = jax.lax.top_k(cand, n)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-5)
    real = np.asarray(want) > S.NEG / 2  # the NEG ones' tokens do not matter
    got_tokens = np.asarray(jnp.take_along_axis(tokens, pick, -1))
    np.testing.assert_array_equal(got_tokens[real], np.asarray(want_tokens)[real])
