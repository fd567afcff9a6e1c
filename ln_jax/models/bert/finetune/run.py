"""Fine-tuning's set-up and summary, around its grid (`ln_jax.experiments.finetune`, a study
on the one runner).

  setup(cfg, workdir) -> Context       the mesh, the pretrained encoder and the task's data
                                       (loaded once for every run), WORKDIR/config.json checked
  run_config(ctx, cell, seed)          the TrainConfig of one cell x seed
  summarize(ctx, results)              summary.json's content; format_summary: its text

Each cell x seed is an ordinary run of `ln_jax.train.trainer.train_and_evaluate` with the task
`GlueClassification` (`ln_jax.models.bert.finetune.task`): the same loop, train step,
checkpoints, NaN stop (`trainer.NonFiniteError`) and SIGTERM/Ctrl-C handling as pretraining.

Layout: `WORKDIR/config.json` (the fine-tuning config and the pretrained step it started from),
`WORKDIR/summary.json` (per cell: every seed's best and last dev scores, their median, spread
and mean; the best cell by median), and per run `WORKDIR/<cell>/seed<k>/` (a trainer workdir)
with its `config.json` (the run's TrainConfig), `metrics.jsonl` (split "train" every
`log_every` steps, at steps 1-2 and at every epoch's end; "eval" after every epoch with `epoch`,
the task's metrics and `score`; one "result" record with the best and last epoch's scores),
`result.json` (the runner's result of the run, `task_result` its "result" record),
`checkpoints/` (orbax, after every epoch) and `tensorboard/`. Batch `s` of a run is a function
of (seed, s) only (each epoch a keyed permutation of the training set, the last partial batch
dropped; the iterator's state is checkpointed) and dropout keys are the train step's, so a run
resumed from any checkpoint logs what an uninterrupted one logs.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.models.bert.finetune import task as task_lib
from ln_jax.models.bert.finetune.config import Cell, FinetuneConfig, moved_optim, train_config
from ln_jax.models.bert.finetune.pretrained import Pretrained, check_sequence_length
from ln_jax.models.bert.finetune.tasks import GLUE_TASKS, GlueTask
from ln_jax.train import run_identity
from ln_jax.validate import ConfigError, UserError

SUMMARY_FILE = "summary.json"
# Fields a workdir's fine-tuning may change: the grid and seeds grow, cadences and the mesh move.
_FREE = tuple(
    f"finetune.{name}"
    for name in ("seeds", "learning_rates", "batch_sizes", "epochs", "log_every", "mesh.")
    + ("eval_batch_size", "checkpoint.")
)
_OWN = ("finetune.", "init.")  # the fields of WORKDIR/config.json (`_identity`)


class FinetuneMismatchError(UserError):
    """The workdir holds a fine-tuning run of another config."""


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
    """A workdir holds one fine-tuning config (the grid and seeds may grow). One recorded before
    the optimizer's fields moved into `optim` (2026-12-05) is read as one recorded since."""
    old = run_identity.read_config(workdir)
    if old is None:
        run_identity.record_config(workdir, identity)
        return
    if "finetune" in old:
        old = {**old, "finetune": moved_optim(old["finetune"])}
    # Only the record's own fields: `differences` also fills in a TrainConfig's added fields.
    found = run_identity.differences(old, identity)
    changes = [c for c in found if c.field.startswith(_OWN) and not c.field.startswith(_FREE)]
    if changes:
        listed = "; ".join(f"{c.field}: {c.old!r} -> {c.new!r}" for c in changes[:6])
        raise FinetuneMismatchError(
            f"workdir {workdir} holds a fine-tuning run of another config ({listed}); give a new "
            "--workdir, or the config it was run with."
        )
    run_identity.record_config(workdir, identity)


def context(cfg: FinetuneConfig) -> Context:
    """Mesh, pretrained encoder and the task's data (both kept for the runs, `task.release`)."""
    glue_task = GLUE_TASKS[cfg.task]
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
    return train_config(
        cfg, cell, seed, pretrained.model, init, steps_per_epoch, eval_batch,
        type_vocab_size=pretrained.type_vocab_size,
    )  # fmt: skip


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
