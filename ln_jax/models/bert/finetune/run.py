"""Fine-tuning runs: every grid cell x seed, each an ordinary resumable run.

  finetune(cfg, workdir) -> summary   (what `finetune.py` runs and the tests call)

Layout: `WORKDIR/config.json` (the fine-tuning config and the pretrained step it started from),
`WORKDIR/summary.json` (per cell: every seed's best and last dev scores, their median, spread
and mean; the best cell by median), and per run `WORKDIR/<cell>/seed<k>/` with `metrics.jsonl`
(split "train" every `log_every` steps; "eval" after every epoch with the task's metrics and
`score`; one "result" record with the best and last epoch's scores) and `checkpoints/` (orbax,
after every epoch). Batch `s` of a run is a function of (seed, s) only (each epoch a keyed
permutation of the training set, the last partial batch dropped) and dropout keys are the
train step's, so a run resumed from its last epoch's checkpoint logs what an uninterrupted
one logs. SIGTERM and Ctrl-C (`ln_jax.train.preemption`) save the step in flight and raise
Preempted; the rerun resumes from that step.

The update is `ln_jax.train.steps`' one train step: `steps.model_state` builds the classifier's
state (AdamW's moments in the parameters' shardings), and `steps.jit_train_step(..., forward=...)`
jits that same step with the classification loss in place of pretraining's: NaN handling,
clipping, the schedule and the dropout keys are shared, not rewritten.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ln_jax import paths, sharding
from ln_jax.data import glue
from ln_jax.models.bert.finetune import model as model_lib
from ln_jax.models.bert.finetune.config import Cell, FinetuneConfig, train_config
from ln_jax.models.bert.finetune.pretrained import (
    Pretrained,
    check_sequence_length,
    load_pretrained,
)
from ln_jax.models.bert.finetune.tasks import TASKS, Task, predictions, task_scores
from ln_jax.results import write_json
from ln_jax.train import run_identity, steps
from ln_jax.train.checkpoint import Checkpointer
from ln_jax.train.metrics import METRICS_FILE, MetricsWriter, read_records
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


class FinetuneMismatchError(UserError):
    """The workdir holds a fine-tuning run of another config."""


class NonFiniteFinetuneError(RuntimeError):
    """A fine-tuning run produced a NaN/Inf loss or gradient (nan_policy="stop")."""


@dataclasses.dataclass
class Context:
    """What every run of one `finetune` call shares."""

    cfg: FinetuneConfig
    task: Task
    mesh: Any
    pretrained: Pretrained
    train: dict  # encode_examples of the train split: [N, T] arrays and labels [N]
    dev: dict
    config_dict: dict


# --------------------------------------------------------------------------- set-up


def load_task_data(cfg: FinetuneConfig, task: Task, tokenizer: Any) -> tuple[dict, dict]:
    """(train, dev) BERT inputs of `task`, read through TFDS (`ln_jax.data.glue`)."""
    builder = glue.open_task_dataset(task.dataset, cfg.data.data_dir, cfg.data.download)
    read = lambda split, limit: glue.read_split(builder, split, task.text_features, limit)
    train = read(task.train_split, cfg.data.max_train_examples)
    dev = read(task.eval_split, cfg.data.max_eval_examples)
    encode = lambda ex: glue.encode_examples(ex, tokenizer, cfg.max_seq_length)
    return encode(train), encode(dev)


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


def setup(cfg: FinetuneConfig, workdir: str) -> Context:
    """Mesh, pretrained encoder, task data; checks and records the workdir's config."""
    task = TASKS[cfg.task]
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    pretrained = load_pretrained(cfg, mesh)
    check_sequence_length(pretrained.model, cfg.max_seq_length)
    train, dev = load_task_data(cfg, task, pretrained.tokenizer)
    identity = _identity(cfg, pretrained)
    run_identity.prepare_workdir(workdir)
    _check_workdir(workdir, identity)
    return Context(cfg, task, mesh, pretrained, train, dev, identity)


def build_classifier(ctx: Context, seed: int) -> model_lib.BertClassifier:
    """A classifier whose encoder (and pooler, if the source has one) are the pretrained
    arrays, in the classifier's shardings; the classifier layer is initialised from `seed`."""
    cfg, pre = ctx.cfg, ctx.pretrained
    hidden = pre.model.hidden_dropout if cfg.hidden_dropout is None else cfg.hidden_dropout
    attention = cfg.attention_dropout
    model_cfg = pre.model.replace(
        hidden_dropout=hidden,
        attention_dropout=pre.model.attention_dropout if attention is None else attention,
    )
    head_dropout = hidden if cfg.classifier_dropout is None else cfg.classifier_dropout
    model = model_lib.create_classifier(
        model_cfg, ctx.task.num_labels, head_dropout, seed, ctx.mesh
    )
    state = nnx.state(model, nnx.Param)
    values = nnx.to_pure_dict(state)
    values["bert"] = _placed_like(pre.encoder, values["bert"])
    if pre.pooler is not None:
        values["pooler"] = _placed_like(pre.pooler, values["pooler"])
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)
    return model


def _placed_like(source: dict, target: dict) -> dict:
    """`source`'s arrays in `target`'s shardings; a shape that differs is a ConfigError."""

    def place(path, new, old):
        if tuple(new.shape) != tuple(old.shape):
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            raise ConfigError(
                f"pretrained parameter {name} has shape {tuple(new.shape)}, the encoder of its "
                f"config {tuple(old.shape)}: the checkpoint does not fit its config."
            )
        return jax.device_put(new, old.sharding, may_alias=False)  # the step donates it

    return jax.tree_util.tree_map_with_path(place, source, target)


# --------------------------------------------------------------------------- one run


def _device_batch(arrays: dict, rows: np.ndarray, mesh) -> dict:
    """The rows of every array as one global batch split over data x fsdp."""
    return jax.device_put({k: v[rows] for k, v in arrays.items()}, sharding.batch_sharding(mesh))


def batch_rows(num_examples: int, batch: int, seed: int, step: int) -> np.ndarray:
    """Rows of update `step` (0-based): epoch e = step // steps_per_epoch is a permutation of
    the examples keyed by (seed, e); the last partial batch of an epoch is dropped."""
    per_epoch = num_examples // batch
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return order[index * batch : (index + 1) * batch]


def _eval_batch_size(cfg: FinetuneConfig, mesh) -> int:
    divisor = sharding.batch_divisor(mesh)
    return -(-cfg.eval_batch_size // divisor) * divisor


def evaluate(ctx: Context, predict: Callable, params: Any, rest: Any) -> dict[str, float]:
    """The task's metrics on the whole dev split (the last batch padded, padding ignored)."""
    n, size = len(ctx.dev["label"]), _eval_batch_size(ctx.cfg, ctx.mesh)
    outputs = []
    for start in range(0, n, size):
        rows = np.arange(start, start + size) % n  # the padding rows repeat real ones
        logits = predict(params, rest, _device_batch(ctx.dev, rows, ctx.mesh))
        outputs.append(np.asarray(jax.device_get(logits))[: min(size, n - start)])
    return task_scores(ctx.task, predictions(ctx.task, np.concatenate(outputs)), ctx.dev["label"])


@dataclasses.dataclass
class Run:
    """One cell x seed: its TrainConfig, state and jitted steps."""

    cfg: Any  # TrainConfig
    directory: str
    pieces: steps.TrainState
    train_step: Callable
    predict: Callable
    steps_per_epoch: int


def _make_run(ctx: Context, cell: Cell, seed: int, workdir: str) -> Run:
    per_epoch = len(ctx.train["label"]) // cell.batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"batch size {cell.batch_size} exceeds the {len(ctx.train['label'])} training "
            "examples; lower batch_sizes."
        )
    tcfg = train_config(ctx.cfg, cell, seed, ctx.pretrained.model, per_epoch)
    steps.abstract_batch(tcfg, ctx.mesh)  # a batch that does not divide: ConfigError
    pieces = steps.model_state(build_classifier(ctx, seed), tcfg, ctx.mesh)
    forward = model_lib.classification_forward(ctx.task.regression)
    train_step = steps.jit_train_step(tcfg, ctx.mesh, pieces, forward=forward)
    param_sh = jax.tree.map(lambda x: x.sharding, pieces.state["params"])
    rest_sh = jax.tree.map(lambda x: x.sharding, pieces.rest)
    predict = jax.jit(
        model_lib.predict_fn(pieces.graphdef),
        in_shardings=(param_sh, rest_sh, sharding.batch_sharding(ctx.mesh)),
        out_shardings=NamedSharding(ctx.mesh, PartitionSpec()),
    )
    directory = os.path.join(workdir, cell.name, f"seed{seed}")
    return Run(
        tcfg,
        directory,
        pieces,
        steps.in_mesh(train_step, ctx.mesh),
        steps.in_mesh(predict, ctx.mesh),
        per_epoch,
    )


def result_of(records: Sequence[dict]) -> dict[str, float]:
    """The best epoch's (by `score`) and the last epoch's dev scores of a run's eval records:
    best_score, best_epoch, best_<metric>, last_score, last_<metric>."""
    evals = [r for r in records if r["split"] == "eval"]
    best = max(evals, key=lambda r: r["score"])  # the earliest of equal scores
    skip = ("step", "split", "time", "epoch")
    out = {f"best_{k}": v for k, v in best.items() if k not in skip}
    out["best_epoch"] = best["epoch"]
    out.update({f"last_{k}": v for k, v in evals[-1].items() if k not in skip})
    return out


class Preempted(Exception):  # noqa: N818 (a stop, not an error: the command exits 0)
    """Fine-tuning stopped on SIGTERM or Ctrl-C after saving a checkpoint; rerunning the same
    command resumes from `step` of the run in `directory`."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(f"{signal_name}: saved step {step} in {directory}")
        self.signal_name, self.step, self.directory = signal_name, step, directory


def _train(
    ctx: Context, run: Run, hooks: Sequence[Callable], preemption: Preemption | None = None
) -> None:
    """Trains `run` from its latest checkpoint to its last step.

    Raises:
      Preempted: after SIGTERM / Ctrl-C, once the step in flight is checkpointed (batches are
        a function of (seed, step), so a run resumed mid-epoch continues exactly).
    """
    ckpt = Checkpointer(os.path.join(run.directory, "checkpoints"), ctx.cfg.checkpoint)
    state, rest, total = run.pieces.state, run.pieces.rest, run.cfg.total_steps
    writer = None
    try:
        restored = ckpt.restore(state)
        if restored is not None:
            state = restored[1]
        start = int(state["step"])
        writer = MetricsWriter(run.directory, resume_step=start)
        for step in range(start + 1, total + 1):
            rows = batch_rows(
                len(ctx.train["label"]), run.cfg.data.global_batch_size, run.cfg.seed, step - 1
            )
            state, metrics = run.train_step(state, rest, _device_batch(ctx.train, rows, ctx.mesh))
            _after_step(ctx, run, state, metrics, step, writer, ckpt)
            for hook in hooks:
                hook(step, run)
            stop = preemption.stop_after(step) if preemption else None
            if stop:
                if step % run.steps_per_epoch:  # an epoch's end is saved already
                    ckpt.save(step, state, {"step": step}, ctx.config_dict)
                raise Preempted(stop, step, run.directory)
    finally:
        ckpt.close()
        if writer is not None:
            writer.close()


def _after_step(ctx, run, state, metrics, step, writer, ckpt) -> None:
    """Logging, the NaN stop, and at an epoch's end: evaluation and a checkpoint."""
    epoch_end = step % run.steps_per_epoch == 0
    if step % ctx.cfg.log_every == 0 or epoch_end:
        metrics = jax.device_get(metrics)
        writer.write(step, "train", metrics)
        if bool(state["halted"]):
            raise NonFiniteFinetuneError(
                f"{run.directory}: non-finite loss or gradient at step "
                f"{int(state['nonfinite_step'])}; lower the learning rate."
            )
    if epoch_end:
        scores = evaluate(ctx, run.predict, state["params"], run.pieces.rest)
        writer.write(step, "eval", {"epoch": step // run.steps_per_epoch, **scores})
        ckpt.save(step, state, {"step": step}, ctx.config_dict)


def run_one(
    ctx: Context,
    cell: Cell,
    seed: int,
    workdir: str,
    hooks=(),
    preemption: Preemption | None = None,
) -> dict[str, float]:
    """Trains (or resumes, or just reads) one cell x seed; returns its result record (raises
    Preempted when `preemption` saw SIGTERM / Ctrl-C)."""
    directory = os.path.join(workdir, cell.name, f"seed{seed}")
    found = _finished_result(directory)
    if found is not None:
        return found
    run = _make_run(ctx, cell, seed, workdir)
    _train(ctx, run, hooks, preemption)
    path = paths.as_path(directory) / METRICS_FILE
    result = result_of(read_records(path))
    writer = MetricsWriter(directory, tensorboard=False, resume_step=run.cfg.total_steps)
    try:
        writer.write(run.cfg.total_steps, "result", result)
    finally:
        writer.close()
    return result


def _finished_result(directory: str) -> dict | None:
    path = paths.as_path(directory) / METRICS_FILE
    if not path.exists():
        return None
    done = [r for r in read_records(path) if r["split"] == "result"]
    if not done:
        return None
    return {k: v for k, v in done[-1].items() if k not in ("step", "split", "time")}


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
    one resumes); writes and returns the summary. `hooks(step, run)` run after every step.

    Raises:
      UserError subclasses (ConfigError, CheckpointError, DatasetNotPreparedError,
      FinetuneMismatchError) for what the user must fix; NonFiniteFinetuneError; Preempted
      (SIGTERM or Ctrl-C: the run in flight saved its step; rerun to resume).
    """
    ctx = ctx or setup(cfg, workdir)
    with Preemption(shared=jax.process_count() > 1) as preemption:
        results = _run_grid(ctx, cfg, workdir, hooks, preemption)
    summary = summarize(ctx, results)
    write_json(os.path.join(workdir, SUMMARY_FILE), summary)
    return summary


def _run_grid(ctx, cfg, workdir, hooks, preemption) -> dict[str, dict[int, dict]]:
    """{cell: {seed: result}} of every cell x seed, trained or read back in grid order."""
    results: dict[str, dict[int, dict]] = {}
    for cell in cfg.cells:
        for seed in cfg.seeds:
            result = run_one(ctx, cell, seed, workdir, hooks, preemption)
            results.setdefault(cell.name, {})[seed] = result
            log.info(
                "%s seed %d: best %.4f, last %.4f",
                cell.name,
                seed,
                result["best_score"],
                result["last_score"],
            )
    return results


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
