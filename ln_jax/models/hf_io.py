"""Reading HuggingFace checkpoints and moving arrays between HF's layout and ln_jax's.

Shared by the BERT converter (`ln_jax.models.bert.convert`) and the Marian one
(`ln_jax.models.translation.convert`). Only local files are read; nothing is downloaded.
HF torch `Linear` weights are [out, in]; ln_jax kernels are [in..., out...], attention
projections split per head (q/k/v [D, heads, head_dim], output [heads, head_dim, D]).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

Arrays = dict[str, np.ndarray]
ParamPath = tuple[Any, ...]

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TORCH_SUFFIXES = (".bin", ".pt", ".pth")

# An ln_jax array's layout from HF's: "copy" (same), "flat" (HF flat, ln_jax split per head),
# or k: a torch Linear [out, in] whose ln_jax kernel is [in..., out...] with k input axes.
Layout = Any


def hf_shape(kind: Layout, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of an array whose ln_jax shape is `shape`."""
    if kind == "copy":
        return shape
    if kind == "flat":
        return (math.prod(shape),)
    return (math.prod(shape[kind:]), math.prod(shape[:kind]))


def to_ln(x: np.ndarray, kind: Layout, shape: tuple[int, ...]) -> np.ndarray:
    return x if kind == "copy" else (x if kind == "flat" else x.T).reshape(shape)


def to_hf(x: np.ndarray, kind: Layout) -> np.ndarray:
    if kind == "copy":
        return x
    if kind == "flat":
        return x.reshape(-1)
    return x.reshape(math.prod(x.shape[:kind]), -1).T


def read_state_dict(path: str | os.PathLike) -> Arrays:
    """The arrays of a local HuggingFace checkpoint, keys as stored.

    Args:
      path: a `.safetensors` file, a torch `state_dict` (`.bin`, `.pt`, `.pth`), a sharded
        checkpoint's `.index.json`, or a directory holding one of `WEIGHT_FILES` (searched in
        that order).

    Raises:
      FileNotFoundError: naming the path and the files looked for.
      ImportError: for a torch file when torch is not installed.
    """
    file = weights_file(Path(path))
    if file.name.endswith(".index.json"):
        shards = sorted(set(json.loads(file.read_text())["weight_map"].values()))
        return {k: v for s in shards for k, v in read_file(file.parent / s).items()}
    return read_file(file)


def check_shape(key: str, found: tuple[int, ...], kind: Layout, shape: tuple[int, ...]) -> None:
    """Raises ValueError when the checkpoint's array `key` cannot fill an ln_jax `shape`."""
    want = hf_shape(kind, shape)
    if tuple(found) != want:
        raise ValueError(
            f"shape mismatch at {key!r}: the checkpoint has {tuple(found)}, the model expects "
            f"{want} (HF layout)."
        )


def weights_file(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(
            f"no HuggingFace checkpoint in directory {str(path)!r}: looked for "
            f"{', '.join(WEIGHT_FILES)}."
        )
    raise FileNotFoundError(
        f"checkpoint path {str(path)!r} does not exist (expected a directory with one of "
        f"{', '.join(WEIGHT_FILES)}, or a .safetensors / {' / '.join(TORCH_SUFFIXES)} file)."
    )


def read_file(file: Path) -> Arrays:
    if file.suffix == ".safetensors":
        return read_safetensors(file)
    if file.suffix in TORCH_SUFFIXES:
        return read_torch(file)
    raise ValueError(
        f"{str(file)!r}: unknown checkpoint format; expected .safetensors or "
        f"{' / '.join(TORCH_SUFFIXES)}."
    )


def read_safetensors(file: Path) -> Arrays:
    from safetensors import numpy as st_numpy
    from safetensors import safe_open

    try:
        return st_numpy.load_file(str(file))
    except TypeError:  # bfloat16 has no numpy dtype: read through JAX, widen to float32
        with safe_open(str(file), framework="flax") as f:
            return {k: np.asarray(f.get_tensor(k), np.float32) for k in f.keys()}  # noqa: SIM118


def read_torch(file: Path) -> Arrays:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"reading {str(file)!r} needs PyTorch (pip install torch), or convert the "
            "checkpoint to model.safetensors."
        ) from e
    state = torch.load(file, map_location="cpu", weights_only=True)
    out = {}
    for key, t in state.items():
        t = t.detach()
        out[key] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return out


def param_shapes(model: nnx.Module) -> dict[ParamPath, tuple[int, ...]]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {path: tuple(var.get_value().shape) for path, var in flat}


def assign(model: nnx.Module, arrays: Mapping[ParamPath, np.ndarray]) -> None:
    """Writes each array into its parameter, in the parameter's existing sharding.

    `make_array_from_callback` hands each device only its own shard (also across hosts).
    """
    state = nnx.state(model, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        x, where = arrays[path], getattr(var.get_value(), "sharding", None)
        if where is None:  # an abstract, unsharded model: the default device
            var.set_value(jax.device_put(x))
        else:
            var.set_value(jax.make_array_from_callback(x.shape, where, lambda i, x=x: x[i]))
    nnx.update(model, state)


def target_model(build: Any, mesh: jax.sharding.Mesh | None, rules: Any = None) -> nnx.Module:
    """The module `build()` makes, to be filled by `assign`: abstract without a mesh (only
    shapes are traced, nothing is initialised), else created directly in its shards."""
    from ln_jax import sharding

    if mesh is None:
        return nnx.merge(*sharding.abstract_sharded(build, None))
    return sharding.create_sharded(build, mesh, rules or sharding.DEFAULT_RULES)
