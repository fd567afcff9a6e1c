"""The trainer's train step compiled ahead of time, without running it: per-device memory,
FLOPs and, on a GPU, its kernels; for this host's devices or for devices that are not here.

- `compile_report(cfg, mesh)`: lowered from the abstract state (`ln_jax.train.steps`: the
  trainer's own shardings, jit and donation) and compiled; XLA's `memory_analysis()` of the
  per-device program, an "auto" accumulation chosen as the trainer would choose it.
- `gpu_report(build, "h100")` / `tpu_report(build, "v5e-8")`: the same, compiled here by the
  GPU's or the TPU's own compiler for compile-only devices (`ln_jax.xla.deviceless`).
- `census_report(build, "gpu")`: the step lowered for a platform, its matmuls by dtype.

`python -m ln_jax.compile_check` is the command (`ln_jax.compile_check`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.runtime import platforms
from ln_jax.task import Task, make_task
from ln_jax.train import accumulation, steps
from ln_jax.train.setup import check_device
from ln_jax.xla import deviceless, kernel_census, matmul_census

GIB = 1024**3
MIB = 1024**2

# --------------------------------------------------------------------------- abstract state


def tree_bytes_per_device(tree: Any) -> int:
    """Per-device bytes of a pytree of ShapeDtypeStructs (or arrays) with NamedShardings: the
    largest shard of each leaf."""
    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(tree)
    )


# --------------------------------------------------------------------------- compile


def resolve_mesh(mesh: Any, cfg: TrainConfig) -> jax.sharding.Mesh:
    """A Mesh from a Mesh, a (data, fsdp, tensor) tuple, or None (= the config's mesh).

    Raises:
      ValueError: from `ln_jax.sharding` when the mesh does not match the device count.
    """
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    if mesh is None:
        mesh = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    return sharding.make_mesh(*mesh)


def lower_train_step(
    cfg: TrainConfig,
    task: Task,
    mesh: jax.sharding.Mesh,
    platforms: tuple[str, ...] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Lowers the trainer's own train step (`ln_jax.train.steps`) of `cfg` and its task
    (`make_task(cfg)`, made once by the caller) for `mesh` from the abstract state; returns
    (lowered, {"pieces": the abstract TrainState, "batch": the abstract batch}).

    Lowered inside `sharding.use_mesh(mesh)`, so that the model's activation sharding
    constraints apply (outside a mesh context they are no-ops). `platforms`: JAX's names of
    the platforms to lower for ("cuda", "tpu"; default: the mesh's), no device of theirs needed.
    """
    pieces = steps.abstract_state(task, mesh)
    batch = steps.abstract_batch(task, mesh)
    train, _ = steps.jit_steps(cfg, task, mesh, pieces)
    with sharding.use_mesh(mesh):
        lowered = train.lower(pieces.state, pieces.rest, batch, platforms=platforms)
    return lowered, {"pieces": pieces, "batch": batch}


@dataclasses.dataclass(frozen=True)
class PlatformCensus:
    """`census_report`'s answer.

    Attributes:
      cfg: the config as built for the platform ("auto" fields resolved there).
      census: the train step's matmuls (`ln_jax.xla.matmul_census`).
      mesh: the mesh's axis sizes.
      num_params: the model's parameter count.
      params_bytes, opt_state_bytes, batch_bytes: per device, exact on any backend (the
        largest shard of each array); activations need the platform's compiler.
    """

    cfg: TrainConfig
    census: matmul_census.Census
    mesh: dict[str, int]
    num_params: int
    params_bytes: int
    opt_state_bytes: int
    batch_bytes: int


def census_report(
    build: Callable[[], TrainConfig], platform: str, mesh: Any = None
) -> PlatformCensus:
    """The train step as a `platform` ("gpu", "tpu") device would run it, lowered here
    without one: the census of its matmuls and its per-device state bytes.

    `build` makes the config inside `platforms.lowering_for(platform)`, so its "auto" fields
    resolve as on that platform (dtype bfloat16, its attention and dropout bits), and the
    Pallas kernel lowers as Triton, not as its CPU interpreter. Nothing is compiled: there is
    no estimate of the activations' memory for a platform that is not here, and an "auto"
    gradient accumulation is lowered at one micro-batch.

    Raises:
      ConfigError: a setting that cannot run on `platform` (as the trainer would refuse it).
      ValueError: an unknown platform, or a mesh that does not match the devices.
    """
    with platforms.lowering_for(platform) as target:
        cfg = build()
        check_device(cfg)
        if not cfg.grad_accum_steps:  # "auto" would be chosen on the device: one micro-batch
            cfg = dataclasses.replace(cfg, grad_accum_steps=1)
        mesh = resolve_mesh(mesh, cfg)
        lowered, abstract = lower_train_step(cfg, make_task(cfg), mesh, platforms=(target,))
    state = abstract["pieces"].state
    return PlatformCensus(
        cfg=cfg,
        census=matmul_census.read(lowered, (f"{platform} ({target})",)),
        mesh=dict(mesh.shape),
        num_params=abstract["pieces"].num_params,
        params_bytes=tree_bytes_per_device(state["params"]),
        opt_state_bytes=tree_bytes_per_device(state["opt_state"]),
        batch_bytes=tree_bytes_per_device(abstract["batch"]),
    )


def format_census(report: PlatformCensus) -> str:
    """The config line, the per-device state bytes and the matmul census."""
    cfg, m = report.cfg, report.cfg.model
    mesh = " ".join(f"{k}={v}" for k, v in report.mesh.items())
    state = ", ".join(
        f"{label} {getattr(report, key) / MIB:.1f} MiB"
        for label, key in (
            ("parameters", "params_bytes"),
            ("optimizer", "opt_state_bytes"),
            ("batch", "batch_bytes"),
        )
    )
    return "\n".join(
        [
            f"{cfg.name}: {m.placement}-LN {m.size}, {m.dtype}, attention {m.attention_impl}, "
            f"dropout bits {cfg.dropout_rng}; {report.num_params / 1e6:.1f}M parameters; "
            f"mesh {mesh}",
            f"per device: {state} (activations: only the platform's compiler knows)",
            report.census.format(),
        ]
    )


def _memory_fields(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    if stats is None:  # some backends give no analysis
        return {}
    names = ("argument", "output", "alias", "temp", "generated_code")
    out = {f"{n}_bytes": int(getattr(stats, f"{n}_size_in_bytes")) for n in names}
    out["total_bytes"] = (
        out["argument_bytes"]
        + out["output_bytes"]
        - out["alias_bytes"]
        + out["temp_bytes"]
        + out["generated_code_bytes"]
    )
    peak = getattr(stats, "peak_memory_in_bytes", 0)
    if peak:
        out["xla_peak_bytes"] = int(peak)
    return out


def _flops(compiled: Any) -> float:
    costs = compiled.cost_analysis()
    if isinstance(costs, (list, tuple)):  # older JAX: one dict per program
        costs = costs[0] if costs else {}
    return float((costs or {}).get("flops", 0.0))


def _default_compiler_options(mesh: jax.sharding.Mesh) -> dict[str, Any] | None:
    # Nothing runs, and XLA:CPU assigns buffers (the memory figures) and counts FLOPs before its
    # LLVM passes: skipping LLVM's optimisations halves the compile with the same figures.
    return {"xla_backend_optimization_level": 0} if _platform(mesh) == "cpu" else None


def _platform(mesh: jax.sharding.Mesh) -> str:
    return mesh.devices.flat[0].platform


def compile_report(
    cfg: TrainConfig,
    mesh: Any = None,
    compiler_options: dict[str, Any] | None = None,
    device_memory_gib: float | None = None,
) -> dict[str, Any]:
    """Compiles the train step for `mesh` without running it; per-device memory and FLOPs.

    Args:
      cfg: the run's config (only model, optim, data batch shapes, seed, accumulation and mesh
        are read).
      mesh: a `jax.sharding.Mesh`, a (data, fsdp, tensor) tuple (one entry may be -1), or
        None for `cfg.mesh`; it must use all of `jax.devices()` unless a Mesh is given.
      compiler_options: XLA options for the compile; None = backend optimisation level 0 on
        CPU (same memory and FLOP figures, half the compile time), the defaults elsewhere.
      device_memory_gib: the target's memory per device. Only used when
        `cfg.grad_accum_steps` is 0 ("auto"): the accumulation is then chosen as the trainer
        would choose it on such a device (`ln_jax.train.accumulation.fit`);
        without a budget, auto is reported at one micro-batch.

    Returns:
      A dict of per-device bytes ("params_bytes", "opt_state_bytes", "batch_bytes",
      "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
      "total_bytes" = arguments + outputs - aliased + temp + code), "flops_per_device" (XLA's
      cost analysis of the per-device program; where it gives none, as on a GPU, the census's
      matmul FLOPs: "flops_source"), "flops_per_step" (x devices), "num_params",
      "grad_accum_steps" (the one compiled), "mesh", "num_devices", "platform",
      "device_kind", shape fields, the lowering and compile seconds, and on a GPU mesh (real
      or `ln_jax.xla.deviceless`) "kernel_census" (`ln_jax.xla.kernel_census.Census`) and
      "hlo_text".
    """
    mesh = resolve_mesh(mesh, cfg)
    if compiler_options is None:
        compiler_options = _default_compiler_options(mesh)
    task = make_task(cfg)  # once: every accumulation tried compiles the same task
    if cfg.grad_accum_steps:
        return _compile_report(cfg, task, mesh, compiler_options)
    reports = []

    def compile_at(k: int) -> tuple[int, int]:
        at_k = dataclasses.replace(cfg, grad_accum_steps=k)
        reports.append(_compile_report(at_k, task, mesh, compiler_options))
        temp = reports[-1].get("temp_bytes", 0)  # 0, 0: no memory analysis (fits at one)
        return reports[-1].get("total_bytes", 0) - temp, temp

    if device_memory_gib is None:  # no budget: reported at one micro-batch
        compile_at(1)
    else:
        budget = accumulation.budget_bytes(int(device_memory_gib * GIB))
        batch, divisor = cfg.data.global_batch_size, sharding.batch_divisor(mesh)
        accumulation.fit(batch, divisor, budget, compile_at)
    return {**reports[-1], "grad_accum_auto": True}


def _compile_report(
    cfg: TrainConfig,
    task: Task,
    mesh: jax.sharding.Mesh,
    compiler_options: dict[str, Any] | None,
) -> dict[str, Any]:
    start = time.perf_counter()
    lowered, abstract = lower_train_step(cfg, task, mesh)
    lowered_at = time.perf_counter()
    compiled = lowered.compile(compiler_options=compiler_options)
    compiled_at = time.perf_counter()
    pieces = abstract["pieces"]
    state = pieces.state
    kernels = _kernels(compiled, mesh)
    flops, source = _flops(compiled), "xla"
    if not flops and kernels:  # XLA:GPU's cost analysis leaves out cuBLAS, or gives nothing
        flops = kernels["kernel_census"].by_class().get("matmul", {}).get("flops", 0.0)
        source = "kernel_census"  # matmuls only; loop bodies times their trip counts
    return {
        "name": cfg.name,
        "model_size": cfg.model.size,
        "placement": cfg.model.placement,
        "num_params": pieces.num_params,
        "global_batch_size": cfg.data.global_batch_size,
        "seq_length": cfg.data.max_seq_length,
        "grad_accum_steps": cfg.grad_accum_steps,
        "dtype": cfg.model.dtype,
        "attention_impl": cfg.model.attention_impl,
        "dropout_rng": cfg.dropout_rng,
        "remat": cfg.model.remat,
        "mesh": dict(mesh.shape),
        "num_devices": mesh.size,
        "platform": _platform(mesh),
        "device_kind": mesh.devices.flat[0].device_kind,
        "params_bytes": tree_bytes_per_device(state["params"]),
        "opt_state_bytes": tree_bytes_per_device(state["opt_state"]),
        "batch_bytes": tree_bytes_per_device(abstract["batch"]),
        **_memory_fields(compiled),
        "flops_per_device": flops,
        "flops_per_step": flops * mesh.size,
        "flops_source": source,
        "lower_seconds": lowered_at - start,
        "compile_seconds": compiled_at - lowered_at,
        **kernels,
    }


def _kernels(compiled: Any, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """On a GPU mesh: {"kernel_census": the program's kernels (`ln_jax.xla.kernel_census`),
    "hlo_text": its optimised HLO}."""
    if _platform(mesh) != "gpu":
        return {}
    text = compiled.as_text()
    return {"kernel_census": kernel_census.read(text), "hlo_text": text}


# --------------------------------------------------------------------------- report


def format_report(report: dict[str, Any]) -> str:
    """The report as a small human-readable table."""
    mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
    lines = [
        f"{report['name']}: {report['placement']}-LN {report['model_size']} "
        f"({report['num_params'] / 1e6:.1f}M params, {report['dtype']}, attention "
        f"{report['attention_impl']}, dropout bits {report['dropout_rng']}, remat "
        f"{report['remat']}), global batch {report['global_batch_size']} x seq "
        f"{report['seq_length']}, grad accumulation {report['grad_accum_steps']}"
        + (" (auto)" if report.get("grad_accum_auto") else ""),
        f"mesh {mesh} on {report['num_devices']} x {report['device_kind']} ({report['platform']})",
        f"{'per-device memory':<34s}{'MiB':>12s}",
    ]
    rows = [
        ("parameters", "params_bytes"),
        ("optimizer state", "opt_state_bytes"),
        ("batch", "batch_bytes"),
        ("arguments (state + batch)", "argument_bytes"),
        ("outputs", "output_bytes"),
        ("aliased (donated state)", "alias_bytes"),
        ("temporaries (activations, grads)", "temp_bytes"),
        ("generated code", "generated_code_bytes"),
        ("total (args + out - alias + temp)", "total_bytes"),
    ]
    lines += [f"  {label:<32s}{report[key] / MIB:12.1f}" for label, key in rows if key in report]
    lines.append(
        f"FLOPs per step: {report['flops_per_step'] / 1e12:.3f} TFLOP "
        f"({report['flops_per_device'] / 1e12:.3f} per device)"
    )
    if report.get("flops_source") == "kernel_census":
        lines.append("  (the matmuls of the compiled program, `ln_jax.xla.kernel_census`)")
    elif report["grad_accum_steps"] > 1:
        lines.append(
            "  (with accumulation XLA counts the scanned micro-batch loop's body once: FLOPs "
            "are a lower bound)"
        )
    lines.append(
        f"lowered in {report['lower_seconds']:.1f} s, compiled in {report['compile_seconds']:.1f} s"
    )
    return "\n".join(lines)


def fits(report: dict[str, Any], device_memory_gib: float) -> tuple[bool, str]:
    """Whether the per-device estimate fits the budget, and a one-line verdict."""
    total = report.get("total_bytes")
    if total is None:
        return True, "no memory analysis from this backend: cannot check the budget"
    budget = device_memory_gib * GIB
    used = f"{total / GIB:.2f} GiB of {device_memory_gib:g} GiB per device"
    if total > budget:
        return False, (
            f"WILL NOT FIT: the train step needs an estimated {used}. Shard more (--mesh with "
            "fsdp/tensor > 1), lower the per-device batch, use grad_accum_steps, "
            "model.remat=dots (or full) or bfloat16."
        )
    return True, f"fits: {used} ({100 * total / budget:.0f}%)"


# --------------------------------------------------------------------------- elsewhere


def gpu_report(
    build: Callable[[], TrainConfig],
    gpu: str,
    mesh: tuple[int, int, int] | None = None,
    num_devices: int = 1,
    device_memory_gib: float | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`compile_report` for `num_devices` GPUs of model `gpu` ("h100"), compiled on this host
    without them (`ln_jax.xla.deviceless`): the config is built as on a GPU ("auto" fields), an
    "auto" accumulation is chosen for the GPU's memory (or `device_memory_gib`), and the report
    has the program's "kernel_census". `options`: XLA compiler options over
    `deviceless.COMPILER_OPTIONS` (e.g. Triton GEMMs on, at autotune level 0).

    Raises:
      DevicelessError: no CUDA plugin here (the message says what to install).
      ConfigError: a setting that cannot run on a GPU.
      ValueError: an unknown GPU, or a mesh that does not match `num_devices`.
    """
    budget = device_memory_gib or deviceless.spec(gpu).memory_bytes / GIB
    devices = deviceless.gpu_devices(gpu, num_devices)
    options = {**deviceless.COMPILER_OPTIONS, **(options or {})}
    return _compile_without_devices(build, "gpu", devices, mesh, budget, options)


def tpu_report(
    build: Callable[[], TrainConfig],
    tpu: str,
    mesh: tuple[int, int, int] | None = None,
    device_memory_gib: float | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`compile_report` for the TPU slice `tpu` ("v5e-8", `deviceless.TPU_SLICES`), compiled
    on this host by the TPU's own compiler (libtpu) without a TPU: the config is built as on
    a TPU ("auto" fields: bfloat16, XLA's attention, hash dropout bits), and an "auto"
    accumulation is chosen for the slice's memory per device (or `device_memory_gib`).
    `options`: XLA compiler options.

    Raises:
      DevicelessError: no libtpu here, or not jax's (the message says what to install).
      ConfigError: a setting that cannot run on a TPU.
      ValueError: an unknown slice, or a mesh that does not match its devices.
    """
    budget = device_memory_gib or deviceless.tpu_slice(tpu).memory_bytes / GIB
    devices = deviceless.tpu_devices(tpu)
    return _compile_without_devices(build, "tpu", devices, mesh, budget, options)


def _compile_without_devices(
    build: Callable[[], TrainConfig],
    platform: str,
    devices: list[Any],
    mesh: tuple[int, int, int] | None,
    budget_gib: float,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    """`compile_report` on compile-only `devices` of `platform`, the config built as there."""
    with platforms.lowering_for(platform), deviceless.without_persistent_cache():
        cfg = build()
        check_device(cfg)
        if platform == "gpu":
            deviceless.check_cudnn(cfg.model.attention_impl)
        shape = mesh or (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        on_devices = sharding.make_mesh(*shape, devices=devices)
        return compile_report(cfg, on_devices, options, budget_gib)
