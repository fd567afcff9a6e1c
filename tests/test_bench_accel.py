"""bench/speed/bench_accel.py runs on CPU at a tiny shape; its figures follow from its timings."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from bench.speed import accel_step, bench_accel

pytest_plugins = ("tests.data_fixtures",)

# BERT-tiny: L=2, d=128, F=512, V=8000 (the tests' vocabulary); batch 8 x seq 128, P=20.
L, D, F, V, B, T, P = 2, 128, 512, 8000, 8, 128, 20


def test_tiny_both_feeds_on_cpu(data_dir, tmp_path):
    out = tmp_path / "accel.json"
    r = bench_accel.main([
        "--size=tiny", f"--batch={B}", f"--seq={T}", "--dtype=f32", "--feed=both",
        "--steps=2", "--warmup=1", "--matmul=256", f"--out={out}",
        f"--config.data.data_dir={data_dir}",
        # No dropout: a smaller program to compile; the accounting checked here is the same.
        "--config.model.hidden_dropout=0", "--config.model.attention_dropout=0",
    ])  # fmt: skip
    # Work done: encoder + attention + MLM head at P positions + NSP, x3 for the backward.
    forward = (
        L * T * (8 * D * D + 4 * D * F)
        + L * 4 * T * T * D
        + P * (2 * D * D + 2 * D * V)
        + 2 * D * D
        + 4 * D
    )
    flops = r["flops_per_step"]
    assert flops["done"] == 3 * B * forward == 3_818_139_648
    # 6ND with N = every parameter: embeddings, 2 layers, final norm, MLM and NSP heads.
    n_hand = (
        (V + T + 2 + 2) * D  # word, position (128), segment tables, embedding LayerNorm
        + L * (4 * (D * D + D) + (D * F + F) + (F * D + D) + 4 * D)
        + 2 * D  # final LayerNorm (Pre-LN)
        + (D * D + D) + 2 * D + V  # MLM transform, its LayerNorm, decoder bias
        + (D * D + D) + (2 * D + 2)  # NSP pooler and classifier
    )  # fmt: skip
    n = r["num_params"]
    assert n_hand <= n <= n_hand + 127 * (D + 1)  # the vocabulary may be padded to 128 rows
    assert flops["6nd"] == 6 * n * B * T + 12 * L * D * T * T * B
    assert flops["xla"] and flops["xla"] > 0

    peak = r["peak"]["flops_per_s"]
    assert r["peak"]["source"].startswith("measured: XLA 256^3 float32 matmul")
    for name in ("fixed", "loader"):
        x = r["feeds"][name]
        assert len(x["times_s"]) == 2
        median = statistics.median(x["times_s"])
        assert x["median_s"] == median and x["ms_per_step"] == pytest.approx(1e3 * median)
        assert x["sequences_per_s"] == pytest.approx(B / median)
        assert x["tokens_per_s"] == pytest.approx(B * T / median)
        assert x["mfu_6nd"] == pytest.approx(flops["6nd"] / median / peak)
        assert x["mfu_done"] == pytest.approx(flops["done"] / median / peak)
        assert x["mfu_xla"] == pytest.approx(flops["xla"] / median / peak)
        assert math.isfinite(r["last_loss"][name])

    # The loader fed a different real batch to each of its 3 steps (not the fixed one).
    lo = r["loader"]
    assert len(set(lo["batch_digests"])) == 3 and lo["fixed_digest"] not in lo["batch_digests"]
    assert r["updates"] == 3 * 2  # 3 rounds x 2 feeds, all on one state
    fixed, loader = r["feeds"]["fixed"]["times_s"], r["feeds"]["loader"]["times_s"]
    assert lo["loader_over_fixed"] == pytest.approx(
        statistics.median(loader) / statistics.median(fixed)
    )
    assert lo["wait_s"] >= 0

    saved = json.loads(out.read_text())
    assert saved["feeds"]["loader"]["ms_per_step"] == r["feeds"]["loader"]["ms_per_step"]
    for key in ("command", "shape", "device", "mesh", "config", "versions", "compile_s"):
        assert key in saved
    assert saved["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}  # default: all on data


def test_peak_table_and_config_defaults():
    peak = accel_step.table_peak
    assert peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989
    assert peak("NVIDIA H100 80GB HBM3", "float32") == 495  # TF32
    assert peak("NVIDIA H100 PCIe", "bfloat16") == 756
    assert peak("NVIDIA A100-SXM4-40GB", "bfloat16") == 312
    assert peak("NVIDIA L4", "bfloat16") == 121 and peak("NVIDIA L40S", "bfloat16") is None
    assert peak("TPU v5 lite", "bfloat16") == 197 and peak("TPU v5", "bfloat16") == 459
    assert peak("TPU v6 lite", "bfloat16") == 918 and peak("TPU v4", "bfloat16") == 275

    argv = ["--size=mini", "--batch=32", "--config.dropout_rng=rbg"]
    cfg = accel_step.train_config(bench_accel.parse_args(argv), argv)
    assert cfg.model.dtype == "bfloat16" and cfg.model.size == "mini"
    assert cfg.model.vocab_size == 30522  # the fixed feed: BERT's vocabulary
    assert (cfg.data.global_batch_size, cfg.data.max_seq_length) == (32, 128)
    assert cfg.grad_accum_steps == 1 and cfg.dropout_rng == "rbg"
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (-1, 1, 1)
    with pytest.raises(SystemExit):  # cuDNN attention needs a GPU
        bench_accel.parse_args(["--attention=cudnn"])


def test_an_arm_s_xla_options_are_split_from_its_config_fields():
    """`--arm=NAME:xla.OPTION=VALUE,...`: the xla.* keys are compiler options of that arm's
    compile (typed), the rest config fields; on a CPU all arms compile at once, elsewhere one
    at a time (autotuning times kernels on the device)."""
    from bench.speed import accel_arms

    name, overrides = bench_accel.parse_arm(
        "cublas:xla.xla_gpu_enable_triton_gemm=false,model.dtype=bfloat16,xla.xla_gpu_x=3"
    )
    fields, options = accel_step.split_xla_options(overrides)
    assert name == "cublas" and fields == {"model.dtype": "bfloat16"}
    assert options == {"xla_gpu_enable_triton_gemm": False, "xla_gpu_x": 3}
    assert accel_step.split_xla_options({"xla.o": "fast"})[1] == {"o": "fast"}
    assert accel_arms.compile_threads(4) == 4  # the tests' backend is the CPU


def test_on_a_gpu_each_arm_dumps_its_autotuning_and_an_xla_without_the_option_still_compiles(
    monkeypatch, tmp_path
):
    """`--autotune_dump=DIR`: on a GPU an arm's compile writes DIR/ARM.textproto; where XLA
    refuses the option, the arm compiles without it; on a CPU nothing is asked."""
    import argparse

    from bench.speed import accel_arms

    args = argparse.Namespace(autotune_dump=str(tmp_path / "at"))
    assert accel_arms.autotune_dump(args, "default") == ""  # the tests' CPU
    monkeypatch.setattr(accel_arms.jax, "default_backend", lambda: "gpu")
    path = accel_arms.autotune_dump(args, "cublas")
    assert path == str(tmp_path / "at" / "cublas.textproto") and (tmp_path / "at").is_dir()
    assert accel_arms.autotune_dump(argparse.Namespace(autotune_dump=None), "x") == ""

    calls = []

    def compile_step(cfg, mesh, options):
        calls.append(dict(options))
        if accel_arms.DUMP_OPTION in options:
            raise RuntimeError(
                f"INVALID_ARGUMENT: No such compile option: '{accel_arms.DUMP_OPTION}'"
            )
        return "pieces", "compiled", 1.0

    monkeypatch.setattr(accel_arms, "compile_step", compile_step)
    monkeypatch.setattr(accel_arms.sharding, "make_mesh", lambda *a: "mesh")
    fake = argparse.Namespace(autotune_dump=str(tmp_path / "at"))
    cfg_attrs = argparse.Namespace(data=1, fsdp=1, tensor=1)
    monkeypatch.setattr(accel_arms, "train_config", lambda *a: argparse.Namespace(mesh=cfg_attrs))
    built = accel_arms._compile_arm(fake, [], "cublas", {"xla.xla_gpu_enable_triton_gemm": "false"})
    assert built[2:] == ("pieces", "compiled", 1.0)
    assert calls == [
        {"xla_gpu_enable_triton_gemm": False, accel_arms.DUMP_OPTION: path},
        {"xla_gpu_enable_triton_gemm": False},
    ]


def test_a_batch_too_short_for_its_predictions_is_refused_before_compiling():
    from bench.speed import measure

    shape = dict(batch=2, seq=16, predictions=20, vocab=50)
    with pytest.raises(measure.ShapeError, match=r"length 16 has 14 maskable .* 20 masked.*--seq"):
        measure.make_batch(shape)
    batch = measure.make_batch(shape | {"predictions": 14})  # every maskable position
    assert batch["masked_positions"].tolist() == [list(range(1, 15))] * 2
