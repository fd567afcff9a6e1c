"""Admin (Liu et al. 2020, section 4.3): profiling omega, setting it, and folding it away.

With placement "admin" sub-layer i computes LN(x * omega_i + F_i(x)), omega_i [embed] learned.
Profiling walks the sub-layers in order with a running r = 1: omega_i = r, then
r <- sqrt(Var(x_i * omega_i) + Var(F_i(x_i))), so that omega_i^2 ~ 1 + sum_{j<i} Var(F_j).
Since x_i (the sub-layer input) depends on the earlier omegas through the LayerNorms, omega_i is
only known once omega_1..omega_{i-1} are set: `admin_profile` runs one (jitted) forward pass per
sub-layer on the same batch and dropout key.

Sub-layers are numbered stack by stack (`model.stack_views()`: the encoder, then a decoder),
layer by layer, in each layer's order (`StackView.sublayers`): in BERT 2l is layer l's
attention, 2l + 1 its feed-forward; in a decoder layer self-attention, cross-attention,
feed-forward. Exporting a profiled BERT as plain
Post-LN: `ln_jax.models.bert.fold.fold_admin`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax import paths
from ln_jax.nn.init import admin_closed_form
from ln_jax.nn.stack import Stacked, stacks

__all__ = [
    "ADMIN_PROFILE",
    "admin_closed_form",
    "admin_profile",
    "get_admin_omega",
    "profile_omegas",
    "set_admin_omega",
    "setup_admin",
    "sublayer_variances",
]
log = logging.getLogger(__name__)
# A run's profiled omegas, kept in its workdir so that a resumed run reuses them.
ADMIN_PROFILE = "admin_profile.json"


def _check_admin(model: Stacked) -> None:
    names = set(model.cfg.layer_placements)
    if names != {"admin"}:
        raise ValueError(
            f"Admin needs placement 'admin' in every layer, got {model.cfg.placement!r}."
        )


def _omega_params(model: Stacked) -> list[tuple[nnx.Param, int | None]]:
    """(omega variable, layer index into its stacked leading axis or None), per sub-layer,
    in order: stack by stack, layer by layer, sub-layer by sub-layer."""
    _check_admin(model)
    out = []
    for view, stack in stacks(model):
        for layer in range(view.num_layers):
            for name in view.sublayers:
                if stack.cfg.scan_layers:
                    out.append((getattr(stack.layers, name).omega, layer))
                else:
                    out.append((getattr(stack.layers[layer], name).omega, None))
    return out


def get_admin_omega(model: Stacked) -> np.ndarray:
    """The model's omegas, [num_sublayers, embed] float32."""
    rows = []
    for var, layer in _omega_params(model):
        value = np.asarray(jax.device_get(var[...]))
        rows.append(value if layer is None else value[layer])
    return np.stack(rows)


def set_admin_omega(model: Stacked, omegas: Any) -> None:
    """Sets every sub-layer's omega in place, keeping each parameter's sharding.

    Args:
      model: a model with placement "admin".
      omegas: [num_sublayers] (one scalar per sub-layer, broadcast over channels) or
        [num_sublayers, embed], in `_omega_params`' order.
    """
    params = _omega_params(model)
    n, d = len(params), model.cfg.hidden_size
    values = np.asarray(omegas, np.float32)
    if values.ndim == 1:
        values = np.repeat(values[:, None], d, axis=1)
    if values.shape != (n, d):
        raise ValueError(f"omegas of shape {values.shape}; expected ({n},) or ({n}, {d}).")
    for i, (var, layer) in enumerate(params):
        old = var[...]
        new = values[i] if layer is None else np.asarray(jax.device_get(old)).copy()
        if layer is not None:
            new[layer] = values[i]
        var[...] = jax.device_put(jnp.asarray(new), old.sharding)


@functools.partial(jax.jit, static_argnums=0)
def _variances(graphdef, state, batch: Mapping[str, Any], key) -> tuple[jax.Array, jax.Array]:
    """Var(x_i) and Var(F_i(x_i)) over all elements, each [num_sublayers], in
    `_omega_params`' order.

    Compiled once per model structure (`graphdef` is static): profiling costs one compilation,
    not one per call.
    """
    model = nnx.merge(graphdef, state)
    records = model.stack_records(batch, key)
    pairs = [sublayer_variances(records[v.attribute], v.sublayers) for v in model.stack_views()]
    return tuple(jnp.concatenate([p[i].reshape(-1) for p in pairs]) for i in (0, 1))


def sublayer_variances(
    rec: Mapping[str, jax.Array], names: tuple[str, ...]
) -> tuple[jax.Array, jax.Array]:
    """(Var(x_i), Var(F_i(x_i))), each [num_layers, len(names)], from a stack's `record=True`
    intermediates ("layer_in", "<name>/output", "<name>/branch_out", each [num_layers, ...]);
    sub-layer j's input is the layer input (j = 0) or sub-layer j - 1's output."""
    var = lambda a: jnp.var(a.astype(jnp.float32), axis=tuple(range(1, a.ndim)))
    ins = [rec["layer_in"]] + [rec[f"{n}/output"] for n in names[:-1]]
    inputs = jnp.stack([var(x) for x in ins], axis=1)
    branches = jnp.stack([var(rec[f"{n}/branch_out"]) for n in names], axis=1)
    return inputs, branches


def profile_omegas(model: Any, statistics: Callable[[], tuple[jax.Array, jax.Array]]) -> np.ndarray:
    """Admin's profiling walk; leaves the model's omegas set to the result.

    omega_i = r, then r <- sqrt(r^2 Var(x_i) + Var(F_i(x_i))) (Var(x_i * omega_i) with a scalar
    omega_i), with `statistics()` the (inputs, branches) variances [num_layers, 2] of one forward
    pass of `model` as it is now.

    Returns:
      omega per sub-layer, [num_sublayers] float64 (omega_1 = 1).
    """
    omegas = np.ones(len(_omega_params(model)))
    r = 1.0
    for i in range(len(omegas)):
        omegas[i:] = r  # later sub-layers do not affect sub-layer i; keep them tidy
        set_admin_omega(model, omegas)
        inputs, branches = jax.device_get(statistics())
        r = math.sqrt(r * r * float(inputs[i]) + float(branches[i]))
    return omegas


def admin_profile(model: Stacked, batch: Mapping[str, Any], key: jax.Array | None) -> np.ndarray:
    """Profiles Admin's omega on one training batch; leaves the model's omegas set to it.

    Call it on a freshly initialised model (standard initialisation), inside the mesh context
    if the model is sharded.

    Args:
      model: placement "admin", a `ln_jax.nn.stack.Stacked` model (BERT's, the translation
        model).
      batch: a training batch of the model (what its `stack_records` reads).
      key: dropout key of the (training-mode) forward pass; None = no dropout.

    Returns:
      omega per sub-layer, [num_sublayers] float64 (omega_1 = 1).
    """
    graphdef, _ = nnx.split(model)
    return profile_omegas(model, lambda: _variances(graphdef, nnx.state(model), batch, key))


def setup_admin(
    model: Stacked,
    peek_batch: Callable[[], Mapping[str, Any]],
    key: jax.Array | None,
    workdir: str | None = None,
) -> None:
    """Admin's set-up hook (see `ln_jax.nn.placement_setup`): profile omega before step 0.

    With `admin_omega="profile"`, omega is read from WORKDIR/admin_profile.json when a run
    already profiled it, else profiled on `peek_batch()` (one training-mode forward pass per
    sub-layer with dropout key `key`) and saved there by process 0. "closed_form" needs
    nothing (omega is set at construction).
    """
    if model.cfg.admin_omega != "profile":
        return
    if set(model.cfg.layer_placements) != {"admin"}:
        log.warning("admin in a per-layer list: omega is not profiled (it stays 1)")
        return
    path = paths.as_path(workdir) / ADMIN_PROFILE if workdir else None  # gs:// too
    if path and path.exists():
        omegas = json.loads(path.read_text())["omega"]
        set_admin_omega(model, omegas)
        log.info("admin: reusing the profile in %s: omega = %s", path, omegas)
        return
    omegas = [float(w) for w in admin_profile(model, peek_batch(), key)]
    if path and jax.process_index() == 0:
        profile = {"omega": omegas, "num_sublayers": len(omegas)}
        paths.write_atomic(path, json.dumps(profile, indent=1))
    log.info("admin: profiled omega per sub-layer = %s (saved to %s)", omegas, path)
