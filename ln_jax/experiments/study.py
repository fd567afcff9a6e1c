"""A study end to end: train the grid (resumably), then write results, table and plot.

OUT/
  runs/NAME/            a run's workdir (checkpoints, metrics.jsonl, TensorBoard, result.json)
  plateau.json          the corpus's unigram plateau
  results.json          {"study", "base_config", "plateau", "runs": [...], "summary": ...}
  table.md, curves.png  the table printed at the end and the validation curves
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ln_jax.experiments import report, runner
from ln_jax.experiments.runner import RunSpec
from ln_jax.results import write_json


def run_only(
    base: Mapping[str, Any], specs: Sequence[RunSpec], out: str, name: str, plateau: float
) -> int:
    """Trains the one run called `name` (a worker of `run_grid(jobs>1)`, or by hand)."""
    chosen = [s for s in specs if s.name == name]
    if not chosen:
        raise ValueError(f"no run named {name!r} in this grid; runs: {[s.name for s in specs]}")
    if runner.load_result(out, chosen[0]) is None:
        runner.run_one(base, chosen[0], out, plateau)
    return 0


def run(
    study: str,
    base: Mapping[str, Any],
    specs: Sequence[RunSpec],
    out: str,
    *,
    plateau: float,
    jobs: int = 1,
    argv: Sequence[str] = (),
    train: bool = True,
    target: float | None = None,
    arms: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Trains what is missing (unless not `train`) and writes OUT/results.json, table, plot.

    Returns:
      {"results": [...], "summary": ..., "table": markdown}.
    """
    os.makedirs(out, exist_ok=True)
    if train:
        results = runner.run_grid(base, specs, out, plateau=plateau, jobs=jobs, argv=argv)
    else:
        results = runner.collect(specs, out, plateau)
    if not results:
        raise ValueError(f"no finished runs in {out}; run the study without --report first.")
    summary, table = _report(study, results, plateau, out, target, arms)
    write_json(
        os.path.join(out, "results.json"),
        {
            "study": study,
            "base_config": dict(base),
            "plateau": plateau,
            "complete": len(results) == len(specs),
            "runs": results,
            "summary": summary,
        },
    )
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    return {"results": results, "summary": summary, "table": table}


def _report(study, results, plateau, out, target, arms):
    plot = os.path.join(out, "curves.png")
    if study == "depth":
        arms = list(arms or dict.fromkeys(r["arm"] for r in results))
        arms = [a for a in arms if any(r["arm"] == a for r in results)]
        report.plot_depth(results, arms, plateau, plot)
        return _depth_summary(results), report.depth_table(results, arms, plateau)
    summary = report.warmup_summary(results, target, plateau)
    report.plot_warmup(summary, plateau, plot)
    return summary, report.warmup_table(summary, plateau)


def _depth_summary(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{arm: {num_layers: {"runs", "diverged", "final": [...]}}}."""
    out: dict[str, Any] = {}
    for r in results:
        cell = out.setdefault(r["arm"], {}).setdefault(
            str(r["tags"]["num_layers"]), {"runs": 0, "diverged": 0, "final": []}
        )
        cell["runs"] += 1
        cell["diverged"] += int(r["diverged"])
        cell["final"].append(r["final_eval_mlm_loss"])
    return out
