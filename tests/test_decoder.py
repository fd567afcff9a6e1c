"""The decoder stack: causal self-attention, cross-attention, incremental decoding with caches,
sub-layer lists and DeepNorm's encoder-decoder constants."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.config.run import ModelConfig
from ln_jax.nn import flash
from ln_jax.nn.attention import Attention
from ln_jax.nn.blocks import DecoderLayer, EncoderLayer, StackDepth
from ln_jax.nn.init import deepnorm_constants
from ln_jax.nn.placements import PLACEMENTS
from ln_jax.nn.stack import Decoder, Encoder, end_decoding, init_decoding

B, T, S, D = 2, 6, 5, 16


@pytest.fixture(autouse=True)
def _one_device_mesh():
    """Modules are built inside a mesh (their parameters carry logical shardings)."""
    with sharding.use_mesh(sharding.single_device_mesh()):
        yield


def _cfg(**kw) -> ModelConfig:
    base = dict(
        size="custom",
        vocab_size=32,
        hidden_size=D,
        num_heads=2,
        mlp_dim=32,
        num_layers=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init="xavier",
    )
    return ModelConfig(**{**base, **kw})


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    memory = jnp.asarray(rng.normal(size=(B, S, D)), jnp.float32)
    memory_mask = jnp.asarray([[1] * S, [1] * 3 + [0] * (S - 3)], jnp.int32)
    return x, memory, memory_mask


def _perturb_omega(decoder: Decoder) -> None:
    """Admin's ω starts at 1 (before profiling): move it so the skip scale is exercised."""
    for path, p in nnx.iter_graph(decoder):
        if path and path[-1] == "omega":
            p[...] = p[...] * 1.7


def _incremental(decoder: Decoder, x, memory, memory_mask, chunks=(1,)) -> jax.Array:
    init_decoding(decoder, B, T, memory, memory_mask)
    outs, t, i = [], 0, 0
    while t < T:
        n = min(chunks[i % len(chunks)], T - t)
        y, _ = decoder(x[:, t : t + n])
        outs.append(y)
        t, i = t + n, i + 1
    end_decoding(decoder)
    return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize(("placement", "scan"), [("post", False), ("admin", True), ("lns", False)])
def test_incremental_decoding_equals_the_full_decoder(placement, scan):
    """Chunks of several positions too (every placement, jitted: test_translation_model.py)."""
    cfg = _cfg(placement=placement, scan_layers=scan)
    decoder = Decoder(cfg, rngs=nnx.Rngs(params=1))
    _perturb_omega(decoder)
    x, memory, memory_mask = _inputs()
    full, _ = decoder(x, memory=memory, memory_mask=memory_mask)
    step = _incremental(decoder, x, memory, memory_mask)
    np.testing.assert_allclose(step, full, atol=1e-5, rtol=1e-5)
    chunked = _incremental(decoder, x, memory, memory_mask, chunks=(2, 1, 3))
    np.testing.assert_allclose(chunked, full, atol=1e-5, rtol=1e-5)
    again, _ = decoder(x, memory=memory, memory_mask=memory_mask)  # training form is back
    np.testing.assert_array_equal(again, full)


def test_decoding_under_jit_carries_the_caches_as_state():
    cfg = _cfg(placement="pre", scan_layers=True)
    decoder = Decoder(cfg, rngs=nnx.Rngs(params=1))
    x, memory, memory_mask = _inputs()
    full, _ = decoder(x, memory=memory, memory_mask=memory_mask)
    init_decoding(decoder, B, T, memory, memory_mask)
    graphdef, params, caches = nnx.split(decoder, nnx.Param, nnx.Cache)

    @jax.jit
    def step(params, caches, token):
        model = nnx.merge(graphdef, params, caches)
        y, _ = model(token)
        return y, nnx.state(model, nnx.Cache)

    outs = []
    for t in range(T):
        y, caches = step(params, caches, x[:, t : t + 1])
        outs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_a_target_token_changes_no_output_before_it():
    decoder = Decoder(_cfg(placement="post"), rngs=nnx.Rngs(params=2))
    x, memory, memory_mask = _inputs()
    y, _ = decoder(x, memory=memory, memory_mask=memory_mask)
    t = 3
    changed = x.at[:, t].add(1.0)
    y2, _ = decoder(changed, memory=memory, memory_mask=memory_mask)
    np.testing.assert_array_equal(y2[:, :t], y[:, :t])
    assert float(jnp.abs(y2[:, t:] - y[:, t:]).max()) > 1e-3


def test_cross_attention_reads_the_real_memory_only():
    decoder = Decoder(_cfg(placement="pre"), rngs=nnx.Rngs(params=3))
    x, memory, memory_mask = _inputs()
    y, _ = decoder(x, memory=memory, memory_mask=memory_mask)
    padded = memory.at[1, 3:].set(100.0)  # sequence 1 has 3 real memory positions
    y_pad, _ = decoder(x, memory=padded, memory_mask=memory_mask)
    np.testing.assert_array_equal(y_pad, y)
    real = memory.at[1, 0].add(1.0)
    y_real, _ = decoder(x, memory=real, memory_mask=memory_mask)
    np.testing.assert_array_equal(y_real[0], y[0])  # the other sequence is untouched
    assert float(jnp.abs(y_real[1] - y[1]).max()) > 1e-3


def test_layers_are_lists_of_named_sublayers():
    cfg = _cfg()
    rule = PLACEMENTS["post"]
    dec = DecoderLayer(cfg, rule, rngs=nnx.Rngs(params=0))
    enc = EncoderLayer(cfg, rule, rngs=nnx.Rngs(params=0))
    assert [n for n, _ in dec.sublayers()] == ["self_attention", "cross_attention", "ffn"]
    assert [n for n, _ in enc.sublayers()] == ["attention", "ffn"]
    kinds = [s.branch.kind for _, s in dec.sublayers()[:2]]
    assert kinds == ["causal", "cross"]
    assert dec.cross_attention.branch.reads == ("memory", "memory_mask")
    x, memory, memory_mask = _inputs()
    _, rec = dec(x, memory=memory, memory_mask=memory_mask, record=True)
    assert {"self_attention/output", "cross_attention/branch_out", "ffn/post_norm_in"} <= set(rec)


@pytest.mark.parametrize("kind", ["causal", "cross"])
def test_the_pallas_kernel_equals_xla_in_the_decoder(kind):
    if flash.triton_missing() and jax.default_backend() != "cpu":
        pytest.skip(flash.triton_missing())
    x, memory, memory_mask = _inputs()
    outs = {}
    for impl in ("xla", "pallas"):
        cfg = _cfg(attention_impl=impl, attention_dropout=0.0)
        attention = Attention(cfg, kind=kind, rngs=nnx.Rngs(params=4))
        outs[impl] = attention(x, mask=None, memory=memory, memory_mask=memory_mask)
    np.testing.assert_allclose(outs["pallas"], outs["xla"], atol=2e-5, rtol=2e-5)


def test_attention_probabilities_are_what_the_module_computes():
    """The monitor reads the attention from the module: its probabilities times the values,
    projected, are the module's output."""
    cfg = _cfg(qk_norm=True)
    x, memory, memory_mask = _inputs()
    for kind in ("self", "causal", "cross"):
        a = Attention(cfg, kind=kind, rngs=nnx.Rngs(params=5))
        mask = memory_mask[:, :1].repeat(T, 1)  # all tokens real
        probs = a.probabilities(x, mask, memory, memory_mask)
        _, v = a.keys_values(memory if kind == "cross" else x)
        ctx = jnp.einsum("bnts,bsnh->btnh", probs, v)
        out = a(x, mask=mask, memory=memory, memory_mask=memory_mask)
        np.testing.assert_allclose(a.out(ctx), out, atol=1e-5, rtol=1e-5)
        if kind == "causal":
            assert float(jnp.triu(probs[0, 0], 1).max()) == 0.0
        if kind == "cross":
            assert float(probs[1, :, :, 3:].max()) == 0.0


def test_deepnorm_constants_of_the_encoder_decoder():
    """Wang et al. 2022, Table 1: N encoder and M decoder layers."""
    c = deepnorm_constants(6, 6)
    np.testing.assert_allclose(
        c["encoder"], (0.81 * (6**5) ** (1 / 16), 0.87 * (6**5) ** -(1 / 16))
    )
    np.testing.assert_allclose(c["decoder"], ((18.0) ** 0.25, (72.0) ** -0.25))
    np.testing.assert_allclose(deepnorm_constants(12)["encoder"], (24**0.25, 96**-0.25))
    cfg = _cfg(placement="deepnorm", num_layers=6)
    depth = StackDepth.of("decoder", 18, 6)
    decoder = Decoder(cfg, rngs=nnx.Rngs(params=0), depth=depth)
    plain = Decoder(cfg.replace(placement="post"), rngs=nnx.Rngs(params=0))
    assert decoder.layers[0].cross_attention.alpha == pytest.approx(18.0**0.25)
    ratio = decoder.layers[0].ffn.branch.wo.kernel[...] / plain.layers[0].ffn.branch.wo.kernel[...]
    np.testing.assert_allclose(ratio, 72.0**-0.25, rtol=1e-5)
    encoder = Encoder(cfg, rngs=nnx.Rngs(params=0), depth=StackDepth.of("encoder", 6, 6))
    assert encoder.layers[0].attention.alpha == pytest.approx(c["encoder"][0])


def test_admin_closed_form_counts_each_stacks_sublayers():
    cfg = _cfg(placement="admin", admin_omega="closed_form", num_layers=4)
    decoder = Decoder(cfg, rngs=nnx.Rngs(params=0))
    encoder = Encoder(cfg, rngs=nnx.Rngs(params=0))
    n_dec, n_enc = 13, 9  # 3 x 4 + 1, 2 x 4 + 1
    want = lambda n: np.sqrt(n / np.log(n) - 1)
    np.testing.assert_allclose(decoder.layers[0].ffn.omega[...][0], want(n_dec), rtol=1e-6)
    np.testing.assert_allclose(encoder.layers[0].ffn.omega[...][0], want(n_enc), rtol=1e-6)
