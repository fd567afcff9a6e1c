"""Every mesh and sharding call of ln_jax lives here.

Parameters carry *logical* axis names (`vocab`, `embed`, `mlp`, `heads`, `kv`, ...); a table of
rules maps them to the physical mesh axes `data`, `fsdp` and `tensor`. Activations use their own
`act_*` names so that a batch sharded over `('data', 'fsdp')` never collides with a weight
dimension sharded over `fsdp`.

When the next JAX sharding API change lands, this is the only file that should need to change.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import NamedSharding, PartitionSpec

from ln_jax.validate import ConfigError

_log = logging.getLogger(__name__)
MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")
# The residual stream [batch, length, embed]: the activation every sub-layer reads and adds to.
ACT: tuple[str, ...] = ("act_batch", "act_length", "act_embed")
ACTIVATION_LAYOUTS = ("xla", "row_major")

# Logical axis -> mesh axis (or axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed_proj", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("position", None),
    ("segment", None),
    ("classes", None),
    ("layers", None),
    ("dlcl_to", None),
    ("dlcl_from", None),
    # activations
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_kv", None),
    ("act_vocab", "tensor"),
    ("act_predictions", None),
)

Rules = Sequence[tuple[str, Any]]


def _auto_axis_types(n: int) -> tuple[Any, ...]:
    # Logical rules + GSPMD propagation need Auto axes; make_mesh defaults to Explicit.
    return (jax.sharding.AxisType.Auto,) * n


def resolve_mesh_shape(
    data: int, fsdp: int, tensor: int, num_devices: int | None = None
) -> tuple[int, int, int]:
    """Resolves a mesh shape in which at most one axis is -1 ("all the remaining devices").

    Raises:
      ValueError: naming both the requested size and the device count when they do not match.
    """
    n = jax.device_count() if num_devices is None else num_devices
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.{name}={size}: each mesh axis is a positive size or -1.")
    auto = [k for k, v in sizes.items() if v == -1]
    if len(auto) > 1:
        raise ConfigError(
            f"mesh axes {auto} are all -1; at most one mesh axis may be -1 (= the rest)."
        )
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if auto:
        if n % fixed:
            raise ConfigError(
                f"mesh {sizes} cannot fill {n} devices: the fixed axes multiply to {fixed}, "
                f"which does not divide {n}."
            )
        sizes[auto[0]] = n // fixed
    total = math.prod(sizes.values())
    if total != n:
        raise ConfigError(
            f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} x tensor={sizes['tensor']} "
            f"needs {total} devices but {n} are available; set the mesh.* fields so that they "
            f"multiply to {n}, or make one of them -1."
        )
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> jax.sharding.Mesh:
    """Builds the ('data', 'fsdp', 'tensor') mesh; one axis may be -1."""
    devs = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devs))
    if devices is None:
        return jax.make_mesh(shape, MESH_AXES, axis_types=_auto_axis_types(3))
    if devs[0].platform == "tpu":  # the chips' links decide the order (compile-only devices)
        return jax.make_mesh(shape, MESH_AXES, axis_types=_auto_axis_types(3), devices=devs)
    return jax.sharding.Mesh(
        np.asarray(devs).reshape(shape), MESH_AXES, axis_types=_auto_axis_types(3)
    )


def single_device_mesh() -> jax.sharding.Mesh:
    """A 1x1x1 mesh on the first device: lets sharded code run unchanged on one device."""
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def lockstep(mesh: jax.sharding.Mesh) -> bool:
    """Whether a loop must wait for each program on `mesh` before dispatching the next: on
    several CPU devices.

    XLA:CPU runs the devices of every queued program on one thread pool. A loop that runs ahead
    fills it with devices waiting in a collective for devices of another program that then get
    no thread: a deadlock, which XLA ends after 40 s by aborting the process ("Termination
    timeout for `all gather ...`", "Fatal Python error: Aborted"). Measured here: BERT-tiny's
    train step on a 2x2x2 CPU mesh, dispatched from pre-read batches without waiting, aborted
    near step 200; waiting for each step, 400 steps ran. A GPU or TPU runs each device's
    programs on its own stream, and one CPU device has no collective.
    """
    return mesh.size > 1 and mesh.devices.flat[0].platform == "cpu"


@contextlib.contextmanager
def use_mesh(mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
    """Context in which modules are built sharded and activation constraints apply."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules)):
        yield


def logical_to_spec(names: Sequence[str | None], rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec using `rules`."""
    return nn.logical_to_mesh_axes(tuple(names), tuple(rules))


def named_sharding(
    mesh: jax.sharding.Mesh, names: Sequence[str | None], rules: Rules = DEFAULT_RULES
) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(names, rules))


_ROW_MAJOR_STREAM = contextvars.ContextVar("ln_jax_row_major_stream", default=False)


@contextlib.contextmanager
def activation_layout(layout: str) -> Iterator[None]:
    """While a model is traced inside it, "row_major" pins the memory layout of the residual
    stream (every activation `constrain`ed to `ACT`: the embeddings' output and each
    sub-layer's output) to row-major [batch, length, embed], in the forward pass and in its
    cotangent; "xla" leaves every layout to XLA (`model.activation_layout`).

    Values are unchanged; only where XLA may transpose moves. On an H100, XLA:GPU laid the
    stream out batch-minor and transposed it around every residual add and LayerNorm backward
    (docs/results/gpu/journal.md); this pins it.
    """
    if layout not in ACTIVATION_LAYOUTS:
        raise ConfigError(
            f"activation layout {layout!r} is not one of {ACTIVATION_LAYOUTS}: set "
            "--config.model.activation_layout to one of them."
        )
    token = _ROW_MAJOR_STREAM.set(layout == "row_major")
    try:
        yield
    finally:
        _ROW_MAJOR_STREAM.reset(token)


def _row_major(x: jax.Array) -> jax.Array:
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrains an activation to its logical sharding (a no-op outside a mesh context) and,
    inside `activation_layout("row_major")`, the residual stream's layout to row-major."""
    if _ROW_MAJOR_STREAM.get() and tuple(names) == ACT:
        x = _row_major(x)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return nn.with_logical_constraint(x, tuple(names))


def batch_spec() -> PartitionSpec:
    """PartitionSpec of a batch's leading dimension: split over ('data', 'fsdp')."""
    return PartitionSpec(("data", "fsdp"))


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of every array of a batch (leading dimension = global batch)."""
    return NamedSharding(mesh, batch_spec())


def batch_struct(mesh: jax.sharding.Mesh) -> Callable[..., jax.ShapeDtypeStruct]:
    """`struct(shape, dtype=int32)`: the ShapeDtypeStruct of a batch array of `shape` (its
    leading axis the examples), split as every batch array is (`batch_sharding(mesh)`); what a
    task's `abstract_batch` is made of."""
    sh = batch_sharding(mesh)

    def struct(shape: tuple[int, ...], dtype: Any = np.int32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

    return struct


def batch_shards(rows: int) -> int:
    """Into how many device shards the current mesh splits a batch of `rows` (the data x fsdp
    device count where it divides `rows`, else their gcd; 1 outside a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return 1
    return math.gcd(rows, mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def batch_divisor(mesh: jax.sharding.Mesh) -> int:
    """The global batch size must be a multiple of this (the data x fsdp device count)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def param_spec(
    names: Sequence[str | None],
    shape: Sequence[int],
    mesh: jax.sharding.Mesh,
    rules: Rules = DEFAULT_RULES,
) -> PartitionSpec:
    """The PartitionSpec of a parameter from its logical names, for this mesh.

    1. Each dimension takes the mesh axes its logical name maps to, unless an earlier dimension
       already uses them or their size does not divide the dimension (then it is replicated:
       `unsplit_dims` names those).
    2. ZeRO-3 style: a parameter that still does not use `fsdp` (biases, LayerNorm vectors,
       heads whose rule is `tensor`) is split over `fsdp` along its largest dimension that
       divides, so that `fsdp=N` leaves each device ~1/N of every parameter.
    """
    axes, _ = _split_axes(names, shape, mesh, rules)
    return PartitionSpec(*(a[0] if len(a) == 1 else (a or None) for a in axes))


def _split_axes(
    names: Sequence[str | None], shape: Sequence[int], mesh: jax.sharding.Mesh, rules: Rules
) -> tuple[list[tuple[str, ...]], list[tuple[str, int, tuple[str, ...]]]]:
    """`param_spec`'s mesh axes of each dimension, and the dimensions its rules would split
    that the mesh cannot: (logical name, size, mesh axes) for each size the axes' product
    (> 1) does not divide."""
    table = dict(rules)
    used: set[str] = set()
    axes: list[tuple[str, ...]] = []
    refused: list[tuple[str, int, tuple[str, ...]]] = []
    for name, size in zip(names, shape, strict=True):
        target = table.get(name) if name is not None else None
        target = (target,) if isinstance(target, str) else tuple(target or ())
        n = math.prod(mesh.shape[a] for a in target)
        free = target and not used & set(target)
        ok = free and size % n == 0
        if free and size % n:
            refused.append((name, size, target))
        axes.append(target if ok else ())
        used |= set(target) if ok else set()
    fsdp = mesh.shape.get("fsdp", 1)
    if fsdp > 1 and "fsdp" not in used:
        fits = [
            i
            for i, size in enumerate(shape)
            if size % (math.prod(mesh.shape[a] for a in axes[i]) * fsdp) == 0
        ]
        if fits:
            i = max(fits, key=lambda j: shape[j])
            axes[i] = (*axes[i], "fsdp")
    return axes, refused


def unsplit_dims(state: Any, mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> dict:
    """The parameter dimensions of `state` (annotated nnx Variables, values or
    ShapeDtypeStructs) that the rules map to mesh axes whose size does not divide them:
    {(logical name, size, mesh axes): number of parameters}. Each such dimension stays whole
    on those axes' devices (e.g. 12 heads on `tensor=8`: every tensor device computes all
    the heads), which runs, but not as split as the mesh asks."""
    found: dict[tuple[str, int, tuple[str, ...]], int] = {}
    for var in jax.tree.leaves(state, is_leaf=_is_var):
        names = var.get_metadata().get("out_sharding") if _is_var(var) else None
        if names is None:
            continue
        value = var.get_value() if hasattr(var, "get_value") else var[...]
        for key in _split_axes(names, value.shape, mesh, rules)[1]:
            found[key] = found.get(key, 0) + 1
    return found


def unsplit_notice(found: dict, mesh: jax.sharding.Mesh) -> str | None:
    """One line for `unsplit_dims`'s findings (None if there are none), with the axis sizes
    that divide both the dimension and the mesh's device count."""
    if not found:
        return None
    parts = []
    for (name, size, axes), count in sorted(found.items()):
        where = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in axes)
        devices = mesh.devices.size
        fits = [d for d in range(2, devices + 1) if size % d == devices % d == 0]
        hint = " or ".join(map(str, fits))
        hint = f"{'x'.join(axes)} {hint} would split it" if fits else "no larger axis splits it"
        parts.append(
            f"{where} does not divide '{name}' ({size}) of {count} parameters: that dimension "
            f"stays whole (replicated) on those devices; {hint}"
        )
    return "; ".join(parts) + "."


_NOTICED: set[str] = set()


def _notice_unsplit(state: Any, mesh: jax.sharding.Mesh, rules: Rules) -> None:
    """Logs `unsplit_notice` once per process and message."""
    notice = unsplit_notice(unsplit_dims(state, mesh, rules), mesh)
    if notice is not None and notice not in _NOTICED:
        _NOTICED.add(notice)
        _log.warning("%s", notice)


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings (as a pure dict) for an nnx.State of annotated variables.

    Unannotated variables are replicated. Works on abstract (eval_shape) states too.
    """

    def sharding_of(var: nnx.Variable) -> NamedSharding:
        names = var.get_metadata().get("out_sharding")
        value = var.get_value() if hasattr(var, "get_value") else var[...]
        if names is None:
            return NamedSharding(mesh, PartitionSpec())
        return NamedSharding(mesh, param_spec(names, value.shape, mesh, rules))

    _notice_unsplit(state, mesh, rules)
    return nnx.to_pure_dict(jax.tree.map(sharding_of, state, is_leaf=_is_var))


def _init_values(build: Callable[[], nnx.Module]) -> dict:
    with nnx.use_eager_sharding(False):
        return nnx.to_pure_dict(nnx.split(build())[1])


def _abstract(build: Callable[[], nnx.Module]) -> tuple[Any, Any]:
    """(graphdef, state of ShapeDtypeStructs): the module traced for shapes only."""
    with nnx.use_eager_sharding(False):
        return nnx.split(nnx.eval_shape(build))


def _merge(graphdef: Any, abstract: Any, values: dict) -> nnx.Module:
    state = jax.tree.map(lambda x: x, abstract)  # fresh Variables: `abstract` may be reused
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def _init_compiler_options() -> dict[str, Any] | None:
    """XLA options for the initialisers: on CPU, LLVM optimisation level 1 instead of 3.

    The program runs once, so its speed does not matter, and level 1 compiles it 2-3x faster
    (2.6 s against 7 s for a 2-layer model). The values are bit for bit those of the default
    level (tests/test_sharding.py checks it); level 0 would change them.
    """
    return {"xla_backend_optimization_level": 1} if jax.default_backend() == "cpu" else None


def _build_jitted(build: Callable[[], nnx.Module], out_shardings: Any = None) -> nnx.Module:
    """Runs all initialisers in one jit (one compilation instead of one per random draw)."""
    graphdef, abstract = _abstract(build)
    shardings = None if out_shardings is None else out_shardings(abstract)
    values = jax.jit(
        lambda: _init_values(build),
        out_shardings=shardings,
        compiler_options=_init_compiler_options(),
    )()
    return _merge(graphdef, abstract, values)


def create_sharded(
    build: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES
) -> nnx.Module:
    """Builds a module inside jit so that each parameter is created directly in its shards.

    The initialisers run under `jax.jit` with `out_shardings` from `param_spec`, so XLA
    generates each shard on its own device and the whole model never sits on one device.
    `build` is compiled anew at each call; `create_seeded` compiles once per structure.
    """
    with use_mesh(mesh, rules):
        return _build_jitted(build, lambda abstract: state_shardings(abstract, mesh, rules))


def create_unsharded(build: Callable[[], nnx.Module]) -> nnx.Module:
    """Builds an annotated module on the default device, with no mesh (tests, conversion)."""
    return _build_jitted(build)


# (cache_key, mesh, rules) -> (graphdef, abstract state, jitted initialiser of a PRNG key).
# Compiling the initialisers of even a tiny BERT takes seconds on CPU; a model of the same
# structure built again (another seed, another test) reuses them.
_SEEDED_INITS: dict[Hashable, tuple[Any, Any, Callable[[jax.Array], dict]]] = {}


def _hashable_rules(rules: Rules) -> tuple[tuple[str, Any], ...]:
    as_axes = lambda t: tuple(t) if isinstance(t, list) else t
    return tuple((name, as_axes(target)) for name, target in rules)


def _seeded_init(
    make: Callable[[nnx.Rngs], nnx.Module],
    cache_key: Hashable,
    mesh: jax.sharding.Mesh | None,
    rules: Rules,
) -> tuple[Any, Any, Callable[[jax.Array], dict]]:
    key = (cache_key, None) if mesh is None else (cache_key, mesh, _hashable_rules(rules))
    if key not in _SEEDED_INITS:
        graphdef, abstract = _abstract(lambda: make(nnx.Rngs(params=0)))
        shardings = None if mesh is None else state_shardings(abstract, mesh, rules)
        init = jax.jit(
            lambda rng: _init_values(lambda: make(nnx.Rngs(params=rng))),
            out_shardings=shardings,
            compiler_options=_init_compiler_options(),
        )
        _SEEDED_INITS[key] = (graphdef, abstract, init)
    return _SEEDED_INITS[key]


def create_seeded(
    make: Callable[[nnx.Rngs], nnx.Module],
    seed: int | jax.Array,
    *,
    cache_key: Hashable,
    mesh: jax.sharding.Mesh | None = None,
    rules: Rules = DEFAULT_RULES,
) -> nnx.Module:
    """`make(nnx.Rngs(params=seed))` with its initialisers compiled once per `cache_key` and mesh.

    The PRNG key is an argument of the jitted initialiser, so another seed (or the same one
    again) reuses the compiled program. `cache_key` must identify the module `make` builds
    (e.g. its frozen config): two `make`s with equal keys must build the same structure.
    Under `mesh` every parameter is created directly in its shards, as in `create_sharded`;
    without one, on the default device as in `create_unsharded`. Same values as either of
    those with `nnx.Rngs(params=seed)` inside `build`.
    """
    rng = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    if mesh is None:
        graphdef, abstract, init = _seeded_init(make, cache_key, None, rules)
        return _merge(graphdef, abstract, init(rng))
    with use_mesh(mesh, rules):
        graphdef, abstract, init = _seeded_init(make, cache_key, mesh, rules)
        return _merge(graphdef, abstract, init(rng))


def abstract_sharded(
    build: Callable[[], nnx.Module], mesh: jax.sharding.Mesh | None, rules: Rules = DEFAULT_RULES
) -> tuple[Any, Any]:
    """(graphdef, abstract state) of a module with no array materialised.

    With a mesh, each leaf is a ShapeDtypeStruct carrying its NamedSharding (`param_spec`):
    the target of a checkpoint restore or of an ahead-of-time compile.
    """
    with nnx.use_eager_sharding(False):
        graphdef, abstract = nnx.split(nnx.eval_shape(build))
    if mesh is not None:
        pure = nnx.to_pure_dict(abstract)
        shardings = state_shardings(abstract, mesh, rules)
        nnx.replace_by_pure_dict(
            abstract,
            jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), pure, shardings
            ),
        )
    return graphdef, abstract


def bytes_per_device(tree: Any) -> dict[Any, int]:
    """Bytes of `tree`'s arrays held on each device (addressable shards only)."""
    held: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def mirror_shardings(tree: Any, params: Any, mesh: jax.sharding.Mesh) -> Any:
    """Shardings for a pytree whose leaves mirror `params` (optimizer moments, EMA, ...).

    A leaf takes the sharding of the parameter whose tree path is a suffix of its own and whose
    shape is equal (Adam's `mu`/`nu` copy the parameter tree); any other leaf (step counts,
    scalars) is replicated. `tree` may be abstract (`jax.eval_shape`).
    """
    by_path = {
        tuple(path): leaf.sharding for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    shapes = {
        tuple(path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path: Any, leaf: Any) -> Any:
        path = tuple(path)
        for start in range(len(path)):
            suffix = path[start:]
            if suffix in by_path and shapes[suffix] == leaf.shape:
                return by_path[suffix]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def per_shard(
    fn: Callable, in_names: Sequence[Sequence[str | None]], out_names: Sequence[str | None]
) -> Callable:
    """`fn` applied to each device's shard of its arguments (`jax.shard_map` over the context
    mesh, each argument and the output split by its logical names); `fn` itself outside a
    mesh. For kernels XLA cannot partition (Pallas calls), whose work is independent along
    the sharded axes."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return fn
    in_specs = tuple(nn.logical_to_mesh_axes(tuple(n)) for n in in_names)
    out_spec = nn.logical_to_mesh_axes(tuple(out_names))
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_spec, check_vma=False)


# --------------------------------------------------------------------------- compile-only devices
# Devices that only compile (`ln_jax.xla.deviceless`: a GPU's or TPU's compiler on a host
# without one) hold no array: a host value stands there as its abstract shape and sharding.


def is_compile_only(devices: Any) -> bool:
    """Whether these devices (a mesh's `.devices`, a list) only compile: no array lives there."""
    first = next(iter(getattr(devices, "flat", devices)))
    return getattr(first.client, "runtime_type", "") == "compile_only_runtime"


def abstract(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    """A host value's shape and dtype with `sharding`: what stands for it on compile-only
    devices, where no array can be put."""
    return jax.ShapeDtypeStruct(np.shape(value), np.asarray(value).dtype, sharding=sharding)
