"""The one trainer of every task: set-up and the loop (run identity, checkpoints, metrics,
SIGTERM/Ctrl-C, NaN).

`train_and_evaluate(cfg, workdir)` is what `train.py` runs, what fine-tuning runs for each
grid cell x seed (`ln_jax.models.bert.finetune.run`) and what the tests call. It knows a model
family only through `cfg.task` (`ln_jax.task`). The state and the jitted steps come from
`ln_jax.train.steps` (the same ones the ahead-of-time check, the benchmarks and the analyses
use); step 0's parameters from the task's `initialize` (a warm start, fresh runs only) or else
a placement's set-up (Admin's profiling, `ln_jax.nn.placement_setup`).

WORKDIR holds `config.json`, `metrics.jsonl` (splits "train", "eval", "monitor",
"warning/<rule>", "note/<rule>" and "result": docs/usage.md, "metrics.jsonl", lists each
record's fields), `checkpoints/` and `tensorboard/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from ln_jax import console, paths, sharding
from ln_jax.config.run import TrainConfig
from ln_jax.nn.placement_setup import setup_placements
from ln_jax.runtime import compile_cache, platforms
from ln_jax.task import Task, make_task
from ln_jax.train import accumulation, monitor, optim, precompile, run_identity, steps
from ln_jax.train.checkpoint import Checkpointer, CheckpointError
from ln_jax.train.early_warning import EarlyWarning
from ln_jax.train.metrics import (
    METRICS_FILE,
    MetricsWriter,
    Progress,
    Scope,
    eval_records,
    evaluated_at,
    read_records,
)
from ln_jax.train.preemption import Preemption
from ln_jax.train.workdir_lock import run_lock
from ln_jax.validate import ConfigError, Fix, NonFiniteError

__all__ = [
    "CheckpointError",
    "NonFiniteError",
    "RunMismatchError",
    "WorkdirError",
    "setup",
    "train_and_evaluate",
]
RunMismatchError = run_identity.RunMismatchError
WorkdirError = run_identity.WorkdirError
log = logging.getLogger(__name__)
note_log = console.file_only_logger(__name__)  # early-warning notes: train.log only
setup_log = console.file_only_logger(f"{__name__}.setup")  # set-up phases: train.log only
Batch = dict[str, jax.Array]
State = dict[str, Any]


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
    task: Task
    monitor_step: Callable | None = None  # the train step with measurements (None = off)
    # the programs compiled at set-up ("train", "measured"), with their batch's shapes
    ready: dict[str, tuple] = dataclasses.field(default_factory=dict)
    pending: Any = None  # set-up not finished (`setup(..., wait=False)`): `finish_setup`


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


class _PhaseClock:
    """Seconds of each set-up phase, logged to train.log as one line (where a slow start
    went: on one H200, 110 s passed before the first step of BERT-base)."""

    def __init__(self):
        self.last = self.start = time.perf_counter()
        self.laps: list[tuple[str, float]] = []

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


def setup(cfg: TrainConfig, compile_ahead: bool = True, wait: bool = True) -> Run:
    """Builds the mesh, the data pipelines, the sharded state and the jitted steps of `cfg`;
    with `grad_accum_steps=0` the accumulation is chosen here (`ln_jax.train.accumulation`).

    With `compile_ahead` (what a run does) the train programs compile in a background thread
    while the state is built (`ln_jax.train.precompile`); without, they compile at their first
    calls (the probe of "auto" accumulation excepted). With `wait=False` set-up returns while
    they compile, `Run.train_step` and `Run.monitor_step` unset and `Run.cfg`'s accumulation
    perhaps still "auto": the trainer restores a checkpoint meanwhile (its errors come at once),
    then calls `finish_setup`."""
    check_device(cfg)
    clock = _PhaseClock()
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    clock.lap("devices")  # a GPU's or TPU's runtime starts here
    task = make_task(cfg)
    train_iter, eval_batches = task.pipelines(mesh)  # its errors come before any compile
    clock.lap("data pipelines")
    ahead = precompile.Ahead(cfg, mesh) if compile_ahead else None
    try:
        pieces = steps.init_state(cfg, mesh)
        clock.lap("state")
        programs = {}
        if ahead is None:
            cfg = _auto_accumulation(cfg, mesh, pieces, clock)
            programs = precompile.programs_of(cfg, mesh, pieces)
        elif pieces.graphdef != ahead.abstract.graphdef:
            raise AssertionError("the abstract and the initialised model differ in structure")
    except BaseException:
        if ahead is not None:
            ahead.abandon()
        raise
    run = Run(
        cfg,
        mesh,
        pieces.graphdef,
        pieces.rest,
        pieces.state,
        None,
        steps.in_mesh(steps.jit_eval_step(cfg, mesh, pieces), mesh),
        optim.make_schedule(cfg.optim),
        train_iter,
        eval_batches,
        task,
        pending=(ahead, clock),
    )
    if ahead is None:
        return _with_programs(run, cfg, programs)
    return finish_setup(run) if wait else run


def finish_setup(run: Run) -> Run:
    """`run` (from `setup(..., wait=False)`) once its train programs are compiled; the set-up
    line written to train.log. A run whose set-up is finished is returned as it is."""
    if run.pending is None:
        return run
    ahead, clock = run.pending
    if ahead is None:
        clock.report()
        return dataclasses.replace(run, pending=None)
    try:
        cfg, programs = ahead.finish()
    except BaseException:
        ahead.abandon()
        raise
    took = " then ".join(f"{k} {v:.1f} s" for k, v in ahead.seconds.items())
    clock.lap("waiting for the compiles", f"{took}, in a background thread")
    clock.report()
    ready = {name: precompile.batch_shapes(ahead.batch) for name in programs}
    return _with_programs(dataclasses.replace(run, ready=ready, pending=None), cfg, programs)


def _with_programs(run: Run, cfg: TrainConfig, programs: dict) -> Run:
    """`run` with its config (accumulation chosen) and its train programs."""
    if run.pending is not None:  # compiled lazily: nothing to wait for
        run.pending[1].report()
    measured = programs.get(precompile.MEASURED)
    return dataclasses.replace(
        run,
        cfg=cfg,
        train_step=steps.in_mesh(programs[precompile.TRAIN], run.mesh),
        monitor_step=measured and steps.in_mesh(measured, run.mesh),
        pending=None,
    )


def _auto_accumulation(cfg: TrainConfig, mesh, pieces, clock: _PhaseClock) -> TrainConfig:
    """`cfg` with "auto" accumulation chosen by compiling the step (`accumulation.fit`;
    else `cfg`)."""
    if cfg.grad_accum_steps:
        return cfg
    args = (pieces.state, pieces.rest, steps.abstract_batch(cfg, mesh))

    def compile_at(k: int) -> tuple[int, int]:
        step = steps.jit_train_step(dataclasses.replace(cfg, grad_accum_steps=k), mesh, pieces)
        with sharding.use_mesh(mesh):
            return accumulation.step_memory(step.lower(*args).compile())

    divisor, budget = sharding.batch_divisor(mesh), accumulation.budget_bytes()
    accum = accumulation.fit(cfg.data.global_batch_size, divisor, budget, compile_at)
    clock.lap("grad_accum_steps=auto (compiles the step)")
    return dataclasses.replace(cfg, grad_accum_steps=accum)


# --------------------------------------------------------------------------- loop


def evaluate(run: Run) -> dict[str, float]:
    """The task's metrics over the validation batches (`Task.eval_metrics`). The batches'
    programs are all launched before their outputs are fetched (a GPU or TPU does not wait
    for the host between batches), except where the mesh runs in lockstep
    (`sharding.lockstep`: several CPU devices)."""
    params, wait = run.state["params"], sharding.lockstep(run.mesh)
    outputs = []
    for batch in run.eval_batches:
        out = run.eval_step(params, run.rest, batch)
        outputs.append(jax.device_get(out) if wait else out)
    return run.task.eval_metrics(jax.device_get(outputs))


def _check_finite(run: Run, ckpt: Checkpointer) -> None:
    """Raises NonFiniteError naming the first non-finite step and the checkpoint kept."""
    if not bool(run.state["halted"]):
        return
    bad = int(run.state["nonfinite_step"])
    ckpt.wait()
    kept = ckpt.latest_step()
    if kept is None:
        where = (
            f"no checkpoint was saved before it (checkpoint_every={run.cfg.checkpoint_every}), "
            "so none is kept"
        )
    else:
        where = f"the checkpoint of step {kept} is kept ({ckpt.directory / str(kept)})"
    raise NonFiniteError(
        f"non-finite loss or gradient at step {bad}: that update was dropped and training "
        f"stopped; {where}. Lower optim.peak_lr, add warm-up (a new --workdir), or set "
        "--config.nan_policy=skip to drop such updates and go on.",
        fix=Fix(set={"--config.nan_policy": "skip"}),
    )


def _save(run: Run, ckpt: Checkpointer, step: int, config_dict: dict) -> None:
    if bool(run.state["halted"]):
        return  # never overwrite the last good checkpoint with a halted state
    ckpt.save(step, run.state, run.train_iter.get_state(), config_dict)


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def _peek(iterator: Any) -> Callable[[], Batch]:
    """A function returning the iterator's next batch without consuming it."""

    def peek() -> Batch:
        position = iterator.get_state()
        batch = next(iterator)
        iterator.set_state(position)
        return batch

    return peek


def _initial_parameters(run: Run, workdir: str, fresh: bool) -> None:
    """Step 0's parameters, before a restore (which then overwrites them): a task with
    `initialize` sets them from elsewhere on a fresh run (a warm start; on a resumed run it is
    not asked, the restore sets them); otherwise, or if it declines, the placements' set-up
    hooks run on the fresh ones (`ln_jax.nn.placement_setup`) with step 0's dropout key."""
    initialize = getattr(run.task, "initialize", None)
    if initialize is not None and not fresh:
        return
    model = nnx.merge(run.graphdef, run.state["params"], run.rest)
    with sharding.use_mesh(run.mesh):
        done = bool(initialize(model)) if initialize is not None else False
        if not done:
            key = steps.dropout_key(run.cfg, 0)
            done = bool(setup_placements(model, _peek(run.train_iter), key, workdir))
    if done:
        _, run.state["params"], _ = nnx.split(model, nnx.Param, ...)


def train_and_evaluate(
    cfg: TrainConfig,
    workdir: str,
    hooks: Sequence[Callable[[int, Run], None]] = (),
    accept_changes: bool = False,
    preemption: Preemption | None = None,
    scope: Scope | None = None,
) -> dict[str, Any]:
    """Trains `cfg` in `workdir`, resuming from its latest checkpoint if there is one.

    A workdir holds one run: resuming it with another config raises RunMismatchError, unless
    every change is safe to continue with and `accept_changes` (`ln_jax.train.run_identity`).
    `hooks` are called as `hook(step, run)` after every step, before it is logged
    (measurements, custom logging). `preemption`: a `Preemption` a caller running several
    runs has entered (fine-tuning's grid), so that a signal between runs is not lost; None =
    this run's own. `scope`: where the run stands in a larger job (fine-tuning's grid), for the
    progress line.

    Returns:
      {"step": last step, "train": last train metrics, "eval": last eval metrics,
       "result": the "result" record (tasks with `run_result`, once the last step is done),
       "preempted": the signal's name ("SIGTERM", "SIGINT") if one stopped the run, else None,
       "already_done": True if the workdir already held the last step}.

    Raises:
      ln_jax.validate.UserError subclasses (RunMismatchError, WorkdirError, CheckpointError,
      ConfigError, DatasetNotPreparedError, RunLockedError: another live process trains this
      workdir) for what the user must fix; NonFiniteError.
    """
    run_identity.prepare_workdir(workdir)
    lock = run_lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()
    with lock, compile_cache.use(cfg.compilation_cache):
        return _train_and_evaluate(cfg, workdir, hooks, accept_changes, preemption, scope)


def _train_and_evaluate(cfg, workdir, hooks, accept_changes, preemption, scope) -> dict:
    """`train_and_evaluate` while this process holds the workdir's lock."""
    is_main = jax.process_index() == 0
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), cfg.checkpoint)
    writer = run = None
    try:
        cfg, latest = _check_identity(cfg, workdir, ckpt, accept_changes)
        config_dict = run_identity.as_dict(cfg)
        finished = latest is not None and latest >= cfg.total_steps
        if finished and (latest > cfg.total_steps or evaluated_at(workdir, latest)):
            return _already_done(cfg, workdir, latest)  # else: its final evaluation was cut
        # The train programs compile in the background while step 0's parameters are set
        # and the checkpoint is read (a corrupt one is an error at once, not after them).
        run = setup(cfg, wait=False)
        _initial_parameters(run, workdir, fresh=latest is None)
        restored = ckpt.restore(run.state)
        if restored is not None:
            start, run.state, data_state = restored
            run.train_iter.set_state(data_state)
            log.info("resumed from step %d in %s", start, workdir)
        run = finish_setup(run)
        start = int(run.state["step"])
        if is_main:  # the run starts (or goes on) here: from now on the workdir is this run's
            run_identity.record_config(workdir, config_dict)
        writer = MetricsWriter(workdir, enabled=is_main, resume_step=start)
        tokens = tokens_per_step(run.task)
        progress = Progress(cfg.total_steps, tokens, start, enabled=is_main, scope=scope)
        result = {"step": start, "train": {}, "eval": {}, "result": {}, "preempted": None}
        result["already_done"] = False
        own = Preemption(shared=jax.process_count() > 1) if preemption is None else None
        with own or contextlib.nullcontext(preemption) as stops:
            loop = _Loop(run, ckpt, writer, progress, config_dict, stops, hooks, workdir)
            return loop.steps(start, result)
    finally:
        if run is not None:
            if run.pending is not None and run.pending[0] is not None:
                run.pending[0].abandon()  # set-up failed: no further compile starts
            run.train_iter.close()  # stops the data workers
        ckpt.close()
        if writer is not None:
            writer.close()


def eval_line(result: dict[str, Any]) -> str | None:
    """What a command prints about a run's last evaluation (None if it had none), naming the
    step evaluated: after a stop (SIGTERM, Ctrl-C) that is the last eval before the saved
    step, not the saved step itself (an eval of the stop's step would be a record an
    uninterrupted run does not write)."""
    record = result.get("eval") or {}
    if not record:
        return None
    evaluated, last = record.get("step", result["step"]), result["step"]
    scalars = ", ".join(
        f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float) and k != "time"
    )
    if evaluated == last:
        return f"final eval at step {evaluated}: {scalars}"
    return f"last eval at step {evaluated} (training stopped at step {last}): {scalars}"


def tokens_per_step(task: Task) -> int:
    """The tokens one step trains on, for the progress line's rate: the task's
    `tokens_per_step()` (translation: the token budget), else batch x sequence length."""
    own = getattr(task, "tokens_per_step", None)
    if own is not None:
        return int(own())
    return task.cfg.data.global_batch_size * task.cfg.data.max_seq_length


def _check_identity(cfg, workdir, ckpt, accept_changes) -> tuple[TrainConfig, int | None]:
    """Checks `cfg` against the run the workdir holds (`ln_jax.train.run_identity`), with the
    layers' layout that run recorded where "auto" chose it (`keep_recorded_layout`); returns
    (that config, the latest checkpointed step or None)."""
    latest = ckpt.latest_step()
    old = run_identity.read_config(workdir)
    if old is None and latest is not None:  # a workdir from before config.json
        try:
            old = ckpt.restore_config(latest)
        except Exception:  # an unreadable checkpoint: the restore will say so
            old = None
    cfg = run_identity.keep_recorded_layout(cfg, old)
    config_dict = run_identity.as_dict(cfg)
    for note in run_identity.check_resume(old, config_dict, latest, workdir, accept_changes):
        log.info("continuing %s with a changed config: %s", workdir, note)
    return cfg, latest


def _already_done(cfg: TrainConfig, workdir: str, step: int) -> dict[str, Any]:
    """The result of a run whose workdir already holds its last step (nothing is trained; a
    "result" record that a cut-off run did not write yet is written now)."""
    path = paths.as_path(workdir) / METRICS_FILE  # a local folder or a URL
    records = read_records(path) if path.exists() else []
    last = lambda split: next((r for r in reversed(records) if r["split"] == split), {})
    done = last("result")
    task = make_task(cfg)
    if not done and hasattr(task, "run_result") and jax.process_index() == 0:
        writer = MetricsWriter(workdir, tensorboard=False, resume_step=step)
        try:
            done = _write_result(task, writer, step, [r for r in records if r["split"] == "eval"])
        finally:
            writer.close()
    return {
        "step": step,
        "train": last("train"),
        "eval": last("eval"),
        "result": done,
        "preempted": None,
        "already_done": True,
    }


def _write_result(task: Task, writer: MetricsWriter, step: int, evals: list) -> dict[str, Any]:
    """Writes the task's result of the run (`Task.run_result` of its eval records)."""
    return writer.write(step, "result", task.run_result(evals)) if evals else {}


def _measured(run: Run, step: int) -> bool:
    """Whether `step` runs the measured train step: every `monitor_every` steps, the first
    and the last."""
    every = run.cfg.monitor_every
    return run.monitor_step is not None and (step in (1, run.cfg.total_steps) or step % every == 0)


def _watch(run, ckpt, writer, watcher, step, metrics, measures) -> None:
    """Writes the step's measurements (split "monitor") and applies the early-warning rules
    (`ln_jax.train.early_warning`): a warning is logged as a WARNING (on the terminal and in
    train.log), written (split "warning/<rule>") and may keep the checkpoint before it; a note
    (a state healthy runs pass through too) is logged at INFO to train.log only
    (`console.file_only_logger`) and written (split "note/<rule>")."""
    named = monitor.named(measures) if measures is not None else {}
    if named:
        writer.write(step, "monitor", named)
    alerts = watcher.check(step, {**{k: float(v) for k, v in metrics.items()}, **named})
    # The checkpoint before an episode of warnings (not one from its middle) is kept.
    keep = run.cfg.monitor.keep_checkpoint and watcher.episode_start
    kept = ckpt.keep_before(step) if keep else None
    for alert in alerts:
        message = alert.message
        if alert.level == "note":
            note_log.info("early-warning note: %s", message)
        else:
            if kept is not None:
                message += f"; checkpoint {kept} is kept ({ckpt.directory / str(kept)})"
            log.warning("early warning: %s", message)
        writer.write(step, alert.split, {**alert.record(), "message": message})


class _Loop:
    """The steps of a run from `start` to `total_steps` (or a stop)."""

    def __init__(self, run, ckpt, writer, progress, config_dict, preemption, hooks, workdir):
        self.run, self.ckpt, self.writer, self.progress = run, ckpt, writer, progress
        self.config_dict, self.preemption, self.hooks = config_dict, preemption, hooks
        self.watcher = EarlyWarning(run.cfg.monitor) if run.monitor_step is not None else None
        self.evals = eval_records(workdir)  # those a resumed run kept (the later ones pruned)
        self.workdir = workdir
        self.compiled = set(run.ready.items())  # (program, batch shapes) compiled so far
        self.skipped_shown = 0  # nan_policy="skip": the dropped updates already reported
        self.lockstep = sharding.lockstep(run.mesh)  # wait for each step (`sharding.lockstep`)

    def _note_compilation(self, measured: bool, batch: Batch) -> None:
        """A train program's first step at a batch shape in this process compiles it (unless
        set-up did: `Run.ready`): not a steady step."""
        program = (precompile.MEASURED if measured else precompile.TRAIN,
                   precompile.batch_shapes(batch))  # fmt: skip
        if program not in self.compiled:
            self.compiled.add(program)
            self.progress.disturb("compilation")

    def steps(self, start: int, result: dict[str, Any]) -> dict[str, Any]:
        run, cfg, last = self.run, self.run.cfg, self.run.cfg.total_steps
        if start and _due(start, cfg.eval_every, last) and not evaluated_at(self.workdir, start):
            self._evaluate(start, result)  # a stop saved the step, then its evaluation was cut
        for step in range(start + 1, last + 1):
            measured = _measured(run, step)
            batch = next(run.train_iter)
            self._note_compilation(measured, batch)
            train_step = run.monitor_step if measured else run.train_step
            run.state, metrics = train_step(run.state, run.rest, batch)
            if self.lockstep:  # several CPU devices: running ahead can deadlock XLA:CPU
                jax.block_until_ready(metrics)
            for hook in self.hooks:
                hook(step, run)
            stop = self.preemption.stop_after(step)
            evaluated = _due(step, cfg.eval_every, last)
            # Records follow the cadences (and steps 1-2), so a resumed run logs what an
            # uninterrupted one does; steps 1-2 after a start and a stop are shown too: step
            # 1's time (compilation included), then the first rate.
            record = _due(step, cfg.log_every, last) or evaluated or step <= 2 or measured
            if record or step - start <= 2 or stop:
                result["train"] = self._log(step, metrics, record) or result["train"]
            if stop:  # saved first: a preemption's grace period may end in the evaluation
                _save(run, self.ckpt, step, self.config_dict)
                self.ckpt.wait()
            if evaluated:
                self._evaluate(step, result)
            if _due(step, cfg.checkpoint_every, last) and not stop:
                _save(run, self.ckpt, step, self.config_dict)
            result["step"] = step
            if stop:  # the command says so (train.py, finetune.py): the log file only here
                note_log.info("%s: saved step %d, exiting", stop, step)
                result["preempted"] = stop
                return result
        if hasattr(run.task, "run_result"):
            result["result"] = _write_result(run.task, self.writer, last, self.evals)
        return result

    def _log(self, step: int, metrics: dict, record: bool) -> dict[str, Any] | None:
        """Shows the step's progress line, writes its "train" record (if `record`), checks
        that it is finite and that no background save failed, and applies the early-warning
        rules on measured steps."""
        run = self.run
        metrics = jax.device_get(metrics)
        measures = metrics.pop("monitor", None)
        steps_s, tokens_s = self.progress.rates(step)
        values = {**metrics, "steps_per_s": steps_s, "tokens_per_s": tokens_s}
        written = self.writer.write(step, "train", values) if record else None
        self.progress.show(step, steps_s, tokens_s, float(metrics["loss"]))
        _check_finite(run, self.ckpt)
        self._report_skipped(step, int(metrics.get("skipped_updates", 0)))
        self.ckpt.check()  # a background save that failed stops the run now
        if self.watcher is not None:
            _watch(run, self.ckpt, self.writer, self.watcher, step, metrics, measures)
        return written

    def _report_skipped(self, step: int, skipped: int) -> None:
        """A warning when updates were dropped (nan_policy="skip") since the last report."""
        if skipped > self.skipped_shown:
            log.warning(
                "%d update(s) dropped for a non-finite loss or gradient by step %d "
                "(nan_policy=skip; %d since the last report)",
                skipped, step, skipped - self.skipped_shown,
            )  # fmt: skip
            self.skipped_shown = skipped

    def _evaluate(self, step: int, result: dict[str, Any]) -> None:
        """Writes the step's "eval" record (with its epoch when the config counts epochs) into
        `result["eval"]` and metrics.jsonl."""
        _check_finite(self.run, self.ckpt)
        per_epoch = self.run.cfg.steps_per_epoch
        epoch = {"epoch": step // per_epoch} if per_epoch else {}
        describe = getattr(self.run.task, "eval_description", None)
        what = describe() if describe is not None else None
        if what:  # a long evaluation (decoding) says what it does, and then how long it took
            self.progress.note(f"step {step}: {what} ...")
        started = time.perf_counter()
        metrics = evaluate(self.run)
        if what:
            self.progress.note(f"step {step}: evaluated in {time.perf_counter() - started:.1f} s")
        written = self.writer.write(step, "eval", {**epoch, **metrics})
        self.evals.append(written)
        self.progress.evaluated(step, written)
        self.progress.disturb("evaluation")  # its time falls in the next window
        result["eval"] = written
