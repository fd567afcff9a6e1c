"""A run's set-up: the mesh, the task, the data pipelines, the sharded state and the jitted
steps, each made once per run, and step 0's parameters.

  run = setup(cfg)                     # everything, its train programs compiled
  run = setup(cfg, wait=False)         # returns while they compile (`Run.pending`) ...
  ...                                  # ... step 0's parameters, the checkpoint's restore
  run = finish_setup(run)              # waits for them

The task (`ln_jax.task.make_task`) is made here, once, and passed to every builder of
`ln_jax.train.steps`; the train programs compile in a background thread while the state is
built (`ln_jax.train.precompile`). The loop (`ln_jax.train.loop`) takes the `Run` it returns.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from ln_jax import console, sharding
from ln_jax.config.run import TrainConfig
from ln_jax.nn.placement_setup import setup_placements
from ln_jax.runtime import platforms
from ln_jax.task import Task, make_task, warm_starts
from ln_jax.train import accumulation, optim, precompile, steps
from ln_jax.validate import ConfigError

__all__ = ["PendingSetup", "Run", "check_device", "finish_setup", "initial_parameters", "setup"]
setup_log = console.file_only_logger(__name__)  # set-up phases: train.log only
Batch = dict[str, jax.Array]
State = dict[str, Any]


class _PhaseClock:
    """Seconds of each set-up phase, logged to train.log as one line (where a slow start
    went: on one H200, 110 s passed before the first step of BERT-base)."""

    def __init__(self):
        self.last = self.start = time.perf_counter()
        self.laps: list[tuple[str, float, str]] = []

    def lap(self, name: str, note: str = "") -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self.last, note))
        self.last = now

    def report(self) -> None:
        parts = ", ".join(
            f"{name} {seconds:.1f} s" + (f" ({note})" if note else "")
            for name, seconds, note in self.laps
        )
        setup_log.info("set up in %.1f s: %s", self.last - self.start, parts)


@dataclasses.dataclass
class PendingSetup:
    """What `setup(..., wait=False)` leaves for `finish_setup`: the train programs compiling
    in the background and the clock of the set-up's phases."""

    ahead: precompile.Ahead
    clock: _PhaseClock

    def finish(self) -> tuple[TrainConfig, dict[str, steps.BoundStep]]:
        """(cfg with its accumulation chosen, the compiled programs); the set-up line logged."""
        try:
            cfg, programs = self.ahead.finish()
        except BaseException:
            self.abandon()
            raise
        took = " then ".join(f"{k} {v:.1f} s" for k, v in self.ahead.seconds.items())
        self.clock.lap("waiting for the compiles", f"{took}, in a background thread")
        self.clock.report()
        return cfg, programs

    def abandon(self) -> None:
        """Set-up failed: no further compile starts."""
        self.ahead.abandon()


@dataclasses.dataclass
class Run:
    """The pieces of a run, built once by `setup`."""

    cfg: TrainConfig
    mesh: jax.sharding.Mesh
    task: Task
    graphdef: Any
    rest: Any
    state: State
    eval_step: Callable
    schedule: Callable
    train_iter: Any
    eval_batches: Any
    train_step: Callable | None = None  # None until the train programs are compiled
    monitor_step: Callable | None = None  # the train step with measurements (None = off)
    # the programs compiled at set-up ("train", "measured"), with their batch's shapes
    ready: dict[str, tuple] = dataclasses.field(default_factory=dict)
    pending: PendingSetup | None = None  # set-up not finished: `finish_setup`


def check_device(cfg: TrainConfig) -> None:
    """Settings that cannot run on this backend (or the `ln_jax.runtime.platforms.lowering_for`
    target) are errors before anything is compiled."""
    backend = platforms.current()
    if cfg.model.attention_impl == "cudnn" and backend != "gpu":
        raise ConfigError(
            f"model.attention_impl='cudnn' needs an NVIDIA GPU, but JAX runs on {backend}; "
            "use --config.model.attention_impl=xla here."
        )
    if cfg.model.attention_impl == "pallas" and backend == "tpu":
        raise ConfigError(
            "model.attention_impl='pallas' is a Triton kernel for NVIDIA GPUs (Pallas's "
            "interpreter on CPU); a TPU needs --config.model.attention_impl=xla."
        )


def setup(cfg: TrainConfig, compile_ahead: bool = True, wait: bool = True) -> Run:
    """Builds the mesh, the task, the data pipelines, the sharded state and the jitted steps
    of `cfg`, each once; with `grad_accum_steps=0` the accumulation is chosen here
    (`ln_jax.train.accumulation`).

    With `compile_ahead` (what a run does) the train programs compile in a background thread
    while the state is built (`ln_jax.train.precompile`); without, they compile at their first
    calls (the probe of "auto" accumulation excepted). With `wait=False` set-up returns while
    they compile: `Run.pending` holds them, `Run.train_step` and `Run.monitor_step` are unset
    and `Run.cfg`'s accumulation is perhaps still "auto"; the trainer restores a checkpoint
    meanwhile (its errors come at once), then calls `finish_setup`."""
    check_device(cfg)
    clock = _PhaseClock()
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    clock.lap("devices")  # a GPU's or TPU's runtime starts here
    task = make_task(cfg)  # the run's one Task
    train_iter, eval_batches = task.pipelines(mesh)  # its errors come before any compile
    clock.lap("data pipelines")
    ahead = precompile.Ahead(cfg, task, mesh) if compile_ahead else None
    try:
        pieces = steps.init_state(task, mesh)
        clock.lap("state")
        if ahead is None:
            cfg = _auto_accumulation(cfg, task, mesh, pieces, clock)
        elif pieces.graphdef != ahead.abstract.graphdef:
            raise AssertionError("the abstract and the initialised model differ in structure")
    except BaseException:
        if ahead is not None:
            ahead.abandon()
        raise
    run = Run(
        cfg=cfg,
        mesh=mesh,
        task=task,
        graphdef=pieces.graphdef,
        rest=pieces.rest,
        state=pieces.state,
        eval_step=steps.in_mesh(steps.jit_eval_step(task, mesh, pieces), mesh),
        schedule=optim.make_schedule(cfg.optim),
        train_iter=train_iter,
        eval_batches=eval_batches,
    )
    if ahead is None:  # compiled at their first calls: nothing to wait for
        clock.report()
        return _with_programs(run, cfg, precompile.programs_of(cfg, task, mesh, pieces))
    run.pending = PendingSetup(ahead, clock)
    return finish_setup(run) if wait else run


def finish_setup(run: Run) -> Run:
    """`run` (from `setup(..., wait=False)`) once its train programs are compiled; the set-up
    line written to train.log. A run whose set-up is finished is returned as it is."""
    if run.pending is None:
        return run
    cfg, programs = run.pending.finish()
    ready = {name: precompile.batch_shapes(run.pending.ahead.batch) for name in programs}
    return _with_programs(dataclasses.replace(run, ready=ready), cfg, programs)


def _with_programs(run: Run, cfg: TrainConfig, programs: dict) -> Run:
    """`run`, set up: its config (accumulation chosen) and its train programs."""
    measured = programs.get(precompile.MEASURED)
    return dataclasses.replace(
        run,
        cfg=cfg,
        train_step=steps.in_mesh(programs[precompile.TRAIN], run.mesh),
        monitor_step=measured and steps.in_mesh(measured, run.mesh),
        pending=None,
    )


def _auto_accumulation(
    cfg: TrainConfig, task: Task, mesh, pieces: steps.TrainState, clock: _PhaseClock
) -> TrainConfig:
    """`cfg` with "auto" accumulation chosen by compiling the step (`accumulation.fit`;
    else `cfg`)."""
    if cfg.grad_accum_steps:
        return cfg
    args = (pieces.state, pieces.rest, steps.abstract_batch(task, mesh))

    def compile_at(k: int) -> tuple[int, int]:
        at_k = dataclasses.replace(cfg, grad_accum_steps=k)
        step = steps.jit_train_step(at_k, task, mesh, pieces)
        with sharding.use_mesh(mesh):
            return accumulation.step_memory(step.lower(*args).compile())

    divisor, budget = sharding.batch_divisor(mesh), accumulation.budget_bytes()
    accum = accumulation.fit(cfg.data.global_batch_size, divisor, budget, compile_at)
    clock.lap("grad_accum_steps=auto (compiles the step)")
    return dataclasses.replace(cfg, grad_accum_steps=accum)


def initial_parameters(run: Run, workdir: str, fresh: bool) -> None:
    """Step 0's parameters, before a restore (which then overwrites them): a task with a warm
    start (`Task.initialize`) sets them from elsewhere on a fresh run (on a resumed run neither
    it nor the placements' set-up is asked: the restore sets them); otherwise, or if it
    declines, the placements' set-up hooks run on the fresh ones
    (`ln_jax.nn.placement_setup`) with step 0's dropout key."""
    if not fresh and warm_starts(run.task):
        return
    model = nnx.merge(run.graphdef, run.state["params"], run.rest)
    with sharding.use_mesh(run.mesh):
        done = bool(run.task.initialize(model))  # the base class declines
        if not done:
            key = steps.dropout_key(run.cfg, 0)
            done = bool(setup_placements(model, _peek(run.train_iter), key, workdir))
    if done:
        _, run.state["params"], _ = nnx.split(model, nnx.Param, ...)


def _peek(iterator: Any) -> Callable[[], Batch]:
    """A function returning the iterator's next batch without consuming it."""

    def peek() -> Batch:
        position = iterator.get_state()
        batch = next(iterator)
        iterator.set_state(position)
        return batch

    return peek
