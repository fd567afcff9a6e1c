"""Compiling for an NVIDIA GPU or a TPU slice on a host without one.

XLA's GPU compiler runs on any host where JAX's CUDA plugin is installed, and the TPU's on
any host where libtpu is: JAX then offers compile-only devices of a described GPU or TPU
slice (`jax.experimental.topologies`), and a program lowered and compiled for them is the
program those devices would run: its fusions, layouts, buffer assignment (the memory
figures) and, on a GPU, its kernels (`ln_jax.xla.kernel_census`). Nothing runs.

    devices = deviceless.gpu_devices("h100", 8)             # 8 H100s on one host
    mesh = sharding.make_mesh(8, 1, 1, devices=devices)
    with platforms.lowering_for("gpu"):                     # "auto" fields as on a GPU
        compiled = jitted.lower(*abstract_args).compile(deviceless.COMPILER_OPTIONS)

    devices = deviceless.tpu_devices("v5e-8")               # a v5litepod-8: 8 chips, one host

`python -m ln_jax.compile_check --gpu=h100` (or `--tpu=v5e-8`) does this for the train step.

What differs from the GPU itself: no autotuning (nothing to time), so each matmul takes
XLA's default choice. `COMPILER_OPTIONS` asks for cuBLAS, which is what the project's GPU
profiles ran (`nvjet` kernels); the Pallas attention compiles through Triton as there. A TPU
compile is the TPU's own (libtpu is the compiler a TPU VM runs).

Install (CPU host): `pip install -e ".[gpu-compile]"`: the plugin and its PJRT library
(~430 MB; no CUDA libraries, no driver). Their version must equal jaxlib's.
`pip install -e ".[tpu-compile]"`: libtpu (~140 MB), the version jax's own `jax[tpu]` names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Iterator
from typing import Any

import jax

from ln_jax.runtime import host
from ln_jax.xla.kernel_census import SPECS, GpuSpec

# The plugin packages jax can load, newest CUDA first.
PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
COMPILER_OPTIONS: dict[str, Any] = {"xla_gpu_enable_triton_gemm": False}
# cuDNN the plugins are built against (the compiler asks which fusions it may emit).
_CUDNN = (9, 10)


class DevicelessError(RuntimeError):
    """The GPU compiler is not available here; the message says how to install it."""


def spec(name: str) -> GpuSpec:
    """The published figures of a GPU model ("h100", "h200", "a100").

    Raises:
      ValueError: naming the models there are.
    """
    if name not in SPECS:
        raise ValueError(f"--gpu={name!r}: not a known GPU; use one of {', '.join(SPECS)}.")
    return SPECS[name]


def plugin() -> str:
    """The installed CUDA plugin's module name.

    Raises:
      DevicelessError: none is installed, or its version is not jaxlib's.
    """
    jaxlib = importlib.metadata.version("jaxlib")
    for module in PLUGINS:
        if not _importable(module):
            continue
        package = f"jax-cuda{module[-2:]}-plugin"
        version = importlib.metadata.version(package)
        if version != jaxlib:
            raise DevicelessError(
                f"{package} {version} does not match jaxlib {jaxlib}: "
                f'pip install "{package}=={jaxlib}" "jax-cuda{module[-2:]}-pjrt=={jaxlib}".'
            )
        return module
    raise DevicelessError(
        "compiling for a GPU without one needs JAX's CUDA plugin: "
        f'pip install -e ".[gpu-compile]" (or "jax-cuda13-plugin=={jaxlib}" '
        f'"jax-cuda13-pjrt=={jaxlib}"); no CUDA libraries or driver are needed.'
    )


def _importable(module: str) -> bool:
    """Whether `module` can be imported; False also where its parent package is missing (no
    CUDA plugin installed: no `jax_plugins` at all, which `find_spec` raises for)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def check_cudnn(attention_impl: str) -> None:
    """Raises DevicelessError if `attention_impl` is cuDNN's and the CUDA plugin finds no cuDNN
    library here: JAX builds cuDNN's attention from the library's version (a GPU machine with
    `jax[cuda13]` has one; the `gpu-compile` extra installs none, being ~1 GB)."""
    if attention_impl != "cudnn":
        return
    try:
        from jax._src.lib import cuda_versions

        cuda_versions.cudnn_get_version()
    except Exception as err:  # no plugin module, or "cuDNN not found."
        raise DevicelessError(
            f"model.attention_impl='cudnn' cannot be compiled on this host ({err}): JAX's "
            "cuDNN attention needs the cuDNN library, which a GPU machine has. Compile "
            "--config.model.attention_impl=pallas (a GPU's default) or xla here, or install "
            f"cuDNN's wheel for the plugin: pip install nvidia-cudnn-cu{plugin()[-2:]}."
        ) from None


def target_config(gpu: GpuSpec, cuda_major: int) -> str:
    """XLA's GpuTargetConfigProto, as text, for `gpu` (the fields XLA's GPU compiler reads)."""
    major, minor = gpu.compute_capability
    info = {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 48 * 1024,
        "shared_memory_per_block_optin": gpu.shared_memory_per_block_optin,
        "shared_memory_per_core": gpu.shared_memory_per_sm,
        "threads_per_core_limit": 2048,
        "core_count": gpu.sms,
        "fpus_per_core": gpu.fp32_lanes_per_sm,
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": int(gpu.memory_bandwidth),
        "l2_cache_size": gpu.l2_bytes,
        "clock_rate_ghz": gpu.clock_ghz,
        "device_memory_size": gpu.memory_bytes,
        "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
    }
    fields = "\n".join(f"  {k}: {v}" for k, v in info.items())
    return (
        f"gpu_device_info {{\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n"
        f'{fields}\n}}\nplatform_name: "CUDA"\n'
        f"dnn_version_info {{ major: {_CUDNN[0]} minor: {_CUDNN[1]} }}\n"
        f"runtime_version {{ major: {cuda_major} minor: 0 }}\n"
        f'device_description_str: "{gpu.name}"\n'
    )


def gpu_devices(name: str, count: int = 1) -> list[Any]:
    """`count` compile-only devices of GPU model `name` on one host, for a mesh.

    Raises:
      ValueError: an unknown model, or a count below 1.
      DevicelessError: no CUDA plugin (the message says what to install).
    """
    gpu = spec(name)
    if count < 1:
        raise ValueError(f"{count} GPUs: give at least one.")
    module = plugin()
    _register(module)
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="cuda",
        target_config=target_config(gpu, int(module[-2:])),
        topology=f"1x1x{count}",
    )
    return list(topology.devices)


def _register(module: str) -> None:
    """Registers the CUDA plugin with JAX if it is not yet (JAX's internals: a change there
    fails `tests/test_deviceless.py`).

    The plugin checks the CUDA libraries it finds when JAX discovers it, unless JAX_PLATFORMS
    leaves CUDA out; on a host without them (no GPU, nothing to run) that check fails and
    JAX drops the plugin, its compiler included. Skipping the check lets it register; JAX's
    backends then start without it as before (a GPU client cannot start here).
    """
    from jax._src import xla_bridge

    if "cuda" in xla_bridge._topology_factories:
        return
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if not xla_bridge.backends_are_initialized():
        xla_bridge._discover_and_register_pjrt_plugins()
    if "cuda" not in xla_bridge._topology_factories:  # discovered before, without it
        importlib.import_module(module).initialize()


def host_backend_only() -> None:
    """JAX's backends limited to the host's CPU, if they have not started and the user named
    none (JAX_PLATFORMS). Compile-only devices need no other; JAX then neither loads libtpu
    as a backend nor checks the CUDA plugin's libraries, each of which prints a failure on a
    host without that accelerator."""
    from jax._src import xla_bridge

    if not jax.config.jax_platforms and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")


@contextlib.contextmanager
def without_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off while the block compiles: a compile-only
    executable is written there but cannot be read back ("PjRtCompiler must be constructed
    with a Client"), so each entry would cost disk and a warning, and nothing else."""
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


# --------------------------------------------------------------------------- TPU slices

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """A single-host TPU slice as Cloud TPU rents it (Colab's TPUs are such slices).

    Attributes:
      accelerator_type: Cloud TPU's name of the slice ("v5litepod-8").
      topology: libtpu's name of its chips' layout ("v5e:2x4").
      chips_per_host: the chips on the one host, as libtpu's bounds (x, y, z).
      devices: JAX devices (a v2 or v3 chip is two, one per core).
      device_kind: JAX's `device_kind` of each.
      memory_bytes: high-bandwidth memory per JAX device (published figures).
    """

    accelerator_type: str
    topology: str
    chips_per_host: tuple[int, int, int]
    devices: int
    device_kind: str
    memory_bytes: int


TPU_SLICES = {
    "v2-8": TpuSlice("v2-8", "v2:2x2", (2, 2, 1), 8, "TPU v2", 8 * GIB),
    "v3-8": TpuSlice("v3-8", "v3:2x2", (2, 2, 1), 8, "TPU v3", 16 * GIB),
    "v5e-1": TpuSlice("v5litepod-1", "v5e:1x1", (1, 1, 1), 1, "TPU v5 lite", 16 * GIB),
    "v5e-4": TpuSlice("v5litepod-4", "v5e:2x2", (2, 2, 1), 4, "TPU v5 lite", 16 * GIB),
    "v5e-8": TpuSlice("v5litepod-8", "v5e:2x4", (2, 4, 1), 8, "TPU v5 lite", 16 * GIB),
    "v5p-8": TpuSlice("v5p-8", "v5p:2x2x1", (2, 2, 1), 4, "TPU v5", 95 * GIB),
    "v6e-1": TpuSlice("v6e-1", "v6e:1x1", (1, 1, 1), 1, "TPU v6 lite", 32 * GIB),
    "v6e-4": TpuSlice("v6e-4", "v6e:2x2", (2, 2, 1), 4, "TPU v6 lite", 32 * GIB),
    "v6e-8": TpuSlice("v6e-8", "v6e:2x4", (2, 4, 1), 8, "TPU v6 lite", 32 * GIB),
}


def tpu_slice(name: str) -> TpuSlice:
    """The slice called `name` ("v5e-8", or Cloud TPU's "v5litepod-8").

    Raises:
      ValueError: naming the slices there are.
    """
    found = TPU_SLICES.get(name) or next(
        (s for s in TPU_SLICES.values() if s.accelerator_type == name), None
    )
    if found is None:
        raise ValueError(
            f"--tpu={name!r}: not a known TPU slice; use one of {', '.join(TPU_SLICES)} "
            "(one host each; Colab's TPUs are v2-8, v5e-1 and v6e-1)."
        )
    return found


def libtpu() -> str:
    """The installed libtpu's version, checked against the one jax's `jax[tpu]` names.

    Raises:
      DevicelessError: libtpu is missing, or another version than jax's.
    """
    jax_version = importlib.metadata.version("jax")
    wanted = _libtpu_wanted()
    install = f'pip install -e ".[tpu-compile]" (or "jax[tpu]=={jax_version}")'
    if importlib.util.find_spec("libtpu") is None:
        raise DevicelessError(
            f"compiling for a TPU without one needs libtpu: {install}; no TPU is needed."
        )
    have = importlib.metadata.version("libtpu")
    if wanted and not (have == wanted or have.startswith(wanted.rstrip("*"))):
        raise DevicelessError(
            f"libtpu {have} is not the {wanted} jax {jax_version} needs: {install}."
        )
    return have


def _libtpu_wanted() -> str | None:
    """The libtpu version jax's "tpu" extra pins ("0.0.42.*"), if it pins one."""
    for requirement in importlib.metadata.requires("jax") or ():
        found = re.match(r"libtpu\s*==\s*([0-9.*]+)", requirement)
        if found:
            return found.group(1)
    return None


def tpu_devices(name: str) -> list[Any]:
    """The compile-only devices of TPU slice `name` ("v5e-8"), in one process.

    Raises:
      ValueError: an unknown slice.
      DevicelessError: no libtpu, or not jax's (the message says what to install).
    """
    chosen = tpu_slice(name)
    libtpu()
    if not host.has_tpu_chips():
        _quiet_libtpu(chosen)
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu",
        topology_name=chosen.topology,
        chips_per_host_bounds=list(chosen.chips_per_host),
    )
    return list(topology.devices)


def _quiet_libtpu(chosen: TpuSlice) -> None:
    """Settings libtpu otherwise looks for on a TPU VM and, without them, prints errors
    about (worker hostnames, the accelerator type, its metadata server); and leave
    libtpu's one-process lock off, so that two compiles on one host do not refuse each
    other. Only where the host has no TPU, and never over a value the user set."""
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", chosen.accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
