"""The train state and the jitted train/eval steps: the one train step of ln_jax.

The trainer, the ahead-of-time check (`compile_check`), automatic accumulation
(`accumulation`), the benchmarks and the analyses all build their state and steps here, so an
estimate or a measurement can never drift from what a run really does. The model family and
its loss come from the run's task (`ln_jax.task`), made once by the caller and passed in:
nothing here names a family or makes a task.

  task = make_task(cfg)                 # once per run
  pieces = init_state(task, mesh)       # parameters and optimizer state, created in shards
  pieces = abstract_state(task, mesh)   # the same tree as ShapeDtypeStructs, same shardings
  train, evaluate = jit_steps(cfg, task, mesh, pieces)  # jitted: those shardings, state donated

The jitted steps are kept in the process (the last `KEPT_PROGRAMS`, by `program_key`): a run
whose program another run of the process already built (a resumed run, a notebook's second
run, a grid that varies only seed, learning rate, schedule or cadences) traces, lowers and
compiles nothing again.

The state and the batch follow `task.cfg`; the train step takes the run's `cfg` besides (its
accumulation, optimizer, seed and NaN policy), which differs from `task.cfg` only where set-up
chose the accumulation ("auto").

`train(state, rest, batch) -> (state, metrics)` and `evaluate(params, rest, batch) -> output`
take the global batch of `abstract_batch` (every array split over data x fsdp). `train` takes
the state dict or the `flat.FlatState` it returns (its arrays in one list, read as the dict:
`state["params"]`), so that a step's call spends no host time on the NNX Variables; call or lower
them inside `sharding.use_mesh(mesh)` (`in_mesh` wraps a step so), where the model's activation
sharding constraints apply. The run's seed and schedule numbers (`run_values`) are bound
inputs of `train`, not constants: a grid over them compiles one program.

Every task trains with this same step, fine-tuning too (its task is
`ln_jax.models.bert.finetune.task.GlueClassification`): the loss, always the task's.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ln_jax import sharding
from ln_jax.config.optim import SCHEDULE_FIELDS
from ln_jax.config.run import TrainConfig
from ln_jax.nn.random import prng_impl
from ln_jax.runtime import platforms
from ln_jax.task import Task
from ln_jax.train import flat, optim
from ln_jax.validate import ConfigError

Batch = dict[str, jax.Array]
State = dict[str, Any]

__all__ = [
    "BoundStep",
    "TrainState",
    "forget_programs",
    "abstract_batch",
    "abstract_state",
    "in_mesh",
    "init_state",
    "jit_steps",
    "jit_train_step",
    "make_eval_step",
    "make_train_step",
    "model_state",
    "program_key",
    "run_values",
]


class TrainState(NamedTuple):
    """What a run trains, split the way the jitted steps take it.

    Attributes:
      graphdef: the model's structure (static).
      rest: the model's non-parameter variables (an nnx.State).
      state: {"params", "opt_state", "step", "halted", "nonfinite_step"}; arrays, or
        ShapeDtypeStructs with their NamedShardings for an abstract state. `nonfinite_step` is
        the first step (1-based) whose loss or gradient was not finite, 0 if none was.
      tx: the optax optimizer.
    """

    graphdef: Any
    rest: Any
    state: State
    tx: optax.GradientTransformation

    @property
    def num_params(self) -> int:
        return sum(math.prod(x.shape) for x in jax.tree.leaves(self.state["params"]))


# --------------------------------------------------------------------------- state


def _replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def _optimizer_and_shardings(cfg: TrainConfig, params: Any, mesh: jax.sharding.Mesh):
    """The optimizer and its state's shardings: Adam's moments mirror the parameters."""
    tx = optim.make_optimizer(cfg.optim, params)
    return tx, sharding.mirror_shardings(jax.eval_shape(tx.init, params), params, mesh)


def init_state(task: Task, mesh: jax.sharding.Mesh) -> TrainState:
    """The parameters and optimizer state of `task.cfg`, each created directly in its shards."""
    return model_state(create_model(task, mesh), task.cfg, mesh)


def create_model(task: Task, mesh: jax.sharding.Mesh | None = None) -> nnx.Module:
    """The task's model with `task.cfg.seed`'s parameters, created in its shards under `mesh`
    (its initialisers compiled once per task, model config and mesh)."""
    cfg = task.cfg
    return sharding.create_seeded(
        task.build,
        cfg.seed,
        cache_key=(task.name, cfg.model, cfg.options),
        mesh=mesh,
        rules=sharding.DEFAULT_RULES,
    )


def model_state(model: nnx.Module, cfg: TrainConfig, mesh: jax.sharding.Mesh) -> TrainState:
    """The train state of any sharded model: its parameters, the optimizer of `cfg.optim`
    with its state created in the parameters' shardings, step 0."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx, opt_sh = _optimizer_and_shardings(cfg, params, mesh)
    with sharding.use_mesh(mesh):
        opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
    # Typed as `abstract_state`'s (not weakly typed, as jnp.asarray(0) is): the programs
    # compiled from the abstract state (`ln_jax.train.precompile`) take these.
    scalar = lambda v, dtype: jax.device_put(jnp.asarray(v, dtype), _replicated(mesh))
    state = {
        "params": params,
        "opt_state": opt_state,
        "step": scalar(0, jnp.int32),
        "halted": scalar(False, jnp.bool_),
        "nonfinite_step": scalar(0, jnp.int32),
    }
    return TrainState(graphdef, rest, state, tx)


def abstract_state(task: Task, mesh: jax.sharding.Mesh) -> TrainState:
    """`init_state`'s tree as ShapeDtypeStructs carrying the same NamedShardings; nothing is
    allocated, so a BERT-large state for 256 devices is built on a laptop."""
    cfg = task.cfg
    build = lambda: task.build(nnx.Rngs(params=cfg.seed))
    graphdef, abstract = sharding.abstract_sharded(build, mesh)
    graphdef, params, rest = nnx.split(nnx.merge(graphdef, abstract), nnx.Param, ...)
    tx, opt_sh = _optimizer_and_shardings(cfg, params, mesh)
    opt_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(tx.init, params),
        opt_sh,
    )
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=_replicated(mesh))
    state = {
        "params": params,
        "opt_state": opt_state,
        "step": scalar(jnp.int32),
        "halted": scalar(jnp.bool_),
        "nonfinite_step": scalar(jnp.int32),
    }
    return TrainState(graphdef, rest, state, tx)


def abstract_batch(task: Task, mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes, dtypes and shardings of one global batch of `task` (no data is read; every
    array split over data x fsdp).

    Raises:
      ConfigError: if the global batch does not divide over the data x fsdp devices and the
        processes (the data loader's own check, `ln_jax.data.batches.check_global_batch`).
    """
    from ln_jax.data.batches import check_global_batch

    divisor = sharding.batch_divisor(mesh)
    check_global_batch(task.cfg.data.global_batch_size, divisor, jax.process_count())
    return task.abstract_batch(mesh)


# --------------------------------------------------------------------------- steps


def _forward(graphdef, params, rest, batch: Batch, key, task: Task, normalizers, measure=0):
    """(loss, metrics) of one (micro-)batch; with `measure` > 0, metrics["monitor"] holds the
    task's activation measures divided by `measure` (the number of micro-batches, so that
    their sum is the mean)."""
    model = nnx.merge(graphdef, params, rest)
    with sharding.activation_layout(task.cfg.model.activation_layout):
        loss, metrics, outputs = task.loss(model, batch, key, normalizers, record=bool(measure))
    if measure:
        stats = task.forward_measures(model, outputs, batch)
        metrics["monitor"] = jax.tree.map(lambda x: jax.lax.stop_gradient(x) / measure, stats)
    return loss, metrics


def _micro_batches(batch: Batch, accum: int) -> Batch:
    """[B, ...] -> [accum, B/accum, ...], micro-batch a = rows a, a+accum, ... (strided).

    Strided so that every device keeps contributing its own rows to every micro-batch.
    """

    def split(x):
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return sharding.constrain(x, (None, "act_batch") + (None,) * (x.ndim - 2))

    return jax.tree.map(split, batch)


def _grads(graphdef, params, rest, batch, key, cfg, task, measure=False):
    """Loss metrics and gradients of the whole batch, summed over `grad_accum_steps`
    micro-batches (with `measure`, metrics["monitor"]: the task's activation measures).

    Every micro-batch's loss divides by the whole batch's normalizers (`Task.normalizers`:
    e.g. the masked-token weight), so the sum over micro-batches is the big batch's loss: a
    micro-batch with fewer tokens weighs exactly as much as its tokens.
    """
    accum = cfg.grad_accum_steps
    normalizers = task.normalizers(batch)
    forward = functools.partial(_forward, task=task, measure=accum if measure else 0)
    grad_fn = jax.value_and_grad(forward, argnums=1, has_aux=True)
    if accum == 1:
        (_, metrics), grads = grad_fn(graphdef, params, rest, batch, key, normalizers=normalizers)
        return metrics, grads

    def one(micro, index):
        micro_key = jax.random.fold_in(key, index)
        (_, m), g = grad_fn(graphdef, params, rest, micro, micro_key, normalizers=normalizers)
        return m, g

    def body(carry, xs):
        return jax.tree.map(jnp.add, carry, one(*xs)), None

    micro = _micro_batches(batch, accum)
    shapes = jax.eval_shape(one, jax.tree.map(lambda x: x[0], micro), 0)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    total, _ = jax.lax.scan(body, zeros, (micro, jnp.arange(accum)))
    return total


def dropout_key(cfg: TrainConfig, step: Any, seed: Any = None) -> jax.Array:
    """The dropout key of update `step` (0-based; traced or not), of `cfg.dropout_rng`; `seed`
    (default `cfg.seed`) may be traced, as in the train step (`run_values`)."""
    base = jax.random.key(cfg.seed if seed is None else seed, impl=prng_impl(cfg.dropout_rng))
    return jax.random.fold_in(base, step)


def run_values(cfg: TrainConfig) -> dict[str, np.ndarray]:
    """The numbers of a run that the train step takes as inputs rather than constants: the seed
    of its dropout keys and the schedule's numbers (`optim.SCHEDULE_FIELDS`, float32).

    Runs that differ only in these (a learning-rate, warm-up or length grid; other seeds)
    compile one program and share it through the persistent compilation cache.
    """
    values = {k: np.float32(v) for k, v in optim.schedule_values(cfg.optim).items()}
    return {"seed": np.int32(cfg.seed), **values}


def make_train_step(cfg: TrainConfig, task: Task, graphdef: Any, measure: bool = False) -> Callable:
    """(state, rest, batch, values) -> (state, metrics): one update of `task`'s loss with the
    run's `cfg` (accumulation, optimizer, seed, NaN policy); non-finite updates are dropped.
    `values`: `run_values(cfg)`, concrete or traced (the optimizer is built from them).

    state = {"params", "opt_state", "step", "halted", "nonfinite_step"}. With nan_policy
    "stop", the first non-finite step sets `halted` and freezes the state at the last good
    parameters; `nonfinite_step` records that step (with "skip", the first skipped one).
    Update `step` uses lr(step) whether or not earlier updates were dropped (Adam's bias
    correction counts the updates applied); with "skip", metrics["skipped_updates"] counts the
    updates dropped since the run began.

    With `measure` the same update also returns metrics["monitor"], the per-layer measurements
    of `ln_jax.train.monitor` (a second compiled program that the trainer calls on logging steps
    only; the update itself is the same).

    Raises:
      ConfigError: `grad_accum_steps` is 0 ("auto", which set-up resolves by compiling).
    """
    if not cfg.grad_accum_steps:
        raise ConfigError(
            "grad_accum_steps=0 (auto) is chosen when a run is set up, by compiling the step "
            "(ln_jax.train.accumulation.fit); a step built directly needs a number of "
            "micro-batches: dataclasses.replace(cfg, grad_accum_steps=1) or more."
        )

    def step_fn(state: State, rest, batch: Batch, values: dict[str, Any]):
        step = state["step"]
        key = dropout_key(cfg, step, values["seed"])
        # The learning rate of the trainer's step, not of optax's count: with nan_policy
        # "skip" the count falls behind by one per dropped update, the schedule does not.
        lr = optim.make_schedule(cfg.optim, values)(step)
        tx = optim.make_optimizer(cfg.optim, state["params"], lambda _count: lr)
        args = (graphdef, state["params"], rest, batch, key, cfg, task, measure)
        metrics, grads = _grads(*args)
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
            "nonfinite_step": jnp.where(
                (state["nonfinite_step"] == 0) & ~finite, step + 1, state["nonfinite_step"]
            ),
        }
        metrics.update(grad_norm=grad_norm, learning_rate=lr, finite=finite)
        if cfg.nan_policy == "skip":  # dropped so far, this step's included
            metrics["skipped_updates"] = step + 1 - optim.applied_updates(new_state["opt_state"])
        if measure:
            stats = task.parameter_measures(grads, updates, state["params"])
            metrics["monitor"] = {**metrics["monitor"], **jax.lax.stop_gradient(stats)}
        return new_state, metrics

    return step_fn


def make_eval_step(task: Task, graphdef: Any) -> Callable:
    """(params, rest, batch) -> the task's evaluation output of one batch (`Task.eval_batch`)."""

    def eval_fn(params, rest, batch: Batch):
        return task.eval_batch(nnx.merge(graphdef, params, rest), batch)

    return eval_fn


# What a run's config does not put into its programs: labels, cadences, how checkpoints are
# kept and data fetched, the evaluation set's size, and the run values (`run_values`: inputs).
_NOT_IN_THE_PROGRAM = {
    "": ("name", "seed", "total_steps", "log_every", "eval_every", "checkpoint_every",
         "compilation_cache", "eval_batches", "checkpoint"),
    "data": ("cache_dir", "download", "worker_count", "device_prefetch", "prepare_timeout_s"),
    "optim": SCHEDULE_FIELDS,
    "monitor": ("every",),
}  # fmt: skip
KEPT_PROGRAMS = 8  # jitted steps kept per process (each holds its compiled executables)
_PROGRAMS: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()


def program_key(cfg: TrainConfig) -> str:
    """The fields of `cfg` that a run's train and eval programs are built from, as one string:
    two configs with equal keys (and equal state and mesh) compile the same programs."""
    fields = dataclasses.asdict(cfg)
    for section, names in _NOT_IN_THE_PROGRAM.items():
        for name in names:
            (fields[section] if section else fields).pop(name, None)
    return json.dumps(fields, sort_keys=True, default=repr)


def _signature(tree: Any) -> tuple:
    """A tree's structure and each leaf's shape, dtype and sharding (arrays or abstract)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves)


def _kept(key: Hashable, build: Callable[[], Any], mesh: jax.sharding.Mesh) -> Any:
    """The jitted function kept under `key`, or `build()` kept from now on (least recently
    used dropped past `KEPT_PROGRAMS`). Not for compile-only devices (`ln_jax.xla.deviceless`):
    a report is compiled once, and its process may be comparing variants of the code."""
    if sharding.is_compile_only(mesh.devices):
        return build()
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    _PROGRAMS[key] = built = build()
    while len(_PROGRAMS) > KEPT_PROGRAMS:
        _PROGRAMS.popitem(last=False)
    return built


def forget_programs() -> None:
    """Drops the jitted steps kept in this process: the next run builds and compiles its own
    (a test that counts compiles; a process that must free their executables)."""
    _PROGRAMS.clear()


def _pieces_key(kind: str, cfg: TrainConfig, task: Task, mesh, pieces: TrainState) -> tuple:
    return (kind, task.name, program_key(cfg), mesh, platforms.current(), pieces.graphdef,
            _signature(pieces.state), _signature(pieces.rest))  # fmt: skip


def jit_train_step(
    cfg: TrainConfig,
    task: Task,
    mesh: jax.sharding.Mesh,
    pieces: TrainState,
    measure: bool = False,
) -> Callable:
    """The train step jitted with the shardings of `pieces`, as a function of (state, rest,
    batch): state, rest and batch shardings in; the same state shardings and replicated
    metrics out; the state donated. `measure`: the variant with per-layer measurements.
    The state goes in and comes out as a `flat.FlatState` (a state dict passed in is packed).

    This run's `run_values` are bound as the program's last input (`BoundStep`), so the
    compiled program does not depend on them (on compile-only devices, `ln_jax.xla.deviceless`,
    their shapes: such a step is lowered and compiled, never called).
    """
    layout = flat.Layout.of(pieces.state)
    replicated = _replicated(mesh)

    def build() -> Any:
        shardings = layout.pack(jax.tree.map(lambda x: x.sharding, pieces.state))
        rest_sh = jax.tree.map(lambda x: x.sharding, pieces.rest)
        return jax.jit(
            flat.stepping(make_train_step(cfg, task, pieces.graphdef, measure), layout),
            in_shardings=(shardings, rest_sh, sharding.batch_sharding(mesh), replicated),
            out_shardings=(shardings, replicated),
            donate_argnums=(0,),
        )

    jitted = _kept((*_pieces_key("train", cfg, task, mesh, pieces), measure), build, mesh)
    put = sharding.abstract if sharding.is_compile_only(mesh.devices) else jax.device_put
    values = {k: put(v, replicated) for k, v in run_values(cfg).items()}
    return BoundStep(jitted, values, layout)


class BoundStep:
    """A jitted function of (state, *args, bound) used as a function of (state, *args):
    called, lowered, and its lowered form compiled and called, with `bound` passed last each
    time. With a `layout` the function takes the state as a `flat.FlatState` of it: a state
    dict passed in is packed into one (once; the step returns FlatStates)."""

    def __init__(self, fn: Any, bound: Any, layout: flat.Layout | None = None):
        self.fn, self.bound, self.layout = fn, bound, layout

    def _state(self, state: Any) -> Any:
        if self.layout is None or isinstance(state, flat.FlatState):
            return state
        return self.layout.pack(state)

    def __call__(self, state, *args):
        return self.fn(self._state(state), *args, self.bound)

    def lower(self, state, *args, platforms: tuple[str, ...] | None = None) -> BoundStep:
        """Lowered for this backend, or for `platforms` (JAX's names: "cuda", "tpu"; no device
        of theirs needed)."""
        args = (self._state(state), *args, self.bound)
        if platforms is None:
            return BoundStep(self.fn.lower(*args), self.bound, self.layout)
        traced = self.fn.trace(*args)
        lowered = traced.lower(lowering_platforms=tuple(platforms))
        return BoundStep(lowered, self.bound, self.layout)

    def compile(self, *args, **kwargs) -> BoundStep:
        return BoundStep(self.fn.compile(*args, **kwargs), self.bound, self.layout)

    def __getattr__(self, name: str) -> Any:  # as_text, cost_analysis, memory_analysis, ...
        return getattr(self.fn, name)


def jit_steps(cfg: TrainConfig, task: Task, mesh: jax.sharding.Mesh, pieces: TrainState):
    """(train, evaluate), jitted with the shardings of `pieces` (concrete or abstract).

    train: `jit_train_step` (without measurements). evaluate: parameters, rest and batch in;
    replicated sums.
    """
    return jit_train_step(cfg, task, mesh, pieces), jit_eval_step(task, mesh, pieces)


def jit_eval_step(task: Task, mesh: jax.sharding.Mesh, pieces: TrainState) -> Callable:
    """The evaluation step jitted with the shardings of `pieces`: parameters, rest and batch
    in; replicated sums out."""

    def build() -> Any:
        params_sh = jax.tree.map(lambda x: x.sharding, pieces.state["params"])
        rest_sh = jax.tree.map(lambda x: x.sharding, pieces.rest)
        return jax.jit(
            make_eval_step(task, pieces.graphdef),
            in_shardings=(params_sh, rest_sh, sharding.batch_sharding(mesh)),
            out_shardings=_replicated(mesh),
        )

    return _kept(_pieces_key("eval", task.cfg, task, mesh, pieces), build, mesh)


def in_mesh(fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
    """`fn` called with the mesh and rules in context (traced activation constraints need it)."""

    def call(*args):
        with sharding.use_mesh(mesh):
            return fn(*args)

    return call
