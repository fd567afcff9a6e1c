"""Steps to several target losses, the best cell of each arm, and the Pre-LN / Post-LN step ratio
with a bootstrap confidence interval (the warm-up study's key result; Xiong et al.: 0.71).

Targets sit below the unigram plateau by fixed offsets (0.3, 0.6, 1.0 nats by default), so they
measure progress past the plateau rather than the escape from it alone. A cell is one grid
setting (arm, learning rate, warm-up) pooled over its seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ln_jax.experiments.runner import steps_to_target

OFFSETS = (0.3, 0.6, 1.0)  # nats below the unigram plateau
XIONG_RATIO = 0.71  # Pre-LN at 500k updates ~ Post-LN at 700k (Xiong et al. 2020, BERT)
N_BOOT = 2000
BOOT_SEED = 0

Result = dict[str, Any]


def target_losses(
    plateau: float, offsets: Sequence[float] = OFFSETS, given: float | None = None
) -> list[tuple[str, float]]:
    """[(label, loss), ...]: plateau - offset for each offset ("plateau-0.3", ...), then the
    `given` absolute target if any ("given")."""
    out = [(f"plateau-{o:g}", plateau - o) for o in offsets]
    return out + ([("given", float(given))] if given is not None else [])


def run_steps(result: Result, targets: Sequence[tuple[str, float]]) -> dict[str, float | None]:
    """{label: the step at which the run's validation curve reaches that loss (interpolated
    between evaluations), or None}; a diverged run reaches nothing after its divergence."""
    return {label: steps_to_target(result["eval_curve"], loss) for label, loss in targets}


def mean_reached(steps: Sequence[float | None]) -> float | None:
    """The mean of the steps of the seeds that reached a target (None if none did)."""
    hit = [s for s in steps if s is not None]
    return float(np.mean(hit)) if hit else None


def best_cell(cells: Sequence[dict[str, Any]], middle: str) -> dict[str, Any] | None:
    """The best of one arm's cells (its learning rates / warm-ups), judged on the sweep seeds.

    "Best" = the fewest mean steps to the `middle` target among the cells none of whose sweep
    seeds diverged and all of which reached it; if no cell qualifies, the lowest mean final
    validation loss among the cells without a diverged seed; None if every cell diverged.
    """
    ok = [c for c in cells if not c["sweep_diverged"]]
    reached = [c for c in ok if all(s is not None for s in c["sweep_steps"][middle])]
    if reached:
        return min(reached, key=lambda c: (float(np.mean(c["sweep_steps"][middle])), c["cell"]))
    finite = [c for c in ok if math.isfinite(c["sweep_final"])]
    return min(finite, key=lambda c: (c["sweep_final"], c["cell"])) if finite else None


def bootstrap_ratio(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> dict[str, Any]:
    """mean(a) / mean(b) and its 95% percentile-bootstrap interval, resampling the seeds of a and
    of b independently (numpy, fixed `seed`).

    Args:
      a, b: [n_a], [n_b] steps to a target, one per seed (at least one each).

    Returns:
      {"ratio", "lo", "hi", "n_a", "n_b"}; lo = hi = ratio when both have one seed.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_ratio needs at least one value on each side.")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, (n_boot, a.size))
    ib = rng.integers(0, b.size, (n_boot, b.size))
    boot = a[ia].mean(1) / b[ib].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    ratio = float(a.mean() / b.mean())
    return {"ratio": ratio, "lo": float(lo), "hi": float(hi), "n_a": a.size, "n_b": b.size}


def key_ratios(
    pre: dict[str, Any] | None, post: dict[str, Any] | None, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Per target: steps(Pre-LN) / steps(Post-LN) over every seed of the two chosen cells that
    reached it, with its bootstrap interval and whether the interval holds Xiong's 0.71.

    A seed that never reached the target is left out and counted ("pre_missing"), so a ratio
    over fewer seeds than the cell has is visible as such.
    """
    rows = []
    for label in labels:
        row: dict[str, Any] = {"target": label, "ratio": None}
        if pre and post:
            a = [s for s in pre["steps"][label] if s is not None]
            b = [s for s in post["steps"][label] if s is not None]
            row["pre_missing"] = len(pre["steps"][label]) - len(a)
            row["post_missing"] = len(post["steps"][label]) - len(b)
            if a and b:
                row.update(bootstrap_ratio(a, b))
                row["holds_xiong"] = bool(row["lo"] <= XIONG_RATIO <= row["hi"])
        rows.append(row)
    return rows
