"""The fused attention kernel (`ln_jax.nn.flash`, Pallas; here in Pallas's interpreter) and the
counter-hash dropout bits (`ln_jax.nn.random`): the kernel computes the reference function
(forward and gradients, dropout, padding, causal, several blocks, odd sizes), its masks come
from the step's key alone (also on a sharded mesh), and a model on it trains as on XLA's."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest

import ln_jax
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.nn import flash, layers
from ln_jax.nn import random as lnr
from ln_jax.runtime import platforms
from ln_jax.train import steps

pytest_plugins = ("tests.data_fixtures",)


def _qkv(seed, b, t, s, n, h, dtype=jnp.float32):
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (b, t, n, h), dtype)
    k = jax.random.normal(kk, (b, s, n, h), dtype)
    v = jax.random.normal(kv, (b, s, n, h), dtype)
    return q, k, v, jax.random.normal(kg, (b, t, n, h), dtype)


def _valid(lengths, s):
    return jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None]


def _value_and_grads(fn, q, k, v, g):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(g))


@pytest.mark.parametrize(
    "b, t, s, n, h, causal, rate, lengths",
    [
        (2, 128, 128, 2, 64, False, 0.1, (128, 57)),  # BERT's block, padding, dropout
        (2, 256, 256, 1, 32, True, 0.1, None),  # two blocks each way, causal (a decoder)
        (2, 40, 72, 2, 24, False, 0.2, (72, 5)),  # cross-attention lengths, odd head size
    ],
)
def test_the_kernel_computes_the_reference_function_and_its_gradients(
    b, t, s, n, h, causal, rate, lengths
):
    q, k, v, g = _qkv(0, b, t, s, n, h)
    valid = None if lengths is None else _valid(lengths, s)
    key = jax.random.key(7)
    opts = dict(causal=causal, dropout_rate=rate, dropout_key=key)
    got = _value_and_grads(lambda *a: flash.flash_attention(*a, valid, **opts), q, k, v, g)
    ref = _value_and_grads(lambda *a: flash.reference_attention(*a, valid, **opts), q, k, v, g)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref, strict=False):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5, err_msg=name)
    no_drop = flash.reference_attention(q, k, v, valid, causal=causal)
    assert float(jnp.abs(got[0] - no_drop).max()) > 0.1  # the dropout did act


@pytest.mark.parametrize("t, fused", [(128, True), (128, False), (256, False)])
def test_the_kernel_adds_the_projection_biases_and_returns_their_gradients(t, fused):
    """q + bq, k + bk, v + bv inside the kernel (both backward forms, one and two blocks): the
    reference on the biased inputs, and each bias's gradient is its input's summed."""
    q, k, v, g = _qkv(1, 2, t, t, 2, 32)
    biases = tuple(jax.random.normal(jax.random.key(i), (2, 32)) for i in (11, 12, 13))
    valid = _valid((t, 50), t)
    opts = dict(dropout_rate=0.1, dropout_key=jax.random.key(3))
    tuning = flash.Tuning(fused_backward=fused)

    def kernel(q, k, v, bq, bk, bv):
        return flash.flash_attention(q, k, v, valid, biases=(bq, bk, bv), tuning=tuning, **opts)

    def reference(q, k, v, bq, bk, bv):
        return flash.reference_attention(q + bq, k + bk, v + bv, valid, **opts)

    got_out, got_vjp = jax.vjp(kernel, q, k, v, *biases)
    ref_out, ref_vjp = jax.vjp(reference, q, k, v, *biases)
    np.testing.assert_allclose(np.asarray(got_out), np.asarray(ref_out), atol=2e-5)
    names = ("dq", "dk", "dv", "dbq", "dbk", "dbv")
    for name, x, y in zip(names, got_vjp(g), ref_vjp(g), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-4, err_msg=name)
    unbiased = flash.flash_attention(q, k, v, valid, tuning=tuning, **opts)
    assert float(jnp.abs(unbiased - got_out).max()) > 0.1  # the biases did act


def test_without_dropout_the_kernel_equals_jax_attention():
    """An independent reference: `jax.nn.dot_product_attention` with the same key mask."""
    q, k, v, _ = _qkv(1, 3, 64, 64, 2, 32)
    valid = _valid((64, 20, 1), 64)
    ours = flash.flash_attention(q, k, v, valid)
    theirs = jax.nn.dot_product_attention(q, k, v, mask=valid[:, None, None, :])
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6)


def test_the_masks_drop_the_rate_and_are_a_function_of_the_key():
    cols = jnp.arange(128, dtype=jnp.int32)[None, :]
    seeds = flash.row_seeds(jax.random.key(3), 8, 12, 128)[..., None]
    keep = lnr.keep_mask(seeds, cols, 0.1)
    assert abs(lnr.drop_fraction(keep) - 0.1) < 0.003  # 1.6M entries: sd 0.0002
    again = lnr.keep_mask(flash.row_seeds(jax.random.key(3), 8, 12, 128)[..., None], cols, 0.1)
    assert bool((keep == again).all())
    other = lnr.keep_mask(flash.row_seeds(jax.random.key(4), 8, 12, 128)[..., None], cols, 0.1)
    assert abs(float((keep != other).mean()) - 2 * 0.1 * 0.9) < 0.003  # independent masks
    row = np.asarray(keep[0, 0], np.float32).ravel()
    assert abs(np.corrcoef(row[:-1], row[1:])[0, 1]) < 0.02  # neighbours uncorrelated


def test_sharded_kernel_equals_unsharded_and_gathers_nothing():
    """data=2, fsdp=2, tensor=2: batch and heads split, one kernel per shard (shard_map); the
    masks are drawn for the global batch, so the sharded step computes the same numbers. The
    biases' gradients (split by head only) are summed over the batch's shards."""
    q, k, v, _ = _qkv(2, 4, 32, 32, 4, 16)
    biases = [jax.random.normal(jax.random.key(i), (4, 16)) for i in (21, 22, 23)]
    valid = _valid((32, 9, 32, 17), 32)
    key = jax.random.key(5)

    def loss(q, k, v, *biases):
        out = flash.flash_attention(
            q, k, v, valid, dropout_rate=0.1, dropout_key=key, biases=tuple(biases)
        )
        return jnp.sum(out * jnp.cos(out))

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5)))
    want = fn(q, k, v, *biases)
    mesh = sharding.make_mesh(2, 2, 2)
    with sharding.use_mesh(mesh):
        spec = sharding.named_sharding(mesh, ("act_batch", None, "act_heads", None))
        heads = sharding.named_sharding(mesh, ("act_heads", None))
        args = [jax.device_put(x, spec) for x in (q, k, v)]
        args += [jax.device_put(x, heads) for x in biases]
        got = fn(*args)
        hlo = fn.lower(*args).compile().as_text()
    assert "all-gather" not in hlo
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=False):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def _model_loss(impl, rate):
    from flax import nnx

    from ln_jax.models.bert import model as bert
    from tests.test_models import ODD, batch, randomize

    ids, seg, mask, pos = batch(np.random.default_rng(9), t=16, pad_from=(16, 11, 5))
    tgt = {
        "masked_ids": jnp.asarray(ids[np.arange(3)[:, None], pos]),
        "masked_weights": jnp.ones(pos.shape),
    }
    shape = dict(ODD, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, dtype="float32")
    cfg = ln_jax.ModelConfig(**shape, attention_impl=impl, attention_dropout=rate)
    # random q/k/v biases (and all else): the kernel adds them on the Pallas path
    graphdef, state = nnx.split(randomize(ln_jax.create_model(cfg), seed=4))

    def loss(state, key):
        out = nnx.merge(graphdef, state)(ids, seg, mask, pos, dropout_key=key)
        return bert.pretraining_loss(out, tgt, use_nsp=False)[0]

    return jax.jit(jax.value_and_grad(loss)), state


def test_a_model_on_the_kernel_equals_xla_without_attention_dropout():
    """Hidden dropout on, attention dropout off: the same loss and gradients under each key."""
    losses = {}
    for impl in ("xla", "pallas"):
        fn, state = _model_loss(impl, 0.0)
        losses[impl] = [fn(state, jax.random.key(i)) for i in range(2)]
    for (lx, gx), (lp, gp) in zip(losses["xla"], losses["pallas"], strict=False):
        np.testing.assert_allclose(float(lp), float(lx), rtol=1e-5)
        for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gx), strict=False):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_a_model_with_kernel_dropout_is_reproducible_per_key():
    fn, state = _model_loss("pallas", 0.1)
    a, b, c = (float(fn(state, jax.random.key(i))[0]) for i in (0, 0, 1))
    assert a == b and a != c
    assert np.isfinite(a)


def test_hash_bits_are_uniform_fused_and_keyed():
    key = steps.dropout_key(dataclasses.replace(TrainConfig(), dropout_rng="hash"), 3)
    assert str(jax.random.key_impl(key)) == "ln_jax_hash"
    u = np.asarray(jax.random.uniform(key, (200_000,)))
    assert abs(u.mean() - 0.5) < 0.003 and abs(u.var() - 1 / 12) < 0.001
    m = jax.random.bernoulli(key, 0.9, (64, 32, 48))
    assert abs(lnr.drop_fraction(m) - 0.1) < 0.01
    other = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.9, (64, 32, 48))
    assert abs(float((m != other).mean()) - 0.18) < 0.01
    # No random-bits op: integer arithmetic on iotas, which XLA fuses into the user.
    text = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (8, 16))).lower(key).as_text()
    assert "rng_bit_generator" not in text and "threefry" not in text.lower()


def _draws(jaxpr) -> int:
    """How many random_bits ops `jaxpr` and the programs it calls hold."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "random_bits"
        count += sum(_draws(sub) for sub in jex_core.jaxprs_in_params(eqn.params))
    return count


def test_on_a_gpu_the_dropout_backward_draws_its_hash_mask_again(monkeypatch):
    """On a GPU, with hash keys, `layers.dropout`'s backward draws its mask from the key again
    instead of keeping it (XLA:GPU stored every hidden mask of a step otherwise): two draws
    where autodiff has one, and the same output, gradient and Hessian, bit for bit."""
    key = steps.dropout_key(dataclasses.replace(TrainConfig(), dropout_rng="hash"), 3)
    x, g = (jax.random.normal(jax.random.key(i), (4, 16, 32), jnp.bfloat16) for i in (0, 1))

    runs = {}
    for platform in ("cpu", "gpu"):
        monkeypatch.setattr(platforms, "current", lambda platform=platform: platform)

        def value_and_grad(x, g):  # a function of its own per platform: JAX caches traces
            out, vjp = jax.vjp(lambda x: layers.dropout(x, 0.1, key), x)
            return out, vjp(g)[0]

        def curvature(x):  # forward-over-reverse through the custom VJP
            return jax.hessian(lambda x: jnp.sin(layers.dropout(x, 0.3, key)).sum())(x)

        draws = _draws(jax.make_jaxpr(value_and_grad)(x, g).jaxpr)
        small = x[0, :2, :3].astype(jnp.float32)
        runs[platform] = (draws, (*value_and_grad(x, g), curvature(small)))
    assert (runs["cpu"][0], runs["gpu"][0]) == (1, 2)
    for kept, drawn in zip(runs["cpu"][1], runs["gpu"][1], strict=True):
        np.testing.assert_array_equal(np.asarray(kept, np.float32), np.asarray(drawn, np.float32))
    assert float(jnp.mean(runs["gpu"][1][1] == 0)) > 0.05  # the mask did act on the gradient


def test_pallas_attention_on_a_tpu_is_an_error(monkeypatch, data_dir):
    from ln_jax.train.setup import setup
    from ln_jax.validate import ConfigError
    from tests.test_trainer import tiny_config

    cfg = tiny_config(data_dir, **{"model.attention_impl": "pallas"})
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ConfigError, match="Triton kernel for NVIDIA GPUs"):
        setup(cfg)


def test_the_fused_and_split_backwards_agree():
    """One (batch, head) program for dq, dk, dv (lengths <= 128) against the two-kernel form."""
    q, k, v, g = _qkv(4, 2, 128, 128, 2, 32)
    valid = _valid((128, 70), 128)
    grads = {}
    for fused in (True, False):
        opts = dict(dropout_rate=0.1, dropout_key=jax.random.key(2))
        tuning = flash.Tuning(fused_backward=fused)
        fn = lambda *a, tuning=tuning, opts=opts: flash.flash_attention(  # noqa: E731
            *a, valid, tuning=tuning, **opts
        )
        grads[fused] = _value_and_grads(fn, q, k, v, g)
    for x, y in zip(grads[True], grads[False], strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def _reductions(jaxpr) -> list[tuple[int, ...]]:
    """The operand shapes of every reduce_sum in `jaxpr` and the programs it calls, outside
    Pallas kernels (what XLA would run as kernels of its own)."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            continue
        if eqn.primitive.name == "reduce_sum":
            shapes.append(tuple(eqn.invars[0].aval.shape))
        for sub in jex_core.jaxprs_in_params(eqn.params):
            shapes += _reductions(sub)
    return shapes


@pytest.mark.parametrize("t, fused", [(128, True), (256, False)])
def test_the_biases_gradients_do_not_read_dq_dk_dv_again(t, fused):
    """Each backward program writes its block's column sums, so the biases' gradients sum
    [B, N, blocks, H] partials: no reduction over a [B, T, N, H] gradient runs outside the
    kernels (one did before: 36 passes of 50 MB a BERT-base step on a GPU)."""
    q, k, v, g = _qkv(1, 2, t, t, 2, 32)
    biases = tuple(jnp.zeros((2, 32)) for _ in range(3))
    tuning = flash.Tuning(fused_backward=fused)

    def bias_grads(biases):
        attend = lambda b: flash.flash_attention(q, k, v, biases=b, tuning=tuning)  # noqa: E731
        return jax.vjp(attend, biases)[1](g)

    shapes = _reductions(jax.make_jaxpr(bias_grads)(biases).jaxpr)
    assert shapes, "no reduction found: the walk missed the backward"
    assert all(np.prod(s) < q.size for s in shapes), shapes
