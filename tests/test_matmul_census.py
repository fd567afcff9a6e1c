"""The matmul census of lowered programs, and the train steps lowered for a GPU and a TPU on
this CPU: a bf16 step multiplies nothing in float32 (`ln_jax.xla.matmul_census`,
`ln_jax.compile_check --platform`, `ln_jax.nn.layers.float32_einsum`)."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ln_jax import sharding
from ln_jax.config.load import build_config, load_config, override
from ln_jax.nn import layers
from ln_jax.runtime import platforms
from ln_jax.task import make_task
from ln_jax.train import steps
from ln_jax.validate import ConfigError
from ln_jax.xla import aot, compile_check, matmul_census


def test_the_census_reads_types_shapes_and_flops_of_each_matmul():
    """Three products with known answers: a bf16 attention-logits einsum (float32 out), a
    float32 GEMM, and a float32 row-wise dot product (batched, no free dimension: not a GEMM)."""

    def f(q, k, c, d):
        logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
        return logits, c @ c.T, jnp.einsum("bth,bth->bt", d, d)

    args = (
        jnp.ones((2, 4, 3, 8), jnp.bfloat16),
        jnp.ones((2, 5, 3, 8), jnp.bfloat16),
        jnp.ones((6, 8), jnp.float32),
        jnp.ones((2, 3, 8), jnp.float32),
    )
    census = matmul_census.read(jax.jit(f).lower(*args), ("cpu",))
    first, gemm, rows = census.matmuls
    assert (first.lhs, first.rhs, first.out) == ("bf16", "bf16", "f32")
    assert first.out_shape == (2, 3, 4, 5) and first.flops == 2 * 2 * 3 * 4 * 5 * 8
    assert first.gemm and not first.float32 and "btnh,bsnh->bnts" in first.where
    assert (gemm.operands, gemm.flops, gemm.gemm) == ("f32 x f32", 2 * 6 * 6 * 8, True)
    assert (rows.operands, rows.flops, rows.gemm) == ("f32 x f32", 2 * 2 * 3 * 8, False)
    assert census.float32_gemms() == [gemm]
    assert census.by_operands() == {"bf16 x bf16": (1, 1920), "f32 x f32": (2, 672)}
    summary = census.summary()
    assert (summary["matmuls"], summary["float32_gemms"]) == (3, 1)
    assert summary["float32_gemm_flops"] == 576 and summary["custom_calls"] == {}
    text = census.format()
    assert "float32 matrix products: 1" in text and "[6, 8] x [8, 6] -> [6, 6]" in text


def _config(spec: str, **extra):
    return build_config(override(load_config(spec), extra))


# (config, platform, overrides, Triton calls: forward + backward per attention of each layer
# the lowered program holds: on a GPU the layers are stacked ("auto", issue 67) and a stack's
# layer is one scan body, so each attention kind of a stack counts once; as a list, per layer)
STEPS = [
    ("configs/bert_preln.py:tiny", "gpu", {}, 2),
    ("configs/bert_preln.py:tiny", "gpu", {"model.scan_layers": False}, 2 * 2),
    ("configs/bert_preln.py:tiny", "gpu", {"model.attention_impl": "xla"}, 0),
    ("configs/bert_postln.py:tiny", "tpu", {"model.attention_dropout": 0.0}, 0),
    ("configs/mt.py:tiny", "gpu", {}, 2 * (1 + 2)),
    ("configs/mt.py:tiny", "tpu", {}, 0),
]


@pytest.mark.parametrize("spec, platform, extra, triton", STEPS)
def test_a_bf16_train_step_lowered_for_an_accelerator_has_no_float32_gemm(
    spec, platform, extra, triton
):
    """The trainer's step on a 2x2x2 mesh, lowered here for a GPU or a TPU with the "auto"
    fields resolved there (bf16; Pallas attention on a GPU): every matrix product takes bf16
    operands. Before `float32_einsum`, autodiff multiplied the attention logits' and the tied
    output projection's float32 gradients in float32 (4 and 2 GEMMs here)."""
    report = aot.census_report(lambda: _config(spec, **extra), platform, (2, 2, 2))
    cfg, census = report.cfg, report.census
    assert cfg.model.dtype == "bfloat16"
    assert census.float32_gemms() == [], census.format()
    flops = census.by_operands()
    assert flops["bf16 x bf16"][1] > 0.99 * sum(f for _, f in flops.values())
    assert census.custom_calls.get("__gpu$xla.gpu.triton", 0) == triton
    assert census.platforms == (f"{platform} ({platforms.LOWERING_NAMES[platform]})",)
    # float32 parameters and Adam's two moments, split 4 ways (fsdp x tensor) where they split
    assert report.num_params < report.params_bytes < 1.1 * report.num_params
    assert report.opt_state_bytes == pytest.approx(2 * report.params_bytes, rel=0.01)
    monitor = _monitor_census(cfg, platform)  # the step with the per-layer measurements
    assert monitor.float32_gemms() == [], monitor.format()  # (the entropy's logits were)
    assert len(monitor.matmuls) > len(census.matmuls)


def _monitor_census(cfg, platform: str) -> matmul_census.Census:
    """The census of the monitor's step (`measure=True`) of `cfg` on the 2x2x2 mesh."""
    mesh = sharding.make_mesh(2, 2, 2)
    cfg = dataclasses.replace(cfg, grad_accum_steps=1)
    with platforms.lowering_for(platform) as target:
        task = make_task(cfg)
        pieces = steps.abstract_state(task, mesh)
        batch = steps.abstract_batch(task, mesh)
        step = steps.jit_train_step(cfg, task, mesh, pieces, measure=True)
        with sharding.use_mesh(mesh):
            lowered = step.lower(pieces.state, pieces.rest, batch, platforms=(target,))
    return matmul_census.read(lowered)


@pytest.mark.parametrize("spec", ["btnh,bsnh->bnts", "td,vd->tv"])
def test_float32_einsum_multiplies_its_bf16_gradient_in_bf16(spec):
    """Float32 operands: autodiff's gradient exactly. bf16 operands: float32 logits, bf16
    gradients within bf16 rounding of the float32 ones, from two bf16 x bf16 products."""
    shapes = {"btnh,bsnh->bnts": ((2, 4, 3, 8), (2, 5, 3, 8)), "td,vd->tv": ((6, 8), (9, 8))}
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes[spec])
    out_shape = jnp.einsum(spec, a, b).shape
    w = jnp.asarray(rng.normal(size=out_shape), jnp.float32)

    def loss(fn, a, b):
        return (jnp.tanh(fn(a, b)) * w).sum()

    def plain(a, b):
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)

    def ours(a, b):
        return layers.float32_einsum(spec, a, b)

    ref = jax.grad(lambda a, b: loss(plain, a, b), argnums=(0, 1))(a, b)
    for got, want in zip(jax.grad(lambda a, b: loss(ours, a, b), (0, 1))(a, b), ref, strict=True):
        np.testing.assert_array_equal(got, want)
    grad16 = jax.jit(jax.grad(lambda a, b: loss(ours, a, b), argnums=(0, 1)))
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    assert ours(a16, b16).dtype == jnp.float32
    for got, want in zip(grad16(a16, b16), ref, strict=True):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0.05, atol=0.05)
    census = matmul_census.read(grad16.lower(a16, b16))
    assert [m.operands for m in census.matmuls] == ["bf16 x bf16"] * 3  # forward + two grads
    autodiff = jax.jit(jax.grad(lambda a, b: loss(plain, a, b), argnums=(0, 1)))
    assert matmul_census.read(autodiff.lower(a16, b16)).float32_gemms()  # what it avoids
    with layers.autodiff_normalization():  # forward mode traces the plain product
        _, tangent = jax.jvp(lambda a: ours(a, b16), (a16,), (a16,))
    assert tangent.dtype == jnp.float32


def test_float32_einsum_refuses_a_spec_whose_gradient_is_not_an_einsum_of_the_cotangent():
    with pytest.raises(ValueError, match="sums an index away alone"):
        layers.float32_einsum("ab,bc->a", jnp.ones((2, 3), jnp.bfloat16), jnp.ones((3, 4)))


def test_lowering_for_resolves_auto_fields_as_on_that_platform():
    assert _config("configs/bert_preln.py:tiny").model.dtype == "float32"  # this CPU
    with platforms.lowering_for("tpu") as target:
        cfg = _config("configs/bert_preln.py:tiny")
        assert target == "tpu" and platforms.current() == "tpu"
    assert (cfg.model.dtype, cfg.model.attention_impl, cfg.dropout_rng) == (
        "bfloat16",
        "xla",
        "hash",
    )
    with platforms.lowering_for("gpu") as target:
        assert target == "cuda" and _config("configs/bert_preln.py:tiny").dropout_rng == "hash"
    assert platforms.current() == "cpu"
    with (
        pytest.raises(ValueError, match="'metal' is not one of cpu, gpu, tpu"),
        platforms.lowering_for("metal"),
    ):
        pass


def _run(argv, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    return compile_check.COMMAND.run(compile_check._main, argv)


def test_compile_check_platform_prints_the_census(capsys, monkeypatch):
    argv = ["--config=configs/bert_preln.py:tiny", "--mesh=2,2,2", "--platform=gpu"]
    assert _run(argv, monkeypatch) == 0
    out = capsys.readouterr().out
    assert "bfloat16, attention pallas, dropout bits hash; 1.5M parameters; mesh data=2" in out
    assert "per device: parameters 1.4 MiB, optimizer 2.9 MiB, batch 0.0 MiB" in out
    assert "matmuls as lowered for gpu (cuda)" in out
    assert "float32 matrix products: none" in out
    # the Pallas attention (forward, fused backward) of the stacked layers' one scan body, and
    # activation_layout "auto" pinning the residual stream row-major on a GPU: the embeddings'
    # and the body's two sub-layers' output, forward and cotangent (2 x (1 + 2))
    assert "custom calls: LayoutConstraint x6, __gpu$xla.gpu.triton x2" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--platform=tpu", "--config.model.attention_impl=pallas"], "a TPU needs"),
        (["--platform=gpu", "--device_memory_gib=80"], "--platform only lowers"),
        (["--platform=metal"], "'metal' is not one of cpu, gpu, tpu"),
    ],
)
def test_compile_check_platform_errors_name_the_fix(extra, message, capsys, monkeypatch):
    argv = ["--config=configs/bert_preln.py:tiny", "--mesh=2,2,2", *extra]
    assert _run(argv, monkeypatch) == 2
    assert message in capsys.readouterr().err


def test_a_setting_the_platform_cannot_run_is_a_config_error():
    with pytest.raises(ConfigError, match="a TPU needs"):
        aot.census_report(
            lambda: _config("configs/bert_preln.py:tiny", **{"model.attention_impl": "pallas"}),
            "tpu",
            (2, 2, 2),
        )
