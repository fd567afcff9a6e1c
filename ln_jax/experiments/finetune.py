"""Fine-tuning's lr x batch x epochs x seeds grid: a study on the one runner.

  finetune(cfg, workdir) -> summary   (what `finetune.py` and the downstream study run)

Every cell x seed of a `FinetuneConfig` is a `runner.RunSpec`: the TrainConfig of the grid's
first run (`finetune.run.run_config`) is the base, and a run's overrides are the fields a cell
and a seed set (`CELL_FIELDS`). `runner.run_grid` trains them in this process
(`runner.Session`: the pretrained encoder and the task's data are loaded once,
`finetune.run.context`; one `Preemption` covers the grid), each in its trainer workdir
WORKDIR/<cell>/seed<k>/ (the spec's `folder`), with the runner's resume rule: a run with a
`result.json` is read back, a run cut off resumes from its checkpoint. A run's result.json
holds, besides the runner's curves, the task's result (`task_result`: the best and last
epochs' dev scores). WORKDIR/summary.json (`finetune.run.summarize`: per cell the seeds'
scores, their median, spread and mean; the best cell by median) is made from those results.

A workdir finished before runs stored a result.json has its "result" records: its runs are
read back through the trainer (nothing is trained) and get their result.json then.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from ln_jax.experiments import runner
from ln_jax.models.bert.finetune import run as ft_run
from ln_jax.models.bert.finetune import task as task_lib
from ln_jax.models.bert.finetune.config import FinetuneConfig
from ln_jax.results import write_json
from ln_jax.train import run_identity
from ln_jax.train.preemption import Preemption

Preempted = runner.Preempted  # SIGTERM / Ctrl-C: the run in flight saved its step (exit 0)

# The TrainConfig fields that a cell (learning rate, batch size, epochs) and a seed set; every
# other field is the grid's (`finetune.config.train_config`).
CELL_FIELDS = (
    "name",
    "seed",
    "total_steps",
    "eval_every",
    "checkpoint_every",
    "steps_per_epoch",
    "optim.peak_lr",
    "optim.warmup_steps",
    "optim.total_steps",
    "data.global_batch_size",
    "data.seed",
)


def _field(values: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


def grid(ctx: ft_run.Context) -> tuple[dict[str, Any], list[runner.RunSpec]]:
    """(base, specs): the runner's base config (the first run's TrainConfig as a mapping) and
    one spec per cell x seed, named and placed `<cell>/seed<k>`, tagged with its cell and seed.

    Raises:
      ConfigError: if a batch size exceeds the training examples.
    """
    cfg, base, specs = ctx.cfg, None, []
    for cell in cfg.cells:
        for seed in cfg.seeds:
            values = run_identity.as_dict(ft_run.run_config(ctx, cell, seed))
            base = base or values
            name = f"{cell.name}/seed{seed}"
            overrides = {f: _field(values, f) for f in CELL_FIELDS}
            tags = {"cell": cell.name, "seed": seed}
            specs.append(runner.RunSpec(name, cell.name, overrides, tags, folder=name))
    return base, specs


def finetune(
    cfg: FinetuneConfig,
    workdir: str,
    hooks: Sequence[Callable] = (),
    ctx: ft_run.Context | None = None,
) -> dict[str, Any]:
    """Fine-tunes every cell x seed of `cfg` in `workdir` (finished runs are read back, a cut
    one resumes); writes and returns the summary. `hooks(step, run)` run after every step
    (`trainer.train_and_evaluate`'s); `ctx` reuses a `finetune.run.setup`.

    Raises:
      UserError subclasses (ConfigError, CheckpointError, DatasetNotPreparedError,
      FinetuneMismatchError, RunMismatchError) for what the user must fix;
      trainer.NonFiniteError; Preempted (SIGTERM or Ctrl-C: the run in flight saved its step;
      rerun to resume).
    """
    ctx = ctx or ft_run.setup(cfg, workdir)
    try:
        base, specs = grid(ctx)
        with Preemption(shared=jax.process_count() > 1) as preemption:
            session = runner.Session(hooks=hooks, preemption=preemption)
            results = runner.run_grid(base, specs, workdir, session=session)
    finally:
        task_lib.release()
    summary = ft_run.summarize(ctx, by_cell(results))
    write_json(os.path.join(workdir, ft_run.SUMMARY_FILE), summary)
    return summary


def by_cell(results: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, dict]]:
    """{cell: {seed: the task's result}} of the grid's stored results, in grid order."""
    out: dict[str, dict[int, dict]] = {}
    for result in results:
        tags = result["tags"]
        out.setdefault(tags["cell"], {})[tags["seed"]] = result["task_result"]
    return out
