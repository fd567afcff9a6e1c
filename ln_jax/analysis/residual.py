"""Liu et al. (2020) section 4: output change under perturbation, and layer dependency.

* `output_change` (Figure 2): |F(x, theta) - F(x, theta*)|^2, F the encoder output (after the
  final norm), theta* = theta + delta with delta a random perturbation of every encoder weight
  matrix of relative Frobenius size epsilon. Liu et al.: O(N) in the depth N for Post-LN,
  O(log N) for Pre-LN, and Admin close to Pre-LN.
* `layer_dependency` (Figures 7-8): the share of each residual branch in each sub-layer's
  output. The output of sub-layer i is decomposed exactly as x_i = sum_{j<=i} c_{i,j} (+ the
  norms' biases), c_{i,0} from the encoder input and c_{i,j} from branch j: each add scales the
  earlier components by the skip scale (1, Admin's omega, DeepNorm's alpha) and appends the
  branch output; a LayerNorm is affine once its per-token mean and std are fixed, so it maps
  each component c to gamma (c - mean(c)) / std. The share is beta_{i,j}^2 =
  Var(c_{i,j}) / Var(x_i) (Liu et al.'s beta_{i,j} with normalised branch outputs; the shares
  sum to 1 when the branches are uncorrelated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.analysis.models import (
    AnyModel,
    Batch,
    all_arms,
    checkpoint_arm,
    checkpoint_info,
    encode,
    first_stack,
    instances,
    jit_model_fn,
    real_tokens,
    take_batches,
)
from ln_jax.analysis.settings import Arm, Settings, depth_arms, describe, one_depth
from ln_jax.analysis.stats import seed_mean_std
from ln_jax.nn.stack import layer_module

# --------------------------------------------------------------------------- output change


def perturb(
    params: nnx.State, key: jax.Array, epsilon: float, stacked: bool, layers: tuple[str, ...]
) -> nnx.State:
    """Adds to every encoder-layer kernel W (under the path `layers`, the stack's layers) a
    Gaussian delta with ||delta||_F = eps ||W||_F.

    With `stacked` (scan_layers) kernels are [num_layers, ...] and the size is per layer.
    Embeddings, norms, biases and Admin's omega are left unchanged.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for i, (path, w) in enumerate(leaves):
        keys = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)
        if keys[: len(layers)] != layers or "kernel" not in keys:
            out.append(w)
            continue
        axes = tuple(range(1 if stacked else 0, w.ndim))
        noise = jax.random.normal(jax.random.fold_in(key, i), w.shape, w.dtype)
        size = jnp.sqrt(jnp.square(w).sum(axes, keepdims=True))
        noise_size = jnp.sqrt(jnp.square(noise).sum(axes, keepdims=True))
        out.append(w + epsilon * size * noise / noise_size)
    return jax.tree_util.tree_unflatten(treedef, out)


def _output_change(model: AnyModel, batch: Batch, key: jax.Array, epsilon: float) -> jax.Array:
    """Mean over real tokens of ||F(x, theta) - F(x, theta + delta)||^2 (a scalar)."""
    before, _ = encode(model, batch)
    params = nnx.state(model, nnx.Param)
    view, stack = first_stack(model)
    nnx.update(model, perturb(params, key, epsilon, stack.cfg.scan_layers, view.path))
    after, _ = encode(model, batch)
    mask = real_tokens(batch).astype(jnp.float32)
    change = jnp.square((after - before).astype(jnp.float32)).sum(-1)
    return (change * mask).sum() / mask.sum()


def _change_arm(settings: Settings, arm: Arm, fn, epsilon: float) -> dict[str, Any]:
    batches = take_batches(settings, arm, settings.batches)
    values = []
    for m, (_, model) in enumerate(instances(settings, arm, batches[0])):
        keys = [jax.random.key(1_000 * m + b) for b in range(len(batches))]
        values.append([float(fn(model, b, k, epsilon)) for b, k in zip(batches, keys, strict=True)])
    return seed_mean_std(values)


def output_change(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre", "admin"),
    num_layers: Sequence[int] = (2, 4, 6, 8, 10, 12),
    epsilon: float = 0.01,
) -> dict[str, Any]:
    """Liu et al. Figure 2: the output change under a random parameter perturbation, by depth.

    Per model and mini-batch one fresh delta is drawn; mean and std over seeds.

    Returns:
      {"results": {placement: {num_layers: {"mean", "std", "std_over"}}}, "config": ...}.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon={epsilon}: the relative perturbation size must be > 0.")
    arms = depth_arms(settings, placements, num_layers)
    ckpt = checkpoint_arm(settings)  # a bad path fails before anything is measured
    fn = jit_model_fn(_output_change)
    results = {
        label: {str(n): _change_arm(settings, a, fn, epsilon) for n, a in by_n.items()}
        for label, by_n in arms.items()
    }
    if ckpt is not None:
        results["checkpoint"] = {
            str(ckpt.model.num_layers): _change_arm(settings, ckpt, fn, epsilon)
        }
    return {
        "measurement": "mean over tokens of |F(x,theta) - F(x,theta*)|^2, F = encoder output",
        "results": results,
        "config": describe(
            settings,
            epsilon=epsilon,
            perturbed="every encoder-layer kernel W, delta Gaussian with |delta|_F = eps |W|_F",
            checkpoint_arm=checkpoint_info(settings),
        ),
    }


# --------------------------------------------------------------------------- dependency


def _norm_linear(comps: jax.Array, const: jax.Array, y: jax.Array, norm: nnx.Module):
    """Applies the post-norm of input y [B, T, d] to the components [K, B, T, d] and const,
    as the norm decomposes itself (`decompose`: LayerNorm, RMSNorm, DyT)."""
    f, offset = norm.decompose(y)
    return f(comps), f(const) + offset


def _masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Variance over the real tokens' elements: x [..., B, T, d], mask [B, T] -> [...]."""
    m = mask[..., None].astype(x.dtype)
    n = m.sum() * x.shape[-1]
    mean = (x * m).sum((-3, -2, -1), keepdims=True) / n
    return (jnp.square(x - mean) * m).sum((-3, -2, -1)) / n


def dependency_shares(model: AnyModel, batch: Batch) -> dict[str, jax.Array]:
    """beta^2 of every sub-layer output on one batch.

    Returns:
      {"share": [2L, 2L + 1]: row i = output of sub-layer i (layer i // 2, attention if i is
       even), column 0 = the encoder input, column j >= 1 = branch of sub-layer j - 1 (zero for
       j > i + 1); "bias_share": [2L], the share of the post-norms' biases (0 at init);
       "error": the largest relative error of the decomposition, a scalar}.
    """
    cfg = model.cfg
    if cfg.dlcl:
        raise ValueError("layer dependency is not defined for DLCL (its inputs mix layers).")
    _, rec = encode(model, batch, record=True)
    mask = real_tokens(batch)
    x0 = rec["embeddings"].astype(jnp.float32)
    view, stack = first_stack(model)
    names = view.sublayers
    n_sub = view.num_sublayers
    comps = jnp.zeros((n_sub + 1, *x0.shape), jnp.float32).at[0].set(x0)
    const = jnp.zeros_like(x0)
    shares, biases, errors = [], [], []
    for i in range(n_sub):
        layer, j = divmod(i, len(names))
        name = names[j]
        sublayer = getattr(layer_module(stack, layer), name)
        x_in = rec["layer_in" if j == 0 else f"{names[j - 1]}/output"][layer]
        post = sublayer.norms().get("post_norm")
        summed = rec[f"{name}/post_norm_in" if post else f"{name}/output"][layer]
        skip = sublayer.skip_scale()
        comps = (comps * skip).at[i + 1].set(summed - skip * x_in)
        const = const * skip
        if post:
            comps, const = _norm_linear(comps, const, summed, post)
        out = rec[f"{name}/output"][layer].astype(jnp.float32)
        total = _masked_var(out, mask)
        shares.append(_masked_var(comps, mask) / total)
        biases.append(_masked_var(const, mask) / total)
        error = comps.sum(0) + const - out
        errors.append(jnp.sqrt(_masked_var(error, mask) / total))
    return {
        "share": jnp.stack(shares),
        "bias_share": jnp.stack(biases),
        "error": jnp.max(jnp.stack(errors)),
    }


def _dependency_arm(settings: Settings, arm: Arm, fn) -> dict[str, Any]:
    batches = take_batches(settings, arm, settings.batches)
    values = [
        [jax.device_get(fn(model, b)) for b in batches]
        for _, model in instances(settings, arm, batches[0])
    ]
    collect = lambda f: [[f(v) for v in per_model] for per_model in values]
    return {
        "share": seed_mean_std(collect(lambda v: v["share"])),
        "own": seed_mean_std(collect(lambda v: np.diagonal(v["share"], offset=1))),
        "bias_share": seed_mean_std(collect(lambda v: v["bias_share"])),
        "reconstruction_error": float(np.max(collect(lambda v: v["error"]))),
        "placement": arm.model.placement,
    }


def layer_dependency(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre", "admin"),
    num_layers: int | Sequence[int] = 18,
) -> dict[str, Any]:
    """Liu et al. Figures 7-8: beta^2_{i,j}, the share of residual branch j in sub-layer i's
    output, at initialisation (mean and std over seeds and mini-batches) and, with
    `settings.checkpoint`, for the trained model (std over mini-batches).

    Returns:
      {"results": {arm: {"share": {"mean": [2L, 2L+1], "std": ...}, "own": {"mean": [2L]:
       the share of each sub-layer's own branch}, "bias_share": {"mean": [2L]},
       "reconstruction_error": float}}, "config": ...}.
    """
    depth = one_depth(num_layers)
    fn = jit_model_fn(dependency_shares)
    arms = all_arms(settings, placements, depth)
    results = {arm.label: _dependency_arm(settings, arm, fn) for arm in arms}
    return {
        "measurement": "beta^2_ij = Var(part of sub-layer i's output from branch j) / Var(output)",
        "index": "rows: sub-layer outputs 1..2L; columns: 0 = encoder input, j = sub-layer j",
        "results": results,
        "config": describe(settings, num_layers=depth, checkpoint_arm=checkpoint_info(settings)),
    }
