"""Compiling for an NVIDIA GPU on a host without one.

XLA's GPU compiler runs on any host where JAX's CUDA plugin is installed: JAX then offers
compile-only devices of a described GPU (`jax.experimental.topologies`), and a program
lowered and compiled for them is the program that GPU would run: its fusions, layouts,
buffer assignment (the memory figures) and kernels (`ln_jax.kernel_census`). Nothing runs.

    devices = deviceless.gpu_devices("h100", 8)             # 8 H100s on one host
    mesh = sharding.make_mesh(8, 1, 1, devices=devices)
    with platforms.lowering_for("gpu"):                     # "auto" fields as on a GPU
        compiled = jitted.lower(*abstract_args).compile(deviceless.COMPILER_OPTIONS)

`python -m ln_jax.compile_check --gpu=h100` does this for the train step.

What differs from the GPU itself: no autotuning (nothing to time), so each matmul takes
XLA's default choice. `COMPILER_OPTIONS` asks for cuBLAS, which is what the project's GPU
profiles ran (`nvjet` kernels); the Pallas attention compiles through Triton as there.

Install (CPU host): `pip install -e ".[gpu-compile]"`: the plugin and its PJRT library
(~430 MB; no CUDA libraries, no driver). Their version must equal jaxlib's.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ln_jax.kernel_census import SPECS, GpuSpec

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
        if importlib.util.find_spec(module) is None:
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


def is_compile_only(devices: Any) -> bool:
    """Whether these devices (a mesh's `.devices`, a list) only compile: no array lives there."""
    first = next(iter(getattr(devices, "flat", devices)))
    return getattr(first.client, "runtime_type", "") == "compile_only_runtime"


def abstract(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    """A host value's shape and dtype with `sharding`: what stands for it on compile-only
    devices, where no array can be put."""
    return jax.ShapeDtypeStruct(np.shape(value), np.asarray(value).dtype, sharding=sharding)
