"""Folding Admin's omega away: a profiled BERT as an equivalent plain Post-LN BERT (export)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.models.bert.model import BertForPreTraining, create_model
from ln_jax.nn.admin import _check_admin, get_admin_omega
from ln_jax.nn.attention import Attention
from ln_jax.nn.blocks import EncoderLayer

__all__ = ["fold_admin"]


def _fold_sublayer(model: BertForPreTraining, index: int, omega: np.ndarray) -> None:
    """Moves omega_i of sub-layer `index` into the previous norm and F_i's input maps."""
    layers, names = model.bert.encoder.layers, EncoderLayer.names  # attention, ffn
    layer, kind = divmod(index, len(names))
    if kind:
        prev = getattr(layers[layer], names[kind - 1]).post_norm
    else:
        prev = (
            getattr(layers[layer - 1], names[-1]).post_norm if layer else model.bert.embeddings.norm
        )
    prev.scale[...] = prev.scale[...] * omega
    if getattr(prev, "bias", None) is not None:
        prev.bias[...] = prev.bias[...] * omega
    branch = getattr(layers[layer], names[kind]).branch
    inputs = ("query", "key", "value") if isinstance(branch, Attention) else ("wi",)
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
      A new, unsharded BertForPreTraining with placement "post" and the model's own BERT
      fields (`model.options`: segment rows, NSP head).
    """
    cfg = model.cfg
    _check_admin(model)
    if cfg.scan_layers or not cfg.embedding_layernorm:
        raise ValueError("fold_admin needs scan_layers=False and embedding_layernorm=True.")
    omegas = get_admin_omega(model)
    folded = create_model(cfg.replace(placement="post"), seed=0, options=model.options)
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    kept = [(path, jax.device_get(var[...])) for path, var in params if path[-1] != "omega"]
    target = nnx.state(folded, nnx.Param)
    flat_target = dict(nnx.to_flat_state(target))
    for path, value in kept:
        flat_target[path][...] = jnp.asarray(value)
    for index in range(len(omegas)):  # one per sub-layer (`StackView.num_sublayers`)
        _fold_sublayer(folded, index, jnp.asarray(omegas[index]))
    return folded
