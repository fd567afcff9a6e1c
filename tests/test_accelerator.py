"""Accelerator paths checked on CPU (issue 18): padding as sequence lengths (the form cuDNN
takes), cuDNN's limits as config errors, float32 logits from bf16 matmuls, the logsumexp MLM
loss, and the dropout PRNG choice. The cuDNN kernel itself runs where a GPU is present."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import ln_jax
from ln_jax.config.run import RNG_IMPLS, TrainConfig
from ln_jax.models.bert import model as bert
from ln_jax.nn import attention, layers
from ln_jax.train import steps
from tests import reference
from tests.test_models import ODD, batch, build

pytest_plugins = ("tests.data_fixtures",)

HAS_GPU = jax.default_backend() == "gpu"


def _qkv(seed: int, dtype=jnp.float32, b=4, t=10, n=2, h=8):
    keys = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (b, t, n, h), dtype) for k in keys]


def _right_padded(lengths, t=10):
    return (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int32)


def test_sequence_lengths_mask_the_same_keys_as_the_boolean_mask():
    q, k, v = _qkv(0)
    mask = _right_padded([10, 7, 3, 1])
    lengths = attention.sequence_lengths(mask)
    np.testing.assert_array_equal(lengths, [10, 7, 3, 1])
    by_lengths = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths)
    by_mask = jax.nn.dot_product_attention(q, k, v, mask=attention.attention_mask(mask))
    np.testing.assert_allclose(by_lengths, by_mask, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(attention.key_mask(lengths, 10), attention.attention_mask(mask))
    # A padded key changes nothing: the keys past each length are ignored.
    k2 = k.at[1, 7:].set(100.0)
    np.testing.assert_allclose(
        jax.nn.dot_product_attention(q, k2, v, key_value_seq_lengths=lengths), by_lengths, atol=1e-6
    )


def test_the_model_ignores_padding_through_sequence_lengths():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, attention_dropout=0.0, hidden_dropout=0.0)
    model = build(cfg)
    ids, seg, mask, pos = batch(np.random.default_rng(3))
    out = model(ids, seg, mask, pos)["mlm_logits"]
    noisy = np.where(mask > 0, ids, 7)  # other tokens in the padding
    np.testing.assert_allclose(model(noisy, seg, mask, pos)["mlm_logits"], out, atol=1e-5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dtype": "float32", "attention_dropout": 0.0}, "needs model.dtype bfloat16 or float16"),
        ({"dtype": "bfloat16", "attention_dropout": 0.1}, "attention dropout is not usable"),
        ({"dtype": "bfloat16", "attention_dropout": 0.0, "hidden_size": 640, "num_heads": 4},
         "multiple of 8 up to 128"),
    ],
)  # fmt: skip
def test_cudnn_settings_that_cannot_work_are_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        ln_jax.ModelConfig.from_mapping({"size": "tiny", "attention_impl": "cudnn", **overrides})
    ok = {"size": "tiny", "attention_impl": "cudnn", "dtype": "bfloat16", "attention_dropout": 0}
    assert ln_jax.ModelConfig.from_mapping(ok).attention_impl == "cudnn"
    scan = {**ok, "scan_layers": True, "remat": "full"}
    assert ln_jax.ModelConfig.from_mapping(scan).attention_impl == "cudnn"


NO_ATTENTION_DROPOUT = {"model.attention_dropout": 0.0}


@pytest.mark.parametrize(
    "on, extra, expected",
    [
        ("cpu", {}, ("float32", "xla", "hash")),
        ("gpu", {}, ("bfloat16", "pallas", "hash")),  # the recipe's attention dropout: Pallas
        ("gpu", NO_ATTENTION_DROPOUT, ("bfloat16", "cudnn", "hash")),
        ("tpu", {}, ("bfloat16", "xla", "hash")),  # rbg before: docs/tpu.md
        ("gpu", {**NO_ATTENTION_DROPOUT, "model.dtype": "float32"}, ("float32", "xla", "hash")),
        ("gpu", {"model.dtype": "float32"}, ("float32", "xla", "hash")),
        ("gpu", {"model.hidden_size": 1280, "model.num_heads": 4}, ("bfloat16", "xla", "hash")),
        ("gpu", {"dropout_rng": "rbg"}, ("bfloat16", "pallas", "rbg")),
    ],
)  # fmt: skip
def test_auto_fields_resolve_by_platform_into_the_config(monkeypatch, on, extra, expected):
    """dtype / attention_impl / dropout_rng / activation_layout "auto" become the platform's
    choice when the config is built, so config.json (the run's identity) holds the resolved
    values."""
    from ln_jax.config import run as config
    from ln_jax.config.load import build_config, load_config, override
    from ln_jax.train import run_identity

    monkeypatch.setattr(config, "platform", lambda: on)
    values = override(load_config("configs/bert_preln.py:tiny"), extra)
    assert values["model"]["dtype"] == "auto" or "model.dtype" in extra
    cfg = build_config(values)
    assert (cfg.model.dtype, cfg.model.attention_impl, cfg.dropout_rng) == expected
    # the residual stream pinned row-major on a GPU (measured faster there), XLA's elsewhere
    assert cfg.model.activation_layout == ("row_major" if on == "gpu" else "xla")
    saved = run_identity.as_dict(cfg)  # what config.json holds
    assert saved["model"]["dtype"] == expected[0] and saved["dropout_rng"] == expected[2]
    assert '"auto"' not in json.dumps(saved)


def test_the_decoder_backward_multiplies_in_the_compute_dtype():
    """bert.decode: float32 logits from bf16 operands; its backward's two matmuls take bf16
    operands (autodiff's would take the float32 cotangent: a TF32 GEMM on a GPU); in float32
    its gradients are autodiff's exactly, in bf16 within bf16 rounding of them."""
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(3, 5, 16)), jnp.float32)
    table = jnp.asarray(rng.normal(size=(37, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 5, 37)), jnp.float32)

    def auto(h, t):
        return jnp.einsum("bpd,vd->bpv", h, t, preferred_element_type=jnp.float32)

    def loss(fn, h, t):
        return (fn(h, t) * w).sum()

    g_ref = jax.grad(functools.partial(loss, auto), argnums=(0, 1))(h, table)
    g32 = jax.grad(functools.partial(loss, bert.decode), argnums=(0, 1))(h, table)
    for a, b in zip(g32, g_ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    hb, tb = h.astype(jnp.bfloat16), table.astype(jnp.bfloat16)
    assert bert.decode(hb, tb).dtype == jnp.float32
    grad16 = jax.jit(jax.grad(functools.partial(loss, bert.decode), argnums=(0, 1)))
    for a, b in zip(grad16(hb, tb), g_ref, strict=True):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.05, atol=0.05)
    text = grad16.lower(hb, tb).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) == 2, dots  # the two gradient matmuls (a linear loss needs no forward)
    assert all(re.search(r": \(tensor<[^)]*bf16>, tensor<[^)]*bf16>\)", d) for d in dots), dots
    auto_text = jax.jit(jax.grad(functools.partial(loss, auto), argnums=(0, 1))).lower(hb, tb)
    assert "xf32>, tensor<" in auto_text.as_text()  # what the custom backward avoids


@pytest.mark.skipif(HAS_GPU, reason="checks the error off a GPU")
def test_cudnn_off_a_gpu_is_an_error_before_any_compile(data_dir, tmp_path):
    from ln_jax.train.setup import setup
    from ln_jax.validate import ConfigError
    from tests.test_trainer import tiny_config

    cudnn = {"model.attention_impl": "cudnn", "model.dtype": "bfloat16"}
    cfg = tiny_config(data_dir, **cudnn, **{"model.attention_dropout": 0.0})
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU, but JAX runs on cpu"):
        setup(cfg)


@pytest.mark.skipif(not HAS_GPU, reason="the Triton kernel needs an NVIDIA GPU")
@pytest.mark.parametrize("causal, t", [(False, 128), (False, 256), (True, 256)])
def test_the_pallas_kernel_on_gpu_computes_the_reference_under_dropout(causal, t):
    """Compiled by Triton, bf16, BERT-base head shapes, dropout 0.1, padding, the q/k/v
    projections' biases added in the kernel: the same output and gradients as
    `reference_attention` on the biased inputs (same masks, XLA ops, float32 softmax), and the
    biases' gradients (the kernels' column sums) the sums of those gradients."""
    from ln_jax.nn import flash

    q, k, v = _qkv(3, jnp.bfloat16, b=2, t=t, n=4, h=64)  # t=128: the fused backward
    g = _qkv(4, jnp.bfloat16, b=2, t=t, n=4, h=64)[0]
    biases = [0.5 * x[0, 0] for x in _qkv(5, jnp.float32, b=1, t=1, n=4, h=64)]  # [N, H]
    valid = jnp.asarray(_right_padded([t, 57], t=t)) > 0
    opts = dict(causal=causal, dropout_rate=0.1, dropout_key=jax.random.key(11))

    def kernel(q, k, v, bq, bk, bv):
        return flash.flash_attention(q, k, v, valid, biases=(bq, bk, bv), **opts)

    def reference(q, k, v, bq, bk, bv):
        biased = [(x + b.astype(x.dtype)) for x, b in ((q, bq), (k, bk), (v, bv))]
        return flash.reference_attention(*biased, valid, **opts)

    def run(fn):
        out, vjp = jax.vjp(fn, q, k, v, *biases)
        return [np.asarray(x, np.float32) for x in (out, *vjp(g))]

    got, ref = run(kernel), run(reference)
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, ref, strict=False):
        scale = np.abs(y).max()
        assert np.abs(x - y).max() <= 3e-2 * scale, (name, np.abs(x - y).max(), scale)
    # Each bias's gradient is its input's summed over batch and length (dbk's true value is 0:
    # a shift of every key changes no softmax), so the kernel's float32 column sums equal the
    # sums of its own bf16 dq, dk, dv to their rounding (2^-8 relative, each term).
    for name, d_input, d_bias in zip(("dbq", "dbk", "dbv"), got[1:4], got[4:], strict=True):
        bound = 2.0**-7 * np.abs(d_input).sum((0, 1)) + 1e-3
        err = np.abs(d_input.sum((0, 1)) - d_bias)
        assert (err <= bound).all(), (name, err.max(), bound.min())


@pytest.mark.skipif(not HAS_GPU, reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_attention_with_padding_equals_xla_on_gpu():
    q, k, v = _qkv(1, jnp.bfloat16, b=2, t=128, n=4, h=64)
    lengths = attention.sequence_lengths(jnp.asarray(_right_padded([128, 57], t=128)))
    xla = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths)
    cudnn = jax.nn.dot_product_attention(
        q, k, v, key_value_seq_lengths=lengths, implementation="cudnn"
    )
    np.testing.assert_allclose(
        np.asarray(cudnn, np.float32), np.asarray(xla, np.float32), atol=2e-2
    )


@pytest.mark.skipif(not HAS_GPU, reason="cuDNN attention needs an NVIDIA GPU")
def test_a_cudnn_bf16_model_matches_the_xla_path_under_the_same_dropout_key_on_gpu():
    """BERT-tiny shapes, bf16, hidden dropout 0.1, no attention dropout (what "auto" runs on
    cuDNN): under each dropout key the two implementations give the same loss (the hidden masks
    come from the key, the attention is the same function), and different keys differ."""
    from flax import nnx

    ids, seg, mask, pos = batch(np.random.default_rng(9), t=16, pad_from=(16, 11, 5))
    tgt = {
        "masked_ids": jnp.asarray(ids[np.arange(3)[:, None], pos]),
        "masked_weights": jnp.ones(pos.shape),
    }
    shape = dict(ODD, hidden_size=64, num_heads=2, mlp_dim=128, num_layers=2, dtype="bfloat16")

    def jitted_loss(graphdef):
        def loss(state, key):
            out = nnx.merge(graphdef, state)(ids, seg, mask, pos, dropout_key=key)
            return bert.pretraining_loss(out, tgt, use_nsp=False)[0]

        return jax.jit(loss)

    losses = {}
    for impl in ("xla", "cudnn"):
        cfg = ln_jax.ModelConfig(**shape, attention_impl=impl, attention_dropout=0.0)
        graphdef, state = nnx.split(build(cfg))
        loss = jitted_loss(graphdef)
        losses[impl] = np.array([float(loss(state, jax.random.key(i))) for i in range(4)])
    np.testing.assert_allclose(losses["cudnn"], losses["xla"], rtol=1e-2)
    assert np.ptp(losses["xla"]) > 1e-3, losses  # the keys do change the hidden masks


def test_mlm_loss_in_logsumexp_form_equals_log_softmax():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 5, 97)) * 4, jnp.float32)
    ids = jnp.asarray(rng.integers(0, 97, (3, 5)), jnp.int32)

    def reference(x):
        return -jnp.take_along_axis(jax.nn.log_softmax(x), ids[..., None], axis=-1)[..., 0]

    np.testing.assert_allclose(bert.mlm_nll(logits, ids), reference(logits), rtol=1e-5)
    grad = jax.grad(lambda x: bert.mlm_nll(x, ids).sum())(logits)
    np.testing.assert_allclose(grad, jax.grad(lambda x: reference(x).sum())(logits), atol=1e-6)


def _dots(cfg) -> list[tuple[str, str]]:
    """(operand types, result type) of every dot_general in the jitted forward of `cfg`."""
    model = build(cfg)
    ids, seg, mask, pos = batch(np.random.default_rng(1))
    text = jax.jit(lambda m: m(ids, seg, mask, pos)["mlm_logits"]).lower(model).as_text()
    lines = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    return [re.search(r": \((.*)\) -> (.*)$", line).groups() for line in lines]


def test_bf16_step_multiplies_in_bf16_and_accumulates_logits_in_float32():
    """Ahead of time: every matmul of a bf16 forward takes bf16 operands; the MLM logits
    (vocabulary 23) come out of their matmul as float32, never rounded to bf16 first."""
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, dtype="bfloat16")
    dots = _dots(cfg)
    assert dots and all(ops.count("bf16") == 2 for ops, _ in dots), dots
    vocab_dots = [out for _, out in dots if re.search(r"x23x\w+>$", out)]
    assert len(vocab_dots) == 1 and vocab_dots[0].endswith("xf32>"), dots
    # The attention logits too (XLA's attention, q.k^T: [B, N, T, S]) are float32.
    scores = [out for ops, out in dots if re.search(r"<3x3x9x9x\w+>$", out)]
    assert scores and all(out.endswith("xf32>") for out in scores), dots


def test_bf16_loss_tracks_float32_loss():
    ids, seg, mask, pos = batch(np.random.default_rng(5))
    tgt = {
        "masked_ids": jnp.asarray(ids[np.arange(3)[:, None], pos]),
        "masked_weights": jnp.ones(pos.shape),
    }
    losses = {}
    for dtype in ("float32", "bfloat16"):
        model = build(ln_jax.ModelConfig(**ODD, num_layers=2, dtype=dtype))
        out = model(ids, seg, mask, pos)
        losses[dtype] = float(bert.pretraining_loss(out, tgt, use_nsp=False)[0])
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.02 * losses["float32"], losses


def test_dropout_rng_choice_sets_the_key_implementation():
    cfg = TrainConfig()
    for name, impl in RNG_IMPLS.items():
        key = steps.dropout_key(dataclasses.replace(cfg, dropout_rng=name), 3)
        assert str(jax.random.key_impl(key)) == impl
    a = steps.dropout_key(dataclasses.replace(cfg, dropout_rng="rbg"), 3)
    b = steps.dropout_key(dataclasses.replace(cfg, dropout_rng="rbg"), 4)
    mask = lambda k: np.asarray(jax.random.bernoulli(k, 0.5, (64,)))
    assert np.array_equal(
        mask(a), mask(steps.dropout_key(dataclasses.replace(cfg, dropout_rng="rbg"), 3))
    )
    assert not np.array_equal(mask(a), mask(b))
    with pytest.raises(ValueError, match="unknown dropout_rng 'philox'"):
        TrainConfig(dropout_rng="philox")


def _copy_into(target, source) -> None:
    """Copies every parameter of `source` into `target`, the vocabulary rows into the first
    rows of `target`'s padded tables (the padding rows keep their values)."""
    from flax import nnx

    src = dict(nnx.to_flat_state(nnx.state(source, nnx.Param)))
    state = nnx.state(target, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        x, s = var.get_value(), src[path].get_value()
        var.set_value(x.at[: s.shape[0]].set(s) if x.shape != s.shape else s)
    nnx.update(target, state)


def test_a_padded_vocabulary_changes_no_loss_prediction_or_gradient():
    """vocab 23 padded to 32 rows: the same loss, accuracy and gradients as the unpadded model
    with the same weights; the padding rows get no gradient and their logits are masked."""
    ids, seg, mask, pos = batch(np.random.default_rng(7))
    tgt = {
        "masked_ids": jnp.asarray(ids[np.arange(3)[:, None], pos]),
        "masked_weights": jnp.ones(pos.shape),
    }
    plain = build(ln_jax.ModelConfig(**ODD, num_layers=1))
    padded = build(ln_jax.ModelConfig(**ODD, num_layers=1, vocab_multiple=16))
    assert padded.bert.embeddings.word[...].shape == (32, 12)
    assert padded.mlm.bias[...].shape == (32,)
    _copy_into(padded, plain)

    def loss(model):
        out = model(ids, seg, mask, pos)
        return bert.pretraining_loss(out, tgt, use_nsp=False)

    from flax import nnx

    (l0, m0), g0 = nnx.value_and_grad(loss, has_aux=True)(plain)
    (l1, m1), g1 = nnx.value_and_grad(loss, has_aux=True)(padded)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    np.testing.assert_allclose(m1["mlm_accuracy"], m0["mlm_accuracy"])
    logits = padded(ids, seg, mask, pos)["mlm_logits"]
    assert np.all(np.asarray(logits[..., 23:]) == bert.MASKED_LOGIT)
    word0, word1 = g0["bert"]["embeddings"]["word"][...], g1["bert"]["embeddings"]["word"][...]
    np.testing.assert_allclose(word1[:23], word0, atol=1e-6)
    assert np.all(np.asarray(word1[23:]) == 0.0)
    assert np.all(np.asarray(g1["mlm"]["bias"][...][23:]) == 0.0)


def test_a_float32_residual_keeps_the_stream_in_float32_and_nearer_float32():
    """bf16 branches, float32 residual: every sub-layer output is float32, the branch matmuls
    stay bf16, and a 12-layer Pre-LN stack's last hidden state is nearer the float32 model's
    than with a bf16 residual (the residual sum, before the final norm rounds it to bf16)."""
    ids, seg, mask, _ = batch(np.random.default_rng(3))
    shape = dict(ODD, hidden_size=48, num_heads=4, mlp_dim=96, num_layers=12, scan_layers=True)
    hidden = {}
    for name, extra in (
        ("f32", dict(dtype="float32")),
        ("bf16", dict(dtype="bfloat16")),
        ("bf16+f32res", dict(dtype="bfloat16", residual_float32=True)),
    ):
        model = build(ln_jax.ModelConfig(**shape, **extra))  # BERT's sigma 0.02
        h, rec = model.bert(ids, seg, mask, record=True)
        del h
        hidden[name] = np.asarray(rec["final_norm_in"].astype(jnp.float32))
        if name == "bf16+f32res":
            assert rec["attention/output"].dtype == jnp.float32
            assert rec["ffn/output"].dtype == jnp.float32
            assert rec["attention/branch_out"].dtype == jnp.bfloat16
    err = {k: np.abs(hidden[k] - hidden["f32"]).mean() for k in ("bf16", "bf16+f32res")}
    # Measured: 1.5e-4 vs 5.3e-3 (36x); the branch matmuls' own bf16 error is what remains.
    assert err["bf16+f32res"] < 0.2 * err["bf16"], err
    dots = _dots(ln_jax.ModelConfig(**ODD, num_layers=2, dtype="bfloat16", residual_float32=True))
    assert dots and all(ops.count("bf16") == 2 for ops, _ in dots), dots


def test_the_erf_gelu_backward_equals_autodiff():
    x = 3 * jax.random.normal(jax.random.key(0), (4096,))
    ours = jax.grad(lambda x: jnp.sum(jnp.sin(layers.activation("gelu", x))))(x)
    plain = jax.grad(lambda x: jnp.sum(jnp.sin(jax.nn.gelu(x, approximate=False))))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(plain), atol=2e-6)
    # The forward saves only x: its jaxpr under vjp holds one erf (the backward's, not two).
    _, vjp = jax.vjp(lambda x: layers.activation("gelu", x), x)
    residuals = [r for r in jax.tree.leaves(vjp) if hasattr(r, "shape") and r.shape == x.shape]
    assert len(residuals) == 1, len(residuals)


def _primitives(jaxpr) -> list[tuple[str, str]]:
    """(primitive, first input's dtype) of every equation, inside sub-jaxprs too."""
    out = []
    for eqn in jaxpr.eqns:
        out.append((eqn.primitive.name, str(getattr(eqn.invars[0].aval, "dtype", ""))))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out += _primitives(sub)
    return out


def test_the_erf_gelu_is_the_erf_form_in_float32():
    """BERT's GELU as PyTorch computes it, x (1 + erf(x / sqrt 2)) / 2 in float32: no erfc
    (whose expansion was 5 ms of an H200 step) and a float32 erf on bf16 inputs."""
    x = np.linspace(-6.0, 6.0, 4001, dtype=np.float32)
    want = reference.gelu(x.astype(np.float64))
    got = np.asarray(layers.activation("gelu", jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(got, want, atol=1.5e-6)
    for dtype in (jnp.float32, jnp.bfloat16):
        jaxpr = jax.make_jaxpr(lambda v: layers.activation("gelu", v))(jnp.ones(8, dtype))
        ops = _primitives(jaxpr.jaxpr)
        assert [d for p, d in ops if p == "erf"] == ["float32"], ops
        assert "erfc" not in {p for p, _ in ops}, ops
    with layers.autodiff_normalization():  # the plain path computes the same function
        plain = np.asarray(layers.activation("gelu", jnp.asarray(x)))
    np.testing.assert_array_equal(plain, got.astype(np.float32))
