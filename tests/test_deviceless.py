"""The train step compiled for NVIDIA GPUs on this CPU host (ln_jax.xla.deviceless): memory figures,
kernels, the row-major layout pin, and the command's errors.

Needs JAX's CUDA plugin (`pip install -e ".[gpu-compile]"`; CI installs it); skipped without.
"""

import dataclasses
import re

import pytest

from configs import bert_preln
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.runtime import platforms
from ln_jax.task import make_task
from ln_jax.xla import aot, deviceless, kernel_census, matmul_census
from tests.deviceless_support import (
    needs,
    reuse_compile,
    run_compile_check,
    without_the_extras,
)

needs_plugin = needs(deviceless.plugin)


def tiny(batch: int = 8, seq: int = 32, vocab: int | None = None, **model) -> TrainConfig:
    """BERT-tiny with the recipe's dropout (so on a GPU: Pallas attention, hash dropout bits)."""
    c = bert_preln.get_config("tiny")
    c.model.update(model)
    if vocab:
        c.data.vocab_size = vocab
    c.data.max_seq_length, c.data.global_batch_size = seq, batch
    c.bert.max_predictions_per_seq = 4
    c.grad_accum_steps = 1
    return TrainConfig.from_mapping(c.to_dict())


def tiny_list(**model) -> TrainConfig:
    """`tiny` with its layers as a list (on a GPU "auto" stacks them): the lowered program's
    census (`matmul_census`) counts a scanned body once."""
    return tiny(**{"scan_layers": False, **model})


def bert_vocab_list() -> TrainConfig:
    """`tiny_list` at BERT's vocabulary (the MLM loss's test needs it: with a small one XLA
    fuses the logsumexp's two passes itself)."""
    return tiny_list(vocab=30522)


@pytest.fixture(scope="module")
def two_h100s():
    return aot.gpu_report(bert_vocab_list, "h100", (2, 1, 1), num_devices=2)


@needs_plugin
def test_the_step_compiles_for_two_h100s_with_the_gpu_s_settings(two_h100s):
    r = two_h100s
    assert r["platform"] == "gpu" and r["num_devices"] == 2
    assert r["device_kind"] == kernel_census.SPECS["h100"].name
    assert (r["dtype"], r["grad_accum_steps"]) == ("bfloat16", 1)  # "auto" resolved as on a GPU
    assert r["temp_bytes"] > 0 and r["argument_bytes"] > r["params_bytes"] > 0
    rows = r["kernel_census"].by_class()
    assert rows["collective"]["kernels"] >= 1  # the data axis's gradient reduction
    assert rows["attention"]["kernels"] >= 2 * 2  # Pallas forward and backward, each layer
    assert "pallas_call" in r["hlo_text"] and "__cublas" in r["hlo_text"]


@needs_plugin
def test_a_gpu_s_gradient_norm_is_not_one_kernel_a_parameter(two_h100s):
    """On a GPU the norm sums the parameters of one shape and logical axes as one stacked
    array (`optim.grouped_norm`): BERT-tiny's 48 gradients in 15 groups. Leaf by leaf its
    reductions were 54 kernels (one or two a parameter); grouped, 21."""
    top_level_sum = re.compile(r"jit\(step_fn\)/(cond/branch_\d+_fun/)?reduce_sum$")
    norm = [k for k in two_h100s["kernel_census"].kernels if top_level_sum.match(k.op_name)]
    assert 15 <= len(norm) <= 2 * 15, [(k.op_name, k.shape) for k in norm]


@needs_plugin
def test_a_gpu_s_step_stores_no_hidden_dropout_mask(two_h100s):
    """The backward draws each hidden dropout mask from its key again (`layers.dropout` with
    hash bits on a GPU), so no kernel writes a mask [batch / 2, length, hidden] to memory: XLA
    stored BERT-base's 25 in one kernel before (0.63 GB a step); BERT-tiny's compile had one."""
    masks = [k for k in two_h100s["kernel_census"].kernels if "pred[4,32,128]" in k.shape]
    assert not masks, [(k.name, k.op_name) for k in masks]


@needs_plugin
def test_the_census_finds_every_flop_the_lowered_step_multiplies(two_h100s):
    """Per device, the compiled program's matmul FLOPs are the lowered program's (global
    shapes, `ln_jax.xla.matmul_census`) over the two data shards: no GEMM is missed or doubled."""
    with platforms.lowering_for("gpu"):
        cfg = bert_vocab_list()
        mesh = sharding.make_mesh(2, 1, 1, devices=deviceless.gpu_devices("h100", 2))
        lowered, _ = aot.lower_train_step(cfg, make_task(cfg), mesh)
    global_flops = sum(m.flops for m in matmul_census.read(lowered).matmuls if m.gemm)
    compiled_flops = two_h100s["kernel_census"].by_class()["matmul"]["flops"]
    assert compiled_flops == pytest.approx(global_flops / 2, rel=0.02)
    assert two_h100s["flops_per_step"] == pytest.approx(2 * compiled_flops)
    assert two_h100s["flops_source"] == "kernel_census"  # XLA:GPU's cost analysis: none


@needs_plugin
def test_a_gpu_s_layer_norms_read_their_input_once(two_h100s, monkeypatch):
    """On a GPU each LayerNorm's statistics are one reduction (`norms.row_moments`:
    Welford's), fused into the kernel that writes its input; the two-pass form read that input
    again for the variance, in a kernel of its own, plus its small follow-ups."""
    from ln_jax.nn import norms

    monkeypatch.setattr(norms, "row_moments", norms._two_pass_moments)
    build = lambda: tiny(vocab=30522)  # noqa: E731
    two_pass = aot.gpu_report(build, "h100", (2, 1, 1), num_devices=2)["kernel_census"]
    one_pass = two_h100s["kernel_census"]
    n_norms = 2 * 2 + 2  # BERT-tiny: two per layer, the embeddings', the MLM head's
    reductions = {c.by_class()["reduction"]["kernels"] for c in (one_pass, two_pass)}
    assert (
        two_pass.by_class()["reduction"]["kernels"] - one_pass.by_class()["reduction"]["kernels"]
        >= n_norms
    ), reductions
    stream = 4 * 32 * 128 * 2  # one bf16 read of a device's [batch, seq, hidden] input
    total = lambda c: sum(row["bytes"] for row in c.by_class().values())  # noqa: E731
    assert total(two_pass) - total(one_pass) >= n_norms * stream


@needs_plugin
def test_a_gpu_s_mlm_loss_reads_its_logits_once_for_the_logsumexp(two_h100s, monkeypatch):
    """On a GPU the MLM loss's logsumexp is one reduction (`layers.logsumexp`): a step moves
    one float32 read of the logits less than with `jax.nn.logsumexp` (maximum, then sum).
    At BERT's vocabulary: with a small one XLA fuses the two passes itself. The one-pass
    step is the fixture's."""
    from ln_jax.nn import layers

    one_pass = two_h100s["kernel_census"]
    monkeypatch.setattr(layers, "_one_pass_logsumexp", layers._two_pass_logsumexp)
    two_pass = aot.gpu_report(bert_vocab_list, "h100", (2, 1, 1), num_devices=2)["kernel_census"]
    total = lambda c: sum(row["bytes"] for row in c.by_class().values())  # noqa: E731
    vocab = bert_vocab_list().model.padded_vocab_size
    logits = 8 // 2 * 4 * vocab * 4  # a device's [batch, predictions, V] float32
    assert total(two_pass) - total(one_pass) >= 0.9 * logits
    reductions = [c.by_class()["reduction"]["kernels"] for c in (one_pass, two_pass)]
    assert reductions[0] < reductions[1], reductions


@needs_plugin
def test_the_row_major_pin_leaves_no_transpose_of_the_residual_stream():
    """At batches like BERT-base's XLA:GPU lays the stream out batch-minor and transposes it
    around every matmul (the H100 profiles' copies; at 64 x 128 as at 256 x 128, not at
    16 x 128); `activation_layout=row_major` pins [batch, seq, hidden]: no transpose of a
    stream-sized array is left."""
    stream = 64 * 128 * 128  # batch x seq x hidden (BERT-tiny's 128)
    copies = {}
    for layout in ("xla", "row_major"):
        build = lambda layout=layout: tiny(batch=64, seq=128, activation_layout=layout)  # noqa: E731
        census = aot.gpu_report(build, "h100", (1, 1, 1))["kernel_census"]
        copies[layout] = [
            k
            for k in census.kernels_of("copy")
            if "transpose" in k.name and max(kernel_census.array_sizes(k.shape)) >= stream
        ]
    assert copies["row_major"] == [], [(k.name, k.shape) for k in copies["row_major"]]
    # What the pin is for (18 at this shape with jaxlib 0.10.2): if XLA stops transposing the
    # stream here, pick a shape where it does, or the assertion above tests nothing.
    assert len(copies["xla"]) >= 12


@needs_plugin
def test_the_command_compiles_for_a_gpu_and_checks_its_memory(two_h100s, capsys, monkeypatch):
    """The command on `two_h100s`'s config and devices: its compile is the fixture's, reused
    (the same program by `steps.program_key`; a GPU compile is ~15 s of the suite)."""
    asked = reuse_compile(monkeypatch, two_h100s, bert_vocab_list, size=2)
    code = run_compile_check(
        "--config=configs/bert_preln.py:tiny",
        "--config.data.global_batch_size=8",
        "--config.data.max_seq_length=32",
        "--config.bert.max_predictions_per_seq=4",
        "--config.grad_accum_steps=1",
        "--config.model.scan_layers=False",
        "--config.data.vocab_size=30522",
        "--gpu=h100",
        "--mesh=2,1,1",
        "--num_devices=2",
        "--device_memory_gib=0.001",
    )
    out = capsys.readouterr().out
    assert [reused for *_, reused in asked] == [True]
    assert code == 1 and "WILL NOT FIT" in out
    assert "2 x NVIDIA H100 80GB HBM3 (gpu)" in out and "kernels per step, by class" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpu=h999"], "not a known GPU; use one of h100, h200, a100"),
        (["--gpu=h100", "--platform=gpu"], "give one"),
    ],
)
def test_command_errors_name_the_fix(extra, message, capsys):
    code = run_compile_check("--config=configs/bert_preln.py:tiny", *extra)
    assert code != 0 and message in capsys.readouterr().err


def test_without_the_plugin_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(deviceless.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(deviceless.DevicelessError, match=r'pip install -e "\.\[gpu-compile\]"'):
        deviceless.gpu_devices("h100")

    def no_jax_plugins(name):  # no plugin at all: its parent package is missing too
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

    monkeypatch.setattr(deviceless.importlib.util, "find_spec", no_jax_plugins)
    with pytest.raises(deviceless.DevicelessError, match=r'pip install -e "\.\[gpu-compile\]"'):
        deviceless.plugin()


SKIPS_AND_COMMANDS = """
import tests.test_deviceless as gpu, tests.test_deviceless_tpu as tpu
from tests.deviceless_support import run_compile_check
for mark in (gpu.needs_plugin, tpu.needs_libtpu):
    print("skip" if mark.args[0] else "run", "|", mark.kwargs["reason"])
for target in ("--gpu=h100", "--tpu=v5e-4"):
    print("exit", run_compile_check("--config=configs/bert_preln.py:tiny", target), flush=True)
"""


def test_without_the_extras_both_files_import_skip_with_the_reason_and_the_command_says_so():
    """A fresh `pip install -e ".[test]"` has neither `jax_plugins` nor `libtpu`: both test
    files still import (collection errored on `No module named 'jax_plugins'`), their marks
    skip with what to install, and `compile_check --gpu` / `--tpu` say it in one line, exit 2
    (--gpu was a 28-line traceback)."""
    proc = without_the_extras(SKIPS_AND_COMMANDS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    skips = [line for line in proc.stdout.splitlines() if " | " in line]
    assert len(skips) == 2 and all(line.startswith("skip | ") for line in skips), proc.stdout
    assert 'pip install -e ".[gpu-compile]"' in skips[0]
    assert 'pip install -e ".[tpu-compile]"' in skips[1]
    assert [line for line in proc.stdout.splitlines() if line.startswith("exit")] == ["exit 2"] * 2
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") for line in errors), proc.stderr
    assert "needs JAX's CUDA plugin" in errors[0] and "needs libtpu" in errors[1]


@needs_plugin
def test_cudnn_attention_without_the_cudnn_library_names_what_to_do(capsys, monkeypatch):
    """The gpu-compile extra installs no cuDNN; cuDNN's attention then cannot be built (it was
    JAX's traceback "cuDNN not found.")."""
    from jax._src.lib import cuda_versions

    def not_found():
        raise RuntimeError("cuDNN not found.")

    monkeypatch.setattr(cuda_versions, "cudnn_get_version", not_found)
    code = run_compile_check(
        "--config=configs/bert_preln.py:tiny",
        "--gpu=h100",
        "--mesh=1,1,1",
        "--config.model.attention_impl=cudnn",
        "--config.model.attention_dropout=0.0",
    )
    err = capsys.readouterr().err
    assert code == 2 and "model.attention_impl='cudnn' cannot be compiled on this host" in err
    assert "--config.model.attention_impl=pallas" in err and "nvidia-cudnn-cu" in err
    deviceless.check_cudnn("pallas")  # only cuDNN's attention asks


def test_the_target_config_carries_the_gpu_s_figures():
    text = deviceless.target_config(kernel_census.SPECS["a100"], 12)
    assert "cuda_compute_capability { major: 8 minor: 0 }" in text
    assert "core_count: 108" in text and "runtime_version { major: 12 minor: 0 }" in text
    assert dataclasses.asdict(kernel_census.SPECS["h200"])["memory_bytes"] > 140 * 2**30


def test_compiles_for_a_gpu_here_skip_the_persistent_cache():
    """A compile-only executable is written to JAX's persistent cache but cannot be read back
    (a warning and a recompile each time): `gpu_report` compiles with the cache off."""
    import jax

    before = jax.config.jax_enable_compilation_cache
    with deviceless.without_persistent_cache():
        assert jax.config.jax_enable_compilation_cache is False
    assert jax.config.jax_enable_compilation_cache == before


@needs_plugin
def test_a_process_on_a_host_without_a_driver_prints_no_cuda_traceback():
    """With the plugin installed and no driver, a JAX process that lets JAX pick its platforms
    starts on the CPU without the plugin's cuDNN traceback."""
    import os
    import subprocess
    import sys

    if any(os.path.exists(f) for f in ("/proc/driver/nvidia/version", "/dev/nvidiactl")):
        pytest.skip("this host has an NVIDIA driver")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = "import ln_jax, jax; print(jax.devices()[0].platform)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "cpu", out.stderr
    assert "cuDNN" not in out.stderr and "xla_cuda" not in out.stderr, out.stderr


@needs_plugin
@pytest.mark.parametrize("t, fused", [(128, True), (256, False)])
def test_the_attention_kernels_compile_for_a_gpu_with_the_biases_gradients(t, fused):
    """Triton lowers every form of `ln_jax.nn.flash` (the fused backward of one block; dq and
    dk/dv for two query blocks, causal), and the q/k/v biases' gradients come from the
    kernels' column sums: no kernel outside them reads a [B, T, N, H] gradient again."""
    import jax
    import jax.numpy as jnp

    from ln_jax.nn import flash

    (device,) = deviceless.gpu_devices("h100", 1)
    spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device)
    )
    tuning = flash.Tuning(fused_backward=fused)
    opts = dict(causal=not fused, dropout_rate=0.1, tuning=tuning, interpret=False)

    def grads(q, k, v, g, bq, bk, bv, key):
        attend = (
            lambda *a: flash.flash_attention(  # noqa: E731
                *a[:3], biases=a[3:], dropout_key=key, **opts
            )
        )
        return jax.vjp(attend, q, k, v, bq, bk, bv)[1](g)

    qkv = spec((4, t, 2, 64))
    args = (qkv,) * 4 + (spec((2, 64), jnp.float32),) * 3 + (spec((), jax.random.key(0).dtype),)
    with platforms.lowering_for("gpu"), deviceless.without_persistent_cache():
        lowered = jax.jit(grads).trace(*args).lower(lowering_platforms=("cuda",))
        census = kernel_census.read(lowered.compile(deviceless.COMPILER_OPTIONS).as_text())
    kernels = {k.op_name.rsplit("/", 2)[-2] for k in census.kernels_of("attention")}
    wanted = {"ln_jax_flash_bwd"} if fused else {"ln_jax_flash_dq", "ln_jax_flash_dkdv"}
    assert {f"transpose(jvp({name}))" for name in wanted} <= kernels, kernels
    sums = [k for k in census.kernels_of("reduction") if k.op_name.endswith("reduce_sum")]
    reread = [k for k in sums if k.bytes >= 4 * t * 2 * 64 * 2]  # (the split's delta: a dot)
    assert not reread, [(k.name, k.shape) for k in reread]
