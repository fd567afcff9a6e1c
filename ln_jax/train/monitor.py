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
  attention_entropy/layer_03      entropy (nats) of the attention probabilities (as the
                                  layer's attention module computes them), mean over heads and
                                  real query tokens; with several attentions in a layer (a
                                  decoder): attention_entropy/layer_03/<sub-layer>
  omega/layer_03/attention        Admin's ω, mean over channels;  gate/...: ReZero's gate
  deepnorm_alpha                  DeepNorm's constant skip scale α
  dyt_alpha/layer_03/ffn          DyT's learned α of the sub-layer's input norm (placement dyt)

Sub-layer names are the layer's own (`Layer.sublayers()`: "attention" and "ffn" in BERT's
encoder). Each stack is seen through its `ln_jax.nn.stack.StackView`; in a model of several
stacks (`StackView.name`), the stack's name follows the layer:
grad_norm/layer_03/decoder/cross_attention. RMS and means are over the real (unpadded) tokens
of the batch, with dropout as trained; with gradient accumulation the activation measures are
the mean over micro-batches.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.nn.attention import Attention
from ln_jax.nn.stack import StackView, layer_module

Array = jax.Array
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


def _entropy(probs: Array, mask: Array) -> Array:
    """probs [batch, heads, length, keys] -> entropy (nats), mean over heads and real query
    tokens (mask [batch, length]) []."""
    logp = jnp.log(jnp.maximum(probs, 1e-30))
    entropy = -(probs * logp).sum(-1)  # [b, n, t]
    return _token_mean(entropy.mean(1), mask)


def _layer_dicts(params: Any, view: StackView) -> list[dict]:
    """Each layer's parameters as a pure dict (a slice of the stack when scanned)."""
    tree = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    for part in view.path:
        tree = tree[part]
    if all(i in tree for i in range(view.num_layers)):
        return [tree[i] for i in range(view.num_layers)]
    return [jax.tree.map(lambda a, i=i: a[i], tree) for i in range(view.num_layers)]


def sublayer_norms(tree: Any, view: StackView) -> dict[str, Array]:
    """||.||_2 of each sub-layer's leaves in a parameter-shaped tree (gradients, updates).

    Returns:
      {sub-layer name: [L]}, e.g. {"attention": [L], "ffn": [L]}.
    """
    layers = _layer_dicts(tree, view)
    sq = lambda t: sum(jnp.square(a.astype(jnp.float32)).sum() for a in jax.tree.leaves(t))
    return {s: jnp.sqrt(jnp.stack([sq(layer[s]) for layer in layers])) for s in view.sublayers}


def forward_stats(
    rec: dict, hidden: Array, stack: Any, mask: Array, view: StackView, **inputs: Any
) -> dict:
    """The activation measures of one forward pass of a stack (see the module docstring).

    Args:
      rec: the stack's records (`Stack.__call__` with record=True), [L, batch, length, d].
      hidden: the stack's output [batch, length, d] (what the heads read).
      stack: the `ln_jax.nn.stack.Stack` itself: the attention entropy is what its attention
        modules compute (`Attention.probabilities`), from each sub-layer's recorded input.
      mask: [batch, length] 1 for real tokens.
      view: the stack's names (`StackView`).
      inputs: what the stack's branches read besides the mask (a decoder's `memory`,
        `memory_mask`).

    Returns:
      {"stream_ms/<sublayer>", "branch_ms/<sublayer>", "norm_in_ms/<sublayer>/<norm>": [L]
       mean squares (`named` takes the root), "collapse": [L], "collapse/output": [],
       "attention_entropy[/<sublayer>]": [L] (the sub-layer named only when a layer has
       several attentions)}, each with the stack's name after the measure.
    """
    out = {}
    for s in view.sublayers:
        out[view.key("stream_ms", s)] = _mean_square(rec[f"{s}/output"], mask)
        out[view.key("branch_ms", s)] = _mean_square(rec[f"{s}/branch_out"], mask)
        for norm in NORMS:
            if f"{s}/{norm}_in" in rec:  # NaN for the layers whose rule lacks that norm
                out[view.key("norm_in_ms", f"{s}/{norm}")] = _mean_square(
                    rec[f"{s}/{norm}_in"], mask
                )
    last = rec[f"{view.sublayers[-1]}/output"]
    out[view.key("collapse")] = _token_mean_seq(mean_pairwise_cosine(last, mask), mask)
    out[view.key("collapse", "output")] = _token_mean_seq(mean_pairwise_cosine(hidden, mask), mask)
    out.update(_attention_entropies(rec, stack, mask, view, inputs))
    return jax.lax.stop_gradient(out)


def _branch_inputs(rec: dict, names: tuple[str, ...]) -> dict[str, Array]:
    """What each sub-layer's branch read, [L, batch, length, d]: its pre-norm output where the
    rule has one (NaN layers: the sub-layer input), else the sub-layer input (the layer input,
    or the previous sub-layer's output)."""
    out = {}
    for j, s in enumerate(names):
        x = rec["layer_in"] if j == 0 else rec[f"{names[j - 1]}/output"]
        pre = rec.get(f"{s}/pre_norm_out")
        out[s] = x if pre is None else jnp.where(jnp.isnan(pre), x.astype(pre.dtype), pre)
    return out


def _attention_entropies(rec, stack, mask, view: StackView, inputs) -> dict[str, Array]:
    """Entropy per layer of each attention sub-layer's probabilities, as the module computes
    them (`Attention.probabilities`), one layer at a time."""
    branch_in = _branch_inputs(rec, view.sublayers)
    per_name: dict[str, list] = {}
    for i in range(view.num_layers):
        for s, sublayer in layer_module(stack, i).sublayers():
            if isinstance(sublayer.branch, Attention):
                probs = sublayer.branch.probabilities(branch_in[s][i], mask, **inputs)
                per_name.setdefault(s, []).append(_entropy(probs, mask))
    single = len(per_name) == 1
    return {
        view.key("attention_entropy", "" if single else s): jnp.stack(v)
        for s, v in per_name.items()
    }


def _token_mean_seq(values: Array, mask: Array) -> Array:
    """values [..., batch] -> mean over the sequences with at least two tokens [...]."""
    has_pairs = ((mask > 0).sum(-1) > 1).astype(jnp.float32)
    return (values * has_pairs).sum(-1) / jnp.maximum(has_pairs.sum(), 1.0)


def parameter_stats(grads: Any, updates: Any, params: Any, view: StackView) -> dict:
    """Gradient norms, update/parameter norm ratios and the placements' learned scales of a
    stack's sub-layers.

    Returns:
      {"grad_norm/<sublayer>", "update_ratio/<sublayer>": [L], "omega/<sublayer>": [L] (Admin:
       mean of ω; NaN for layers without), "gate/<sublayer>": [L] (ReZero), "dyt_alpha/
       <sublayer>": [L] (DyT's α of the input norm), "deepnorm_alpha"}, each with the stack's
       name after the measure.
    """
    grad, update = sublayer_norms(grads, view), sublayer_norms(updates, view)
    weight = sublayer_norms(params, view)
    out = {}
    for s in view.sublayers:
        out[view.key("grad_norm", s)] = grad[s]
        out[view.key("update_ratio", s)] = update[s] / jnp.maximum(weight[s], 1e-30)
    layers = _layer_dicts(params, view)
    subs = view.sublayers
    for name in ("omega", "gate"):  # Admin's ω [d] and ReZero's gate [1], where they exist
        if any(name in layer[s] for layer in layers for s in subs):
            for s in subs:
                values = [_mean_or_nan(layer[s], name) for layer in layers]
                out[view.key(name, s)] = jnp.stack(values)
    if any("alpha" in layer[s].get("pre_norm", {}) for layer in layers for s in subs):
        for s in subs:  # DyT's α [1] of each sub-layer's input norm
            out[view.key("dyt_alpha", s)] = jnp.stack(
                [_mean_or_nan(layer[s].get("pre_norm", {}), "alpha") for layer in layers]
            )
    if view.deepnorm_alpha is not None:
        out[view.key("deepnorm_alpha")] = jnp.asarray(view.deepnorm_alpha, jnp.float32)
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
