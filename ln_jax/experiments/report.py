"""Tables and plots of a study's results (the dicts of `runner.summarize_run`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ln_jax.experiments.runner import steps_to_target
from ln_jax.results import arm_colour, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Result = dict[str, Any]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _step(step: float | None) -> str:
    """A (possibly interpolated) step count, or "never" for a level not reached."""
    return "never" if step is None else f"{step:.0f}"


def _mean_std(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "NaN"
    if len(finite) == 1:
        return f"{finite[0]:.3f}"
    return f"{np.mean(finite):.3f} ± {np.std(finite):.3f}"


def group(results: Sequence[Result], key: Callable[[Result], Any]) -> dict[Any, list[Result]]:
    out: dict[Any, list[Result]] = defaultdict(list)
    for r in results:
        out[key(r)].append(r)
    return dict(out)


# --------------------------------------------------------------------------------------------
# Depth study
# --------------------------------------------------------------------------------------------


def depth_table(results: Sequence[Result], arms: Sequence[str], plateau: float) -> str:
    """Markdown: a row per arm; per depth, runs diverged / runs, runs ending below the unigram
    plateau / runs, and the final validation MLM loss (mean ± std over the seeds)."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    cells = group(results, lambda r: (r["arm"], r["tags"]["num_layers"]))
    head = (
        "| arm | "
        + " | ".join(f"L={d}: diverged | below plateau | final val MLM" for d in depths)
        + " |"
    )
    lines = [head, "|---|" + "---|---|---|" * len(depths)]
    for arm in arms:
        row = [arm]
        for d in depths:
            runs = cells.get((arm, d), [])
            bad = sum(r["diverged"] for r in runs)
            below = sum(r["below_plateau"] for r in runs)
            finals = [r["final_eval_mlm_loss"] for r in runs]
            row += [
                f"{bad}/{len(runs)}",
                f"{below}/{len(runs)}",
                _mean_std(finals) if runs else "–",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        f"\nunigram plateau (validation cross-entropy of train token frequencies): "
        f"{plateau:.3f} nats"
    )
    lines += ["", escape_table(results, arms, plateau)]
    return "\n".join(lines)


ESCAPE_MARGIN = 0.1  # nats below the unigram plateau that count as having left it


def escape_table(results: Sequence[Result], arms: Sequence[str], plateau: float) -> str:
    """Markdown: per arm and depth, the step at which each seed's validation loss first falls
    ESCAPE_MARGIN below the plateau (interpolated between evaluations; "never")."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    cells = group(results, lambda r: (r["arm"], r["tags"]["num_layers"]))
    lines = [
        f"Step at which the validation loss first falls {ESCAPE_MARGIN} nats below the plateau "
        "(per seed):",
        "",
        "| arm | " + " | ".join(f"L={d}" for d in depths) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for arm in arms:
        row = [arm]
        for d in depths:
            steps = [
                steps_to_target(r["eval_curve"], plateau - ESCAPE_MARGIN)
                for r in sorted(cells.get((arm, d), []), key=lambda r: r["tags"].get("seed", 0))
            ]
            row.append(", ".join(_step(x) for x in steps) or "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Warm-up study
# --------------------------------------------------------------------------------------------


def cell_name(r: Result) -> str:
    """A run's name without its seed suffix: the grid cell it is one seed of."""
    suffix = f"-s{r['tags'].get('seed')}"
    return r["name"][: -len(suffix)] if r["name"].endswith(suffix) else r["name"]


def mean_curve(runs: Sequence[Result]) -> list[list[float]]:
    """[[step, loss, seconds], ...]: the runs' validation curves averaged over seeds, at the
    steps every one of them evaluated (a diverged seed's NaN makes the mean NaN)."""
    by_step = [{e[0]: e for e in r["eval_curve"]} for r in runs]
    common = sorted(set.intersection(*(set(b) for b in by_step)))
    return [
        [
            step,
            float(np.mean([b[step][1] for b in by_step])),
            float(np.mean([b[step][2] for b in by_step])),
        ]
        for step in common
    ]


def largest_spike(curve: Sequence[Sequence[float]]) -> float:
    """The largest rise of a [[step, loss, ...], ...] curve above its running minimum, in nats
    (0 for a curve that never goes back up; non-finite points are skipped): a loss spike that
    the run recovered from still shows here, though it is not a divergence."""
    best, spike = math.inf, 0.0
    for point in curve:
        loss = point[1]
        if math.isfinite(loss):
            spike = max(spike, loss - best)
            best = min(best, loss)
    return spike


def warmup_cells(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One entry per grid cell (arm, lr, warm-up), its seeds pooled: the mean curve, the finals
    and how many seeds diverged."""
    cells = []
    for name, runs in group(results, cell_name).items():
        curve = mean_curve(runs)
        cells.append(
            {
                "cell": name,
                "arm": runs[0]["arm"],
                "lr": runs[0]["tags"].get("lr"),
                "warmup_steps": runs[0]["tags"].get("warmup_steps", 0),
                "runs": [r["name"] for r in runs],
                "finals": [r["final_eval_mlm_loss"] for r in runs],
                "mean_final": curve[-1][1] if curve else math.nan,
                "diverged": sum(bool(r["diverged"]) for r in runs),
                "spike": max(largest_spike(r["eval_curve"]) for r in runs),
                "curve": curve,
            }
        )
    return cells


def warmup_target(cells: Sequence[dict[str, Any]], target: float | None) -> tuple[float, str]:
    """The target loss and its source: `target`, else the lowest seed-mean final validation MLM
    loss of the Post-LN cells with warm-up (Adam) none of whose seeds diverged."""
    if target is not None:
        return target, "given"
    warm = [
        c
        for c in cells
        if c["arm"].startswith("post_warmup")
        and not c["diverged"]
        and math.isfinite(c["mean_final"])
    ]
    if not warm:
        raise ValueError(
            "no Post-LN run with warm-up finished without diverging, so there is no default "
            "target loss; pass --target=LOSS."
        )
    best = min(warm, key=lambda c: c["mean_final"])
    return best["mean_final"], best["cell"]


def warmup_summary(
    results: Sequence[Result], target: float | None = None, plateau: float | None = None
) -> dict[str, Any]:
    """Steps and seconds to the target per cell (on its seed-mean curve) and per run; and the
    key ratio steps(Pre-LN, no warm-up) / steps(Post-LN with warm-up) to the target, each side
    its cell with the fewest steps. With `plateau`, each cell also gets the step at which its
    mean curve first falls ESCAPE_MARGIN below the unigram plateau ("steps_below_plateau"):
    the one figure that still separates the arms when the target sits on the plateau.

    With one seed a cell is its run. With several, the default target is the best Post-LN
    warm-up cell's mean final loss, which its mean curve reaches by its last evaluation.
    """
    cells = warmup_cells(results)
    tgt, source = warmup_target(cells, target)
    for c in cells:
        c["steps_to_target"] = steps_to_target(c["curve"], tgt)
        c["seconds_to_target"] = _seconds_at(c["curve"], c["steps_to_target"])
        if plateau is not None:
            c["steps_below_plateau"] = steps_to_target(c["curve"], plateau - ESCAPE_MARGIN)
    runs = []
    for r in results:
        steps = steps_to_target(r["eval_curve"], tgt)
        runs.append(
            {
                "name": r["name"],
                "cell": cell_name(r),
                "final": r["final_eval_mlm_loss"],
                "best": r["best_eval_mlm_loss"],
                "steps_to_target": steps,
                "seconds_to_target": _seconds_at(r["eval_curve"], steps),
                "diverged": r["diverged"],
                "wall_s": r["wall_s"],
            }
        )

    def fewest(prefix: str) -> dict[str, Any] | None:
        hits = [c for c in cells if c["arm"].startswith(prefix) and c["steps_to_target"]]
        return min(hits, key=lambda c: c["steps_to_target"]) if hits else None

    pre, post = fewest("pre"), fewest("post_warmup")
    ratio = pre["steps_to_target"] / post["steps_to_target"] if pre and post else None
    return {
        "target": tgt,
        "target_from": source,
        "cells": cells,
        "runs": runs,
        "pre_run": pre and pre["cell"],
        "post_warmup_run": post and post["cell"],
        "steps_ratio_pre_over_post_warmup": ratio,
    }


def _seconds_at(curve: Sequence[Sequence[float]], step: float | None) -> float | None:
    """Training seconds at `step`, interpolated on a [[step, loss, seconds], ...] curve."""
    if step is None:
        return None
    pts = [(s, t) for s, _, t in curve if math.isfinite(t)]
    if not pts:
        return None
    return float(np.interp(step, [s for s, _ in pts], [t for _, t in pts]))


def warmup_table(summary: dict[str, Any], plateau: float) -> str:
    """Markdown: a row per cell (seeds pooled), then the target and the key ratio."""
    lines = [
        "| run | lr_max | warm-up steps | seeds | final val MLM | steps to target | "
        f"s to target | {ESCAPE_MARGIN} below plateau at | largest spike | diverged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["cells"]:
        lines.append(
            f"| {c['cell']} | {c['lr']:g} | {c['warmup_steps']} | {len(c['runs'])} | "
            f"{_mean_std(c['finals'])} | {_step(c['steps_to_target'])} | "
            f"{_fmt(c['seconds_to_target'], 0)} | {_step(c.get('steps_below_plateau'))} | "
            f"{c['spike']:.2f} | {c['diverged']}/{len(c['runs'])} |"
        )
    ratio = summary["steps_ratio_pre_over_post_warmup"]
    lines.append(
        f"\ntarget loss {summary['target']:.3f} (from {summary['target_from']}); unigram "
        f"plateau {plateau:.3f} nats; steps to target (on the seed-mean curve), Pre-LN "
        f"({summary['pre_run']}) / Post-LN with warm-up ({summary['post_warmup_run']}) = "
        f"{_fmt(ratio, 2)}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def _plot_loss(
    ax: Any, curve: Sequence[Sequence[float]], x_index: int, arm: str, diverged: bool, **kw
) -> None:
    """A validation-loss curve [[step, loss, seconds], ...] against its column `x_index` (0 step,
    2 seconds), in the arm's colour, dotted if diverged; non-finite losses are left out."""
    pts = [(p[x_index], p[1]) for p in curve if math.isfinite(p[1])]
    if pts:
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, ":" if diverged else "-", color=arm_colour(arm), **kw)


def depth_figure(results: Sequence[Result], arms: Sequence[str], plateau: float) -> Figure:
    """One panel per depth: validation MLM loss against steps, a line per run (its gid the
    run's name), in the order of `arms`."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    fig, axes = new_figure(len(depths), width=5, squeeze=False)
    for ax, d in zip(axes[0], depths, strict=True):
        seen = set()
        for r in sorted(results, key=lambda r: arms.index(r["arm"])):
            if r["tags"]["num_layers"] == d:
                label = None if r["arm"] in seen else r["arm"]
                _plot_loss(
                    ax,
                    r["eval_curve"],
                    0,
                    r["arm"],
                    r["diverged"],
                    alpha=0.8,
                    label=label,
                    gid=r["name"],
                )
                seen.add(r["arm"])
        ax.axhline(plateau, color="black", lw=0.8, ls="--", label="unigram plateau")
        ax.set(title=f"{d} layers", xlabel="step", ylabel="validation MLM loss (nats)")
        ax.set_ylim(plateau - 0.8, plateau + 0.5)
        ax.legend(fontsize=7)
    fig.suptitle("Depth study: same large learning rate (dotted = diverged)")
    return fig


def plot_depth(results: Sequence[Result], arms: Sequence[str], plateau: float, path: str) -> str:
    """Saves `depth_figure` as the PNG `path`; returns the path."""
    return save_figure(depth_figure(results, arms, plateau), path)


def warmup_figure(summary: dict[str, Any], plateau: float) -> Figure:
    """Validation MLM loss against steps (top row) and against training seconds (bottom row),
    a column per peak learning rate and a line per cell of `warmup_summary` (the mean over its
    seeds; its gid the cell's name); dotted = a seed diverged. Every panel shares the y range,
    the plateau and the target."""
    lrs = sorted({c["lr"] for c in summary["cells"] if c["lr"] is not None}) or [None]
    fig, axes = new_figure(len(lrs), 2, width=4.0, height=3.75, sharey=True, squeeze=False)
    for col, lr in enumerate(lrs):
        cells = [c for c in summary["cells"] if c["lr"] == lr]
        for row, (x_index, xlabel) in enumerate(((0, "step"), (2, "training seconds"))):
            ax = axes[row, col]
            for c in cells:
                _plot_loss(
                    ax,
                    c["curve"],
                    x_index,
                    c["arm"],
                    c["diverged"],
                    alpha=0.85,
                    label=c["arm"],
                    gid=c["cell"],
                )
            ax.axhline(plateau, color="black", lw=0.8, ls="--", label="unigram plateau")
            ax.axhline(summary["target"], color="gray", lw=0.8, ls="-.", label="target")
            ax.set(xlabel=xlabel, ylim=(summary["target"] - 1.0, plateau + 1.5))
            ax.set_title(f"lr_max = {lr:g}" if lr is not None else "", fontsize=9)
        axes[0, col].legend(fontsize=6)
    for row in range(2):
        axes[row, 0].set_ylabel("validation MLM loss (nats)")
    fig.suptitle("Warm-up study: validation MLM loss, mean over seeds (dotted = a seed diverged)")
    return fig


def plot_warmup(summary: dict[str, Any], plateau: float, path: str) -> str:
    """Saves `warmup_figure` as the PNG `path`; returns the path."""
    return save_figure(warmup_figure(summary, plateau), path)
