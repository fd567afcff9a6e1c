"""Admin (Liu et al. 2020, section 4.3): profiling omega, setting it, and folding it away.

With placement "admin" sub-layer i computes LN(x * omega_i + F_i(x)), omega_i [embed] learned.
Profiling walks the sub-layers in order with a running r = 1: omega_i = r, then
r <- sqrt(Var(x_i * omega_i) + Var(F_i(x_i))), so that omega_i^2 ~ 1 + sum_{j<i} Var(F_j).
Since x_i (the sub-layer input) depends on the earlier omegas through the LayerNorms, omega_i is
only known once omega_1..omega_{i-1} are set: `admin_profile` runs one (jitted) forward pass per
sub-layer on the same batch and dropout key.

Sub-layers are numbered layer by layer: 2l is layer l's attention, 2l + 1 its feed-forward.
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
from ln_jax.models.bert.model import BertForPreTraining, create_model
from ln_jax.nn.init import admin_closed_form

__all__ = [
    "ADMIN_PROFILE",
    "admin_closed_form",
    "admin_profile",
    "fold_admin",
    "get_admin_omega",
    "profile_omegas",
    "set_admin_omega",
    "setup_admin",
    "sublayer_variances",
]
log = logging.getLogger(__name__)
# A run's profiled omegas, kept in its workdir so that a resumed run reuses them.
ADMIN_PROFILE = "admin_profile.json"

SUBLAYERS = ("attention", "ffn")
BATCH_KEYS = ("input_ids", "segment_ids", "attention_mask", "masked_positions")


def _check_admin(model: BertForPreTraining) -> None:
    names = set(model.cfg.layer_placements)
    if names != {"admin"}:
        raise ValueError(
            f"Admin needs placement 'admin' in every layer, got {model.cfg.placement!r}."
        )


def _omega_params(model: BertForPreTraining) -> list[tuple[nnx.Param, int | None]]:
    """(omega variable, layer index into its stacked leading axis or None), per sub-layer."""
    _check_admin(model)
    layers = model.bert.encoder.layers
    if model.cfg.scan_layers:
        return [
            (getattr(layers, name).omega, layer)
            for layer in range(model.cfg.num_layers)
            for name in SUBLAYERS
        ]
    return [(getattr(layer, name).omega, None) for layer in layers for name in SUBLAYERS]


def get_admin_omega(model: BertForPreTraining) -> np.ndarray:
    """The model's omegas, [num_sublayers, embed] float32."""
    rows = []
    for var, layer in _omega_params(model):
        value = np.asarray(jax.device_get(var[...]))
        rows.append(value if layer is None else value[layer])
    return np.stack(rows)


def set_admin_omega(model: BertForPreTraining, omegas: Any) -> None:
    """Sets every sub-layer's omega in place, keeping each parameter's sharding.

    Args:
      model: a model with placement "admin".
      omegas: [num_sublayers] (one scalar per sub-layer, broadcast over channels) or
        [num_sublayers, embed].
    """
    cfg = model.cfg
    values = np.asarray(omegas, np.float32)
    if values.ndim == 1:
        values = np.repeat(values[:, None], cfg.hidden_size, axis=1)
    if values.shape != (cfg.num_sublayers, cfg.hidden_size):
        raise ValueError(
            f"omegas of shape {values.shape}; expected ({cfg.num_sublayers},) or "
            f"({cfg.num_sublayers}, {cfg.hidden_size})."
        )
    for i, (var, layer) in enumerate(_omega_params(model)):
        old = var[...]
        new = values[i] if layer is None else np.asarray(jax.device_get(old)).copy()
        if layer is not None:
            new[layer] = values[i]
        var[...] = jax.device_put(jnp.asarray(new), old.sharding)


@functools.partial(jax.jit, static_argnums=0)
def _variances(graphdef, state, batch: Mapping[str, Any], key) -> tuple[jax.Array, jax.Array]:
    """Var(x_i) and Var(F_i(x_i)) over all elements, each [num_layers, 2] (attention, ffn).

    Compiled once per model structure (`graphdef` is static): profiling costs one compilation,
    not one per call.
    """
    model = nnx.merge(graphdef, state)
    out = model(*(batch[k] for k in BATCH_KEYS), dropout_key=key, record=True)
    return sublayer_variances(out["intermediates"])


def sublayer_variances(rec: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(Var(x_i), Var(F_i(x_i))), each [num_layers, 2], from a forward pass's `record=True`
    intermediates ("layer_in", "attention/output", "attention/branch_out", "ffn/branch_out",
    each [num_layers, ...])."""
    var = lambda a: jnp.var(a.astype(jnp.float32), axis=tuple(range(1, a.ndim)))
    inputs = jnp.stack([var(rec["layer_in"]), var(rec["attention/output"])], axis=1)
    branches = jnp.stack([var(rec["attention/branch_out"]), var(rec["ffn/branch_out"])], axis=1)
    return inputs, branches


def profile_omegas(model: Any, statistics: Callable[[], tuple[jax.Array, jax.Array]]) -> np.ndarray:
    """Admin's profiling walk; leaves the model's omegas set to the result.

    omega_i = r, then r <- sqrt(r^2 Var(x_i) + Var(F_i(x_i))) (Var(x_i * omega_i) with a scalar
    omega_i), with `statistics()` the (inputs, branches) variances [num_layers, 2] of one forward
    pass of `model` as it is now.

    Returns:
      omega per sub-layer, [num_sublayers] float64 (omega_1 = 1).
    """
    omegas = np.ones(model.cfg.num_sublayers)
    r = 1.0
    for i in range(len(omegas)):
        omegas[i:] = r  # later sub-layers do not affect sub-layer i; keep them tidy
        set_admin_omega(model, omegas)
        inputs, branches = jax.device_get(statistics())
        layer, kind = divmod(i, 2)
        r = math.sqrt(r * r * float(inputs[layer, kind]) + float(branches[layer, kind]))
    return omegas


def admin_profile(
    model: BertForPreTraining, batch: Mapping[str, Any], key: jax.Array | None
) -> np.ndarray:
    """Profiles Admin's omega on one training batch; leaves the model's omegas set to it.

    Call it on a freshly initialised model (standard initialisation), inside the mesh context
    if the model is sharded.

    Args:
      model: placement "admin".
      batch: "input_ids", "segment_ids", "attention_mask" [batch, length] and
        "masked_positions" [batch, P] (other keys are ignored).
      key: dropout key of the (training-mode) forward pass; None = no dropout.

    Returns:
      omega per sub-layer, [num_sublayers] float64 (omega_1 = 1).
    """
    batch = {k: batch[k] for k in BATCH_KEYS}
    graphdef, _ = nnx.split(model)
    return profile_omegas(model, lambda: _variances(graphdef, nnx.state(model), batch, key))


def setup_admin(
    model: BertForPreTraining,
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


def _fold_sublayer(model: BertForPreTraining, index: int, omega: np.ndarray) -> None:
    """Moves omega_i of sub-layer `index` into the previous norm and F_i's input maps."""
    layers = model.bert.encoder.layers
    layer, kind = divmod(index, 2)
    if kind == 1:
        prev = layers[layer].attention.post_norm
    else:
        prev = layers[layer - 1].ffn.post_norm if layer else model.bert.embeddings.norm
    prev.scale[...] = prev.scale[...] * omega
    if getattr(prev, "bias", None) is not None:
        prev.bias[...] = prev.bias[...] * omega
    branch = getattr(layers[layer], SUBLAYERS[kind]).branch
    inputs = ("query", "key", "value") if kind == 0 else ("wi",)
    for name in inputs:
        kernel = getattr(branch, name).kernel
        scale = omega.reshape((-1,) + (1,) * (kernel[...].ndim - 1))
        kernel[...] = kernel[...] / scale


def fold_admin(model: BertForPreTraining) -> BertForPreTraining:
    """An equivalent plain Post-LN model (placement "post"), e.g. for export.

    LN(omega * x + F(x)) with x = LN_prev(z) = gamma * n(z) + beta: multiplying gamma and beta
    of the previous norm (the embedding LayerNorm for the first sub-layer) by omega makes the
    skip omega * x, and dividing F's input kernels (q/k/v, or wi) by omega per input channel
    keeps F's input unchanged. Exact up to float rounding; dropout commutes with the scaling.

    Args:
      model: placement "admin", layers as a list (not scan_layers), with the embedding norm.

    Returns:
      A new, unsharded BertForPreTraining with placement "post".
    """
    cfg = model.cfg
    _check_admin(model)
    if cfg.scan_layers or not cfg.embedding_layernorm:
        raise ValueError("fold_admin needs scan_layers=False and embedding_layernorm=True.")
    omegas = get_admin_omega(model)
    folded = create_model(cfg.replace(placement="post"), seed=0)
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    kept = [(path, jax.device_get(var[...])) for path, var in params if path[-1] != "omega"]
    target = nnx.state(folded, nnx.Param)
    flat_target = dict(nnx.to_flat_state(target))
    for path, value in kept:
        flat_target[path][...] = jnp.asarray(value)
    for index in range(cfg.num_sublayers):
        _fold_sublayer(folded, index, jnp.asarray(omegas[index]))
    return folded
