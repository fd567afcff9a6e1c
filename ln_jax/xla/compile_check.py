"""Ahead-of-time check: compile the train step for a mesh and print XLA's per-device memory.

  python -m ln_jax.compile_check --config=configs/bert_preln.py --mesh=8,1,1 --num_devices=8
  python -m ln_jax.compile_check --config=configs/bert_preln.py --config.model.size=large \\
      --mesh=4,2,1 --device_memory_gib=80

The train step (the trainer's own, from `ln_jax.train.steps`: the same state shardings, jit and
donation as a run) is lowered and compiled from ShapeDtypeStructs carrying NamedShardings: no
parameter, optimizer state or batch is ever materialised, and no data pipeline is built, so a
BERT-large check runs on a laptop. The estimate is XLA's `memory_analysis()` of the compiled
per-device program: arguments + outputs - donated (aliased) bytes + temporaries + code.

Devices: the mesh is built on `jax.devices()`. `--num_devices=N` (default: the product of a
fully given `--mesh`) asks XLA for N CPU devices before JAX starts its backends; that only
affects the CPU platform, so on a GPU/TPU host the real accelerators are used unless
`JAX_PLATFORMS=cpu` is set. The parameter and optimizer bytes are exact for any backend; the
temporaries are the compiling backend's buffer assignment (XLA:CPU's fusion and scheduling
differ from a GPU's or TPU's, so treat a CPU figure for them as an estimate).

With `--device_memory_gib=B` the command exits 1 after a "WILL NOT FIT" line when the estimate
exceeds B GiB per device.

Another platform, without its devices: `--platform=gpu` (or `tpu`) builds the config as that
platform would ("auto" fields: bfloat16, its attention and dropout bits), lowers the step for
it (the Pallas kernel as Triton), and prints the step's matmuls by operand dtype and any
float32 matrix product (`ln_jax.xla.matmul_census`) instead of compiling:

  python -m ln_jax.compile_check --config=configs/bert_preln.py --platform=gpu --mesh=1,1,1

A GPU's own compile, without the GPU: `--gpu=h100` (h200, a100) compiles the step with XLA's
GPU compiler here for `--num_devices` compile-only GPUs (`ln_jax.xla.deviceless`; needs
`pip install -e ".[gpu-compile]"`): the GPU's buffer assignment, checked against the chip's
memory, and the program's kernels by class (`ln_jax.xla.kernel_census`):

  python -m ln_jax.compile_check --config=configs/bert_preln.py --gpu=h100 --mesh=1,1,1

A TPU slice's own compile, without the TPU: `--tpu=v5e-8` (v2-8, v5e-1, v6e-1, ...:
`ln_jax.xla.deviceless.TPU_SLICES`) compiles the step with libtpu here for the slice's devices
(needs `pip install -e ".[tpu-compile]"`): the TPU's buffer assignment, checked against its
memory per device, and an "auto" accumulation chosen as the trainer would choose it there:

  python -m ln_jax.compile_check --config=configs/bert_preln.py --tpu=v5e-1
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ln_jax import console
from ln_jax.cli import command as cli
from ln_jax.config.load import config_from_command_line
from ln_jax.validate import UserError
from ln_jax.xla import deviceless, kernel_census
from ln_jax.xla.aot import (
    GIB,
    census_report,
    compile_report,
    fits,
    format_census,
    format_report,
    gpu_report,
    tpu_report,
)

__all__ = ["run"]

# --------------------------------------------------------------------------- command line


def parse_mesh(text: str) -> tuple[int, int, int]:
    """'4,2,1' -> (4, 2, 1): data, fsdp, tensor (one may be -1)."""
    parts = [p for p in re.split(r"[,x ]+", text.strip()) if p]
    if len(parts) != 3:
        raise ValueError(f"--mesh={text!r}: give three sizes data,fsdp,tensor, e.g. 4,2,1.")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in argv (the last one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def requested_devices(argv: Sequence[str]) -> int | None:
    """Fake device count from --num_devices, else the product of a fully given --mesh."""
    given = _flag_value(argv, "num_devices")
    if given is not None:
        return int(given)
    mesh = _flag_value(argv, "mesh")
    if mesh is None:
        return None
    sizes = parse_mesh(mesh)
    return math.prod(sizes) if min(sizes) > 0 else None


def force_host_devices(n: int) -> None:
    """Asks XLA for `n` CPU devices; only effective before JAX initialises its backends."""
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", "")
    )
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


COMMAND = cli.Command("python -m ln_jax.compile_check", __doc__, cli.train_config_front())
_MESH = COMMAND.string(
    "mesh", None, "data,fsdp,tensor, e.g. 4,2,1 (default: the config's).", meta="D,F,T"
)
_NUM_DEVICES = COMMAND.integer(
    "num_devices", None, "Fake CPU devices, or with --gpu the GPUs (default: mesh product)."
)
_DEVICE_MEMORY = COMMAND.real("device_memory_gib", None, "Per-device budget, e.g. 80 for an H100.")
_PLATFORM = COMMAND.string(
    "platform",
    None,
    "Lower the step for gpu or tpu here, without its devices ('auto' fields as there), and "
    "print its matmuls by operand dtype instead of compiling (no memory figures).",
    meta="gpu|tpu",
)
_GPU = COMMAND.string(
    "gpu",
    None,
    "Compile the step for this GPU here, without one (XLA's GPU compiler; needs "
    '`pip install -e ".[gpu-compile]"`): the GPU\'s memory figures, checked against its '
    "memory unless --device_memory_gib is given, and its kernels by class.",
    meta="|".join(kernel_census.SPECS),
)

_TPU = COMMAND.string(
    "tpu",
    None,
    "Compile the step for this single-host TPU slice here, without a TPU (the TPU's own "
    'compiler, libtpu; needs `pip install -e ".[tpu-compile]"`): its memory figures, checked '
    "against its memory per device unless --device_memory_gib is given.",
    meta="|".join(deviceless.TPU_SLICES),
)


def _main(inv: cli.Invocation) -> int:
    """The command's body: fake devices asked for, the report, the verdict; log records
    shown as train.py shows them (`WARNING grad_accum_steps=auto: ...`)."""
    console.configure_logging()
    try:
        with console.absl_level(logging.WARNING):  # not JAX's "Unable to initialize backend"
            return _report(inv)
    finally:
        console.close_logging()


def _report(inv: cli.Invocation) -> int:
    try:
        _check_targets()
        if _GPU.value is not None or _TPU.value is not None:
            deviceless.host_backend_only()
        n = requested_devices(inv.line.rest)
        if n is not None and _GPU.value is None and _TPU.value is None:
            force_host_devices(n)  # before the config: its "auto" fields start JAX's backends
        mesh = parse_mesh(_MESH.value) if _MESH.value else None
        if _PLATFORM.value is not None:
            return _census(inv, _PLATFORM.value, mesh)
        budget = _DEVICE_MEMORY.value
        if _GPU.value is not None:
            report = gpu_report(inv.config, _GPU.value, mesh, n or 1, budget)
            budget = budget or deviceless.spec(_GPU.value).memory_bytes / GIB
        elif _TPU.value is not None:
            report = tpu_report(inv.config, _TPU.value, mesh, budget)
            budget = budget or deviceless.tpu_slice(_TPU.value).memory_bytes / GIB
        else:
            report = compile_report(inv.config(), mesh, device_memory_gib=budget)
    except (UserError, ValueError, deviceless.DevicelessError) as err:
        return inv.report(err)
    print(format_report(report), flush=True)
    if "kernel_census" in report:
        print(report["kernel_census"].format(deviceless.spec(_GPU.value or "h100")), flush=True)
    if budget is None:
        return 0
    ok, verdict = fits(report, budget)
    print(verdict, flush=True)
    return 0 if ok else 1


def _check_targets() -> None:
    """--platform, --gpu and --tpu exclude each other; a TPU slice has its own devices.

    Raises:
      ValueError: saying which flag to drop.
    """
    given = [f"--{f.name}" for f in (_PLATFORM, _GPU, _TPU) if f.value is not None]
    if len(given) > 1:
        raise ValueError(
            f"{' and '.join(given)}: --platform only lowers the step, --gpu compiles it for "
            "a GPU and --tpu for a TPU slice: give one."
        )
    if _TPU.value is not None and _NUM_DEVICES.value is not None:
        raise ValueError(
            f"--num_devices with --tpu={_TPU.value}: a TPU slice has its own devices; drop "
            "--num_devices (or name another slice)."
        )


def _census(inv: cli.Invocation, platform: str, mesh: Any) -> int:
    """--platform: the step lowered for `platform`, its config line and matmul census."""
    if _DEVICE_MEMORY.value is not None:
        raise ValueError(
            "--device_memory_gib needs a compiled step, and --platform only lowers one: drop "
            "one of the two."
        )
    print(format_census(census_report(inv.config, platform, mesh)), flush=True)
    return 0


def command_config(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(the nested config, the other arguments) of this command line."""
    values, line = config_from_command_line(argv)
    return values, line.rest


def run(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    sys.exit(COMMAND.run(_main, argv))


if __name__ == "__main__":
    run()
