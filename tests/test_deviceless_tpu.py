"""The train step compiled for TPU slices on this CPU host by the TPU's own compiler (libtpu,
`ln_jax.xla.deviceless.tpu_devices`): the TPU's settings, its memory figures, the accumulation
chosen for its memory, and the command's errors.

Needs libtpu (`pip install -e ".[tpu-compile]"`; CI installs it); skipped without.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import bert_preln
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.runtime import platforms
from ln_jax.task import make_task
from ln_jax.train import accumulation
from ln_jax.xla import aot, deviceless, matmul_census
from tests.deviceless_support import needs, reuse_compile, run_compile_check

GIB = 1024**3


needs_libtpu = needs(deviceless.libtpu)


def tiny(batch: int = 16, seq: int = 64, accum: int = 1) -> TrainConfig:
    """BERT-tiny with the recipe's dropout and "auto" fields (resolved as on a TPU)."""
    c = bert_preln.get_config("tiny")
    c.data.max_seq_length, c.data.global_batch_size = seq, batch
    c.bert.max_predictions_per_seq = 8
    c.grad_accum_steps = accum
    return TrainConfig.from_mapping(c.to_dict())


@pytest.fixture(scope="module")
def data_parallel():
    return aot.tpu_report(tiny, "v5e-4", (4, 1, 1))


@needs_libtpu
def test_the_step_compiles_for_a_v5e_slice_with_the_tpu_s_settings(data_parallel):
    r = data_parallel
    assert (r["platform"], r["device_kind"], r["num_devices"]) == ("tpu", "TPU v5 lite", 4)
    assert (r["dtype"], r["grad_accum_steps"]) == ("bfloat16", 1)  # "auto" as on a TPU
    # The donated state comes back in place: outputs alias the state's arguments.
    state = r["params_bytes"] + r["opt_state_bytes"]
    assert r["argument_bytes"] >= state + r["batch_bytes"]
    assert r["alias_bytes"] >= state and r["temp_bytes"] > 0


@needs_libtpu
def test_the_tpu_s_flops_are_the_lowered_step_s_matmuls_and_a_little_more(data_parallel):
    """libtpu's cost analysis counts every matmul of the lowered program (global shapes,
    `ln_jax.xla.matmul_census`) once, over the 4 devices, plus the elementwise work."""
    with platforms.lowering_for("tpu"):
        mesh = sharding.make_mesh(4, 1, 1, devices=deviceless.tpu_devices("v5e-4"))
        cfg = tiny()
        lowered, _ = aot.lower_train_step(cfg, make_task(cfg), mesh)
    matmuls = sum(m.flops for m in matmul_census.read(lowered).matmuls if m.gemm)
    assert data_parallel["flops_source"] == "xla"
    assert matmuls <= data_parallel["flops_per_step"] <= 1.25 * matmuls


@needs_libtpu
def test_fsdp_on_the_slice_shards_the_state_the_compile_holds(data_parallel):
    """On fsdp=4 each TPU holds a quarter of the parameters and optimizer state: the compiled
    program's arguments shrink with them (a mesh built wrongly, or shardings lost in the
    lowering, would leave them whole)."""
    fsdp = aot.tpu_report(tiny, "v5e-4", (1, 4, 1))
    assert fsdp["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    whole = data_parallel["params_bytes"] + data_parallel["opt_state_bytes"]
    assert fsdp["params_bytes"] + fsdp["opt_state_bytes"] < 0.3 * whole
    assert fsdp["argument_bytes"] < 0.4 * data_parallel["argument_bytes"]


@pytest.fixture(scope="module")
def busy():
    """64 sequences of 128 a device: the activations are most of the temporaries."""
    return aot.tpu_report(lambda: tiny(batch=256, seq=128), "v5e-4", (4, 1, 1))


@needs_libtpu
def test_auto_accumulation_is_chosen_for_the_tpu_s_memory(busy, monkeypatch):
    """With grad_accum_steps=0 the check picks the micro-batches the trainer would pick on a
    device of the given memory, from the TPU's own buffer assignment, and the micro-batches
    then hold a micro-batch's activations. (At 4 micro-batches of BERT-tiny libtpu's
    temporaries read 0 bytes, as a 2048^2 float32 matmul's gradient does, where an 8192^2
    one reads 256 MiB: small temporaries are not in its figures, presumably kept on chip;
    measured 2026-11-29.) Its probe at one micro-batch is `busy`'s program, whose report is
    reused (libtpu's compiles are not cached; this one took 25-40 s in CI)."""
    asked = reuse_compile(monkeypatch, busy, lambda: tiny(batch=256, seq=128), size=4)
    fixed = busy["total_bytes"] - busy["temp_bytes"]
    # A budget the one-micro-batch step overflows and a third of its temporaries fits.
    gib = (fixed + busy["temp_bytes"] / 3) / accumulation.HEADROOM / GIB
    build = lambda: tiny(batch=256, seq=128, accum=0)  # noqa: E731
    r = aot.tpu_report(build, "v5e-4", (4, 1, 1), gib)
    # the probe (the plain step at one micro-batch), then the fewest dividing 64 that fit (>= 3)
    assert [(accum, reused) for accum, *_, reused in asked] == [(1, True), (4, False)]
    assert r["grad_accum_auto"] and r["grad_accum_steps"] == 4
    assert r["temp_bytes"] < 0.6 * busy["temp_bytes"]
    assert r["total_bytes"] < gib * GIB


@needs_libtpu
def test_hash_dropout_bits_take_less_tpu_memory_than_rbg(busy):
    """libtpu keeps rbg's uint32 bits of every dropout site for the backward; hash bits are
    computed where they are used. Here 91 MiB of temporaries with rbg, 26 with hash: why
    "auto" is hash on a TPU too (docs/tpu.md)."""
    assert busy["dropout_rng"] == "hash"
    build = lambda: dataclasses.replace(tiny(batch=256, seq=128), dropout_rng="rbg")  # noqa: E731
    rbg = aot.tpu_report(build, "v5e-4", (4, 1, 1))
    assert busy["temp_bytes"] < 0.5 * rbg["temp_bytes"], (busy["temp_bytes"], rbg["temp_bytes"])


@needs_libtpu
def test_the_command_compiles_for_a_tpu_and_checks_its_memory(data_parallel, capsys, monkeypatch):
    """The slice's devices make the config's mesh (data=-1: all 4 of a v5e-4's chips) and
    its memory per device is the budget (a v5e chip's 16 GiB). The compile is
    `data_parallel`'s, reused: the same program on the same mesh (libtpu's compiles are not
    cached)."""
    asked = reuse_compile(monkeypatch, data_parallel, tiny, size=4)
    code = run_compile_check(
        "--config=configs/bert_preln.py:tiny", "--tpu=v5e-4",
        "--config.data.global_batch_size=16", "--config.data.max_seq_length=64",
        "--config.bert.max_predictions_per_seq=8", "--config.grad_accum_steps=1",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert asked == [(1, {"data": 4, "fsdp": 1, "tensor": 1}, {"TPU v5 lite"}, True)]
    assert "mesh data=4 fsdp=1 tensor=1 on 4 x TPU v5 lite (tpu)" in out
    assert "fits: 0.0" in out and "GiB of 16 GiB per device" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tpu=v7x-8"], "not a known TPU slice; use one of v2-8, v3-8, v5e-1"),
        (["--tpu=v5e-4", "--gpu=h100"], "--gpu and --tpu: --platform only lowers"),
        (["--tpu=v5e-4", "--platform=tpu"], "give one"),
        (["--tpu=v5e-4", "--num_devices=8"], "a TPU slice has its own devices"),
    ],
)
def test_command_errors_name_the_fix(extra, message, capsys):
    code = run_compile_check("--config=configs/bert_preln.py:tiny", *extra)
    assert code != 0 and message in capsys.readouterr().err


@needs_libtpu
def test_a_mesh_the_slice_cannot_hold_is_refused(capsys):
    code = run_compile_check("--config=configs/bert_preln.py:tiny", "--tpu=v5e-4", "--mesh=8,1,1")
    err = capsys.readouterr().err
    assert code != 0 and "8" in err and "4" in err


def test_without_libtpu_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(deviceless.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(deviceless.DevicelessError, match=r'pip install -e "\.\[tpu-compile\]"'):
        deviceless.tpu_devices("v5e-8")


def test_a_libtpu_that_is_not_jax_s_is_refused(monkeypatch):
    monkeypatch.setattr(deviceless, "_libtpu_wanted", lambda: "0.0.42.*")
    monkeypatch.setattr(deviceless.importlib.util, "find_spec", lambda name: object())
    versions = {"jax": "0.10.2", "libtpu": "0.0.52"}
    monkeypatch.setattr(deviceless.importlib.metadata, "version", versions.__getitem__)
    with pytest.raises(deviceless.DevicelessError, match=r"libtpu 0\.0\.52 is not the 0\.0\.42"):
        deviceless.libtpu()
    versions["libtpu"] = "0.0.42.1"
    assert deviceless.libtpu() == "0.0.42.1"


def test_slices_are_found_by_either_name():
    assert deviceless.tpu_slice("v5litepod-8") is deviceless.tpu_slice("v5e-8")
    v2 = deviceless.tpu_slice("v2-8")
    assert (v2.devices, v2.memory_bytes) == (8, 8 * GIB)  # a v2 chip is two devices of 8 GiB


@needs_libtpu
@pytest.mark.parametrize("name", ["v2-8", "v5e-1", "v5e-8", "v5p-8", "v6e-4"])
def test_each_slice_has_its_devices_on_one_host(name):
    chosen = deviceless.tpu_slice(name)
    devices = deviceless.tpu_devices(name)
    assert len(devices) == chosen.devices
    assert {d.device_kind for d in devices} == {chosen.device_kind}
    assert {d.process_index for d in devices} == {0}  # one host: Colab's, a single TPU VM
    mesh = sharding.make_mesh(-1, 1, 1, devices=devices)
    assert sharding.is_compile_only(mesh.devices) and mesh.size == chosen.devices


@needs_libtpu
def test_a_process_on_a_host_without_a_tpu_prints_no_libtpu_errors():
    """With libtpu installed and no TPU chip, a JAX process that lets JAX pick its platforms
    starts on the CPU without libtpu's five lines about TPU VM settings (`ln_jax.runtime.host`); the
    same process without ln_jax prints them."""
    from ln_jax.runtime import host

    if host.has_tpu_chips():
        pytest.skip("this host has TPU chips")
    drop = ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT", *host.TPU_TOPOLOGY_VARS, *host.LIBTPU_QUIET)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    noise = ("TPU_WORKER_HOSTNAMES", "host bounds", "InitGoogle")

    def run(imports: str) -> subprocess.CompletedProcess:
        code = f"import {imports}; print(jax.devices()[0].platform)"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    quiet, plain = run("ln_jax, jax"), run("jax")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "cpu", quiet.stderr
    assert not [n for n in noise if n in quiet.stderr], quiet.stderr
    assert plain.stdout.strip() == "cpu" and [n for n in noise if n in plain.stderr], plain.stderr


@needs_libtpu
def test_libtpu_logs_into_the_sessions_home():
    """The tests' libtpu writes its log files in the session's home (tests/hermetic.py), not
    in the host's /tmp/tpu_logs (which had 388 files of earlier sessions on 2026-11-29)."""
    logs = Path(os.environ["TPU_LOG_DIR"])
    before = set(logs.iterdir())
    code = "from ln_jax.xla import deviceless; print(len(deviceless.tpu_devices('v5e-4')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["4"], done.stderr[-2000:]
    assert [p for p in set(logs.iterdir()) - before if p.name.startswith("tpu_driver.")]
    assert logs.is_relative_to(os.environ["LN_JAX_TESTS_HOME"])
