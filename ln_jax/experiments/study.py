"""A study end to end: train the grid (resumably), then write results, table and plot.

OUT/
  runs/NAME/            a run's workdir (checkpoints, metrics.jsonl, TensorBoard, result.json)
  plateau.json          the corpus's unigram plateau
  results.json          {"study", "base_config", "plateau", "runs": [...], "summary": ...}
                        (a translation study's "runs": one line each, `report_mt.run_records`)
  table.md, curves.png  the table printed at the end and the validation curves
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ln_jax.experiments import grids, report, report_mt, runner, targets
from ln_jax.experiments.runner import RunSpec
from ln_jax.results import write_json

MT_STUDIES = ("mt_warmup", "mt_depth", "mt_deep_encoder")  # translation: BLEU (report_mt)


def run_only(
    base: Mapping[str, Any],
    specs: Sequence[RunSpec],
    out: str,
    name: str,
    plateau: float,
    extend: Sequence[str] = (),
) -> int:
    """Trains the one run called `name` (a worker of `run_grid(jobs>1)`, or by hand); a
    finished one only when `extend` names it (`runner.extension_due`)."""
    chosen = [s for s in specs if s.name == name]
    if not chosen:
        raise ValueError(f"no run named {name!r} in this grid; runs: {[s.name for s in specs]}")
    if runner.needs_training(base, chosen[0], out, extend):
        stored = runner.load_result(out, chosen[0]) is not None
        runner.run_one(base, chosen[0], out, plateau, extend=stored)
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
    offsets: Sequence[float] = targets.OFFSETS,
    expand: Callable[[list[dict[str, Any]]], list[RunSpec]] | None = None,
    extend: Sequence[str] = (),
) -> dict[str, Any]:
    """Trains what is missing (unless not `train`) and writes OUT/results.json, table, plot.

    `expand`, given the results of `specs` once all of them are finished, returns more runs
    (the key cells' extra seeds of the warm-up study), trained and reported with them.
    `extend`: patterns of finished runs to continue to the config's total_steps (fnmatch).
    If runs failed (`runner.RunsFailed`), the report covers the finished ones and the error is
    raised again once it is written.

    Returns:
      {"results": [...], "summary": ..., "table": markdown}.
    """
    os.makedirs(out, exist_ok=True)
    grid = (base, out, plateau, jobs, argv, train, extend)
    results, failure = _train_or_collect(specs, *grid)
    extra = expand(results) if expand and len(results) == len(specs) else []
    if extra:
        more, failure = _train_or_collect(extra, *grid)
        results += more
    if not results:
        if failure:
            raise failure
        raise ValueError(f"no finished runs in {out}; run the study without --report first.")
    summary, table = _report(study, results, plateau, out, target, arms, offsets)
    mt = study in MT_STUDIES  # a translation run's curves stay in its own result.json
    write_json(
        os.path.join(out, "results.json"),
        {
            "study": study,
            "base_config": dict(base),
            "plateau": plateau,
            "complete": len(results) == len(specs) + len(extra),
            "runs": report_mt.run_records(results) if mt else results,
            "summary": summary,
        },
    )
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    if failure:
        print(table, flush=True)
        raise failure
    return {"results": results, "summary": summary, "table": table}


def _train_or_collect(
    specs, base, out, plateau, jobs, argv, train, extend
) -> tuple[list[dict[str, Any]], runner.RunsFailed | None]:
    """The finished runs' results (after training the missing ones if `train`), and the
    `RunsFailed` of the runs that failed, if any."""
    if not train:
        return runner.collect(specs, out, plateau), None
    try:
        grid = runner.run_grid(
            base, specs, out, plateau=plateau, jobs=jobs, argv=argv, extend=extend
        )
    except runner.RunsFailed as err:
        return err.results, err
    return grid, None


def key_seed_expansion(
    sweep: Sequence[RunSpec], plateau: float, seeds: Sequence[int], offsets: Sequence[float]
) -> Callable[[list[dict[str, Any]]], list[RunSpec]]:
    """The warm-up study's `expand`: the extra `seeds` of the best Post-LN and Pre-LN cells of
    the finished sweep (`report.best_cells`), tagged "key" (not used to choose the cells)."""

    def expand(results: list[dict[str, Any]]) -> list[RunSpec]:
        best = report.best_cells(results, plateau, offsets)
        cells = [best[f] for f in ("post", "pre") if best.get(f)]
        extra = grids.key_cell_specs(sweep, cells, seeds)
        return [dataclasses.replace(s, tags={**s.tags, "key": True}) for s in extra]

    return expand


def _report(study, results, plateau, out, target, arms, offsets):
    plot = os.path.join(out, "curves.png")
    if study in MT_STUDIES:
        summary, table = _mt_report(study, results, plot, offsets, target)
        return summary, "\n\n".join(filter(None, [table, report_mt.plateau_line(plateau)]))
    if study == "depth":
        arms = list(arms or dict.fromkeys(r["arm"] for r in results))
        arms = [a for a in arms if any(r["arm"] == a for r in results)]
        report.plot_depth(results, arms, plateau, plot)
        return _depth_summary(results, plateau), report.depth_table(results, arms, plateau)
    summary = report.warmup_summary(results, plateau, offsets, target)
    report.plot_warmup(summary, plateau, plot)
    return summary, report.warmup_table(summary, plateau)


def _mt_report(study, results, plot, bleu_targets, loss_target):
    """The translation studies' summary and table (`report_mt`): the warm-up study's cells
    and comparisons with steps to the BLEU targets (`offsets` holds them here) and to the
    validation-NLL target; the depth studies' cells by arm and depth."""
    if study == "mt_warmup":
        losses = () if loss_target is None else (loss_target,)
        summary = report_mt.warmup_summary(results, bleu_targets, losses)
        table = report_mt.warmup_table(summary)
    else:
        summary = report_mt.depth_summary(results)
        table = report_mt.depth_table(summary, deep_encoder=study == "mt_deep_encoder")
    report_mt.plot(summary["cells"], f"{study}: validation BLEU and NLL by step", plot)
    monitor = os.path.join(os.path.dirname(plot), "monitor.png")
    report_mt.plot_monitor(summary["cells"], f"{study}: monitor traces by step", monitor)
    return summary, table


def _depth_summary(results: Sequence[dict[str, Any]], plateau: float) -> dict[str, Any]:
    """{arm: {num_layers: {"runs", "diverged", "final": [...], "collapse": [[init, end], ...]}}}
    (arm "ARM lr=X" when the runs have several rates), and "pilot" (`report.pilot_choice`) then."""
    out: dict[str, Any] = {}
    several = len({r["tags"].get("lr") for r in results}) > 1
    for r in results:
        arm = f"{r['arm']} lr={r['tags']['lr']:g}" if several else r["arm"]
        cell = out.setdefault(arm, {}).setdefault(
            str(r["tags"]["num_layers"]), {"runs": 0, "diverged": 0, "final": [], "collapse": []}
        )
        cell["runs"] += 1
        cell["diverged"] += int(r["diverged"])
        cell["final"].append(r["final_eval_mlm_loss"])
        cell["collapse"].append(report.collapse_ends(r))
    if several:
        out["pilot"] = report.pilot_choice(results, plateau)
    return out
