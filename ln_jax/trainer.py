"""Pretraining: the sharded train/eval steps and the loop (checkpoints, metrics, SIGTERM, NaN).

`train_and_evaluate(cfg, workdir)` is what `train.py` runs and what the tests call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ln_jax import memory, optim, sharding
from ln_jax.bert import create_model
from ln_jax.checkpoint import Checkpointer, CheckpointError
from ln_jax.config import TrainConfig
from ln_jax.data import make_pipeline
from ln_jax.metrics import MetricsWriter, Progress

__all__ = ["CheckpointError", "NonFiniteError", "setup", "train_and_evaluate"]
log = logging.getLogger(__name__)
Batch = dict[str, jax.Array]
State = dict[str, Any]


class NonFiniteError(RuntimeError):
    """Training produced a NaN/Inf loss or gradient (nan_policy="stop")."""


# --------------------------------------------------------------------------- losses


def pretraining_loss(outputs: dict, batch: Batch, use_nsp: bool) -> tuple[jax.Array, dict]:
    """Masked-LM (+ next-sentence) cross-entropy and accuracies, all float32.

    outputs["mlm_logits"] [B, P, V] and batch["masked_ids"/"masked_weights"] [B, P]: the MLM
    loss is the weighted mean over real predictions; NSP is the mean over the batch.
    """
    logits = outputs["mlm_logits"].astype(jnp.float32)
    ids, weights = batch["masked_ids"], batch["masked_weights"].astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], axis=-1)[..., 0]
    denom = jnp.maximum(weights.sum(), 1.0)
    metrics = {
        "mlm_loss": (nll * weights).sum() / denom,
        "mlm_accuracy": ((logits.argmax(-1) == ids) * weights).sum() / denom,
    }
    loss = metrics["mlm_loss"]
    if use_nsp:
        nsp_logits = outputs["nsp_logits"].astype(jnp.float32)
        labels = batch["nsp_label"]
        metrics["nsp_loss"] = optax.softmax_cross_entropy_with_integer_labels(
            nsp_logits, labels
        ).mean()
        metrics["nsp_accuracy"] = (nsp_logits.argmax(-1) == labels).mean()
        loss = loss + metrics["nsp_loss"]
    metrics["loss"] = loss
    return loss, metrics


def _forward(graphdef, params, rest, batch: Batch, key, use_nsp: bool):
    model = nnx.merge(graphdef, params, rest)
    outputs = model(
        batch["input_ids"],
        batch["segment_ids"],
        batch["attention_mask"],
        batch["masked_positions"],
        dropout_key=key,
    )
    return pretraining_loss(outputs, batch, use_nsp)


# --------------------------------------------------------------------------- steps


def _micro_batches(batch: Batch, accum: int) -> Batch:
    """[B, ...] -> [accum, B/accum, ...], micro-batch a = rows a, a+accum, ... (strided).

    Strided so that every device keeps contributing its own rows to every micro-batch.
    """

    def split(x):
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return sharding.constrain(x, (None, "act_batch") + (None,) * (x.ndim - 2))

    return jax.tree.map(split, batch)


def _grads(graphdef, params, rest, batch, key, cfg: TrainConfig):
    """Loss metrics and gradients, averaged over `grad_accum_steps` micro-batches."""
    use_nsp = cfg.data.nsp and cfg.model.nsp_head
    grad_fn = jax.value_and_grad(_forward, argnums=1, has_aux=True)
    accum = cfg.grad_accum_steps
    if accum == 1:
        (_, metrics), grads = grad_fn(graphdef, params, rest, batch, key, use_nsp)
        return metrics, grads

    def one(micro, index):
        (_, m), g = grad_fn(graphdef, params, rest, micro, jax.random.fold_in(key, index), use_nsp)
        return m, g

    def body(carry, xs):
        return jax.tree.map(jnp.add, carry, one(*xs)), None

    micro = _micro_batches(batch, accum)
    first = one(jax.tree.map(lambda x: x[0], micro), 0)
    later = (jax.tree.map(lambda x: x[1:], micro), jnp.arange(1, accum))
    total, _ = jax.lax.scan(body, first, later)
    return jax.tree.map(lambda x: x / accum, total)


def make_train_step(graphdef, tx, schedule, cfg: TrainConfig) -> Callable:
    """(state, rest, batch) -> (state, metrics): one update; non-finite updates are dropped.

    state = {"params", "opt_state", "step", "halted"}. With nan_policy "stop", the first
    non-finite step sets `halted` and freezes the state at the last good parameters.
    """
    base_key = jax.random.key(cfg.seed)

    def step_fn(state: State, rest, batch: Batch):
        step = state["step"]
        key = jax.random.fold_in(base_key, step)
        metrics, grads = _grads(graphdef, state["params"], rest, batch, key, cfg)
        grad_norm = optim.global_norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        accept = finite & ~state["halted"]
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(accept, n, o), new, old)
        new_state = {
            "params": keep(params, state["params"]),
            "opt_state": keep(opt_state, state["opt_state"]),
            "step": step + 1,
            "halted": state["halted"] | (~finite if cfg.nan_policy == "stop" else False),
        }
        metrics.update(grad_norm=grad_norm, learning_rate=schedule(step), finite=finite)
        return new_state, metrics

    return step_fn


def make_eval_step(graphdef, cfg: TrainConfig) -> Callable:
    """(params, rest, batch) -> summed metrics of one batch (weights for exact averages)."""
    use_nsp = cfg.data.nsp and cfg.model.nsp_head

    def eval_fn(params, rest, batch: Batch):
        _, metrics = _forward(graphdef, params, rest, batch, None, use_nsp)
        n_pred = jnp.maximum(batch["masked_weights"].sum(), 1.0)
        n_seq = batch["input_ids"].shape[0]
        sums = {
            "mlm_loss": metrics["mlm_loss"] * n_pred,
            "mlm_accuracy": metrics["mlm_accuracy"] * n_pred,
            "n_pred": n_pred,
        }
        if use_nsp:
            sums.update(
                nsp_loss=metrics["nsp_loss"] * n_seq,
                nsp_accuracy=metrics["nsp_accuracy"] * n_seq,
                n_seq=n_seq * 1.0,
            )
        return sums

    return eval_fn


# --------------------------------------------------------------------------- set-up


@dataclasses.dataclass
class Run:
    """The pieces of a run, built once by `setup`."""

    cfg: TrainConfig
    mesh: jax.sharding.Mesh
    graphdef: Any
    rest: Any
    state: State
    train_step: Callable
    eval_step: Callable
    schedule: Callable
    train_iter: Any
    eval_batches: Any


def make_mesh(cfg: TrainConfig) -> jax.sharding.Mesh:
    return sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)


def init_state(cfg: TrainConfig, mesh) -> tuple[Any, Any, State, optax.GradientTransformation]:
    """Sharded parameters and optimizer state (created in their shards)."""
    model = create_model(cfg.model, seed=cfg.seed, mesh=mesh)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optim.make_optimizer(cfg.optim, params)
    abstract = jax.eval_shape(tx.init, params)
    opt_sh = sharding.mirror_shardings(abstract, params, mesh)
    with sharding.use_mesh(mesh):
        opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    scalar = lambda v: jax.device_put(jnp.asarray(v), replicated)
    state = {"params": params, "opt_state": opt_state, "step": scalar(0), "halted": scalar(False)}
    return graphdef, rest, state, tx


def _in_mesh(fn: Callable, mesh) -> Callable:
    """Calls `fn` with the mesh and rules in context (traced activation constraints need it)."""

    def call(*args):
        with sharding.use_mesh(mesh):
            return fn(*args)

    return call


def _jit_steps(cfg, mesh, graphdef, rest, state, tx, schedule):
    shardings = jax.tree.map(lambda x: x.sharding, state)
    rest_sh = jax.tree.map(lambda x: x.sharding, rest)
    batch_sh = sharding.batch_sharding(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    train = jax.jit(
        make_train_step(graphdef, tx, schedule, cfg),
        in_shardings=(shardings, rest_sh, batch_sh),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )
    evaluate = jax.jit(
        make_eval_step(graphdef, cfg),
        in_shardings=(shardings["params"], rest_sh, batch_sh),
        out_shardings=replicated,
    )
    return train, evaluate


def setup(cfg: TrainConfig) -> Run:
    mesh = make_mesh(cfg)
    train_iter, tokenizer = make_pipeline(cfg.data, split="train", seed=cfg.data.seed, mesh=mesh)
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but model.vocab_size="
            f"{cfg.model.vocab_size}; set them equal (data.vocab_size sets both)."
        )
    eval_batches, _ = make_pipeline(
        cfg.data, split="eval", seed=cfg.data.seed, mesh=mesh, num_batches=cfg.eval_batches
    )
    graphdef, rest, state, tx = init_state(cfg, mesh)
    schedule = optim.make_schedule(cfg.optim)
    if cfg.grad_accum_steps == 0:
        probe = dataclasses.replace(cfg, grad_accum_steps=1)
        train, _ = _jit_steps(probe, mesh, graphdef, rest, state, tx, schedule)
        batch = memory.abstract_batch(cfg.data, mesh)
        accum = memory.auto_accumulation(train, (state, rest, batch), cfg.data, mesh)
        cfg = dataclasses.replace(cfg, grad_accum_steps=accum)
    train, evaluate = _jit_steps(cfg, mesh, graphdef, rest, state, tx, schedule)
    return Run(
        cfg,
        mesh,
        graphdef,
        rest,
        state,
        _in_mesh(train, mesh),
        _in_mesh(evaluate, mesh),
        schedule,
        train_iter,
        eval_batches,
    )


# --------------------------------------------------------------------------- loop


def evaluate(run: Run) -> dict[str, float]:
    """Averages the eval metrics over the validation batches (exact, weighted)."""
    totals: dict[str, float] = {}
    for batch in run.eval_batches:
        sums = jax.device_get(run.eval_step(run.state["params"], run.rest, batch))
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    out = {k: totals[k] / totals["n_pred"] for k in ("mlm_loss", "mlm_accuracy")}
    if "n_seq" in totals:
        out.update({k: totals[k] / totals["n_seq"] for k in ("nsp_loss", "nsp_accuracy")})
    out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0)
    return out


class _Preemption:
    """Turns SIGTERM into a flag the loop checks after each step (then: save, exit 0)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: preemption is then the caller's business
            self._previous = None
        return self

    def _handle(self, signum, frame):
        del signum, frame
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _check_finite(run: Run, step: int, metrics: dict) -> None:
    if not bool(run.state["halted"]):
        return
    raise NonFiniteError(
        f"non-finite loss or gradient at or before step {step} (last logged loss "
        f"{float(metrics['loss']):.4g}, grad_norm {float(metrics['grad_norm']):.4g}); training "
        "stopped and the last good checkpoint is kept. Lower optim.peak_lr, add warm-up, or "
        "set --config.nan_policy=skip to drop such updates."
    )


def _save(run: Run, ckpt: Checkpointer, step: int, config_dict: dict) -> None:
    if bool(run.state["halted"]):
        return  # never overwrite the last good checkpoint with a halted state
    ckpt.save(step, run.state, run.train_iter.get_state(), config_dict)


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


ADMIN_PROFILE = "admin_profile.json"


def _admin_omegas(run: Run, workdir: str) -> list[float]:
    """Admin's profiled omegas: read from WORKDIR/admin_profile.json, else profiled and saved.

    The profile is one training-mode forward pass per sub-layer on the first training batch
    (peeked: the data iterator is rewound) with step 0's dropout key.
    """
    from ln_jax import admin

    path = os.path.join(workdir, ADMIN_PROFILE)
    if os.path.exists(path):
        with open(path) as f:
            omegas = json.load(f)["omega"]
        log.info("admin: reusing the profile in %s: omega = %s", path, omegas)
        return omegas
    data_state = run.train_iter.get_state()
    batch = next(run.train_iter)
    run.train_iter.set_state(data_state)
    model = nnx.merge(run.graphdef, run.state["params"], run.rest)
    with sharding.use_mesh(run.mesh):
        omegas = admin.admin_profile(
            model, batch, jax.random.fold_in(jax.random.key(run.cfg.seed), 0)
        )
    omegas = [float(w) for w in omegas]
    if jax.process_index() == 0:
        with open(path, "w") as f:
            json.dump({"omega": omegas, "num_sublayers": len(omegas)}, f, indent=1)
    log.info("admin: profiled omega per sub-layer = %s (saved to %s)", omegas, path)
    return omegas


def _apply_admin(run: Run, workdir: str) -> None:
    """Sets the profiled omegas in the run's parameters (placement "admin", omega "profile")."""
    from ln_jax import admin

    model_cfg = run.cfg.model
    if set(model_cfg.layer_placements) != {"admin"} or model_cfg.admin_omega != "profile":
        return
    omegas = _admin_omegas(run, workdir)
    model = nnx.merge(run.graphdef, run.state["params"], run.rest)
    admin.set_admin_omega(model, omegas)
    _, run.state["params"], _ = nnx.split(model, nnx.Param, ...)


def train_and_evaluate(
    cfg: TrainConfig, workdir: str, hooks: Sequence[Callable[[int, Run], None]] = ()
) -> dict[str, Any]:
    """Trains `cfg` in `workdir`, resuming from its latest checkpoint if there is one.

    `hooks` are called as `hook(step, run)` after every step (measurements, custom logging).

    Returns:
      {"step": last step, "train": last train metrics, "eval": last eval metrics,
       "preempted": bool}.
    """
    os.makedirs(workdir, exist_ok=True)
    run = setup(cfg)
    config_dict = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    _apply_admin(run, workdir)  # before a restore, which then overwrites omega anyway
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), cfg.checkpoint)
    restored = ckpt.restore(run.state)
    if restored is not None:
        start, run.state, data_state = restored
        run.train_iter.set_state(data_state)
        log.info("resumed from step %d in %s", start, workdir)
    start = int(run.state["step"])
    is_main = jax.process_index() == 0
    writer = MetricsWriter(workdir, enabled=is_main)
    tokens = cfg.data.global_batch_size * cfg.data.max_seq_length
    progress = Progress(cfg.total_steps, tokens, start, enabled=is_main)
    result: dict[str, Any] = {"step": start, "train": {}, "eval": {}, "preempted": False}
    try:
        with _Preemption() as preemption:
            result = _loop(
                run, ckpt, writer, progress, config_dict, start, preemption, result, hooks
            )
    finally:
        ckpt.close()
        writer.close()
    return result


def _loop(run, ckpt, writer, progress, config_dict, start, preemption, result, hooks):
    cfg, last = run.cfg, run.cfg.total_steps
    for step in range(start + 1, last + 1):
        run.state, metrics = run.train_step(run.state, run.rest, next(run.train_iter))
        for hook in hooks:
            hook(step, run)
        # Steps 1-2 are always shown: the first ETA comes after one real step, not log_every.
        if _due(step, cfg.log_every, last) or step - start <= 2 or preemption.requested:
            metrics = jax.device_get(metrics)
            steps_s, tokens_s = progress.rates(step)
            result["train"] = writer.write(
                step, "train", {**metrics, "steps_per_s": steps_s, "tokens_per_s": tokens_s}
            )
            progress.show(step, steps_s, tokens_s, float(metrics["loss"]))
            _check_finite(run, step, metrics)
        if _due(step, cfg.eval_every, last):
            _check_finite(run, step, jax.device_get(metrics))
            result["eval"] = writer.write(step, "eval", evaluate(run))
        if _due(step, cfg.checkpoint_every, last) or preemption.requested:
            _save(run, ckpt, step, config_dict)
        result["step"] = step
        if preemption.requested:
            log.warning("SIGTERM: saved step %d, exiting", step)
            result["preempted"] = True
            break
    return result
