"""Training-time measurements per layer and sub-layer, computed inside the jitted train step.

The measured variant of the train step (`steps.make_train_step(..., measure=True)`) runs the
forward pass with `record=True` and returns, beside the loss metrics, `metrics["monitor"]`: a
dict of per-layer arrays [num_layers] (and a few scalars). `named` turns it into the scalars
that metrics.jsonl (records with split "monitor") and TensorBoard (as monitor/NAME) hold:

  grad_norm/layer_03/ffn          ||dL/dθ|| of the sub-layer's parameters (branch, norms, ω/gate)
  update_ratio/layer_03/ffn       ||Δθ|| / ||θ|| of the same parameters in this update
  stream_rms/layer_03/ffn         RMS of the sub-layer's output (the residual stream after it)
  branch_rms/layer_03/ffn         RMS of the branch output F(x)
  norm_in_rms/layer_03/ffn/post_norm   RMS of a LayerNorm's input (pre_norm, branch_norm,
                                  post_norm: those the placement has)
  collapse/layer_03               mean cosine between the positions of a sequence, layer output
  collapse/output                 the same for the encoder output (what the heads read)
  attention_entropy/layer_03      entropy (nats) of the attention probabilities, mean over
                                  heads and real query tokens
  omega/layer_03/attention        Admin's ω, mean over channels;  gate/...: ReZero's gate
  deepnorm_alpha                  DeepNorm's constant skip scale α
  dyt_alpha/layer_03/ffn          DyT's learned α of the sub-layer's input norm (placement dyt)

RMS and means are over the real (unpadded) tokens of the batch, with dropout as trained; with
gradient accumulation the activation measures are the mean over micro-batches.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.config import ModelConfig
from ln_jax.nn.init import deepnorm_alpha
from ln_jax.nn.layers import normalize, rms_normalize

Array = jax.Array
SUBLAYERS = ("attention", "ffn")
NORMS = ("pre_norm", "branch_norm", "post_norm")
# A per-layer name: measure/layer_NN[/part].
LAYER_NAME = re.compile(r"^(?P<measure>[a-z_]+)/layer_(?P<layer>\d+)(?:/(?P<part>.+))?$")

__all__ = [
    "LAYER_NAME",
    "forward_stats",
    "mean_pairwise_cosine",
    "named",
    "parameter_stats",
    "sublayer_norms",
]


# --------------------------------------------------------------------------- measures


def mean_pairwise_cosine(x: Array, mask: Array) -> Array:
    """The rank-collapse measure: mean cosine over pairs of distinct real positions.

    x [..., length, d], mask [..., length] (1 = token) -> [...]. 1 when all rows point the
    same way, 0 for orthogonal rows. O(length d): sum of unit vectors, no length x length matrix.
    """
    x = x.astype(jnp.float32)
    m = mask.astype(jnp.float32)
    unit = x * jax.lax.rsqrt(jnp.maximum(jnp.square(x).sum(-1, keepdims=True), 1e-30))
    unit = unit * m[..., None]
    total = jnp.square(unit.sum(-2)).sum(-1)  # sum over all ordered pairs, i = j included
    self_pairs = jnp.square(unit).sum((-2, -1))
    n = m.sum(-1)
    return (total - self_pairs) / jnp.maximum(n * (n - 1), 1.0)


def _token_mean(values: Array, mask: Array) -> Array:
    """values [..., batch, length], mask [batch, length] -> mean over real tokens [...]."""
    m = mask.astype(jnp.float32)
    return (values * m).sum((-2, -1)) / jnp.maximum(m.sum(), 1.0)


def _mean_square(x: Array, mask: Array) -> Array:
    """x [..., batch, length, d] -> mean over real tokens of mean_d(x^2) [...]."""
    return _token_mean(jnp.square(x.astype(jnp.float32)).mean(-1), mask)


def _attention_entropy(
    h: Array, query: dict, key: dict, mask: Array, eps: float, norms: tuple = (None, None)
) -> Array:
    """Attention entropy per layer, recomputed from each layer's attention input.

    h [L, batch, length, d] (the branch input), query/key {"kernel": [L, d, n, k], "bias":
    [L, n, k]}, mask [batch, length], norms: QK-norm's (query_norm, key_norm) parameters
    {"scale": [L, k], "bias" (LayerNorm only)}, or None each -> [L] (nats; mean over heads
    and real query tokens). One layer at a time (lax.map), so only one [batch, heads, length,
    length] is live.
    """
    keys_ok = (mask > 0)[:, None, None, :]

    def one(args):
        x, q_params, k_params, q_norm, k_norm = args
        x = x.astype(jnp.float32)
        q = _head_norm(
            jnp.einsum("btd,dnk->btnk", x, q_params["kernel"]) + q_params["bias"], q_norm, eps
        )
        k = _head_norm(
            jnp.einsum("btd,dnk->btnk", x, k_params["kernel"]) + k_params["bias"], k_norm, eps
        )
        logits = jnp.einsum("btnk,bsnk->bnts", q, k) * q.shape[-1] ** -0.5
        logp = jax.nn.log_softmax(jnp.where(keys_ok, logits, -1e30), axis=-1)
        entropy = -jnp.where(keys_ok, jnp.exp(logp) * logp, 0.0).sum(-1)  # [b, n, t]
        return _token_mean(entropy.mean(1), mask)

    return jax.lax.map(one, (h, query, key, *norms))


def _head_norm(x: Array, params: dict | None, eps: float) -> Array:
    """QK-norm over the last axis as `layers.head_norm` computes it (LayerNorm if the params
    have a bias, else RMSNorm); x unchanged for params None."""
    if params is None:
        return x
    if "bias" in params:
        return normalize(x, eps) * params["scale"] + params["bias"]
    return rms_normalize(x, eps) * params["scale"]


def _layers_tree(params: Any) -> dict:
    tree = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    return tree["bert"]["encoder"]["layers"]


def _layer_dicts(params: Any, num_layers: int) -> list[dict]:
    """Each layer's parameters as a pure dict (a slice of the stack when scanned)."""
    layers = _layers_tree(params)
    if all(i in layers for i in range(num_layers)):
        return [layers[i] for i in range(num_layers)]
    return [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(num_layers)]


def sublayer_norms(tree: Any, num_layers: int) -> dict[str, Array]:
    """||.||_2 of each sub-layer's leaves in a parameter-shaped tree (gradients, updates).

    Returns:
      {"attention": [L], "ffn": [L]}.
    """
    layers = _layer_dicts(tree, num_layers)
    sq = lambda t: sum(jnp.square(a.astype(jnp.float32)).sum() for a in jax.tree.leaves(t))
    return {s: jnp.sqrt(jnp.stack([sq(layer[s]) for layer in layers])) for s in SUBLAYERS}


def forward_stats(rec: dict, hidden: Array, params: Any, mask: Array, cfg: ModelConfig) -> dict:
    """The activation measures of one forward pass (see the module docstring).

    Args:
      rec: the encoder's records (`Encoder.__call__` with record=True), [L, batch, length, d].
      hidden: the encoder output [batch, length, d].
      params: the model's parameters (nnx.State), for the attention's query and key.
      mask: [batch, length] 1 for real tokens.

    Returns:
      {"stream_ms/<sublayer>", "branch_ms/<sublayer>", "norm_in_ms/<sublayer>/<norm>": [L]
       mean squares (`named` takes the root), "collapse": [L], "collapse/output": [],
       "attention_entropy": [L]}.
    """
    out = {}
    for s in SUBLAYERS:
        out[f"stream_ms/{s}"] = _mean_square(rec[f"{s}/output"], mask)
        out[f"branch_ms/{s}"] = _mean_square(rec[f"{s}/branch_out"], mask)
        for norm in NORMS:
            if f"{s}/{norm}_in" in rec:  # NaN for the layers whose rule lacks that norm
                out[f"norm_in_ms/{s}/{norm}"] = _mean_square(rec[f"{s}/{norm}_in"], mask)
    out["collapse"] = _token_mean_seq(mean_pairwise_cosine(rec["ffn/output"], mask), mask)
    out["collapse/output"] = _token_mean_seq(mean_pairwise_cosine(hidden, mask), mask)
    branch_in = rec["layer_in"]
    if "attention/pre_norm_out" in rec:  # Pre-LN-like layers: the branch reads LN(x)
        pre = rec["attention/pre_norm_out"]
        branch_in = jnp.where(jnp.isnan(pre), branch_in.astype(pre.dtype), pre)
    query, key, norms = _attention_params(params, cfg.num_layers)
    out["attention_entropy"] = _attention_entropy(
        branch_in, query, key, mask, cfg.layer_norm_eps, norms
    )
    return jax.lax.stop_gradient(out)


def _token_mean_seq(values: Array, mask: Array) -> Array:
    """values [..., batch] -> mean over the sequences with at least two tokens [...]."""
    has_pairs = ((mask > 0).sum(-1) > 1).astype(jnp.float32)
    return (values * has_pairs).sum(-1) / jnp.maximum(has_pairs.sum(), 1.0)


def _attention_params(params: Any, num_layers: int) -> tuple[dict, dict, tuple]:
    """Stacked [L, ...] query and key parameters, and QK-norm's (query_norm, key_norm)
    parameters where the model has them (else (None, None))."""
    layers = _layer_dicts(params, num_layers)
    stack = lambda name: jax.tree.map(
        lambda *a: jnp.stack(a).astype(jnp.float32),
        *(layer["attention"]["branch"][name] for layer in layers),
    )
    has_norm = "query_norm" in layers[0]["attention"]["branch"]
    norms = (stack("query_norm"), stack("key_norm")) if has_norm else (None, None)
    return stack("query"), stack("key"), norms


def parameter_stats(grads: Any, updates: Any, params: Any, cfg: ModelConfig) -> dict:
    """Gradient norms, update/parameter norm ratios and the placements' learned scales.

    Returns:
      {"grad_norm/<sublayer>", "update_ratio/<sublayer>": [L], "omega/<sublayer>": [L] (Admin:
       mean of ω; NaN for layers without), "gate/<sublayer>": [L] (ReZero), "dyt_alpha/
       <sublayer>": [L] (DyT's α of the input norm), "deepnorm_alpha"}.
    """
    num_layers = cfg.num_layers
    grad, update = sublayer_norms(grads, num_layers), sublayer_norms(updates, num_layers)
    weight = sublayer_norms(params, num_layers)
    out = {}
    for s in SUBLAYERS:
        out[f"grad_norm/{s}"] = grad[s]
        out[f"update_ratio/{s}"] = update[s] / jnp.maximum(weight[s], 1e-30)
    layers = _layer_dicts(params, num_layers)
    for name in ("omega", "gate"):  # Admin's ω [d] and ReZero's gate [1], where they exist
        if any(name in layer[s] for layer in layers for s in SUBLAYERS):
            for s in SUBLAYERS:
                values = [_mean_or_nan(layer[s], name) for layer in layers]
                out[f"{name}/{s}"] = jnp.stack(values)
    if any("alpha" in layer[s].get("pre_norm", {}) for layer in layers for s in SUBLAYERS):
        for s in SUBLAYERS:  # DyT's α [1] of each sub-layer's input norm
            out[f"dyt_alpha/{s}"] = jnp.stack(
                [_mean_or_nan(layer[s].get("pre_norm", {}), "alpha") for layer in layers]
            )
    if any(cfg.layer_rule(i).skip == "alpha" for i in range(num_layers)):
        out["deepnorm_alpha"] = jnp.asarray(deepnorm_alpha(num_layers), jnp.float32)
    return out


def _mean_or_nan(tree: dict, name: str) -> Array:
    return tree[name].mean().astype(jnp.float32) if name in tree else jnp.float32(jnp.nan)


# --------------------------------------------------------------------------- names


def _layer_key(measure: str, layer: int, part: str | None, width: int) -> str:
    return f"{measure}/layer_{layer:0{width}d}" + (f"/{part}" if part else "")


def named(stats: dict[str, Any]) -> dict[str, float]:
    """The step's `metrics["monitor"]` (fetched to the host) -> {readable name: float}.

    "grad_norm/ffn" [L] becomes "grad_norm/layer_00/ffn", ...; mean squares ("*_ms") become
    RMS ("*_rms"); scalars keep their names. NaN entries (layers without that part) are left
    out.
    """
    out: dict[str, float] = {}
    for key, value in stats.items():
        a = np.asarray(value, np.float64)
        measure, _, part = key.partition("/")
        if measure.endswith("_ms"):
            measure, a = measure[:-3] + "_rms", np.sqrt(a)
        if a.ndim == 0:
            out["/".join(filter(None, (measure, part)))] = float(a)
            continue
        width = max(2, len(str(len(a) - 1)))
        for layer, v in enumerate(a):
            if np.isfinite(v):
                out[_layer_key(measure, layer, part or None, width)] = float(v)
    return out
