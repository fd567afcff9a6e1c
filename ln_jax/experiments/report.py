"""Tables and plots of a study's results (the dicts of `runner.summarize_run`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ln_jax.experiments import targets as targets_mod
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

ESCAPE_MARGIN = 0.1  # nats below the unigram plateau that count as having left it
# A pilot run "trains" if it ends this far below the plateau without diverging (a pilot is
# short: escaping the plateau is what it can show).
TRAIN_MARGIN = ESCAPE_MARGIN
DEPTH_OFFSETS = (0.3, 0.5)  # the depth study's per-seed targets, nats below the plateau
PILOT_STABLE = ("pre", "admin_warmup")  # must train at every depth at the chosen rate
PILOT_POST = "post_warmup"  # should train at the smallest depth and fail at the largest


def _lr(r: Result) -> float:
    return r["tags"].get("lr") or 0.0


def row_labels(results: Sequence[Result], arms: Sequence[str]) -> list[tuple[str, Any]]:
    """(label, key) of the depth tables' rows, in the order of `arms`: the arm, or "arm lr=X"
    for each of its learning rates when the runs have several (a pilot)."""
    lrs = sorted({_lr(r) for r in results})
    rows = []
    for arm in arms:
        for lr in lrs if len(lrs) > 1 else [None]:
            if any(r["arm"] == arm and (lr is None or _lr(r) == lr) for r in results):
                rows.append((arm if lr is None else f"{arm} lr={lr:g}", (arm, lr)))
    return rows


def _depth_cells(results: Sequence[Result]) -> dict[tuple, list[Result]]:
    """{(arm, lr or None, depth): runs} (lr None when all runs share one rate)."""
    several = len({_lr(r) for r in results}) > 1
    return group(
        results, lambda r: (r["arm"], _lr(r) if several else None, r["tags"]["num_layers"])
    )


def collapse_ends(r: Result) -> tuple[float, float] | None:
    """(at initialisation, at the last measurement) of the run's collapse measure, the mean
    cosine between positions of the encoder output (monitor "collapse/output"; its first
    measurement is step 1's forward pass, before any update), or None if it was not logged."""
    pts = [p[1] for p in r.get("collapse_curve") or [] if math.isfinite(p[1])]
    return (pts[0], pts[-1]) if pts else None


def _collapse_cell(runs: Sequence[Result]) -> str:
    ends = [e for e in (collapse_ends(r) for r in runs) if e is not None]
    if not ends:
        return "–"
    return f"{np.mean([e[0] for e in ends]):.2f} → {np.mean([e[1] for e in ends]):.2f}"


def depth_table(results: Sequence[Result], arms: Sequence[str], plateau: float) -> str:
    """Markdown: a row per arm (per arm and rate in a pilot); per depth, runs diverged / runs,
    runs ending below the unigram plateau / runs, the final validation MLM loss (mean ± std over
    the seeds) and the collapse measure at initialisation → at the end (mean over the seeds);
    then the escape steps per seed, and in a pilot the learning-rate decision."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    cells = _depth_cells(results)
    head = "| arm | " + " | ".join(
        f"L={d}: diverged | below plateau | final val MLM | collapse init → end" for d in depths
    )
    lines = [head + " |", "|---|" + "---|---|---|---|" * len(depths)]
    for label, (arm, lr) in row_labels(results, arms):
        row = [label]
        for d in depths:
            runs = cells.get((arm, lr, d), [])
            row += [
                f"{sum(r['diverged'] for r in runs)}/{len(runs)}",
                f"{sum(r['below_plateau'] for r in runs)}/{len(runs)}",
                _mean_std([r["final_eval_mlm_loss"] for r in runs]) if runs else "–",
                _collapse_cell(runs),
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        f"\nunigram plateau (validation cross-entropy of train token frequencies): "
        f"{plateau:.3f} nats; collapse = mean cosine between positions of the encoder output"
    )
    lines += ["", escape_table(results, arms, plateau)]
    if len({_lr(r) for r in results}) == 1:  # a study (a pilot's runs are too short for this)
        lines += ["", seed_table(results, arms, plateau)]
    if len({_lr(r) for r in results}) > 1:
        lines += ["", pilot_table(pilot_choice(results, plateau))]
    return "\n".join(lines)


def escape_table(results: Sequence[Result], arms: Sequence[str], plateau: float) -> str:
    """Markdown: per arm and depth, the step at which each seed's validation loss first falls
    ESCAPE_MARGIN below the plateau (interpolated between evaluations; "never")."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    cells = _depth_cells(results)
    lines = [
        f"Step at which the validation loss first falls {ESCAPE_MARGIN} nats below the plateau "
        "(per seed):",
        "",
        "| arm | " + " | ".join(f"L={d}" for d in depths) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for label, (arm, lr) in row_labels(results, arms):
        row = [label]
        for d in depths:
            runs = sorted(cells.get((arm, lr, d), []), key=lambda r: r["tags"].get("seed", 0))
            steps = [steps_to_target(r["eval_curve"], plateau - ESCAPE_MARGIN) for r in runs]
            row.append(", ".join(_step(x) for x in steps) or "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def seed_table(
    results: Sequence[Result],
    arms: Sequence[str],
    plateau: float,
    offsets: Sequence[float] = DEPTH_OFFSETS,
) -> str:
    """Markdown: per arm and depth, each seed's final validation MLM loss and the step at which
    it reaches plateau - offset for each of `offsets` (in seed order; "never")."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    cells = _depth_cells(results)
    lines = [
        "Per seed (in seed order): final validation MLM, and the step at plateau − "
        + " / − ".join(f"{o:g}" for o in offsets)
        + " nats:",
        "",
        "| arm | L | seeds | final val MLM | "
        + " | ".join(f"step at {plateau - o:.3f}" for o in offsets)
        + " |",
        "|---|---|---|---|" + "---|" * len(offsets),
    ]
    for label, (arm, lr) in row_labels(results, arms):
        for d in depths:
            runs = sorted(cells.get((arm, lr, d), []), key=lambda r: r["tags"].get("seed", 0))
            if not runs:
                continue
            finals = ", ".join(f"{r['final_eval_mlm_loss']:.3f}" for r in runs)
            steps = [
                ", ".join(_step(steps_to_target(r["eval_curve"], plateau - o)) for r in runs)
                for o in offsets
            ]
            seeds = ",".join(str(r["tags"].get("seed", 0)) for r in runs)
            lines.append(f"| {label} | {d} | {seeds} | {finals} | " + " | ".join(steps) + " |")
    return "\n".join(lines)


def trains(r: Result, plateau: float) -> bool:
    """A run trains: it did not diverge and ends TRAIN_MARGIN nats below the plateau."""
    final = r["final_eval_mlm_loss"]
    return not r["diverged"] and math.isfinite(final) and final <= plateau - TRAIN_MARGIN


def pilot_choice(results: Sequence[Result], plateau: float) -> dict[str, Any]:
    """The depth study's learning rate from a pilot over several rates.

    At each rate: do the PILOT_STABLE arms present train (`trains`, every seed) at every
    depth, and does PILOT_POST train at the smallest depth but at no seed at the largest
    (Liu et al.'s regime)? The choice is the largest rate with both; else the largest rate
    at which the stable arms train everywhere (regime False); else None.
    """
    depths = sorted({r["tags"]["num_layers"] for r in results})
    per_lr = {}
    for lr in sorted({_lr(r) for r in results}):
        at = [r for r in results if _lr(r) == lr]

        def ok(arm, depth, at=at):
            runs = [r for r in at if r["arm"] == arm and r["tags"]["num_layers"] == depth]
            return [trains(r, plateau) for r in runs]

        # a rate with an arm missing at some depth (a run not finished or failed) is not stable
        stable = all(ok(a, d) and all(ok(a, d)) for a in PILOT_STABLE for d in depths)
        low, high = ok(PILOT_POST, depths[0]), ok(PILOT_POST, depths[-1])
        regime = bool(low) and all(low) and bool(high) and not any(high)
        per_lr[lr] = {"stable_everywhere": stable, "post_regime": regime}
    regime = [lr for lr, v in per_lr.items() if v["stable_everywhere"] and v["post_regime"]]
    stable = [lr for lr, v in per_lr.items() if v["stable_everywhere"]]
    lr = max(regime or stable) if stable else None
    return {"lr": lr, "regime": bool(regime), "per_lr": per_lr, "depths": depths}


def pilot_table(choice: dict[str, Any]) -> str:
    """Markdown of `pilot_choice`: a row per rate, then the chosen rate."""
    lo, hi = choice["depths"][0], choice["depths"][-1]
    lines = [
        f"Pilot: does each rate give Liu's regime (a run trains = ends {TRAIN_MARGIN} nats below "
        "the plateau, not diverged)?",
        "",
        f"| lr | {', '.join(PILOT_STABLE)} train at every depth | {PILOT_POST} trains at L={lo}, "
        f"fails at L={hi} |",
        "|---|---|---|",
    ]
    for lr, v in choice["per_lr"].items():
        yes = lambda b: "yes" if b else "no"  # noqa: E731
        lines.append(f"| {lr:g} | {yes(v['stable_everywhere'])} | {yes(v['post_regime'])} |")
    lr = choice["lr"]
    verdict = (
        "none: no rate lets the stable arms train at every depth"
        if lr is None
        else (f"{lr:g}" + ("" if choice["regime"] else " (Liu's regime not found at any rate)"))
    )
    lines.append(f"\nchosen learning rate: {verdict}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Warm-up study
# --------------------------------------------------------------------------------------------


def cell_name(r: Result) -> str:
    """A run's name without its seed suffix: the grid cell it is one seed of."""
    suffix = f"-s{r['tags'].get('seed')}"
    return r["name"][: -len(suffix)] if r["name"].endswith(suffix) else r["name"]


def family(arm: str) -> str:
    """The arm a cell's learning rate and warm-up are chosen within: "post" for every Post-LN
    Adam cell (any warm-up, none included), else the arm itself ("pre", "admin_radam", ...)."""
    return "post" if arm == "post_nowarmup" or arm.startswith("post_warmup") else arm


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


def _finals(runs: Sequence[Result]) -> float:
    values = [r["final_eval_mlm_loss"] for r in runs]
    return float(np.mean(values)) if runs and all(map(math.isfinite, values)) else math.nan


def warmup_cells(
    results: Sequence[Result], targets: Sequence[tuple[str, float]]
) -> list[dict[str, Any]]:
    """One entry per grid cell (arm, lr, warm-up), its seeds pooled: the mean curve, finals,
    diverged seeds, per-seed steps to each target; "sweep_*" the same over the sweep's seeds
    only (runs not tagged "key"), on which the best cell is chosen."""
    cells = []
    for name, runs in group(results, cell_name).items():
        runs = sorted(runs, key=lambda r: r["tags"].get("seed", 0))
        sweep = [r for r in runs if not r["tags"].get("key")] or runs
        steps = [targets_mod.run_steps(r, targets) for r in runs]
        labels = [label for label, _ in targets]
        cells.append(
            {
                "cell": name,
                "arm": runs[0]["arm"],
                "family": family(runs[0]["arm"]),
                "lr": runs[0]["tags"].get("lr"),
                "warmup_steps": runs[0]["tags"].get("warmup_steps", 0),
                "runs": [r["name"] for r in runs],
                "seeds": [r["tags"].get("seed", 0) for r in runs],
                "finals": [r["final_eval_mlm_loss"] for r in runs],
                "mean_final": _finals(runs),
                "diverged": sum(bool(r["diverged"]) for r in runs),
                "spike": max(largest_spike(r["eval_curve"]) for r in runs),
                "curve": mean_curve(runs),
                "steps": {k: [s[k] for s in steps] for k in labels},
                "sweep_steps": {
                    k: [targets_mod.run_steps(r, targets)[k] for r in sweep] for k in labels
                },
                "sweep_diverged": any(r["diverged"] for r in sweep),
                "sweep_final": _finals(sweep),
            }
        )
    return cells


def best_cells(
    results: Sequence[Result], plateau: float, offsets: Sequence[float] = targets_mod.OFFSETS
) -> dict[str, str | None]:
    """{family: the name of its best cell} (`targets.best_cell` on the middle target)."""
    targets = targets_mod.target_losses(plateau, offsets)
    middle = targets[len(offsets) // 2][0]
    cells = warmup_cells(results, targets)
    out = {}
    for fam in dict.fromkeys(c["family"] for c in cells):
        best = targets_mod.best_cell([c for c in cells if c["family"] == fam], middle)
        out[fam] = best and best["cell"]
    return out


def warmup_summary(
    results: Sequence[Result],
    plateau: float,
    offsets: Sequence[float] = targets_mod.OFFSETS,
    target: float | None = None,
) -> dict[str, Any]:
    """The warm-up study's result: per cell the steps to each target (plateau - offset, and
    `target` if given); the best cell of each family (fewest mean steps to the middle offset's
    target on the sweep seeds, see `targets.best_cell`); and per target the ratio of mean steps
    Pre-LN / Post-LN of the two best cells per seed, their mean and its 95% t-interval.

    Returns:
      {"targets": [[label, loss], ...], "middle", "target" (the middle loss, for plots),
       "cells": [...], "best": {family: cell}, "ratios": [...]}.
    """
    if not offsets:
        raise ValueError("--target_offsets is empty; give e.g. 0.3,0.6,1.0 (nats below plateau).")
    targets = targets_mod.target_losses(plateau, offsets, target)
    labels = [label for label, _ in targets]
    middle = labels[len(offsets) // 2]
    cells = warmup_cells(results, targets)
    for c in cells:
        c["mean_steps"] = {k: targets_mod.mean_reached(v) for k, v in c["steps"].items()}
        c["seconds_to_middle"] = _mean_seconds(results, c, dict(targets)[middle])
    best = {}
    for fam in dict.fromkeys(c["family"] for c in cells):
        chosen = targets_mod.best_cell([c for c in cells if c["family"] == fam], middle)
        best[fam] = chosen and chosen["cell"]
    by_name = {c["cell"]: c for c in cells}
    pre, post = (by_name.get(best.get(f)) for f in ("pre", "post"))
    return {
        "targets": [[label, loss] for label, loss in targets],
        "middle": middle,
        "target": dict(targets)[middle],
        "cells": cells,
        "best": best,
        "ratios": targets_mod.key_ratios(pre, post, labels),
    }


def _mean_seconds(results: Sequence[Result], cell: dict[str, Any], loss: float) -> float | None:
    """Mean training seconds to `loss` over the cell's seeds that reach it."""
    secs = []
    for r in results:
        if r["name"] in cell["runs"]:
            secs.append(_seconds_at(r["eval_curve"], steps_to_target(r["eval_curve"], loss)))
    hit = [s for s in secs if s is not None]
    return float(np.mean(hit)) if hit else None


def _seconds_at(curve: Sequence[Sequence[float]], step: float | None) -> float | None:
    """Training seconds at `step`, interpolated on a [[step, loss, seconds], ...] curve."""
    if step is None:
        return None
    pts = [(s, t) for s, _, t in curve if math.isfinite(t)]
    if not pts:
        return None
    return float(np.interp(step, [s for s, _ in pts], [t for _, t in pts]))


def _steps_cell(steps: Sequence[float | None]) -> str:
    """Mean ± std of the seeds that reached a target, and how many did ("412 ± 30 (5/5)")."""
    hit = [s for s in steps if s is not None]
    if not hit:
        return f"never (0/{len(steps)})"
    spread = f" ± {np.std(hit):.0f}" if len(hit) > 1 else ""
    return f"{np.mean(hit):.0f}{spread} ({len(hit)}/{len(steps)})"


def warmup_table(summary: dict[str, Any], plateau: float) -> str:
    """Markdown: a row per cell (seeds pooled, best cells marked *), then the key ratio per
    target with its t-interval against Xiong et al.'s 0.71."""
    labels = [label for label, _ in summary["targets"]]
    best = set(summary["best"].values())
    lines = [
        "| cell | lr_max | warm-up steps | seeds | final val MLM | "
        + " | ".join(f"steps to {lab} ({loss:.2f})" for lab, loss in summary["targets"])
        + f" | s to {summary['middle']} | largest spike | diverged |",
        "|---|---|---|---|---|" + "---|" * len(labels) + "---|---|---|",
    ]
    for c in summary["cells"]:
        mark = " *" if c["cell"] in best else ""
        lr = "–" if c["lr"] is None else f"{c['lr']:g}"
        lines.append(
            f"| {c['cell']}{mark} | {lr} | {c['warmup_steps']} | {len(c['runs'])} | "
            f"{_mean_std(c['finals'])} | "
            + " | ".join(_steps_cell(c["steps"][k]) for k in labels)
            + f" | {_fmt(c['seconds_to_middle'], 0)} | {c['spike']:.2f} | "
            f"{c['diverged']}/{len(c['runs'])} |"
        )
    lines += [
        f"\nunigram plateau {plateau:.3f} nats; * = the best cell of its arm (fewest mean steps "
        f"to {summary['middle']} on the sweep seeds, none diverged; else lowest final loss).",
        "",
        f"Steps Pre-LN ({summary['best'].get('pre')}) / Post-LN ({summary['best'].get('post')}),"
        " per seed over the seeds both reached the target with: mean and its 95% t-interval "
        f"(Xiong et al.: {targets_mod.XIONG_RATIO}):",
        "",
        "| target | ratio | 95% t-interval | seeds | seeds with Pre-LN faster | holds 0.71 |",
        "|---|---|---|---|---|---|",
    ]
    lines += _ratio_rows(summary["ratios"])
    lines += ["", "Steps to each target per seed, best cells (in seed order):", ""]
    by_name = {c["cell"]: c for c in summary["cells"]}
    for cell in (summary["best"].get("post"), summary["best"].get("pre")):
        if cell:
            per_target = by_name[cell]["steps"]
            text = "; ".join(
                f"{k}: " + ", ".join(_step(x) for x in v) for k, v in per_target.items()
            )
            lines.append(f"* {cell}: {text}")
    return "\n".join(lines)


def _ratio_rows(ratios: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows of `targets.key_ratios`: the mean per-seed ratio, its 95% t-interval,
    the seeds (and how many never reached the target), the seeds with a ratio below 1, and
    whether the interval holds 0.71."""
    lines = []
    for row in ratios:
        if row["ratio"] is None:
            lines.append(f"| {row['target']} | – | – | – | – | – |")
            continue
        gone = row["pre_missing"] or row["post_missing"]
        missing = f" ({row['pre_missing']} / {row['post_missing']} never reached)" if gone else ""
        interval = f"[{row['lo']:.2f}, {row['hi']:.2f}]" if row["n"] > 1 else "– (1 seed)"
        lines.append(
            f"| {row['target']} | {row['ratio']:.2f} | {interval} | "
            f"{row['n']}{missing} | {row['below_one']} of {row['n']} | "
            f"{'yes' if row['holds_xiong'] else 'no'} |"
        )
    return lines


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


_MARKERS = ("o", "s", "^", "v", "D", "x")  # a pilot's rates, smallest first


def depth_figure(results: Sequence[Result], arms: Sequence[str], plateau: float) -> Figure:
    """One panel per depth: validation MLM loss against steps, a line per run (its gid the
    run's name), in the order of `arms`, labelled by arm (and rate, in a pilot: a marker per
    rate, `_MARKERS` from the smallest)."""
    depths = sorted({r["tags"]["num_layers"] for r in results})
    rates = sorted({_lr(r) for r in results})
    several = len(rates) > 1  # a pilot: one marker per rate, so an arm's rates stay apart
    fig, axes = new_figure(len(depths), width=5, squeeze=False)
    ylim = _depth_ylim(results, plateau)
    for ax, d in zip(axes[0], depths, strict=True):
        seen = set()
        for r in sorted(results, key=lambda r: (arms.index(r["arm"]), _lr(r))):
            if r["tags"]["num_layers"] == d:
                name = f"{r['arm']} lr={_lr(r):g}" if several else r["arm"]
                label = None if name in seen else name
                _plot_loss(
                    ax,
                    r["eval_curve"],
                    0,
                    r["arm"],
                    r["diverged"],
                    alpha=0.8,
                    label=label,
                    gid=r["name"],
                    marker=_MARKERS[rates.index(_lr(r)) % len(_MARKERS)] if several else None,
                    markersize=3,
                )
                seen.add(name)
        ax.axhline(plateau, color="black", lw=0.8, ls="--", label="unigram plateau")
        ax.set(title=f"{d} layers", xlabel="step", ylabel="validation MLM loss (nats)")
        ax.set_ylim(*ylim)
        ax.legend(fontsize=7)
    title = "Depth study: validation MLM loss of each run (dotted = diverged)"
    fig.suptitle(title if len(depths) > 1 else title.replace(" (", "\n("))  # one panel: narrow
    return fig


def _depth_ylim(results: Sequence[Result], plateau: float) -> tuple[float, float]:
    """The y range every depth panel shares: from 0.1 nats under the lowest validation loss of
    any run (at least 0.3 under the plateau) to 0.5 above the plateau."""
    losses = [p[1] for r in results for p in r["eval_curve"] if math.isfinite(p[1])]
    return min([plateau - 0.3, *(v - 0.1 for v in losses)]), plateau + 0.5


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
            ax.set(xlabel=xlabel, ylim=(summary["target"] - 0.3, plateau + 0.7))  # past the plateau
            ax.set_title(f"lr_max = {lr:g}" if lr is not None else "", fontsize=9)
        axes[0, col].legend(fontsize=6)
    for row in range(2):
        axes[row, 0].set_ylabel("validation MLM loss (nats)")
    fig.suptitle("Warm-up study: validation MLM loss, mean over seeds (dotted = a seed diverged)")
    return fig


def plot_warmup(summary: dict[str, Any], plateau: float, path: str) -> str:
    """Saves `warmup_figure` as the PNG `path`; returns the path."""
    return save_figure(warmup_figure(summary, plateau), path)
