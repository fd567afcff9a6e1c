"""The one trainer of every task: `train_and_evaluate(cfg, workdir)`.

It is what `train.py` runs, what fine-tuning runs for each grid cell x seed
(`ln_jax.experiments.finetune`) and what the tests call. It knows a model family only
through `cfg.task` (`ln_jax.task`). It reads top to bottom as a run goes:

  the workdir's lock and the compilation cache          (here)
  the workdir's run identity (a resume with another config is an error)   (`run_identity`)
  set-up: mesh, task, data, state, jitted steps, made once  (`ln_jax.train.setup`)
  step 0's parameters, the checkpoint's restore while the train programs compile
  the loop: steps, evaluations, checkpoints, metrics      (`ln_jax.train.loop`)

WORKDIR holds `config.json`, `metrics.jsonl` (splits "train", "eval", "monitor",
"warning/<rule>", "note/<rule>" and "result": docs/usage.md, "metrics.jsonl", lists each
record's fields), `checkpoints/` and `tensorboard/`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ln_jax import paths
from ln_jax.config.run import TrainConfig
from ln_jax.runtime import compile_cache
from ln_jax.task import make_task
from ln_jax.train import run_identity
from ln_jax.train.checkpoint import Checkpointer, CheckpointError
from ln_jax.train.loop import Loop
from ln_jax.train.metrics import (
    METRICS_FILE,
    MetricsWriter,
    Progress,
    Scope,
    evaluated_at,
    read_records,
)
from ln_jax.train.preemption import Preemption
from ln_jax.train.setup import Run, finish_setup, initial_parameters, setup
from ln_jax.train.workdir_lock import run_lock
from ln_jax.validate import NonFiniteError

__all__ = [
    "CheckpointError",
    "NonFiniteError",
    "RunMismatchError",
    "WorkdirError",
    "train_and_evaluate",
]
RunMismatchError = run_identity.RunMismatchError
WorkdirError = run_identity.WorkdirError
log = logging.getLogger(__name__)


def train_and_evaluate(
    cfg: TrainConfig,
    workdir: str,
    hooks: Sequence[Callable[[int, Run], None]] = (),
    accept_changes: bool = False,
    preemption: Preemption | None = None,
    scope: Scope | None = None,
    *,
    workdir_prepared: bool = False,
) -> dict[str, Any]:
    """Trains `cfg` in `workdir`, resuming from its latest checkpoint if there is one.

    A workdir holds one run: resuming it with another config raises RunMismatchError, unless
    every change is safe to continue with and `accept_changes` (`ln_jax.train.run_identity`).
    `hooks` are called as `hook(step, run)` after every step, before it is logged
    (measurements, custom logging). `preemption`: a `Preemption` a caller running several
    runs has entered (fine-tuning's grid), so that a signal between runs is not lost; None =
    this run's own. `scope`: where the run stands in a larger job (fine-tuning's grid), for the
    progress line. `workdir_prepared`: the caller has prepared `workdir` already
    (`run_identity.prepare_workdir`; train.py does, to log into it from the start).

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
    if not workdir_prepared:
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
        initial_parameters(run, workdir, fresh=latest is None)
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
        tokens = run.task.tokens_per_step()
        progress = Progress(cfg.total_steps, tokens, start, enabled=is_main, scope=scope)
        result = {"step": start, "train": {}, "eval": {}, "result": {}, "preempted": None}
        result["already_done"] = False
        own = Preemption(shared=jax.process_count() > 1) if preemption is None else None
        with own or contextlib.nullcontext(preemption) as stops:
            loop = Loop(run, ckpt, writer, progress, config_dict, stops, hooks, workdir)
            return loop.steps(start, result)
    finally:
        if run is not None:
            if run.pending is not None:
                run.pending.abandon()  # set-up failed: no further compile starts
            run.train_iter.close()  # stops the data workers
        ckpt.close()
        if writer is not None:
            writer.close()


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
    task = make_task(cfg)  # this run's one Task: nothing is set up
    evals = [r for r in records if r["split"] == "eval"]
    outcome = task.run_result(evals) if not done and evals else None
    if outcome is not None and jax.process_index() == 0:
        writer = MetricsWriter(workdir, tensorboard=False, resume_step=step)
        try:
            done = writer.write(step, "result", outcome)
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
