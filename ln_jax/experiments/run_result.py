"""A run's result, read from its metrics.jsonl: the validation curve, divergence, wall time,
a translation run's BLEU and traces, and the task's own result (`Task.run_result`).

`summarize_run` makes what `ln_jax.experiments.runner` stores in OUT/runs/NAME/result.json (and
re-makes when it collects a grid); `steps_to_target`, `diverged` and `stuck` judge a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ln_jax.results import read_metrics

# A run whose last train losses sit above its first one has diverged (Xiong et al.'s "fails").
TAIL = 5
# The monitor's rank-collapse measure of the encoder output (ln_jax/train/monitor.py).
COLLAPSE = "collapse/output"
# A translation run's evaluation: BLEU, and the validation loss its curve holds (the NLL per
# target token, without label smoothing: log of the perplexity).
BLEU = "bleu"
MT_LOSS = "nll_loss"
# The monitor's measures kept in a translation run's result (prefixes of metrics.jsonl names).
MT_TRACES = ("collapse/", "grad_norm", "omega/", "attention_entropy/")
# A translation run that ends less than this far below the corpus's unigram plateau (nats per
# target token, `plateau.translation_plateau`), or above it, is "stuck": it has learnt no more
# than the target language's token frequencies (fixed before the issue-64 studies ran).
STUCK_MARGIN = 0.1
# The names a translation run's result had before issue 64 (BERT's), and its own names now.
MT_RENAMED = {"final_eval_mlm_loss": "final_nll", "best_eval_mlm_loss": "best_nll"}
# A translation run's own fields in the overrides it recorded before 2026-12-05, and now.
MT_MOVED = ("task_options.", "translation.")
RECORD_KEYS = ("step", "split", "time")  # what every metrics.jsonl record carries


def training_seconds(records: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """step -> wall-clock seconds of training up to that record.

    Sums the gaps between consecutive records; a gap over 10x the median (the run was stopped
    and resumed later) counts as one median gap instead.
    """
    timed = sorted(((r["step"], r["time"]) for r in records if "time" in r), key=lambda x: x[1])
    if not timed:
        return {}
    gaps = np.diff([t for _, t in timed])
    cap = 10 * float(np.median(gaps)) if len(gaps) else 0.0
    elapsed, out = 0.0, {timed[0][0]: 0.0}
    for (step, _), gap in zip(timed[1:], gaps, strict=True):
        elapsed += gap if gap <= cap else float(np.median(gaps))
        out[step] = elapsed
    return out


def curve(records: Sequence[Mapping[str, Any]], split: str, key: str) -> list[list[float]]:
    """[[step, value, seconds], ...] of one metric of one split."""
    seconds = training_seconds(records)
    return [
        [r["step"], float(r[key]), seconds.get(r["step"], math.nan)]
        for r in records
        if r["split"] == split and key in r
    ]


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


def diverged(train: Sequence[Sequence[float]], error: str | None) -> tuple[bool, str]:
    """Whether a run diverged: a non-finite loss, or its last train losses above its first."""
    if error:
        return True, error
    losses = [v for _, v, _ in train]
    if not losses:
        return False, ""
    if not all(_finite(v) for v in losses):
        return True, "non-finite training loss"
    tail = float(np.mean(losses[-TAIL:]))
    if tail > losses[0]:
        return True, f"final train loss {tail:.3f} above the first {losses[0]:.3f}"
    return False, ""


def summarize_run(
    spec: Any, workdir: str, error: str | None, plateau: float | None
) -> dict[str, Any]:
    """A run's result: final/best validation loss, curves, divergence, wall time, and the
    collapse measure's curve when the monitor logged it (`monitor.every` > 0).

    The validation loss is BERT's MLM loss ("final_eval_mlm_loss"); a translation run, which
    logs no MLM loss, names its validation NLL per target token "final_nll" / "best_nll" and
    adds BLEU, "stuck" and the monitor's traces (`translation_fields`); a task with a result
    of its own (`task_result`: fine-tuning's dev scores) and no validation loss gets no loss
    fields."""
    records = read_metrics(workdir)
    train = curve(records, "train", "loss")
    evals = curve(records, "eval", "mlm_loss")
    translation = not evals and any(r["split"] == "eval" and BLEU in r for r in records)
    if translation:
        evals = curve(records, "eval", MT_LOSS)
    collapse = curve(records, "monitor", COLLAPSE)
    finite_evals = [v for _, v, _ in evals if _finite(v)]
    is_diverged, reason = diverged(train, error)
    final = evals[-1][1] if evals else math.nan
    names = MT_RENAMED if translation else {k: k for k in MT_RENAMED}
    own = task_result(records)
    losses = {
        names["final_eval_mlm_loss"]: final,
        names["best_eval_mlm_loss"]: min(finite_evals) if finite_evals else math.nan,
    }
    return {
        **spec.to_dict(),
        **({} if own and not evals else losses),
        "first_train_loss": train[0][1] if train else math.nan,
        "diverged": is_diverged,
        "diverged_reason": reason,
        "below_plateau": bool(plateau is not None and _finite(final) and final < plateau),
        "steps": train[-1][0] if train else 0,
        "wall_s": train[-1][2] if train else 0.0,
        "eval_curve": evals,
        "train_curve": train,
        "collapse_curve": collapse,
        **(translation_fields(records) if translation else {}),
        **({"stuck": stuck(final, is_diverged, plateau)} if translation else {}),
        **own,
    }


def task_result(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"task_result": the run's "result" record} for a task that writes one (`Task.run_result`,
    after its last step: fine-tuning's best and last dev scores), without its step, split and
    time; {} for the others."""
    done = [r for r in records if r["split"] == "result"]
    if not done:
        return {}
    return {"task_result": {k: v for k, v in done[-1].items() if k not in RECORD_KEYS}}


def stuck(final_nll: float, is_diverged: bool, plateau: float | None) -> bool | None:
    """Whether a translation run that did not diverge ends within `STUCK_MARGIN` of the unigram
    plateau or above it (None when the plateau is unknown)."""
    if plateau is None:
        return None
    return bool(not is_diverged and _finite(final_nll) and final_nll > plateau - STUCK_MARGIN)


def task_named(result: dict[str, Any]) -> dict[str, Any]:
    """A stored result with a translation run's metrics under their own names (a result
    written before issue 64 called the validation NLL "final_eval_mlm_loss"; "final_eval_loss"
    repeated it) and its overrides under the config's names (before 2026-12-05 translation's
    fields were "task_options.FIELD", now "translation.FIELD")."""
    if "bleu_curve" not in result:
        return result
    out = {MT_RENAMED.get(k, k): v for k, v in result.items() if k != "final_eval_loss"}
    out.setdefault("final_nll", result.get("final_eval_loss", math.nan))
    if "overrides" in out:
        old, new = MT_MOVED
        out["overrides"] = {
            new + k[len(old) :] if k.startswith(old) else k: v for k, v in out["overrides"].items()
        }
    return out


def translation_fields(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A translation run's own summary: its BLEU curve [[step, bleu, seconds], ...], final and
    best BLEU, and the
    monitor's traces `MT_TRACES` ({name: [[step, value], ...]}: collapse, per-layer gradient
    norms of both stacks, Admin's omega, attention entropies), so that a failing run's
    mechanism is in its result."""
    bleu = curve(records, "eval", BLEU)
    finite = [v for _, v, _ in bleu if _finite(v)]
    traces: dict[str, list[list[float]]] = {}
    for r in records:
        if r["split"] != "monitor":
            continue
        for key, value in r.items():
            if key.startswith(MT_TRACES) and isinstance(value, (int, float)):
                traces.setdefault(key, []).append([r["step"], float(value)])
    return {
        "bleu_curve": bleu,
        "final_bleu": bleu[-1][1] if bleu else math.nan,
        "best_bleu": max(finite) if finite else math.nan,
        "monitor_traces": traces,
    }


def steps_to_target(
    evals: Sequence[Sequence[float]], target: float, higher: bool = False
) -> float | None:
    """The first step at which the validation loss reaches `target` (falls to it; with
    `higher`, a score such as BLEU that rises to it).

    Linear interpolation between the two evaluations that bracket the first crossing (the loss
    is only known at evaluations); None if it never gets there.
    """
    prev = None
    for step, loss, _ in evals:
        if _finite(loss) and (loss >= target if higher else loss <= target):
            if prev is None or prev[1] == loss:
                return float(step)
            s0, l0 = prev
            return float(s0 + (l0 - target) / (l0 - loss) * (step - s0))
        prev = (step, loss) if _finite(loss) else None
    return None
