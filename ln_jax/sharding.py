"""Every mesh and sharding call of ln_jax lives here.

Parameters carry *logical* axis names (`vocab`, `embed`, `mlp`, `heads`, `kv`, ...); a table of
rules maps them to the physical mesh axes `data`, `fsdp` and `tensor`. Activations use their own
`act_*` names so that a batch sharded over `('data', 'fsdp')` never collides with a weight
dimension sharded over `fsdp`.

When the next JAX sharding API change lands, this is the only file that should need to change.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

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
            raise ValueError(f"mesh.{name}={size}: each mesh axis is a positive size or -1.")
    auto = [k for k, v in sizes.items() if v == -1]
    if len(auto) > 1:
        raise ValueError(
            f"mesh axes {auto} are all -1; at most one mesh axis may be -1 (= the rest)."
        )
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if auto:
        if n % fixed:
            raise ValueError(
                f"mesh {sizes} cannot fill {n} devices: the fixed axes multiply to {fixed}, "
                f"which does not divide {n}."
            )
        sizes[auto[0]] = n // fixed
    total = math.prod(sizes.values())
    if total != n:
        raise ValueError(
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
    return jax.sharding.Mesh(
        np.asarray(devs).reshape(shape), MESH_AXES, axis_types=_auto_axis_types(3)
    )


def single_device_mesh() -> jax.sharding.Mesh:
    """A 1x1x1 mesh on the first device: lets sharded code run unchanged on one device."""
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


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


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrains an activation to its logical sharding; a no-op outside a mesh context."""
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


def batch_divisor(mesh: jax.sharding.Mesh) -> int:
    """The global batch size must be a multiple of this (the data x fsdp device count)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def create_sharded(
    build: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES
) -> nnx.Module:
    """Builds a module inside jit so that each parameter is created directly in its shards.

    Flax's eager sharding places a `with_sharding_constraint` on every annotated variable; inside
    `nnx.jit` that makes XLA generate each shard on its own device, so the full model is never
    materialised on one device.
    """
    with use_mesh(mesh, rules):
        return nnx.jit(build)()


def create_unsharded(build: Callable[[], nnx.Module]) -> nnx.Module:
    """Builds an annotated module on the default device, with no mesh (tests, conversion)."""
    with nnx.use_eager_sharding(False):
        return build()


def abstract_sharded(
    build: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES
) -> nnx.Module:
    """A module of ShapeDtypeStructs that carry their NamedShardings (checkpoint targets)."""
    with use_mesh(mesh, rules):
        return nnx.eval_shape(build)


def state_shardings(state: Any, mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for an nnx.State of annotated variables (replicated if unannotated)."""
    with use_mesh(mesh, rules):
        specs = nnx.get_partition_spec(state)
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s if isinstance(s, PartitionSpec) else PartitionSpec()),
        specs,
        is_leaf=lambda s: isinstance(s, PartitionSpec),
    )


def bytes_per_device(tree: Any) -> dict[Any, int]:
    """Bytes of `tree`'s arrays held on each device (addressable shards only)."""
    held: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held
