"""Replays recorded runs through the early-warning rules, to calibrate them on real outcomes.

  python -m ln_jax.train.warning_replay docs/results/studies ../shared/gpu/2026-11-26-h200 \\
      [--monitor collapse=0.9 --monitor collapse_steps=200 ...] [--sweep collapse=0.9,0.99]

A recorded run is either a study run (`docs/results/studies/STUDY/runs/NAME/result.json`: its train
loss curve, its collapse curve of the encoder output, its validation curve and its outcome) or a
trainer's records (a `metrics.jsonl` file, or a workdir or folder holding one or
`train_metrics.jsonl`: "train" and "monitor" records). Each run's steps are fed, in order, to
the same `EarlyWarning` the trainer runs, with the values the trainer gives it (the train
metrics of a logged step with that step's monitor measurements). A folder is searched for
runs below it.

Outcome of a run: "diverged" (the study's verdict, or a non-finite train loss), "stalled" (a
study run whose final validation loss is not below the unigram plateau), else "trained". The
step at which a failure **shows in the loss**: for a diverged run, its first non-finite (or
its last) train loss; for a stalled run, the first evaluation at which its validation loss is
above the plateau - `MARGIN` and fell by less than `STALL_DROP` nats over the `STALL_SPAN`
steps before it (what one run's own curve says, without other runs to compare with). The
lead time of a warning: that step minus the first warning's step.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ln_jax.config.run import MonitorConfig
from ln_jax.train.early_warning import Alert, EarlyWarning

STALL_SPAN = 200  # steps over which a stalled validation loss fell by less than STALL_DROP
STALL_DROP = 0.05  # nats
MARGIN = 0.1  # nats below the plateau that count as having left it (the studies' tables)
METRICS_NAMES = ("metrics.jsonl", "train_metrics.jsonl")
SKIP_FIELDS = ("step", "split", "time", "steps_per_s", "tokens_per_s")
__all__ = ["Recorded", "Replay", "find_runs", "load_run", "main", "replay", "sweep", "table"]


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One recorded run: its `name`, `steps` ([(step, values)] in order, as the trainer gives
    them to `EarlyWarning.check`), its `outcome` and the step its failure shows in the loss
    (`failure_step`, None for a run that trained)."""

    name: str
    steps: list[tuple[int, dict[str, float]]]
    outcome: str
    failure_step: int | None

    @property
    def failed(self) -> bool:
        return self.outcome != "trained"


@dataclasses.dataclass(frozen=True)
class Replay:
    """The alerts a recorded run gives under one `MonitorConfig`."""

    run: Recorded
    alerts: list[Alert]

    @property
    def warnings(self) -> list[Alert]:
        return [a for a in self.alerts if _level(a) == "warning"]

    @property
    def notes(self) -> list[Alert]:
        return [a for a in self.alerts if _level(a) == "note"]

    @property
    def first_warning(self) -> Alert | None:
        return self.warnings[0] if self.warnings else None

    @property
    def lead_time(self) -> int | None:
        """Steps from the first warning to the failure showing in the loss (> 0: before)."""
        if self.first_warning is None or self.run.failure_step is None:
            return None
        return self.run.failure_step - self.first_warning.step

    @property
    def correct(self) -> bool:
        """Warned if and only if the run failed."""
        return (self.first_warning is not None) == self.run.failed


def _level(alert: Alert) -> str:
    """The alert's level; "warning" for the alerts of rules that had no levels."""
    return getattr(alert, "level", "warning")


def replay(run: Recorded, cfg: MonitorConfig, rules: type = EarlyWarning) -> Replay:
    """Feeds the run's steps, in order, to a fresh `EarlyWarning` (the trainer's code; `rules`:
    another class with its `check`, e.g. an earlier version's, to compare)."""
    watcher = rules(cfg)
    alerts = [a for step, values in run.steps for a in watcher.check(step, values)]
    return Replay(run, alerts)


# --------------------------------------------------------------------------- reading runs


def _number(value: Any) -> float:
    """A recorded number; null (a non-finite value written as JSON) is NaN."""
    return float("nan") if value is None else float(value)


def _study_steps(result: dict[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """A study run's train losses with its monitor measurements merged in at the steps they
    were measured: a BERT study's collapse of the encoder output (`collapse_curve`), a
    translation study's every trace (`monitor_traces`: per-layer collapse and gradient norms of
    both stacks, under the names the trainer gives `EarlyWarning`)."""
    steps: dict[int, dict[str, float]] = {}
    for step, loss, *_ in result.get("train_curve") or []:
        steps.setdefault(int(step), {})["loss"] = _number(loss)
    for step, value, *_ in result.get("collapse_curve") or []:
        steps.setdefault(int(step), {})["collapse/output"] = _number(value)
    for name, trace in (result.get("monitor_traces") or {}).items():
        for step, value, *_ in trace:
            steps.setdefault(int(step), {})[name] = _number(value)
    return sorted(steps.items())


def _not_below(result: dict[str, Any]) -> bool:
    """Whether a study run ended on its plateau: a translation run's "stuck" (within the
    studies' margin of the unigram plateau, `runner.stuck`), a BERT run's not `below_plateau`."""
    if result.get("stuck") is not None:
        return bool(result["stuck"])
    return not result.get("below_plateau", True)


def stall_step(evals: Sequence[tuple[int, float]], plateau: float) -> int | None:
    """The first evaluation at which the validation loss is above the plateau - MARGIN and
    fell by less than STALL_DROP over the STALL_SPAN steps before it (None: never)."""
    for step, loss in evals:
        earlier = [v for s, v in evals if s <= step - STALL_SPAN]
        if earlier and loss > plateau - MARGIN and earlier[-1] - loss < STALL_DROP:
            return step
    return None


def _divergence_step(steps: list[tuple[int, dict[str, float]]]) -> int:
    """The first non-finite train loss, else the last one (a loss ending above its start)."""
    losses = [(s, v["loss"]) for s, v in steps if "loss" in v]
    bad = [s for s, loss in losses if not math.isfinite(loss)]
    return bad[0] if bad else losses[-1][0]


def load_study_run(path: Path, plateau: float | None) -> Recorded:
    """A study run from its result.json; `plateau`: its study's unigram plateau."""
    result = json.loads(path.read_text())
    steps = _study_steps(result)
    name = f"{path.parent.parent.parent.name}/{result['name']}"
    if result.get("diverged"):
        return Recorded(name, steps, "diverged", _divergence_step(steps))
    if plateau is not None and _not_below(result):
        evals = [(int(s), _number(v)) for s, v, *_ in result.get("eval_curve") or []]
        return Recorded(name, steps, "stalled", stall_step(evals, plateau))
    return Recorded(name, steps, "trained", None)


def load_metrics(path: Path, name: str | None = None) -> Recorded:
    """A trainer's run from its metrics.jsonl: each "train" record with the "monitor" record
    of the same step."""
    steps: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("split") in ("train", "monitor"):
            values = steps.setdefault(int(record["step"]), {})
            values.update({k: _number(v) for k, v in record.items() if _is_value(k, v)})
    ordered = sorted(steps.items())
    losses = [v["loss"] for _, v in ordered if "loss" in v]
    if not losses:
        raise ValueError(f"{path} holds no train records with a loss: is it a run's metrics?")
    diverged = not all(map(math.isfinite, losses)) or losses[-1] > losses[0]
    name = name or path.parent.name
    if diverged:
        return Recorded(name, ordered, "diverged", _divergence_step(ordered))
    return Recorded(name, ordered, "trained", None)


def _is_value(key: str, value: Any) -> bool:
    return key not in SKIP_FIELDS and (value is None or isinstance(value, (int, float)))


def _plateau(study: Path) -> float | None:
    results = study / "results.json"
    return json.loads(results.read_text()).get("plateau") if results.exists() else None


def load_run(path: Path) -> Recorded:
    """A study run's result.json, or a metrics file (metrics.jsonl, train_metrics.jsonl)."""
    if path.name == "result.json":
        return load_study_run(path, _plateau(path.parent.parent.parent))
    return load_metrics(path, name=path.parent.name)


def find_runs(paths: Iterable[str]) -> list[Path]:
    """The recorded runs at or below each path (a file, a run, a study, a folder of studies),
    in path order."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise FileNotFoundError(
                f"{given} does not exist: give a study folder, a run or a metrics.jsonl"
            )
        if path.is_file():
            found.append(path)
            continue
        below = [p for p in sorted(path.rglob("*")) if _is_run_file(p)]
        if not below:
            raise FileNotFoundError(
                f"{given} holds no recorded run (result.json under runs/, or metrics.jsonl)"
            )
        found += below
    return found


def _is_run_file(path: Path) -> bool:
    if path.name == "result.json":
        return path.parent.parent.name == "runs"
    return path.name in METRICS_NAMES


# --------------------------------------------------------------------------- reports


def _lead(replay: Replay) -> str:
    lead = replay.lead_time
    if lead is None:
        return "—"
    return f"{lead} before" if lead > 0 else ("at it" if lead == 0 else f"{-lead} after")


def table(replays: Sequence[Replay]) -> str:
    """A markdown table: run, outcome, the step its failure shows, warned (first warning's step
    and rule), lead time, notes (count, first step)."""
    lines = [
        "| run | outcome | failure shows in the loss at | warned? | first warning | lead time "
        "| notes (first at) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in replays:
        first = r.first_warning
        warned = f"step {first.step} ({first.rule})" if first else "—"
        notes = f"{len(r.notes)} ({r.notes[0].step})" if r.notes else "0"
        shows = "—" if r.run.failure_step is None else f"step {r.run.failure_step}"
        ok = "yes" if first else "no"
        if not r.correct:
            ok += " (wrong)"
        lines.append(
            f"| {r.run.name} | {r.run.outcome} | {shows} | {ok} | {warned} | {_lead(r)} | {notes} |"
        )
    return "\n".join(lines)


def summary(replays: Sequence[Replay]) -> dict[str, Any]:
    """Counts: failed runs warned, recovered runs warned, and the failed runs' lead times."""
    failed = [r for r in replays if r.run.failed]
    trained = [r for r in replays if not r.run.failed]
    return {
        "failed_warned": sum(r.first_warning is not None for r in failed),
        "failed": len(failed),
        "trained_warned": sum(r.first_warning is not None for r in trained),
        "trained": len(trained),
        "lead_times": [r.lead_time for r in failed if r.lead_time is not None],
    }


def sweep(runs: Sequence[Recorded], base: MonitorConfig, grid: dict[str, list]) -> str:
    """A markdown table of `summary` for every combination of the grid's values."""
    keys = list(grid)
    lines = [
        "| " + " | ".join(keys) + " | failed runs warned | recovered runs warned | lead times |",
        "|" + "---|" * (len(keys) + 3),
    ]
    for combo in itertools.product(*grid.values()):
        cfg = dataclasses.replace(base, **dict(zip(keys, combo, strict=True)))
        s = summary([replay(run, cfg) for run in runs])
        leads = ", ".join(map(str, s["lead_times"])) or "—"
        lines.append(
            "| " + " | ".join(map(str, combo)) + f" | {s['failed_warned']}/{s['failed']} "
            f"| {s['trained_warned']}/{s['trained']} | {leads} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def _field(text: str) -> tuple[str, list[Any]]:
    """ "name=v1,v2" -> ("name", [typed values]) for a MonitorConfig field."""
    name, sep, values = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(MonitorConfig)}
    if not sep or name not in fields or name == "every":
        raise ValueError(
            f"{text!r}: give FIELD=VALUE with a rule field of MonitorConfig "
            f"({', '.join(n for n in fields if n != 'every')})"
        )
    kind = type(getattr(MonitorConfig(), name))
    parse = (lambda v: v.lower() in ("1", "true")) if kind is bool else kind
    try:
        return name, [parse(v) for v in values.split(",")]
    except ValueError:
        raise ValueError(f"{text!r}: {name} takes {kind.__name__} values") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ln_jax.train.warning_replay",
        description="Replay recorded runs through the early-warning rules (MonitorConfig's "
        "defaults unless --monitor is given) and print the table: run, outcome, warned, step, "
        "lead time.",
        epilog="example: python -m ln_jax.train.warning_replay docs/results/studies "
        "../shared/gpu/2026-11-26-h200 --sweep collapse=0.9,0.95,0.99 --sweep "
        "collapse_steps=100,200",
    )
    parser.add_argument("paths", nargs="+", help="study folders, runs, or metrics.jsonl files")
    parser.add_argument(
        "--monitor",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a MonitorConfig field for the replay (repeatable)",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="print the summary over these values instead (repeatable)",
    )
    parser.add_argument(
        "--only_failed_and_mixed",
        action="store_true",
        help="list only the failed runs and those with a wrong verdict",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        base = dict(_field(t) for t in args.monitor)
        cfg = MonitorConfig(**{k: v[0] for k, v in base.items()})
        grid = dict(_field(t) for t in args.sweep)
        runs = [load_run(p) for p in find_runs(args.paths)]
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if grid:
        print(sweep(runs, cfg, grid))
        return 0
    replays = [replay(run, cfg) for run in runs]
    if args.only_failed_and_mixed:
        replays = [r for r in replays if r.run.failed or not r.correct]
    print(table(replays))
    s = summary([replay(run, cfg) for run in runs])
    print(
        f"\nfailed runs warned: {s['failed_warned']}/{s['failed']}; "
        f"recovered runs warned: {s['trained_warned']}/{s['trained']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
