"""Xiong et al. (2020) Figure 3: gradient norms of the FFN weights at initialisation.

* `grad_norm_by_depth` (Figure 3(c,d)): ||dL/dW^{2,L}||_F of the last layer's second FFN
  matrix against the depth L. Theorem 1: O(d sqrt(ln d)) for Post-LN whatever L, and
  O(d sqrt(ln d / L)) for Pre-LN.
* `grad_norm_by_layer` (Figure 3(a,b)): per layer, the mean over mini-batches of the gradient
  norm of W^1 and W^2 and the norm of the mean (*expected*) gradient, at initialisation and
  after some Adam steps with a linear warm-up. The per-batch gradients are one `lax.scan`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ln_jax import sharding
from ln_jax.analysis.models import (
    AnyModel,
    Batch,
    all_arms,
    arm_task,
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
from ln_jax.config.optim import OptimConfig
from ln_jax.nn.placement_setup import setup_placements
from ln_jax.nn.stack import StackView
from ln_jax.task import Task, make_task
from ln_jax.train import optim

# What `layers` measures, beside what the papers measured.
ENCODER_ONLY_NOTE = (
    "encoder only (BERT-style): Xiong et al.'s Fig. 3(a,b) measures a 6-6 encoder-decoder "
    "Transformer, whose per-layer shape need not carry over to an encoder alone; Liu et al. "
    "(2020, appendix A) predict no gradient vanishing in a Post-LN encoder (flat by layer)"
)


def ffn_kernels(tree: Any, view: StackView) -> tuple[jax.Array, jax.Array]:
    """W^1 [num_layers, d, mlp] and W^2 [num_layers, mlp, d] of every layer of the stack of
    `view` from a tree shaped like the model's parameters (the parameters themselves, or their
    gradients); the layers a list or scanned."""
    tree = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
    layers = functools.reduce(lambda node, part: node[part], view.path, tree)
    kernel = lambda ffn, name: jnp.asarray(ffn["branch"][name]["kernel"])
    if all(i in layers for i in range(view.num_layers)):  # a list of layers
        stack = lambda name: jnp.stack(
            [kernel(layers[i]["ffn"], name) for i in range(view.num_layers)]
        )
        return stack("wi"), stack("wo")
    return kernel(layers["ffn"], "wi"), kernel(layers["ffn"], "wo")


def ffn_grad_norms(grads: Any, views: Sequence[StackView]) -> dict[str, jax.Array]:
    """{"<stack>/W1": [L], "<stack>/W2": [L]} per view (the stack's attribute name:
    "encoder", "decoder"): ||dL/dW||_F of each layer's FFN matrices from a gradient tree."""
    out = {}
    for view in views:
        for matrix, g in zip(("W1", "W2"), ffn_kernels(grads, view), strict=True):
            out[f"{view.attribute}/{matrix}"] = jnp.sqrt(jnp.sum(g * g, axis=(1, 2)))
    return out


def _encoder_view(model: AnyModel) -> StackView:
    return model.stack_views()[0]


def _ffn_grads(task: Task, model: AnyModel, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """dL/dW^1 [num_layers, d, mlp] and dL/dW^2 [num_layers, mlp, d] of the first stack on
    one batch."""
    grads = nnx.grad(lambda m: model_loss(task, m, batch))(model)
    return ffn_kernels(grads, _encoder_view(model))


def _last_w2_norm(task: Task, model: AnyModel, batch: Batch) -> jax.Array:
    """||dL/dW^{2,L}||_F on one batch (a scalar)."""
    return jnp.linalg.norm(_ffn_grads(task, model, batch)[1][-1])


def _per_model_per_batch(
    settings: Settings, arm: Arm, measure: Callable[[Task, AnyModel, Batch], Any]
) -> list[list[np.ndarray]]:
    """measure(task, model, batch) for every model of the arm and every measurement batch
    (jitted once for the arm's models)."""
    fn = jit_model_fn(functools.partial(measure, arm_task(settings, arm)))
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
    fn = _last_w2_norm
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


def stack_batches(batches: Sequence[Batch]) -> Batch:
    """n batches of equal shapes -> one batch whose arrays have a leading [n] axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


def _ffn_grad_moments(task: Task, model: AnyModel, stacked: Batch) -> tuple[jax.Array, jax.Array]:
    """Per-batch and expected FFN gradient norms over n stacked batches, in one compiled scan.

    Args:
      task: the task whose loss is differentiated.
      model: the model at which the gradients are taken (its first stack is measured).
      stacked: `stack_batches` of n batches (arrays [n, ...]).

    Returns:
      (per_batch [n, 2, num_layers]: ||dL/dW||_F on each batch, W^1 in row 0 and W^2 in row 1;
       of_mean [2, num_layers]: ||mean over the n batches of dL/dW||_F).
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    view = _encoder_view(model)

    def kernel_grads(batch: Batch) -> tuple[jax.Array, jax.Array]:
        loss = lambda p: model_loss(task, nnx.merge(graphdef, p, rest), batch)
        return ffn_kernels(jax.grad(loss)(params), view)

    def layer_norms(g1: jax.Array, g2: jax.Array) -> jax.Array:  # -> [2, num_layers]
        return jnp.stack([jnp.sqrt(jnp.sum(g * g, axis=(1, 2))) for g in (g1, g2)])

    def body(total, batch):
        grads = kernel_grads(batch)
        total = jax.tree.map(jnp.add, total, grads)
        return total, layer_norms(*grads)

    zeros = jax.tree.map(jnp.zeros_like, ffn_kernels(params, view))
    total, per_batch = jax.lax.scan(body, zeros, stacked)
    n = jax.tree.leaves(stacked)[0].shape[0]
    return per_batch, layer_norms(*(t / n for t in total))


def _warmup_optimizer(settings: Settings, steps: int, lr: float) -> OptimConfig:
    """The config's optimizer with a linear warm-up from 0 to `lr` over `steps` steps."""
    return dataclasses.replace(
        settings.config.optim,
        peak_lr=lr,
        schedule="constant",
        warmup_steps=steps,
        total_steps=max(steps, 1),
    )


def make_trainer(cfg: OptimConfig, task: Task) -> Callable[[AnyModel, Any, int], AnyModel]:
    """(model, batch iterator, steps) -> the model after `steps` in-place optimizer updates of
    the task's loss.

    The update is compiled once per model structure, shared by every seed.
    """
    tx = optim.make_optimizer(cfg, {})

    def step(m: AnyModel, state: Any, batch: Batch) -> tuple[Any, Any]:
        grads = nnx.grad(lambda model: model_loss(task, model, batch))(m)
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


def _layer_arm(settings: Settings, arm: Arm, optim_cfg, train_steps: int) -> dict:
    task = arm_task(settings, arm)
    moments_fn = jit_model_fn(functools.partial(_ffn_grad_moments, task))
    train = make_trainer(optim_cfg, task)
    stacked = stack_batches(take_batches(settings, arm, settings.batches))
    measure = lambda m: [np.asarray(x, np.float64) for x in moments_fn(m, stacked)]
    init, trained = [], []
    first = jax.tree.map(lambda x: x[0], stacked)
    for _, model in instances(settings, arm, first):
        init.append(measure(model))
        if train_steps and arm.checkpoint is None:  # a trained model is past its warm-up
            stream = batch_stream(settings, arm)
            for _ in range(settings.batches):  # train on batches after the measured ones
                next(stream)
            train(model, stream, train_steps)
            trained.append(measure(model))
    out = {"init": _by_quantity(init)}
    if trained:
        out["after_warmup"] = _by_quantity(trained)
    return out


def _by_quantity(values: list[list[np.ndarray]]) -> dict[str, Any]:
    """Per model (per_batch [n, 2, L], of_mean [2, L]) -> {"mean_of_norm": {"W1", "W2"},
    "norm_of_mean": {"W1", "W2"}}, each a summary over models of [L] values.

    E||g|| keeps the n per-batch norms (std over batches when there is one model); ||E g|| is
    one value per model.
    """
    per_batch = np.stack([v[0] for v in values])  # [models, n, 2, L]
    of_mean = np.stack([v[1] for v in values])[:, None]  # [models, 1, 2, L]
    by_matrix = lambda a: {"W1": seed_mean_std(a[:, :, 0]), "W2": seed_mean_std(a[:, :, 1])}
    return {"mean_of_norm": by_matrix(per_batch), "norm_of_mean": by_matrix(of_mean)}


def grad_norm_by_layer(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre"),
    num_layers: int | Sequence[int] = 6,
    train_steps: int = 50,
    train_lr: float = 5e-4,
) -> dict[str, Any]:
    """Xiong et al. Figure 3(a,b), on a BERT-style encoder only: FFN gradients of every layer.

    For each model and layer two norms are taken over the `settings.batches` mini-batches:
    E_batches||dL/dW||_F ("mean_of_norm") and ||E_batches[dL/dW]||_F ("norm_of_mean", the
    expected gradient Xiong et al. plot); by Jensen the first is >= the second, equal for one
    batch. Mean and std are over seeds. "after_warmup" repeats the measurement (same batches)
    after `train_steps` updates of the config's optimizer whose learning rate rises linearly
    from 0 to `train_lr` (0 steps, or the checkpoint arm: skipped).

    Returns:
      {"results": {placement: {"init": {"mean_of_norm": {"W1": {"mean": [L], "std": [L]},
       "W2": ...}, "norm_of_mean": ...}, "after_warmup": ...}}, "architecture": ...,
       "config": ...}; layers are numbered 1..L in the plot.
    """
    depth = one_depth(num_layers)
    if train_steps < 0:
        raise ValueError(f"train_steps={train_steps} must be >= 0 (0 skips the training).")
    optim_cfg = _warmup_optimizer(settings, train_steps, train_lr)
    results = {
        arm.label: _layer_arm(settings, arm, optim_cfg, train_steps)
        for arm in all_arms(settings, placements, depth)
    }
    return {
        "measurement": (
            "E_batches||dL/dW||_F (mean_of_norm) and ||E_batches[dL/dW]||_F (norm_of_mean) of "
            "the FFN matrices W1, W2 of each encoder layer"
        ),
        "architecture": ENCODER_ONLY_NOTE,
        "results": results,
        "config": describe(
            settings,
            num_layers=depth,
            train_steps=train_steps,
            optimizer=dataclasses.asdict(optim_cfg),
            checkpoint_arm=checkpoint_info(settings),
        ),
    }


# --------------------------------------------------------------------------- encoder-decoder

TRANSLATION_NOTE = (
    "encoder-decoder (Xiong et al.'s own setting for Fig. 3(a,b): a 6-6 Transformer on "
    "translation); the label-smoothed loss of `configs/study_mt.py`'s task on training batches "
    "of its corpus, at initialisation (placements' set-up hooks run first, e.g. Admin's "
    "profile), dropout off"
)


def _with_seeds(per_seed: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """`seed_mean_std` of one measurement over the seeds, with the per-seed values kept
    ("per_seed": [seeds][layers]) so that a claim about every seed can be checked."""
    values = np.stack([np.asarray(s[key], np.float64) for s in per_seed])
    return {**seed_mean_std(values[:, None]), "per_seed": values.tolist()}


def translation_grad_norm_by_layer(
    cfg: Any,
    placements: Sequence[str] = ("post", "pre"),
    depths: Sequence[int] = (6,),
    seeds: Sequence[int] = tuple(range(10)),
    batches: int = 4,
) -> dict[str, Any]:
    """Xiong et al. Fig. 3(a,b) on the encoder-decoder: per layer of each stack, the FFN
    matrices' gradient norm at initialisation, E_batches||dL/dW||_F, Post-LN against Pre-LN.

    Every model (placement x encoder = decoder depth x seed) is a fresh initialisation of
    `cfg`'s translation model, its gradients taken on the same `batches` training batches
    (data seed 0), dropout off. Mean and std are over seeds.

    Args:
      cfg: a typed TrainConfig of the translation task (configs/study_mt.py:gradients).

    Returns:
      {"results": {"post L6": {"encoder/W1": {"mean": [L], "std": [L], "per_seed": [S][L]},
       ...}},
       "measurement", "architecture", "config"}.
    """
    if cfg.task != "translation" or batches < 1:
        raise ValueError(
            f"mt_gradients needs a translation config (task {cfg.task!r}) and --batches >= 1 "
            f"(got {batches}); use --config=configs/study_mt.py:gradients."
        )
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seed=0))
    stream = make_task(cfg).host_batches()
    data = [next(stream) for _ in range(batches)]
    getattr(stream, "close", lambda: None)()
    results: dict[str, Any] = {}
    for placement in placements:
        for depth in depths:
            over = {"placement": placement, "num_layers": depth}
            run_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **over))
            run_cfg = dataclasses.replace(
                run_cfg, options=dataclasses.replace(cfg.options, decoder_layers=depth)
            )
            per_seed = _ffn_norms_per_seed(run_cfg, data, seeds)
            results[f"{placement} L{depth}"] = {k: _with_seeds(per_seed, k) for k in per_seed[0]}
    return {
        "measurement": "E_batches||dL/dW||_F of the FFN matrices of each encoder/decoder layer",
        "architecture": TRANSLATION_NOTE,
        "results": results,
        "config": {
            "placements": list(placements),
            "depths": list(depths),
            "seeds": list(seeds),
            "batches": batches,
            "width": cfg.model.hidden_size,
            "init": cfg.model.init,
            "dataset": cfg.data.dataset,
            "max_tokens": cfg.options.max_tokens,
        },
    }


def _ffn_norms_per_seed(cfg, data, seeds) -> list[dict[str, np.ndarray]]:
    """Per seed: {stack/matrix: [L] mean over `data`'s batches of the FFN gradient norms} of
    every stack of a fresh model of `cfg`'s task (placements set up on `data[0]`)."""
    task = make_task(cfg)

    def norms(model, batch):
        grads = nnx.grad(lambda m: model_loss(task, m, batch))(model)
        return ffn_grad_norms(grads, model.stack_views())

    fn = nnx.jit(norms)
    out = []
    with sharding.use_mesh(sharding.single_device_mesh()):
        for seed in seeds:
            model = task.build(nnx.Rngs(seed))
            setup_placements(model, lambda: data[0], None)
            values = [jax.device_get(fn(model, b)) for b in data]
            out.append({k: np.mean([v[k] for v in values], axis=0) for k in values[0]})
    return out


def translation_table(result: dict[str, Any]) -> str:
    """Markdown: per arm and stack, the W2 and W1 gradient norms by layer (mean ± std over
    seeds), and the last-over-first layer ratio (Xiong: Post-LN's grow towards the output,
    Pre-LN's stay flat)."""
    lines = [
        f"{result['measurement']}, {result['architecture']}.",
        f"Seeds {result['config']['seeds']}, {result['config']['batches']} batches each.",
        "",
        "| arm | stack / matrix | by layer (1 → L): mean ± std over seeds | last / first |",
        "|---|---|---|---|",
    ]
    for arm, by in result["results"].items():
        for key, stats in sorted(by.items(), key=lambda kv: (kv[0].startswith("decoder"), kv[0])):
            mean, std = np.asarray(stats["mean"]), np.asarray(stats["std"])
            values = ", ".join(f"{m:.3g} ± {s:.2g}" for m, s in zip(mean, std, strict=True))
            lines.append(f"| {arm} | {key} | {values} | {mean[-1] / mean[0]:.2f} |")
    return "\n".join(lines)


def plot_translation(result: dict[str, Any], path: str) -> str:
    """Gradient norm of W2 (and W1 dashed) by layer, encoder and decoder panels."""
    from ln_jax.results import arm_colour, new_figure, save_figure

    fig, axes = new_figure(2, width=5.0, height=4.0)
    for i, (arm, by) in enumerate(result["results"].items()):
        colour = arm_colour(arm.split()[0], i)
        for ax, stack in zip(axes, ("encoder", "decoder"), strict=True):
            for matrix, style in (("W2", "-o"), ("W1", "--")):
                mean = np.asarray(by[f"{stack}/{matrix}"]["mean"])
                layers = np.arange(1, mean.size + 1)
                ax.plot(layers, mean, style, color=colour, label=f"{arm} {matrix}", ms=3)
            ax.set_title(stack)
            ax.set_xlabel("layer")
            ax.set_yscale("log")
    axes[0].set_ylabel("E||dL/dW||_F at initialisation")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)
