"""Tables and plots of the translation studies (results of `runner.summarize_run` on
translation runs: `bleu_curve`, `final_bleu`, `eval_curve` = validation NLL, `monitor_traces`).

BLEU is higher-is-better: steps to a BLEU target count the first evaluation at or above it
(`runner.steps_to_target(..., higher=True)`); steps to a loss target the first at or below it.
A cell is one grid setting pooled over its seeds; the comparisons are differences of final
BLEU and NLL over the seeds both cells ran and ratios of steps to a BLEU target, each with a 95%
t-interval on the paired per-seed values and, below 5 seeds, the sign count as the verdict
(`targets.paired_t`, `targets.describe`). A run is "stuck" when it ends within `STUCK_MARGIN`
of the corpus's unigram plateau (`plateau.translation_plateau`) or above it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ln_jax.experiments import targets as targets_mod
from ln_jax.experiments.report import cell_name, group, largest_spike
from ln_jax.experiments.runner import STUCK_MARGIN, steps_to_target
from ln_jax.experiments.two_by_two import two_by_two, two_by_two_table
from ln_jax.results import arm_colour, new_figure, save_figure

Result = dict[str, Any]
BLEU_TARGETS = (5.0, 10.0)
STACKS = ("encoder", "decoder")
SUBLAYER_ORDER = ("attention", "self_attention", "cross_attention", "ffn")  # forward order
# The papers' figures the studies are compared with (BLEU).
XIONG_FIG2 = "Xiong et al. Fig. 2 (IWSLT14 De-En): Post-LN w/o warm-up 8.45, w/ warm-up ~34"
LIU_TABLE2 = {  # WMT14 En-De, Transformer-base widths, encoder = decoder depth
    "post": {6: "27.80", 12: "diverged", 18: "diverged"},
    "pre": {6: "27.27", 12: "28.26", 18: "28.26"},
    "admin": {6: "27.90", 12: "28.58", 18: "28.80"},
}


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def mean_points(curves: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """[[step, mean value], ...] over the steps every curve has (a NaN makes the mean NaN)."""
    if not curves:
        return []
    by_step = [{p[0]: p[1] for p in c} for c in curves]
    common = sorted(set.intersection(*(set(b) for b in by_step)))
    return [[s, float(np.mean([b[s] for b in by_step]))] for s in common]


def run_steps(
    r: Result, bleu_targets: Sequence[float], loss_targets: Sequence[float]
) -> dict[str, float | None]:
    """{"bleu>=T": step, "loss<=T": step} of one run (None where it never got there)."""
    out = {f"bleu>={t:g}": steps_to_target(r["bleu_curve"], t, higher=True) for t in bleu_targets}
    out.update({f"loss<={t:g}": steps_to_target(r["eval_curve"], t) for t in loss_targets})
    return out


def cells(
    results: Sequence[Result],
    bleu_targets: Sequence[float] = BLEU_TARGETS,
    loss_targets: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """One entry per cell (its seeds pooled, in seed order): seeds, final and best BLEU and
    final validation NLL per seed, diverged seeds, the largest rise of the validation NLL
    ("spike"), per-seed steps to each target, and the mean BLEU and NLL curves."""
    out = []
    for name, runs in group(results, cell_name).items():
        runs = sorted(runs, key=lambda r: r["tags"].get("seed", 0))
        steps = [run_steps(r, bleu_targets, loss_targets) for r in runs]
        first = runs[0]
        out.append(
            {
                "cell": name,
                "arm": first["arm"],
                **{k: first["tags"].get(k) for k in ("lr", "warmup_steps", "full")},
                "num_layers": first["tags"].get("num_layers"),
                "decoder_layers": first["tags"].get("decoder_layers"),
                "seeds": [r["tags"].get("seed", 0) for r in runs],
                "final_bleu": [r["final_bleu"] for r in runs],
                "best_bleu": [r["best_bleu"] for r in runs],
                "final_loss": [r["final_nll"] for r in runs],
                "best_loss": [r.get("best_nll", math.nan) for r in runs],
                "diverged": sum(bool(r["diverged"]) for r in runs),
                "stuck": _stuck_count(runs),
                "spike": max(largest_spike(r["eval_curve"]) for r in runs),
                "steps": {k: [s[k] for s in steps] for k in steps[0]},
                "collapse": {k: _mean_ends(runs, f"collapse/{k}/output") for k in STACKS},
                "max_grad": {k: _max_grad(runs, k) for k in STACKS},
                "cross_entropy": _cross_entropy_ends(runs),
                "traces": monitor_curves(runs),
                "bleu_curve": mean_points([r["bleu_curve"] for r in runs]),
                "loss_curve": mean_points([r["eval_curve"] for r in runs]),
            }
        )
    return out


def _stuck_count(runs: Sequence[Result]) -> int | None:
    """How many of the runs are stuck (`runner.stuck`); None when the plateau was unknown."""
    flags = [r.get("stuck") for r in runs]
    return None if any(f is None for f in flags) else sum(map(bool, flags))


def _mean_ends(runs: Sequence[Result], name: str) -> list[float] | None:
    """[at initialisation, at the last measurement] of a monitor trace, mean over the runs
    that logged it (None if none did)."""
    ends = [(t[0][1], t[-1][1]) for r in runs if (t := r.get("monitor_traces", {}).get(name))]
    return (
        [float(np.mean([e[0] for e in ends])), float(np.mean([e[1] for e in ends]))]
        if ends
        else None
    )


def cross_attention_entropy(r: Result) -> list[list[float]]:
    """[[step, entropy], ...] of one run: the decoder's cross-attention entropy (nats, monitor
    "attention_entropy/layer_NN/decoder/cross_attention"), mean over its layers. Near the
    uniform value over the source, the decoder does not tell source tokens apart."""
    traces = [
        t
        for k, t in r.get("monitor_traces", {}).items()
        if k.startswith("attention_entropy/layer_") and k.endswith("/cross_attention")
    ]
    if not traces:
        return []
    steps = sorted(set.intersection(*({p[0] for p in t} for t in traces)))
    values = [dict(map(tuple, t)) for t in traces]
    return [[s, float(np.mean([v[s] for v in values]))] for s in steps]


def _cross_entropy_ends(runs: Sequence[Result]) -> list[float] | None:
    """[at initialisation, at the end] of `cross_attention_entropy`, mean over the runs."""
    ends = [(c[0][1], c[-1][1]) for r in runs if (c := cross_attention_entropy(r))]
    return (
        [float(np.mean([e[0] for e in ends])), float(np.mean([e[1] for e in ends]))]
        if ends
        else None
    )


def _max_grad(runs: Sequence[Result], stack: str) -> list[float] | None:
    """[at initialisation, largest over the run] of the largest per-sub-layer gradient norm of
    a stack (monitor "grad_norm/layer_NN/<stack>/<sub-layer>"), mean over the runs."""
    ends = []
    for r in runs:
        traces = [t for k, t in r.get("monitor_traces", {}).items()
                  if k.startswith("grad_norm/layer_") and f"/{stack}/" in k]  # fmt: skip
        if traces:
            first = max(t[0][1] for t in traces)
            ends.append((first, max(max(v for _, v in t) for t in traces)))
    return (
        [float(np.mean([e[0] for e in ends])), float(np.mean([e[1] for e in ends]))]
        if ends
        else None
    )


def _grad_curve(r: Result, stack: str) -> list[list[float]]:
    """[[step, largest sub-layer gradient norm of `stack` at that step], ...] of one run."""
    traces = [t for k, t in r.get("monitor_traces", {}).items()
              if k.startswith("grad_norm/layer_") and f"/{stack}/" in k]  # fmt: skip
    if not traces:
        return []
    by_step: dict[float, float] = {}
    for t in traces:
        for step, v in t:
            by_step[step] = max(by_step.get(step, -math.inf), v)
    return [[s, by_step[s]] for s in sorted(by_step)]


def omega_by_sublayer(r: Result, stack: str) -> list[list[float]]:
    """Admin's omega of each residual branch of `stack` in forward order, one row per branch:
    [profiled (first value), at the end]; [] for a run without omega."""
    traces = r.get("monitor_traces", {})
    keys = [k for k in traces if k.startswith("omega/layer_") and f"/{stack}/" in k]
    keys.sort(key=lambda k: (k.split("/")[1], SUBLAYER_ORDER.index(k.split("/")[-1])))
    return [[traces[k][0][1], traces[k][-1][1]] for k in keys]


def monitor_curves(runs: Sequence[Result]) -> dict[str, list[list[float]]]:
    """A cell's monitor curves by step, mean over its seeds: "collapse/<stack>" (the stack
    output's collapse) and "grad/<stack>" (the largest sub-layer gradient norm); and
    "omega/<stack>" ([profiled, end] per residual branch, mean over seeds; empty without Admin);
    "cross_entropy" (`cross_attention_entropy`)."""
    out: dict[str, list[list[float]]] = {}
    for stack in STACKS:
        key = f"collapse/{stack}/output"
        out[f"collapse/{stack}"] = mean_points(
            [t for r in runs if (t := r.get("monitor_traces", {}).get(key))]
        )
        out[f"grad/{stack}"] = mean_points([g for r in runs if (g := _grad_curve(r, stack))])
        omegas = [o for r in runs if (o := omega_by_sublayer(r, stack))]
        out[f"omega/{stack}"] = np.mean(omegas, axis=0).tolist() if omegas else []
    out["cross_entropy"] = mean_points([c for r in runs if (c := cross_attention_entropy(r))])
    return out


def _by_seed(cell: dict[str, Any], key: str) -> dict[int, float]:
    return dict(zip(cell["seeds"], cell[key], strict=True))


def _paired_diff(a: dict[str, Any], b: dict[str, Any], key: str) -> tuple[list[int], Any]:
    """The seeds where both cells' `key` is finite, and a - b over them (`targets.paired_t`;
    None without such a seed)."""
    fa, fb = _by_seed(a, key), _by_seed(b, key)
    common = sorted(s for s in fa.keys() & fb.keys() if math.isfinite(fa[s] + fb[s]))
    if not common:
        return common, None
    return common, targets_mod.paired_t([fa[s] for s in common], [fb[s] for s in common])


def compare(a: dict[str, Any], b: dict[str, Any], label: str) -> dict[str, Any]:
    """Cell `a` against cell `b` over the seeds both ran: final BLEU a - b and final
    validation NLL a - b (95% t-intervals on the per-seed differences) and, per BLEU target
    both reached on some seed, the per-seed step ratio a / b."""
    common, bleu_diff = _paired_diff(a, b, "final_bleu")
    row: dict[str, Any] = {"label": label, "a": a["cell"], "b": b["cell"], "seeds": common}
    row["bleu_diff"] = bleu_diff
    row["nll_diff"] = _paired_diff(a, b, "final_loss")[1]
    ratios = {}
    for key in a["steps"]:
        if not key.startswith("bleu"):
            continue
        pa, pb = targets_mod.paired_steps(
            {"seeds": a["seeds"], "steps": a["steps"]}, {"seeds": b["seeds"], "steps": b["steps"]},
            key,
        )  # fmt: skip
        ratios[key] = targets_mod.paired_t_ratio(pa, pb) if pa else None
    row["step_ratios"] = ratios
    return row


def _diff(d: dict[str, Any] | None, digits: int = 2) -> str:
    return targets_mod.describe(d, digits)


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "–"
    ci = f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r["n"] > 1 else ""
    return f"{r['ratio']:.2f}{ci} (n={r['n']})"


def _bleu_cell(values: Sequence[float]) -> str:
    """ "12.34 ± 0.56 [11.9, 12.8] (3)": mean ± std, its 95% t-interval, seeds."""
    v = _finite(values)
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.2f} (1)"
    mean, lo, hi = targets_mod.t_mean(v)
    return f"{mean:.2f} ± {np.std(v):.2f} [{lo:.1f}, {hi:.1f}] ({len(v)})"


def _nll_cell(values: Sequence[float]) -> str:
    """ "5.061 ± 0.012": mean ± std over the seeds (the value alone for one)."""
    v = _finite(values)
    if not v:
        return "–"
    return f"{v[0]:.3f}" if len(v) == 1 else f"{np.mean(v):.3f} ± {np.std(v):.3f}"


def _steps_cell(steps: Sequence[float | None]) -> str:
    hit = [s for s in steps if s is not None]
    if not hit:
        return f"never (0/{len(steps)})"
    return f"{np.mean(hit):.0f} ({len(hit)}/{len(steps)})"


# --------------------------------------------------------------------------- warm-up study


def warmup_pairs(cs: Sequence[dict[str, Any]]) -> list[tuple[str, dict, dict]]:
    """The warm-up study's comparisons at each rate: full warm-up - none, 500 - none, Pre-LN
    without - Post-LN with the full warm-up (cells that exist only)."""
    by_lr: dict[float, dict[str, dict]] = {}
    for c in cs:
        slot = by_lr.setdefault(c["lr"], {})
        if c["arm"] == "pre":
            slot["pre"] = c
        elif c["arm"] == "post_nowarmup":
            slot["none"] = c
        elif c.get("full"):
            slot["full"] = c
        elif c["warmup_steps"] == 500:
            slot["500"] = c
    out = []
    for lr, s in sorted(by_lr.items()):
        for a, b, what in (
            ("full", "none", "Post-LN: full warm-up − none"),
            ("500", "none", "Post-LN: 500-step warm-up − none"),
            ("pre", "full", "Pre-LN without − Post-LN with full warm-up"),
            ("pre", "none", "Pre-LN without − Post-LN without warm-up"),
        ):
            if a in s and b in s:
                out.append((f"lr {lr:g}: {what}", s[a], s[b]))
    return out


def warmup_summary(
    results: Sequence[Result],
    bleu_targets: Sequence[float] = BLEU_TARGETS,
    loss_targets: Sequence[float] = (),
) -> dict[str, Any]:
    """{"cells": [...], "comparisons": [...], "bleu_targets", "loss_targets"}."""
    cs = cells(results, bleu_targets, loss_targets)
    comps = [compare(a, b, label) for label, a, b in warmup_pairs(cs)]
    return {
        "cells": cs,
        "comparisons": comps,
        "bleu_targets": list(bleu_targets),
        "loss_targets": list(loss_targets),
    }


def _cell_rows(cs: Sequence[dict[str, Any]], first: str) -> list[str]:
    keys = list(cs[0]["steps"]) if cs else []
    head = (
        f"| {first} | seeds | diverged | stuck | final BLEU | best BLEU | final val NLL "
        "| max NLL rise |"
    )
    head += "".join(f" steps to {k} |" for k in keys)
    lines = [head, "|" + "---|" * (8 + len(keys))]
    for c in cs:
        n = len(c["seeds"])
        stuck = "–" if c.get("stuck") is None else f"{c['stuck']}/{n}"
        lines.append(
            f"| {c['cell']} | {n} | {c['diverged']}/{n} | {stuck} | "
            f"{_bleu_cell(c['final_bleu'])} | {_fmt(max(_finite(c['best_bleu']), default=None))} | "
            f"{_nll_cell(c['final_loss'])} | {_fmt(c['spike'], 3)} |"
            + "".join(f" {_steps_cell(c['steps'][k])} |" for k in keys)
        )
    return lines


def _comparison_rows(comps: Sequence[dict[str, Any]]) -> list[str]:
    if not comps:
        return []
    keys = list(comps[0]["step_ratios"])
    lines = [
        "",
        "Comparisons over the seeds both cells ran (mean of the per-seed differences, its 95% "
        "t-interval; below 5 seeds the verdict is the sign count, k of n seeds):",
        "",
        "| comparison | seeds | final BLEU a − b | final val NLL a − b |"
        + "".join(f" steps a / b to {k} |" for k in keys),
        "|" + "---|" * (4 + len(keys)),
    ]
    for row in comps:
        lines.append(
            f"| {row['label']} | {len(row['seeds'])} | {_diff(row['bleu_diff'])} | "
            f"{_diff(row.get('nll_diff'), 3)} |"
            + "".join(f" {_ratio(row['step_ratios'][k])} |" for k in keys)
        )
    return lines


def _ends(values: list[float] | None, digits: int = 2) -> str:
    return "–" if not values else f"{values[0]:.{digits}f} → {values[1]:.{digits}f}"


def monitor_rows(cs: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows of the monitor's traces per cell: the collapse of each stack's output
    (mean cosine between positions, at initialisation → at the end) and the largest sub-layer
    gradient norm of each stack (at initialisation → the largest in the run), and the
    decoder's cross-attention entropy (nats, mean over layers, at initialisation → at the end)."""
    if not any(c["collapse"]["encoder"] or c["max_grad"]["encoder"] for c in cs):
        return []
    lines = [
        "",
        "Monitor (mean over seeds): collapse of the stack output, init → end; largest "
        "sub-layer gradient norm, init → largest in the run; the decoder's cross-attention "
        "entropy (nats, mean over layers), init → end:",
        "",
        "| cell | collapse encoder | collapse decoder | grad encoder | grad decoder "
        "| cross-attention entropy |",
        "|---|---|---|---|---|---|",
    ]
    for c in cs:
        lines.append(
            f"| {c['cell']} | {_ends(c['collapse']['encoder'])} | "
            f"{_ends(c['collapse']['decoder'])} | {_ends(c['max_grad']['encoder'], 3)} | "
            f"{_ends(c['max_grad']['decoder'], 3)} | {_ends(c.get('cross_entropy'))} |"
        )
    return lines


def warmup_table(summary: dict[str, Any]) -> str:
    """Markdown: a row per cell, then the comparisons, and the paper's figure."""
    lines = ["Translation warm-up study (final BLEU: mean ± std [95% t-interval] (seeds)):", ""]
    lines += _cell_rows(summary["cells"], "cell")
    lines += _comparison_rows(summary["comparisons"])
    lines += monitor_rows(summary["cells"])
    lines += ["", f"Paper: {XIONG_FIG2}."]
    return "\n".join(lines)


RECORD_FIELDS = ("final_nll", "best_nll", "final_bleu", "best_bleu", "diverged", "stuck", "steps")


def run_records(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One line per run for a study's results.json: name, arm, seed, tags and `RECORD_FIELDS`
    (the run's curves and monitor traces stay in its own runs/NAME/result.json)."""
    return [
        {
            "name": r["name"],
            "arm": r["arm"],
            "seed": r["tags"].get("seed", 0),
            "tags": r["tags"],
            **{k: r.get(k) for k in RECORD_FIELDS},
        }  # fmt: skip
        for r in results
    ]


def plateau_line(plateau: float | None) -> str:
    if plateau is None:
        return ""
    return (
        f"Unigram plateau {plateau:.3f} nats (the validation NLL of target-token frequencies, "
        f"`plateau.translation_plateau`); stuck = not diverged and ending above plateau − "
        f"{STUCK_MARGIN:g}."
    )


# --------------------------------------------------------------------------- depth studies


def depth_summary(results: Sequence[Result]) -> dict[str, Any]:
    """Cells by (arm, encoder depth); comparisons at each depth: admin - pre, post - pre (and
    a +dlcl arm - its arm without), over the shared seeds; and, at each depth and rate whose
    runs hold Post-LN and Pre-LN each without and with warm-up, their 2 x 2 (`two_by_two`)."""
    cs = cells(results, (), ())
    squares = []
    shape = lambda r: (r["tags"].get("num_layers"), r["tags"].get("lr"))
    for (depth, lr), runs in group(results, shape).items():
        if square := two_by_two(runs):
            squares.append({"num_layers": depth, "lr": lr, **square})
    by = {(c["arm"], c["num_layers"]): c for c in cs}
    comps = []
    for depth in sorted({c["num_layers"] for c in cs}):
        for arm in dict.fromkeys(c["arm"] for c in cs):
            base = _baseline(arm)
            if base and (arm, depth) in by and (base, depth) in by:
                shape = by[(arm, depth)]["cell"].split("-")[0]  # "L18", "E18D6"
                label = f"{shape}: {arm} − {base}"
                comps.append(compare(by[(arm, depth)], by[(base, depth)], label))
    return {"cells": cs, "comparisons": comps, "two_by_two": squares}


def _baseline(arm: str) -> str | None:
    """The arm an arm is compared with: Pre-LN (same suffix) for post/admin, the arm without
    DLCL for a +dlcl arm."""
    if arm.endswith("+dlcl"):
        return arm[: -len("+dlcl")]
    for family in ("post", "admin"):
        if arm.startswith(family):
            return "pre" + arm[len(family) :]
    return None


def depth_table(summary: dict[str, Any], deep_encoder: bool = False) -> str:
    """Markdown: a row per (arm, depth), the comparisons, and Liu et al.'s Table 2."""
    title = "Deep-encoder study" if deep_encoder else "Translation depth study"
    cs = sorted(summary["cells"], key=lambda c: (c["num_layers"], c["arm"]))
    lines = [f"{title} (final BLEU: mean ± std [95% t-interval] (seeds)):", ""]
    lines += _cell_rows(cs, "run cell")
    lines += _comparison_rows(summary["comparisons"])
    lines += monitor_rows(cs)
    for sq in summary.get("two_by_two", []):
        title = f"Placement × warm-up, {sq['num_layers']} layers, lr {sq['lr']:g}"
        lines += ["", two_by_two_table(sq, title)]
    if not deep_encoder:
        lines += ["", "Liu et al. Table 2 (WMT14 En-De, BLEU): " + "; ".join(
            f"{arm} " + ", ".join(f"{d}L {v}" for d, v in row.items())
            for arm, row in LIU_TABLE2.items()
        )]  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots


def line_styles(cs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """{cell: matplotlib line style}: cells that share an arm's colour are told apart by
    style: the highest rate, the shallowest stack and no DLCL solid, then dashed, dotted."""

    def variant(c):
        return (-(c.get("lr") or 0), c.get("num_layers") or 0, c["arm"].endswith("+dlcl"))

    order = sorted({variant(c) for c in cs})
    styles = ("-", "--", ":", "-.")
    return {c["cell"]: styles[order.index(variant(c)) % len(styles)] for c in cs}


def _colour(c: dict[str, Any], i: int) -> str:
    return arm_colour(c["arm"].replace("+dlcl", ""), i)


def bleu_figure(cs: Sequence[dict[str, Any]], title: str):
    """Mean BLEU (left) and validation NLL (right) by step, a line per cell."""
    fig, axes = new_figure(2, width=6.0, height=4.5)
    styles = line_styles(cs)
    for i, c in enumerate(cs):
        for ax, key in zip(axes, ("bleu_curve", "loss_curve"), strict=True):
            pts = c[key]
            if pts:
                ax.plot(*zip(*pts, strict=True), styles[c["cell"]], color=_colour(c, i),
                        label=c["cell"], lw=1.2)  # fmt: skip
    axes[0].set_ylabel("validation BLEU")
    axes[1].set_ylabel("validation NLL (nats/token)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.suptitle(title)
    return fig


MONITOR_PANELS = (
    ("collapse/encoder", "encoder output collapse (mean cosine)"),
    ("collapse/decoder", "decoder output collapse (mean cosine)"),
    ("grad/encoder", "largest encoder sub-layer grad norm"),
    ("grad/decoder", "largest decoder sub-layer grad norm"),
    ("cross_entropy", "decoder cross-attention entropy (nats, mean over layers)"),
)
OMEGA_PANEL, LEGEND_PANEL = 5, 6


def monitor_figure(cs: Sequence[dict[str, Any]], title: str):
    """The monitor's traces by step, a line per cell (mean over seeds), on a 4 × 2 grid: the
    collapse of each stack's output, the largest sub-layer gradient norm of each stack (log
    scale), the decoder's cross-attention entropy, Admin's omega per residual branch
    (profiled: circles, at the end: crosses), and the legend."""
    fig, grid = new_figure(4, 2, width=4.2, height=3.3)
    axes = grid.ravel()
    omega_ax = axes[OMEGA_PANEL]
    styles = line_styles(cs)
    for i, c in enumerate(cs):
        for ax, (key, _) in zip(axes, MONITOR_PANELS, strict=False):
            if pts := c["traces"][key]:
                ax.plot(*zip(*pts, strict=True), styles[c["cell"]], color=_colour(c, i),
                        label=c["cell"], lw=1.1)  # fmt: skip
        offset = 0
        for stack in STACKS:
            omega = np.asarray(c["traces"][f"omega/{stack}"]).reshape(-1, 2)
            x = offset + np.arange(len(omega))
            omega_ax.plot(x, omega[:, 0], "o", ms=3, color=_colour(c, i), mfc="none")
            omega_ax.plot(x, omega[:, 1], "x", ms=3, color=_colour(c, i), label=c["cell"])
            offset += len(omega)
    for ax, (key, label) in zip(axes, MONITOR_PANELS, strict=False):
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("step")
        ax.set_yscale("log" if key.startswith("grad/") else "linear")
    omega_ax.set_title("Admin ω by residual branch (encoder, then decoder)", fontsize=8)
    omega_ax.set_xlabel("branch (layer-major)")
    if not any(c["traces"][f"omega/{k}"] for c in cs for k in STACKS):
        omega_ax.axis("off")
        omega_ax.text(0.5, 0.5, "no Admin arm", ha="center", transform=omega_ax.transAxes)
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in axes[LEGEND_PANEL:]:
        ax.axis("off")
    axes[LEGEND_PANEL].legend(*axes[0].get_legend_handles_labels(), loc="center", fontsize=7)
    fig.suptitle(title)
    return fig


def plot(cs: Sequence[dict[str, Any]], title: str, path: str) -> str:
    return save_figure(bleu_figure(cs, title), path)


def plot_monitor(cs: Sequence[dict[str, Any]], title: str, path: str) -> str:
    return save_figure(monitor_figure(cs, title), path)
