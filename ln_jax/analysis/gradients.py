"""Xiong et al. (2020) Figure 3: gradient norms of the FFN weights at initialisation.

* `grad_norm_by_depth` (Figure 3(c,d)): ||dL/dW^{2,L}||_F of the last layer's second FFN
  matrix against the depth L. Theorem 1: O(d sqrt(ln d)) for Post-LN whatever L, and
  O(d sqrt(ln d / L)) for Pre-LN.
* `grad_norm_by_layer` (Figure 3(a,b)): the scale of the *expected* gradient of W^1 and W^2 of
  every layer (the gradient averaged over mini-batches, then its Frobenius norm), at
  initialisation and after some Adam steps with a linear warm-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ln_jax import optim
from ln_jax.analysis.models import (
    AnyModel,
    Batch,
    all_arms,
    batch_stream,
    checkpoint_arm,
    checkpoint_info,
    instances,
    jit_model_fn,
    model_loss,
    take_batches,
)
from ln_jax.analysis.settings import Arm, Settings, depth_arms, describe, one_depth
from ln_jax.analysis.stats import seed_mean_std


def ffn_kernels(tree: Any, model: AnyModel) -> tuple[jax.Array, jax.Array]:
    """W^1 [num_layers, d, mlp] and W^2 [num_layers, mlp, d] of every layer from a tree shaped
    like the model's parameters (the parameters themselves, or their gradients)."""
    cfg = model.cfg
    encoder = tree["encoder"] if "encoder" in tree else tree["bert"]["encoder"]
    layers = encoder["layers"]
    if cfg.scan_layers:
        ffn = layers["ffn"]["branch"]
        return ffn["wi"]["kernel"][...], ffn["wo"]["kernel"][...]
    stack = lambda name: jnp.stack(
        [layers[i]["ffn"]["branch"][name]["kernel"][...] for i in range(cfg.num_layers)]
    )
    return stack("wi"), stack("wo")


def _ffn_grads(model: AnyModel, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """dL/dW^1 [num_layers, d, mlp] and dL/dW^2 [num_layers, mlp, d] on one batch."""
    grads = nnx.grad(model_loss)(model, batch)
    return ffn_kernels(grads, model)


def _last_w2_norm(model: AnyModel, batch: Batch) -> jax.Array:
    """||dL/dW^{2,L}||_F on one batch (a scalar)."""
    return jnp.linalg.norm(_ffn_grads(model, batch)[1][-1])


def _per_model_per_batch(
    settings: Settings, arm: Arm, fn: Callable[[AnyModel, Batch], Any]
) -> list[list[np.ndarray]]:
    """fn(model, batch) for every model of the arm and every measurement batch."""
    batches = take_batches(settings, arm, settings.batches)
    return [
        [np.asarray(fn(model, b)) for b in batches]
        for _, model in instances(settings, arm, batches[0])
    ]


def grad_norm_by_depth(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre"),
    num_layers: Sequence[int] = (6, 8, 10, 12, 14),
) -> dict[str, Any]:
    """Xiong et al. Figure 3(c,d): ||dL/dW^{2,L}||_F at initialisation, by depth.

    The norm is taken per mini-batch and averaged over `settings.batches` batches; the
    standard deviation is over seeds.

    Returns:
      {"results": {placement: {num_layers: {"mean", "std", "std_over"}}}, "config": ...};
      with a checkpoint also results["checkpoint"] at its own depth.
    """
    arms = depth_arms(settings, placements, num_layers)
    ckpt = checkpoint_arm(settings)  # a bad path fails before anything is measured
    fn = jit_model_fn(_last_w2_norm)
    results = {
        label: {
            str(n): seed_mean_std(_per_model_per_batch(settings, a, fn)) for n, a in by_n.items()
        }
        for label, by_n in arms.items()
    }
    if ckpt is not None:
        values = _per_model_per_batch(settings, ckpt, fn)
        results["checkpoint"] = {str(ckpt.model.num_layers): seed_mean_std(values)}
    return {
        "measurement": "||dL/dW^{2,L}||_F of the last layer's second FFN matrix at init",
        "results": results,
        "config": describe(settings, checkpoint_arm=checkpoint_info(settings)),
    }


# --------------------------------------------------------------------------- by layer


def _expected_grad_norms(model: AnyModel, batches: list[Batch], grad_fn) -> np.ndarray:
    """[2, num_layers]: ||mean over batches of dL/dW||_F for W^1 (row 0) and W^2 (row 1)."""
    total = None
    for batch in batches:
        grads = [np.asarray(g, np.float64) for g in grad_fn(model, batch)]
        total = grads if total is None else [t + g for t, g in zip(total, grads, strict=True)]
    means = [t / len(batches) for t in total]
    return np.stack([np.linalg.norm(m.reshape(m.shape[0], -1), axis=1) for m in means])


def _warmup_optimizer(settings: Settings, steps: int, lr: float) -> optim.OptimConfig:
    """The config's optimizer with a linear warm-up from 0 to `lr` over `steps` steps."""
    return dataclasses.replace(
        settings.config.optim,
        peak_lr=lr,
        schedule="constant",
        warmup_steps=steps,
        total_steps=max(steps, 1),
    )


def make_trainer(cfg: optim.OptimConfig) -> Callable[[AnyModel, Any, int], AnyModel]:
    """(model, batch iterator, steps) -> the model after `steps` in-place optimizer updates.

    The update is compiled once per model structure, shared by every seed.
    """
    tx = optim.make_optimizer(cfg, {})

    def step(m: AnyModel, state: Any, batch: Batch) -> tuple[Any, Any]:
        grads = nnx.grad(model_loss)(m, batch)
        current = nnx.state(m, nnx.Param)
        updates, state = tx.update(grads, state, current)
        return optax.apply_updates(current, updates), state

    step_fn, init_fn = jit_model_fn(step), jax.jit(tx.init)

    def train(model: AnyModel, batches: Any, steps: int) -> AnyModel:
        opt_state = init_fn(nnx.state(model, nnx.Param))
        for _ in range(steps):
            new_params, opt_state = step_fn(model, opt_state, next(batches))
            nnx.update(model, new_params)
        return model

    return train


def _layer_arm(settings: Settings, arm: Arm, grad_fn, train_steps: int, train) -> dict[str, Any]:
    batches = take_batches(settings, arm, settings.batches)
    init, trained = [], []
    for _, model in instances(settings, arm, batches[0]):
        init.append([_expected_grad_norms(model, batches, grad_fn)])
        if train_steps and arm.checkpoint is None:  # a trained model is past its warm-up
            stream = batch_stream(settings, arm)
            for _ in range(settings.batches):  # train on batches after the measured ones
                next(stream)
            train(model, stream, train_steps)
            trained.append([_expected_grad_norms(model, batches, grad_fn)])
    out = {"init": _by_matrix(init)}
    if trained:
        out["after_warmup"] = _by_matrix(trained)
    return out


def _by_matrix(values: list) -> dict[str, Any]:
    """[models, 1, 2, layers] -> {"W1": summary over models [layers], "W2": ...}."""
    a = np.asarray(values)
    return {"W1": seed_mean_std(a[:, :, 0]), "W2": seed_mean_std(a[:, :, 1])}


def grad_norm_by_layer(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre"),
    num_layers: int | Sequence[int] = 6,
    train_steps: int = 50,
    train_lr: float = 5e-4,
) -> dict[str, Any]:
    """Xiong et al. Figure 3(a,b): the expected gradient of W^1 and W^2 of every layer.

    For each model the gradient is averaged over `settings.batches` mini-batches, then its
    Frobenius norm taken per layer; mean and std are over seeds. "after_warmup" repeats the
    measurement (same batches) after `train_steps` updates of the config's optimizer whose
    learning rate rises linearly from 0 to `train_lr` (0 steps, or the checkpoint arm: skipped).

    Returns:
      {"results": {placement: {"init": {"W1": {"mean": [L], "std": [L]}, "W2": ...},
       "after_warmup": ...}}, "config": ...}; layers are numbered 1..L in the plot.
    """
    depth = one_depth(num_layers)
    if train_steps < 0:
        raise ValueError(f"train_steps={train_steps} must be >= 0 (0 skips the training).")
    optim_cfg = _warmup_optimizer(settings, train_steps, train_lr)
    grad_fn, train = jit_model_fn(_ffn_grads), make_trainer(optim_cfg)
    results = {
        arm.label: _layer_arm(settings, arm, grad_fn, train_steps, train)
        for arm in all_arms(settings, placements, depth)
    }
    return {
        "measurement": "||E_batches[dL/dW]||_F of the FFN matrices W1, W2 of each layer",
        "results": results,
        "config": describe(
            settings,
            num_layers=depth,
            train_steps=train_steps,
            optimizer=dataclasses.asdict(optim_cfg),
            checkpoint_arm=checkpoint_info(settings),
        ),
    }
