"""Tables and plots of a study's results (the dicts of `runner.summarize`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ln_jax.experiments.runner import steps_to_target

Result = dict[str, Any]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


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
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Warm-up study
# --------------------------------------------------------------------------------------------


def warmup_target(results: Sequence[Result], target: float | None) -> tuple[float, str]:
    """The target loss and its source: `target`, else the lowest final validation MLM loss of
    the Post-LN runs with warm-up (Adam) that did not diverge."""
    if target is not None:
        return target, "given"
    warm = [
        r
        for r in results
        if r["arm"].startswith("post_warmup")
        and not r["diverged"]
        and math.isfinite(r["final_eval_mlm_loss"])
    ]
    if not warm:
        raise ValueError(
            "no Post-LN run with warm-up finished without diverging, so there is no default "
            "target loss; pass --target=LOSS."
        )
    best = min(warm, key=lambda r: r["final_eval_mlm_loss"])
    return best["final_eval_mlm_loss"], best["name"]


def warmup_summary(results: Sequence[Result], target: float | None = None) -> dict[str, Any]:
    """Per run: steps and seconds to the target; and the key ratio
    steps(Pre-LN, no warm-up) / steps(Post-LN with warm-up) to the target, each side the best
    (fewest steps) of its runs."""
    tgt, source = warmup_target(results, target)
    rows = []
    for r in results:
        steps = steps_to_target(r["eval_curve"], tgt)
        rows.append(
            {
                "name": r["name"],
                "arm": r["arm"],
                "lr": r["tags"].get("lr"),
                "warmup_steps": r["tags"].get("warmup_steps", 0),
                "final": r["final_eval_mlm_loss"],
                "best": r["best_eval_mlm_loss"],
                "steps_to_target": steps,
                "seconds_to_target": _seconds_at(r, steps),
                "diverged": r["diverged"],
                "wall_s": r["wall_s"],
            }
        )

    def fewest(prefix: str) -> dict[str, Any] | None:
        hits = [x for x in rows if x["arm"].startswith(prefix) and x["steps_to_target"]]
        return min(hits, key=lambda x: x["steps_to_target"]) if hits else None

    pre, post = fewest("pre"), fewest("post_warmup")
    ratio = pre["steps_to_target"] / post["steps_to_target"] if pre and post else None
    return {
        "target": tgt,
        "target_from": source,
        "runs": rows,
        "pre_run": pre and pre["name"],
        "post_warmup_run": post and post["name"],
        "steps_ratio_pre_over_post_warmup": ratio,
    }


def _seconds_at(result: Result, step: float | None) -> float | None:
    """Training seconds at `step`, interpolated on the eval curve's (step, seconds)."""
    if step is None:
        return None
    pts = [(s, t) for s, _, t in result["eval_curve"] if math.isfinite(t)]
    if not pts:
        return None
    return float(np.interp(step, [s for s, _ in pts], [t for _, t in pts]))


def warmup_table(summary: dict[str, Any], plateau: float) -> str:
    lines = [
        "| run | lr_max | warm-up steps | final val MLM | best | steps to target | "
        "s to target | diverged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in summary["runs"]:
        steps = x["steps_to_target"]
        lines.append(
            f"| {x['name']} | {x['lr']:g} | {x['warmup_steps']} | {_fmt(x['final'])} | "
            f"{_fmt(x['best'])} | {'never' if steps is None else f'{steps:.0f}'} | "
            f"{_fmt(x['seconds_to_target'], 0)} | {'yes' if x['diverged'] else 'no'} |"
        )
    ratio = summary["steps_ratio_pre_over_post_warmup"]
    lines.append(
        f"\ntarget loss {summary['target']:.3f} (from {summary['target_from']}); unigram "
        f"plateau {plateau:.3f} nats; steps to target, Pre-LN ({summary['pre_run']}) / "
        f"Post-LN with warm-up ({summary['post_warmup_run']}) = {_fmt(ratio, 2)}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


COLORS = {
    "post": "tab:red",
    "post_warmup": "tab:orange",
    "pre": "tab:blue",
    "admin": "tab:green",
    "deepnorm": "tab:purple",
    "post_nowarmup": "tab:red",
    "post_radam": "tab:brown",
    "post_smalllr": "tab:pink",
    "post_sgd": "tab:gray",
    "post_sgd_warmup": "tab:olive",
}


def _color(arm: str) -> str:
    if arm.startswith("post_warmup") and arm != "post_warmup":
        return {"post_warmup500": "gold", "post_warmup4000": "tab:orange"}.get(arm, "tab:orange")
    return COLORS.get(arm, "black")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_curve(ax, r: Result, x_index: int, label: str | None) -> None:
    pts = [(p[x_index], p[1]) for p in r["eval_curve"] if math.isfinite(p[1])]
    if pts:
        xs, ys = zip(*pts, strict=True)
        style = ":" if r["diverged"] else "-"
        ax.plot(xs, ys, style, color=_color(r["arm"]), alpha=0.8, label=label)


def plot_depth(results: Sequence[Result], arms: Sequence[str], plateau: float, path: str) -> None:
    """One panel per depth: validation MLM loss against steps, a line per run."""
    plt = _plt()
    depths = sorted({r["tags"]["num_layers"] for r in results})
    fig, axes = plt.subplots(1, len(depths), figsize=(5 * len(depths), 4), squeeze=False)
    for ax, d in zip(axes[0], depths, strict=True):
        seen = set()
        for r in sorted(results, key=lambda r: arms.index(r["arm"])):
            if r["tags"]["num_layers"] == d:
                _plot_curve(ax, r, 0, None if r["arm"] in seen else r["arm"])
                seen.add(r["arm"])
        ax.axhline(plateau, color="black", lw=0.8, ls="--", label="unigram plateau")
        ax.set(title=f"{d} layers", xlabel="step", ylabel="validation MLM loss (nats)")
        ax.set_ylim(plateau - 1.5, plateau + 1.5)
        ax.legend(fontsize=7)
    fig.suptitle("Depth study: same large learning rate (dotted = diverged)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_warmup(
    results: Sequence[Result], summary: dict[str, Any], plateau: float, path: str
) -> None:
    """Validation MLM loss against steps and against training seconds, a line per run."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, x_index, xlabel in ((axes[0], 0, "step"), (axes[1], 2, "training seconds")):
        for r in results:
            _plot_curve(ax, r, x_index, r["name"])
        ax.axhline(plateau, color="black", lw=0.8, ls="--", label="unigram plateau")
        ax.axhline(summary["target"], color="gray", lw=0.8, ls="-.", label="target")
        ax.set(xlabel=xlabel, ylabel="validation MLM loss (nats)")
        ax.set_ylim(summary["target"] - 1.0, plateau + 1.5)
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle("Warm-up study (dotted = diverged)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
