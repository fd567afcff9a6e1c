"""Xiong et al.'s Fig. 2 as a 2 x 2 (issue 64): placement (Post-LN, Pre-LN) x warm-up (none,
some) over the seeds the four cells share, read at one step of finished translation runs.

Warm-up's gain per placement and seed, NLL(no warm-up) - NLL(warm-up), and the
difference-in-differences DiD = Post-LN's gain - Pre-LN's, per seed, with its t-interval
(`targets.paired_t`): Xiong's thesis (Post-LN needs warm-up, Pre-LN does not) predicts DiD > 0;
warm-up acting only as learning-rate budget (under the inverse square root from step 1 the
no-warm-up arms get far less cumulative rate) predicts DiD <= 0. Used by the depth studies'
report (`report_mt.depth_summary`) and by `python -m ln_jax.experiments mt_2x2`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ln_jax.experiments import targets as targets_mod
from ln_jax.experiments.report import largest_spike

Result = dict[str, Any]

# Xiong Fig. 2 as a 2 x 2 (issue 64): placement x warm-up, the cells' (placement, warm-up > 0)
TWO_BY_TWO = (("post", False), ("post", True), ("pre", False), ("pre", True))
EARLY_STEPS = 500  # the largest train-loss rise is read over these first steps
# ... of the train loss averaged over windows of this many logged steps: one batch's loss moves
# by 0.3-0.8 nats with its length bucket alone (the issue-35 runs, logged every 20 steps)
RISE_WINDOW = 5


def placement_warmup(r: Result) -> tuple[str, bool] | None:
    """A run's (placement, whether it warms up), from its overrides; None for an arm with more
    than a placement and a warm-up (DLCL, qk_norm: `+dlcl`, `+qk`), which is no cell."""
    o = r["overrides"]
    if "+" in r["arm"] or o.get("model.dlcl") or o.get("model.qk_norm"):
        return None
    return o.get("model.placement", ""), int(o.get("optim.warmup_steps", 0) or 0) > 0


def _at(curve: Sequence[Sequence[float]], step: float) -> float:
    """The value a [[step, value, ...], ...] curve has at exactly `step` (NaN if none)."""
    return next((float(p[1]) for p in curve if p[0] == step), math.nan)


def _common_step(runs: Sequence[Result]) -> float | None:
    """The last step every run evaluated (its NLL) at, None if there is none."""
    steps = set.intersection(*({p[0] for p in r["eval_curve"]} for r in runs))
    return max(steps) if steps else None


def two_by_two(results: Sequence[Result], step: float | None = None) -> dict[str, Any] | None:
    """Placement x warm-up at one step, over the seeds all four cells ran (Xiong Fig. 2).

    Per cell and seed: the validation NLL and BLEU at `step` (default: the last step every run
    evaluated) and the largest rise of the train loss (averaged over `RISE_WINDOW` logged steps,
    `windowed`) over the first `EARLY_STEPS` steps. Warm-up's
    gain per placement and seed: NLL(no warm-up) - NLL(warm-up), BLEU(warm-up) - BLEU(no
    warm-up). The difference-in-differences DiD = Post-LN's gain - Pre-LN's, per seed, with
    its t-interval (`targets.paired_t`): Xiong's thesis (Post-LN needs warm-up, Pre-LN does
    not) predicts DiD > 0; warm-up acting only as learning-rate budget predicts DiD <= 0.

    Returns:
      None unless all four cells have a run on a shared seed; else {"step", "seeds",
      "cells": {"post/none": {"runs", "nll", "bleu", "early_rise"}, ...}, "gain": {placement:
      {"nll", "bleu"}}, "did": {"nll", "bleu"}} (gains and DiD are `paired_t` results).
    """
    by: dict[tuple[str, bool], dict[int, Result]] = {k: {} for k in TWO_BY_TWO}
    for r in results:
        key, seed = placement_warmup(r), r["tags"].get("seed", 0)
        if key in by and seed in by[key]:
            raise ValueError(
                f"2 x 2: runs {by[key][seed]['name']!r} and {r['name']!r} are both "
                f"{_two_name(key)} with seed {seed}; give one run per cell and seed (one rate, "
                "one depth)."
            )
        if key in by:
            by[key][seed] = r
    seeds = sorted(set.intersection(*(set(v) for v in by.values())))
    if not seeds:
        return None
    runs = [by[k][s] for k in TWO_BY_TWO for s in seeds]
    step = _common_step(runs) if step is None else step
    if step is None:
        return None
    cells = {}
    for key in TWO_BY_TWO:
        rs = [by[key][s] for s in seeds]
        early = [windowed([p for p in r["train_curve"] if p[0] <= EARLY_STEPS]) for r in rs]
        cells[_two_name(key)] = {
            "runs": [r["name"] for r in rs],
            "nll": [_at(r["eval_curve"], step) for r in rs],
            "bleu": [_at(r["bleu_curve"], step) for r in rs],
            "early_rise": [largest_spike(c) for c in early],
        }
    gain = {}
    for placement in ("post", "pre"):
        none, wu = cells[f"{placement}/none"], cells[f"{placement}/warmup"]
        gain[placement] = {
            "nll": targets_mod.paired_t(none["nll"], wu["nll"]),
            "bleu": targets_mod.paired_t(wu["bleu"], none["bleu"]),
        }
    did = {
        m: targets_mod.paired_t(gain["post"][m]["per_seed"], gain["pre"][m]["per_seed"])
        for m in ("nll", "bleu")
    }
    return {"step": step, "seeds": seeds, "cells": cells, "gain": gain, "did": did}


def windowed(curve: Sequence[Sequence[float]], k: int = RISE_WINDOW) -> list[list[float]]:
    """[[last step, mean value], ...] of consecutive windows of `k` points of a curve (a
    shorter last window kept)."""
    return [
        [curve[min(i + k, len(curve)) - 1][0], float(np.mean([p[1] for p in curve[i : i + k]]))]
        for i in range(0, len(curve), k)
    ]


def _two_name(key: tuple[str, bool]) -> str:
    return f"{key[0]}/{'warmup' if key[1] else 'none'}"


def _per_seed(values: Sequence[float], digits: int) -> str:
    return ", ".join("–" if not math.isfinite(v) else f"{v:.{digits}f}" for v in values)


def _diff(d: dict[str, Any] | None, digits: int = 2) -> str:
    return targets_mod.describe(d, digits)


def two_by_two_table(t: dict[str, Any] | None, title: str = "") -> str:
    """Markdown of `two_by_two`: NLL (BLEU) per seed in each cell, warm-up's gain per
    placement, the DiD, and the early train-loss rises."""
    if not t:
        return ""
    c = t["cells"]
    seeds = ", ".join(map(str, t["seeds"]))
    lines = [
        f"{title or 'Placement × warm-up'} at step {t['step']:g}, seeds {seeds}: validation NLL "
        "per seed (greedy BLEU per seed below it)",
        "",
        "| | no warm-up | warm-up | warm-up's gain, NLL none − warm-up | "
        "warm-up's gain, BLEU warm-up − none |",
        "|---|---|---|---|---|",
    ]
    for placement, label in (("post", "Post-LN"), ("pre", "Pre-LN")):
        none, wu, g = c[f"{placement}/none"], c[f"{placement}/warmup"], t["gain"][placement]
        lines.append(
            f"| {label} | {_per_seed(none['nll'], 3)} ({_per_seed(none['bleu'], 2)}) | "
            f"{_per_seed(wu['nll'], 3)} ({_per_seed(wu['bleu'], 2)}) | "
            f"{_diff(g['nll'], 3)} | {_diff(g['bleu'])} |"
        )
    d = t["did"]
    lines += [
        "",
        f"DiD (Post-LN's gain − Pre-LN's): NLL {_diff(d['nll'], 3)}; BLEU {_diff(d['bleu'])}. "
        "Xiong et al. predict DiD > 0 (Post-LN needs warm-up, Pre-LN does not); warm-up acting "
        "only as learning-rate budget predicts DiD ≤ 0.",
        "",
        f"Largest rise of the train loss (means of {RISE_WINDOW} logged steps) in the first "
        f"{EARLY_STEPS} steps (nats, per seed): "
        + "; ".join(f"{k} {_per_seed(v['early_rise'], 3)}" for k, v in c.items())
        + ".",
    ]
    return "\n".join(lines)
