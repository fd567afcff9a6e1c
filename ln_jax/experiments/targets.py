"""Steps to several target losses, the best cell of each arm, and the one interval method of
every comparison the studies report: a 95% t-interval on paired per-seed differences (or ratios),
with the sign count "k of n seeds" as the verdict below 5 seeds (`paired_t`, `describe`). The
warm-up study's key result is the Pre-LN / Post-LN step ratio (Xiong et al.: 0.71).

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
# Below this many seeds a comparison's verdict is its sign count ("3 of 3 seeds"): a 95%
# t-interval over 2-4 paired differences is wide, and a bootstrap over them is about their range.
MIN_SEEDS_FOR_INTERVAL = 5

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


def _t_interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of `values` and its two-sided 95% Student-t interval
    (lo = hi = mean for a single value)."""
    mean = float(values.mean())
    if values.size < 2:
        return mean, mean, mean
    from scipy import stats  # jax's own dependency

    half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    return mean, mean - float(half), mean + float(half)


def _pairs(a: Sequence[float], b: Sequence[float], what: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0 or a.shape != b.shape:
        raise ValueError(
            f"{what} needs two equally long, non-empty lists, a[i] and b[i] from the same seed "
            f"(got {a.size} and {b.size}); pair the seeds first."
        )
    return a, b


def paired_t(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """mean(a - b) over seeds and its 95% t-interval on the paired per-seed differences.

    The cells of a study share each seed's data order and initialisation key, so the seed's
    own luck cancels in a[i] - b[i]; the interval is the one-sample t-interval of those
    differences (n - 1 degrees of freedom). With fewer than `MIN_SEEDS_FOR_INTERVAL` seeds a
    verdict reads the sign count ("k of n seeds", `describe`), not the interval.

    Args:
      a, b: [n] per-seed values of two cells (final NLL, BLEU, ...), a[i] and b[i] from seed i.

    Returns:
      {"diff", "lo", "hi", "n", "above": seeds with a > b, "below": seeds with a < b,
       "per_seed": [a_i - b_i], "method": "t"}; lo = hi = diff for one pair.
    """
    a, b = _pairs(a, b, "paired_t")
    d = a - b
    mean, lo, hi = _t_interval(d)
    return {"diff": mean, "lo": lo, "hi": hi, "n": int(d.size), "above": int((d > 0).sum()),
            "below": int((d < 0).sum()), "per_seed": d.tolist(), "method": "t"}  # fmt: skip


def paired_t_ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The mean over seeds of a[i] / b[i] (steps to a target, Pre-LN over Post-LN) and its 95%
    t-interval on those per-seed ratios.

    Returns:
      {"ratio", "lo", "hi", "n", "below_one": seeds with a < b, "per_seed", "method": "t"}.
    """
    a, b = _pairs(a, b, "paired_t_ratio")
    r = a / b
    mean, lo, hi = _t_interval(r)
    return {"ratio": mean, "lo": lo, "hi": hi, "n": int(r.size), "below_one": int((r < 1).sum()),
            "per_seed": r.tolist(), "method": "t"}  # fmt: skip


def t_mean(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of per-seed `values` and its 95% t-interval."""
    v = np.asarray(values, np.float64)
    if v.size == 0:
        raise ValueError("t_mean needs at least one value.")
    return _t_interval(v)


def excludes(d: dict[str, Any], value: float = 0.0) -> bool:
    """Whether a comparison (`paired_t` / `paired_t_ratio`) is a verdict that `value` is not
    the truth: at least `MIN_SEEDS_FOR_INTERVAL` seeds and a 95% t-interval without it."""
    return d["n"] >= MIN_SEEDS_FOR_INTERVAL and not d["lo"] <= value <= d["hi"]


def describe(d: dict[str, Any] | None, digits: int = 2) -> str:
    """A paired difference as a table reads it: "+0.34 [−0.06, +0.73] t, 3 of 3 seeds > 0"
    ("(1 seed)" alone; below 5 seeds the sign count is the verdict, the interval is shown)."""
    if not d:
        return "–"
    if d["n"] < 2:
        return f"{d['diff']:+.{digits}f} (1 seed)"
    f = f"+.{digits}f"
    text = f"{d['diff']:{f}} [{d['lo']:{f}}, {d['hi']:{f}}] t"
    if d["n"] < MIN_SEEDS_FOR_INTERVAL:
        sign = ">" if d["above"] >= d["below"] else "<"
        k = max(d["above"], d["below"])
        return f"{text}, {k} of {d['n']} seeds {sign} 0"
    return text + (", excludes 0" if excludes(d) else ", includes 0")


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
    """Per target: steps(Pre-LN) / steps(Post-LN) of the two chosen cells, per seed over the
    seeds both ran and both reached the target with, their mean and its 95% t-interval
    (`paired_t_ratio`), and whether that interval holds Xiong's 0.71.

    A seed where either cell never reached the target is left out and counted
    ("pre_missing", "post_missing"), so a ratio over fewer seeds than the cells have shows.
    """
    rows = []
    for label in labels:
        row: dict[str, Any] = {"target": label, "ratio": None}
        if pre and post:
            row["pre_missing"] = sum(s is None for s in pre["steps"][label])
            row["post_missing"] = sum(s is None for s in post["steps"][label])
            pa, pb = paired_steps(pre, post, label)
            if pa:
                row.update(paired_t_ratio(pa, pb))
                row["holds_xiong"] = bool(row["lo"] <= XIONG_RATIO <= row["hi"])
        rows.append(row)
    return rows
