"""Fine-tuning: every grid cell x seed, each a run of the one trainer.

  finetune(cfg, workdir) -> summary   (what `finetune.py` runs and the tests call)

Each cell x seed is an ordinary run of `ln_jax.train.trainer.train_and_evaluate` with the task
`GlueClassification` (`ln_jax.models.bert.finetune.task`): the same loop, train step,
checkpoints, NaN stop (`trainer.NonFiniteError`) and SIGTERM/Ctrl-C handling as pretraining.

Layout: `WORKDIR/config.json` (the fine-tuning config and the pretrained step it started from),
`WORKDIR/summary.json` (per cell: every seed's best and last dev scores, their median, spread
and mean; the best cell by median), and per run `WORKDIR/<cell>/seed<k>/` (a trainer workdir)
with its `config.json` (the run's TrainConfig), `metrics.jsonl` (split "train" every
`log_every` steps, at steps 1-2 and at every epoch's end; "eval" after every epoch with `epoch`,
the task's metrics and `score`; one "result" record with the best and last epoch's scores),
`checkpoints/` (orbax, after every epoch) and `tensorboard/`. Batch `s` of a run is a function
of (seed, s) only (each epoch a keyed permutation of the training set, the last partial batch
dropped; the iterator's state is checkpointed) and dropout keys are the train step's, so a run
resumed from any checkpoint logs what an uninterrupted one logs. SIGTERM and Ctrl-C
(`ln_jax.train.preemption`) save the step in flight and raise Preempted; the rerun resumes from
that step. Finished runs (a "result" record) are read back, not retrained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from ln_jax import paths, sharding
from ln_jax.config.run import TrainConfig
from ln_jax.models.bert.finetune import task as task_lib
from ln_jax.models.bert.finetune.config import Cell, FinetuneConfig, train_config
from ln_jax.models.bert.finetune.pretrained import Pretrained, check_sequence_length
from ln_jax.models.bert.finetune.tasks import TASKS, GlueTask
from ln_jax.results import write_json
from ln_jax.train import run_identity, trainer
from ln_jax.train.metrics import METRICS_FILE, Scope, read_records
from ln_jax.train.preemption import Preemption
from ln_jax.validate import ConfigError, UserError

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"
# Fields a workdir's fine-tuning may change: the grid and seeds grow, cadences and the mesh move.
_FREE = tuple(
    f"finetune.{name}"
    for name in ("seeds", "learning_rates", "batch_sizes", "epochs", "log_every", "mesh.")
    + ("eval_batch_size", "checkpoint.")
)
_RECORD_KEYS = ("step", "split", "time")


class FinetuneMismatchError(UserError):
    """The workdir holds a fine-tuning run of another config."""


class Preempted(Exception):  # noqa: N818 (a stop, not an error: the command exits 0)
    """Fine-tuning stopped on SIGTERM or Ctrl-C after saving a checkpoint; rerunning the same
    command resumes from `step` of the run in `directory`."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(f"{signal_name}: saved step {step} in {directory}")
        self.signal_name, self.step, self.directory = signal_name, step, directory


@dataclasses.dataclass
class Context:
    """What every run of one `finetune` call shares.

    Attributes:
      cfg: the fine-tuning config.
      task: the GLUE task (dataset, labels, metrics).
      mesh: the device mesh of every run.
      pretrained: the source encoder (its arrays too: kept for the runs' warm starts).
      num_train: training examples (steps per epoch = num_train // batch size).
      identity: what WORKDIR/config.json records.
    """

    cfg: FinetuneConfig
    task: GlueTask
    mesh: Any
    pretrained: Pretrained
    num_train: int
    identity: dict


# --------------------------------------------------------------------------- set-up


def _identity(cfg: FinetuneConfig, pretrained: Pretrained) -> dict:
    """What the workdir records: the config and the pretrained checkpoint it started from."""
    return {
        "finetune": run_identity.as_dict(cfg),
        "init": {"source": pretrained.source, "step": pretrained.step},
    }


def _check_workdir(workdir: str, identity: dict) -> None:
    """A workdir holds one fine-tuning config (the grid and seeds may grow)."""
    old = run_identity.read_config(workdir)
    if old is None:
        run_identity.record_config(workdir, identity)
        return
    changes = [c for c in run_identity.differences(old, identity) if not c.field.startswith(_FREE)]
    if changes:
        listed = "; ".join(f"{c.field}: {c.old!r} -> {c.new!r}" for c in changes[:6])
        raise FinetuneMismatchError(
            f"workdir {workdir} holds a fine-tuning run of another config ({listed}); give a new "
            "--workdir, or the config it was run with."
        )
    run_identity.record_config(workdir, identity)


def context(cfg: FinetuneConfig) -> Context:
    """Mesh, pretrained encoder and the task's data (both kept for the runs, `task.release`)."""
    glue_task = TASKS[cfg.task]
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    pretrained = task_lib.pretrained_lib.cached_pretrained(cfg.init_from, cfg.init_step, mesh)
    check_sequence_length(pretrained.model, cfg.max_seq_length)
    where = (cfg.data.data_dir, cfg.data.download, cfg.max_seq_length)
    limits = (cfg.data.max_train_examples, cfg.data.max_eval_examples)
    train, _ = task_lib.cached_arrays(glue_task, *where, *limits, pretrained)
    num_train = len(train["label"])
    return Context(cfg, glue_task, mesh, pretrained, num_train, _identity(cfg, pretrained))


def setup(cfg: FinetuneConfig, workdir: str) -> Context:
    """`context`, then checks and records the workdir's config."""
    ctx = context(cfg)
    run_identity.prepare_workdir(workdir)
    _check_workdir(workdir, ctx.identity)
    return ctx


def run_config_of(cfg, pretrained, cell, seed, steps_per_epoch, mesh) -> TrainConfig:
    """The TrainConfig of one cell x seed (`config.train_config`)."""
    divisor = sharding.batch_divisor(mesh)
    eval_batch = -(-cfg.eval_batch_size // divisor) * divisor
    init = (pretrained.source, pretrained.step)
    return train_config(cfg, cell, seed, pretrained.model, init, steps_per_epoch, eval_batch)


def run_config(ctx: Context, cell: Cell, seed: int) -> TrainConfig:
    """The TrainConfig of one cell x seed of `ctx`'s grid.

    Raises:
      ConfigError: if the batch size exceeds the training examples.
    """
    per_epoch = ctx.num_train // cell.batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"batch size {cell.batch_size} exceeds the {ctx.num_train} training examples; lower "
            "batch_sizes."
        )
    return run_config_of(ctx.cfg, ctx.pretrained, cell, seed, per_epoch, ctx.mesh)


# --------------------------------------------------------------------------- one run


def run_one(
    ctx: Context,
    cell: Cell,
    seed: int,
    workdir: str,
    hooks: Sequence[Callable] = (),
    preemption: Preemption | None = None,
    scope: Scope | None = None,
) -> dict[str, float]:
    """Trains (or resumes, or just reads) one cell x seed in WORKDIR/<cell>/seed<k> with the
    one trainer; returns its result record. `hooks(step, run)` run after every step; `scope`:
    the run's place in the grid, for its progress line.

    Raises:
      Preempted: after SIGTERM / Ctrl-C, once the step in flight is checkpointed.
    """
    directory = _run_dir(workdir, cell, seed)
    found = _finished_result(directory)
    if found is not None:
        return found
    # The grid's config was checked against WORKDIR/config.json: changes it allows (cadences,
    # mesh, checkpointing) continue a run.
    cfg = run_config(ctx, cell, seed)
    out = trainer.train_and_evaluate(
        cfg, directory, hooks, accept_changes=True, preemption=preemption, scope=scope
    )
    if out["preempted"]:
        raise Preempted(out["preempted"], out["step"], directory)
    return {k: v for k, v in out["result"].items() if k not in _RECORD_KEYS}


def _finished_result(directory: str) -> dict | None:
    path = paths.as_path(directory) / METRICS_FILE
    if not path.exists():
        return None
    done = [r for r in read_records(path) if r["split"] == "result"]
    if not done:
        return None
    return {k: v for k, v in done[-1].items() if k not in _RECORD_KEYS}


# --------------------------------------------------------------------------- the grid


def spread(values: Sequence[float]) -> dict[str, float]:
    """median, min, max, mean and (population) std of the seeds' values."""
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
    }


def summarize(ctx: Context, results: dict[str, dict[int, dict]]) -> dict[str, Any]:
    """summary.json's content: per cell the seeds' results, and the spread of their best
    and last scores; the best cell by median best score."""
    cells = []
    for name, by_seed in results.items():
        best = [r["best_score"] for r in by_seed.values()]
        last = [r["last_score"] for r in by_seed.values()]
        entry = {"cell": name, "seeds": {str(s): r for s, r in by_seed.items()}}
        cells.append({**entry, "best_score": spread(best), "last_score": spread(last)})
    top = max(cells, key=lambda c: c["best_score"]["median"])
    return {
        "task": ctx.task.name,
        "metrics": list(ctx.task.metrics),
        "init_from": ctx.pretrained.source,
        "init_step": ctx.pretrained.step,
        "cells": cells,
        "best_cell": top["cell"],
    }


def finetune(
    cfg: FinetuneConfig, workdir: str, hooks: Sequence[Callable] = (), ctx: Context | None = None
) -> dict[str, Any]:
    """Fine-tunes every cell x seed of `cfg` in `workdir` (finished runs are read back, a cut
    one resumes); writes and returns the summary. `hooks(step, run)` run after every step
    (`trainer.train_and_evaluate`'s); `ctx` reuses a `setup`.

    Raises:
      UserError subclasses (ConfigError, CheckpointError, DatasetNotPreparedError,
      FinetuneMismatchError, RunMismatchError) for what the user must fix;
      trainer.NonFiniteError; Preempted (SIGTERM or Ctrl-C: the run in flight saved its step;
      rerun to resume).
    """
    ctx = ctx or setup(cfg, workdir)
    try:
        with Preemption(shared=jax.process_count() > 1) as preemption:
            results = _run_grid(ctx, cfg, workdir, hooks, preemption)
    finally:
        task_lib.release()
    summary = summarize(ctx, results)
    write_json(os.path.join(workdir, SUMMARY_FILE), summary)
    return summary


def _run_grid(ctx, cfg, workdir, hooks, preemption) -> dict[str, dict[int, dict]]:
    """{cell: {seed: result}} of every cell x seed, trained or read back in grid order."""
    results: dict[str, dict[int, dict]] = {}
    runs = [(cell, seed) for cell in cfg.cells for seed in cfg.seeds]
    todo = [r for r in runs if _finished_result(_run_dir(workdir, *r)) is None]
    clock = GridClock(len(todo))
    for cell, seed in runs:
        label = f"{cell.name} seed {seed}"
        if (cell, seed) in todo:
            index = todo.index((cell, seed)) + 1
            log.info("run %d/%d: %s (%s)", index, len(todo), label, _run_dir(workdir, cell, seed))
            scope = Scope(f"{label} (run {index}/{len(todo)})", clock.after)
            with clock.timing():
                result = run_one(ctx, cell, seed, workdir, hooks, preemption, scope)
        else:
            result = run_one(ctx, cell, seed, workdir, hooks, preemption)
        results.setdefault(cell.name, {})[seed] = result
        best, last = result["best_score"], result["last_score"]
        log.info("%s: best %.4f, last %.4f", label, best, last)
    return results


def _run_dir(workdir: str, cell: Cell, seed: int) -> str:
    return os.path.join(workdir, cell.name, f"seed{seed}")


class GridClock:
    """Times the grid's runs for the progress line's ETA of all of them (`Scope.after`)."""

    def __init__(self, runs: int):
        self.runs = runs
        self.durations: list[float] = []  # of the runs finished in this process
        self.started: float | None = None

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Times one run (its set-up and compilation included)."""
        self.started = time.perf_counter()
        yield
        self.durations.append(time.perf_counter() - self.started)
        self.started = None

    def after(self, run_eta: float) -> float | None:
        """Seconds of the runs after the current one, given its ETA: the median duration of
        the finished runs, or before one has finished, the current run's (elapsed + ETA),
        times the runs left; None when no run follows."""
        left = self.runs - len(self.durations) - 1
        if left <= 0 or self.started is None:
            return None
        per_run = (
            statistics.median(self.durations)
            if self.durations
            else time.perf_counter() - self.started + run_eta
        )
        return left * per_run


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as text: one line per cell, median [min, max] of the seeds' scores."""
    metrics = "/".join(summary["metrics"])
    head = f"{summary['task']} ({metrics}; score = their mean) from {summary['init_from']}" + (
        f" step {summary['init_step']}" if summary["init_step"] is not None else ""
    )
    lines = [head]
    for cell in summary["cells"]:
        b, last = cell["best_score"], cell["last_score"]
        lines.append(
            f"  {cell['cell']}: {len(cell['seeds'])} seeds, best epoch median {b['median']:.4f} "
            f"[{b['min']:.4f}, {b['max']:.4f}], last epoch median {last['median']:.4f} "
            f"[{last['min']:.4f}, {last['max']:.4f}]"
        )
    lines.append(f"  best cell (median of best epochs): {summary['best_cell']}")
    return "\n".join(lines)
