"""Downstream score against pretraining step (Xiong et al. 2020, Fig. 5(b, c)).

  python -m ln_jax.experiments downstream --out=DIR --runs=pre=WORKDIR1,post=WORKDIR2
      [--steps=100,200] [--config=configs/glue.py:offline] [--config.FIELD=value ...]

Every checkpoint kept along each pretraining run (or the `--steps` named) is fine-tuned
(`ln_jax.experiments.finetune`) on the config's task, every seed of its grid, in
`DIR/<run>/step<k>/` (rerunning resumes: finished fine-tuning runs are read back).
`DIR/results.json` holds, per run and step, the seeds' best-epoch and last-epoch dev scores
with their median and spread; `DIR/downstream.png` plots the pretraining run's validation MLM
loss and the median dev score (bars: min to max over seeds) against the pretraining step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ln_jax import paths
from ln_jax.config.load import override
from ln_jax.experiments.finetune import finetune
from ln_jax.models.bert.finetune import build_finetune_config
from ln_jax.models.bert.finetune.run import spread
from ln_jax.results import write_json
from ln_jax.train.metrics import METRICS_FILE, read_records
from ln_jax.validate import ConfigError

RESULTS_FILE = "results.json"
PLOT_FILE = "downstream.png"


def parse_runs(text: Sequence[str]) -> dict[str, str]:
    """["pre=DIR1", "post=DIR2"] -> {"pre": "DIR1", "post": "DIR2"}; a bare DIR is named by
    its folder."""
    runs = {}
    for entry in text:
        name, sep, workdir = entry.partition("=")
        if not sep:
            name, workdir = os.path.basename(entry.rstrip("/")), entry
        if not workdir:
            raise ConfigError(f"--runs entry {entry!r}: give NAME=WORKDIR.")
        runs[name] = workdir
    if not runs:
        raise ConfigError("--runs is empty: give NAME=WORKDIR[,NAME=WORKDIR] of pretraining runs.")
    return runs


def checkpoint_steps(workdir: str) -> list[int]:
    """The steps of a pretraining workdir's kept checkpoints, ascending."""
    folder = paths.as_path(workdir) / "checkpoints"
    found = (
        sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []
    )
    if not found:
        raise ConfigError(
            f"{workdir} holds no checkpoints; pretrain it with train.py and a "
            "checkpoint_every/checkpoint.keep that keeps several steps."
        )
    return found


def _point(step: int, summary: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """One step's entry: the first cell's seeds, their best/last `metric` and spread."""
    cell = next(c for c in summary["cells"] if c["cell"] == summary["best_cell"])
    seeds = cell["seeds"]
    best = [r[f"best_{metric}"] for r in seeds.values()]
    last = [r[f"last_{metric}"] for r in seeds.values()]
    return {"step": step, "cell": cell["cell"], "metric": metric, "best": best, "last": last,
            "best_spread": spread(best), "last_spread": spread(last)}  # fmt: skip


def point_line(name: str, point: Mapping[str, Any]) -> str:
    """'pre step 500: dev accuracy (best epoch) median 0.8125 [0.79, 0.83], 3 seeds'."""
    best = point["best_spread"]
    return (
        f"{name} step {point['step']}: dev {point['metric']} (best epoch) median "
        f"{best['median']:.4f} [{best['min']:.4f}, {best['max']:.4f}], {len(point['best'])} seeds"
    )


def validation_curve(workdir: str) -> list[tuple[int, float]]:
    """(step, validation MLM loss) of a pretraining run's eval records."""
    path = paths.as_path(workdir) / METRICS_FILE
    records = read_records(path) if path.exists() else []
    return [(r["step"], r["mlm_loss"]) for r in records if r["split"] == "eval"]


def run(
    base: Mapping[str, Any], runs: Mapping[str, str], out: str, steps: Sequence[int] | None = None
) -> dict[str, Any]:
    """Fine-tunes each run's checkpoints; writes and returns results.json's content."""
    results: dict[str, Any] = {"task": base["task"], "config": dict(base), "runs": {}}
    for name, workdir in runs.items():
        points = []
        for step in steps or checkpoint_steps(workdir):
            fields = {"init_from": workdir, "init_step": step, "name": f"{base['name']}_{name}"}
            cfg = build_finetune_config(override(base, fields))
            summary = finetune(cfg, os.path.join(out, name, f"step{step}"))
            points.append(_point(step, summary, summary["metrics"][0]))
            print(point_line(name, points[-1]), flush=True)
        results["runs"][name] = {
            "workdir": workdir,
            "points": points,
            "validation_mlm_loss": validation_curve(workdir),
        }
    write_json(os.path.join(out, RESULTS_FILE), results)
    plot(results, os.path.join(out, PLOT_FILE))
    return results


def plot(results: Mapping[str, Any], path: str) -> None:
    """Validation MLM loss (left) and median best-epoch dev score with min-max bars (right)
    against the pretraining step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, entry in results["runs"].items():
        curve = entry["validation_mlm_loss"]
        if curve:
            left.plot(*zip(*curve, strict=True), marker="o", label=name)
        pts = entry["points"]
        x = [p["step"] for p in pts]
        med = [p["best_spread"]["median"] for p in pts]
        low = [m - p["best_spread"]["min"] for m, p in zip(med, pts, strict=True)]
        high = [p["best_spread"]["max"] - m for m, p in zip(med, pts, strict=True)]
        right.errorbar(x, med, yerr=[low, high], marker="o", capsize=3, label=name)
    metric = next(iter(results["runs"].values()))["points"][0]["metric"]
    left.set(xlabel="pretraining step", ylabel="validation MLM loss (nats)", title="pretraining")
    right.set(
        xlabel="pretraining step",
        ylabel=f"dev {metric} (median of seeds, best epoch)",
        title=f"fine-tuned on {results['task']}",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
