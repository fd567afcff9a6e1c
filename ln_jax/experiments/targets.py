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


def paired_bootstrap_ratio(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> dict[str, Any]:
    """mean(a) / mean(b) and its 95% percentile-bootstrap interval, resampling seeds as pairs.

    For two cells that share each seed's data order and initialisation key: a slow seed is slow
    for both, and resampling the pairs keeps that shared part out of the interval (resampling
    each side on its own, as `bootstrap_ratio` does, counts it twice).

    Args:
      a, b: [n] steps to a target, a[i] and b[i] from the same seed (n >= 1).

    Returns:
      {"ratio", "lo", "hi", "n"}; lo = hi = ratio for one pair.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0 or a.shape != b.shape:
        raise ValueError(
            f"paired_bootstrap_ratio needs two equally long, non-empty lists (got {a.size} and "
            f"{b.size}); pair the seeds first."
        )
    idx = np.random.default_rng(seed).integers(0, a.size, (n_boot, a.size))
    boot = a[idx].mean(1) / b[idx].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"ratio": float(a.mean() / b.mean()), "lo": float(lo), "hi": float(hi), "n": a.size}


def paired_steps(
    pre: dict[str, Any], post: dict[str, Any], label: str
) -> tuple[list[float], list[float]]:
    """The steps to `label` of the seeds that both cells ran and both reached it, in seed order
    (cells carry "seeds" beside "steps", one entry per run)."""
    a = dict(zip(pre.get("seeds", []), pre["steps"][label], strict=True))
    b = dict(zip(post.get("seeds", []), post["steps"][label], strict=True))
    common = sorted(s for s in a.keys() & b.keys() if a[s] is not None and b[s] is not None)
    return [a[s] for s in common], [b[s] for s in common]


def key_ratios(
    pre: dict[str, Any] | None, post: dict[str, Any] | None, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Per target: steps(Pre-LN) / steps(Post-LN) over every seed of the two chosen cells that
    reached it, with its bootstrap interval and whether the interval holds Xiong's 0.71.

    A seed that never reached the target is left out and counted ("pre_missing"), so a ratio
    over fewer seeds than the cell has is visible as such. "paired" is the same ratio over the
    seeds both cells reached it with, its interval from resampling seeds as pairs
    (`paired_bootstrap_ratio`), or None when no seed is shared.
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
                pa, pb = paired_steps(pre, post, label)
                row["paired"] = paired_bootstrap_ratio(pa, pb) if pa else None
                if row["paired"]:
                    p = row["paired"]
                    p["holds_xiong"] = bool(p["lo"] <= XIONG_RATIO <= p["hi"])
        rows.append(row)
    return rows


def bootstrap_diff(
    a: Sequence[float],
    b: Sequence[float],
    *,
    paired: bool = True,
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
) -> dict[str, Any]:
    """mean(a) - mean(b) (e.g. final BLEU of two cells) and its 95% percentile-bootstrap
    interval: seeds resampled as pairs (`paired`, a[i] and b[i] from the same seed, which the
    cells share data order and initialisation key with) or each side on its own.

    Returns:
      {"diff", "lo", "hi", "n_a", "n_b", "paired"}; lo = hi = diff with one seed a side.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0 or b.size == 0 or (paired and a.shape != b.shape):
        raise ValueError(
            f"bootstrap_diff needs non-empty lists (equally long when paired); got {a.size} "
            f"and {b.size}."
        )
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, (n_boot, a.size))
    ib = ia if paired else rng.integers(0, b.size, (n_boot, b.size))
    boot = a[ia].mean(1) - b[ib].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    diff = float(a.mean() - b.mean())
    return {"diff": diff, "lo": float(lo), "hi": float(hi), "n_a": a.size, "n_b": b.size,
            "paired": paired}  # fmt: skip


def bootstrap_mean(values: Sequence[float], *, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean, lo, hi): the mean of `values` (one per seed) and its 95% percentile-bootstrap
    interval (lo = hi = mean for a single value)."""
    v = np.asarray(values, np.float64)
    if v.size == 0:
        raise ValueError("bootstrap_mean needs at least one value.")
    idx = np.random.default_rng(seed).integers(0, v.size, (n_boot, v.size))
    lo, hi = np.percentile(v[idx].mean(1), [2.5, 97.5])
    return float(v.mean()), float(lo), float(hi)
