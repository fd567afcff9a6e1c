"""A run's loop: its steps from the start (or the step resumed) to `total_steps` or a stop,
with the evaluations, checkpoints, metrics records, early warnings and the run's result.

`Loop(run, ...).steps(start, result)` runs the `ln_jax.train.setup.Run` that set-up built;
`ln_jax.train.trainer.train_and_evaluate` opens what it writes to (the checkpointer, the
metrics writer, the progress line) and calls it. `eval_line` is what a command prints about
the run's last evaluation.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax

from ln_jax import console, sharding
from ln_jax.task import Task
from ln_jax.train import monitor, precompile
from ln_jax.train.checkpoint import Checkpointer
from ln_jax.train.early_warning import EarlyWarning
from ln_jax.train.metrics import MetricsWriter, eval_records, evaluated_at
from ln_jax.train.setup import Run
from ln_jax.validate import Fix, NonFiniteError

__all__ = ["Loop", "eval_line", "evaluate", "write_result"]
log = logging.getLogger(__name__)
note_log = console.file_only_logger(__name__)  # early-warning notes: train.log only
Batch = dict[str, jax.Array]


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


def write_result(task: Task, writer: MetricsWriter, step: int, evals: list) -> dict[str, Any]:
    """Writes the task's result of the run (`Task.run_result` of its eval records, if it has
    one) as the "result" record; returns it ({} if none)."""
    outcome = task.run_result(evals) if evals else None
    return {} if outcome is None else writer.write(step, "result", outcome)


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


class Loop:
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
        result["result"] = write_result(run.task, self.writer, last, self.evals)
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
        what = self.run.task.eval_description()
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
