"""Grids of training runs: specs, resumable execution, per-run summaries.

A study is a list of `RunSpec`s, each a name plus dotted config overrides applied to one base
config. `run_grid` trains every run that has no result yet in `OUT/runs/NAME/result.json`
(a run cut off midway resumes from its own orbax checkpoint), optionally several at once in
subprocesses, and `collect` gathers the per-run results into `OUT/results.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ln_jax import console
from ln_jax.results import read_metrics, write_json
from ln_jax.train.workdir_lock import LOCK_FILE, RunLockedError, run_lock  # noqa: F401
from ln_jax.validate import UserError

log = logging.getLogger(__name__)

RESULT = "result.json"
LOG_FILE = "train.log"  # a run's library logs, as train.py's (`console.logging_to`)
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


class RunsFailed(RuntimeError):
    """Some runs of a grid failed (an exception, or a worker's nonzero exit) while the others
    went on: `failed` maps each failed run's name to what went wrong, `results` holds the
    stored results of every finished run of the grid."""

    def __init__(self, failed: Mapping[str, str], results: list[dict[str, Any]], out: str):
        self.failed, self.results = dict(failed), results
        names = "; ".join(f"{n} ({why})" for n, why in self.failed.items())
        super().__init__(
            f"{len(self.failed)} run(s) failed while the others went on: {names}. Each one's "
            f"log and checkpoints are in {out}/runs/NAME/; rerun the same command to retry them "
            "(a run resumes from its last checkpoint, finished runs are kept)."
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run of a study.

    Attributes:
      name: unique within the study; names the run's directory OUT/runs/NAME.
      arm: the compared setting ("post", "post_warmup", "pre", ...), for tables and colours.
      overrides: dotted config fields -> values, applied on top of the study's base config.
      tags: extra labels for grouping (e.g. {"num_layers": 12, "seed": 1}).
    """

    name: str
    arm: str
    overrides: Mapping[str, Any]
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arm": self.arm,
            "overrides": dict(self.overrides),
            "tags": dict(self.tags),
        }


def run_config(base: Mapping[str, Any], spec: RunSpec, out: str | None = None) -> Any:
    """The typed `TrainConfig` of one run: `base` with the run's name and overrides set
    (through `ln_jax.config.load.override`, the one override function of every command line).

    With `out` (the study's folder), a study on a CPU, where `compilation_cache="auto"` is off,
    keeps one persistent compilation cache in `OUT/jax_compilation` for all its runs: a grid's
    runs compile the same programs (their seeds and schedule numbers are inputs of the train
    step, `ln_jax.train.steps.run_values`), and a deep model's step takes minutes on a CPU.
    """
    from ln_jax.config.load import build_config, override
    from ln_jax.config.run import platform
    from ln_jax.runtime import compile_cache

    values = {"name": spec.name, **spec.overrides}
    cpu_auto = compile_cache.resolve(compile_cache.AUTO, platform()) == compile_cache.OFF
    if out is not None and cpu_auto and base.get("compilation_cache") == compile_cache.AUTO:
        values["compilation_cache"] = os.path.join(out, compile_cache.SUBDIR)
    return build_config(override(base, values))


# --------------------------------------------------------------------------------------------
# Reading a run's metrics
# --------------------------------------------------------------------------------------------


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
    spec: RunSpec, workdir: str, error: str | None, plateau: float | None
) -> dict[str, Any]:
    """A run's result: final/best validation loss, curves, divergence, wall time, and the
    collapse measure's curve when the monitor logged it (`monitor.every` > 0).

    The validation loss is BERT's MLM loss ("final_eval_mlm_loss"); a translation run, which
    logs no MLM loss, names its validation NLL per target token "final_nll" / "best_nll" and
    adds BLEU, "stuck" and the monitor's traces (`translation_fields`)."""
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
    return {
        **spec.to_dict(),
        names["final_eval_mlm_loss"]: final,
        names["best_eval_mlm_loss"]: min(finite_evals) if finite_evals else math.nan,
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
    }


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


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def result_path(out: str, name: str) -> str:
    return os.path.join(out, "runs", name, RESULT)


def load_result(out: str, spec: RunSpec) -> dict[str, Any] | None:
    """The stored result of `spec`, or None if it has none (or one for other overrides)."""
    path = result_path(out, spec.name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        result = task_named(json.load(f))
    if result.get("overrides") != json.loads(json.dumps(dict(spec.overrides))):
        raise ValueError(
            f"{path} holds run {spec.name!r} with other overrides than this grid's "
            f"({result.get('overrides')} vs {dict(spec.overrides)}); use another --out or "
            "delete that run's directory."
        )
    return result


def extension_due(
    base: Mapping[str, Any], spec: RunSpec, stored: Mapping[str, Any], extend: Sequence[str]
) -> bool:
    """Whether the finished run `stored` is to be continued to the config's total_steps: its
    name matches one of the `extend` patterns (fnmatch, e.g. "pre-lr1e-3-s*"), it did not
    diverge, and it stopped before total_steps."""
    if not any(fnmatch.fnmatchcase(spec.name, p) for p in extend) or stored.get("diverged"):
        return False
    return stored.get("steps", 0) < run_config(base, spec).total_steps


def needs_training(
    base: Mapping[str, Any], spec: RunSpec, out: str, extend: Sequence[str] = ()
) -> bool:
    """A run without a stored result, or one to extend (`extension_due`)."""
    stored = load_result(out, spec)
    return stored is None or extension_due(base, spec, stored, extend)


def check_extendable(cfg: Any, workdir: str) -> None:
    """Raises ValueError unless every step the workdir's run has trained keeps its learning rate
    under `cfg` (a schedule that does not depend on the run's length: constant, warmup_rsqrt).

    Continuing a linear-decay run to a later end would give it steps no fresh run of the new
    length has, so it is refused rather than mixed into a study.
    """
    from ln_jax.config.optim import OptimConfig
    from ln_jax.train import optim, run_identity

    old = run_identity.read_config(workdir)
    if old is None:
        return
    done = int(old["total_steps"])
    lr_old = optim.make_schedule(OptimConfig.from_mapping(old["optim"]))
    lr_new = optim.make_schedule(cfg.optim)
    steps = np.arange(done)
    if not np.allclose(np.asarray(lr_old(steps)), np.asarray(lr_new(steps)), rtol=1e-6):
        raise ValueError(
            f"{workdir} cannot be extended to {cfg.total_steps} steps: its schedule "
            f"({old['optim'].get('schedule')}) depends on the run's length, so its first {done} "
            "steps would differ from a fresh run of the new length. Use a schedule that does "
            "not (--schedule=constant or warmup_rsqrt), or train the longer runs in a new --out."
        )


def run_one(
    base: Mapping[str, Any],
    spec: RunSpec,
    out: str,
    plateau: float | None,
    extend: bool = False,
) -> dict:
    """Trains one run (resuming its checkpoint if any) and stores its result; with `extend`, a
    finished run goes on from its last checkpoint to the config's total_steps."""
    from ln_jax.train.trainer import NonFiniteError, train_and_evaluate

    cfg = run_config(base, spec, out)
    workdir = os.path.join(out, "runs", spec.name)
    if extend:
        check_extendable(cfg, workdir)
    error = None
    start = time.time()
    try:
        with run_lock(workdir), console.logging_to(os.path.join(workdir, LOG_FILE)):
            outcome = train_and_evaluate(cfg, workdir, accept_changes=extend)
    except NonFiniteError as err:
        error, outcome = f"non-finite loss or gradient: {err}", {"preempted": False}
    if outcome.get("preempted"):
        raise SystemExit(0)  # SIGTERM: the checkpoint is saved; no result, rerun to resume
    result = summarize_run(spec, workdir, error, plateau)
    result["error"] = error
    result["process_wall_s"] = time.time() - start
    result["code_version"] = _code_version()
    write_json(result_path(out, spec.name), result)
    return result


def _code_version() -> str | None:
    """`git describe` of the checkout ln_jax runs from (with "-dirty" for local edits)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _child_command(argv: Sequence[str], name: str) -> list[str]:
    kept = [a for a in argv if not a.startswith(("--jobs", "--only"))]
    return [sys.executable, "-m", "ln_jax.experiments", *kept, f"--only={name}", "--jobs=1"]


CPUS_ENV = "LN_JAX_CPUS"  # a worker's share of the CPUs, e.g. "0,2", set by `run_parallel`


def cpu_share(slot: int, jobs: int) -> list[int] | None:
    """The CPUs of worker `slot` of `jobs`: every jobs-th of this process's, from the slot-th
    (Linux); None where there are fewer CPUs than workers or no affinity to read."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[slot::jobs] if len(cpus) >= jobs else None


def pin_to_share() -> list[int] | None:
    """In a worker: every thread of this process onto the CPUs named by $LN_JAX_CPUS (its
    share, `cpu_share`); returns them, or None when unset or unsupported.

    The worker pins itself, first thing in its command: a `preexec_fn` would do it between the
    parent's fork and exec, which is unsafe in a process that runs threads (JAX's: it warns
    "os.fork() was called ... will likely lead to a deadlock"), and pinning the worker's pid
    from the parent after it started would race with the threads it starts.
    """
    value = os.environ.get(CPUS_ENV)
    if not value or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(int(c) for c in value.split(","))
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    return cpus


def _worker_env(slot: int, jobs: int) -> dict[str, str]:
    """This process's environment, with the share of worker `slot` in $LN_JAX_CPUS."""
    share = cpu_share(slot, jobs)
    env = {k: v for k, v in os.environ.items() if k != CPUS_ENV}
    return env if share is None else {**env, CPUS_ENV: ",".join(map(str, share))}


def run_parallel(
    pending: Sequence[RunSpec], argv: Sequence[str], jobs: int, out: str
) -> dict[str, str]:
    """Runs each pending spec as `python -m ln_jax.experiments ... --only=NAME`, `jobs` at once.

    Each child pins itself to its share of the CPUs (`pin_to_share`); its output is
    OUT/runs/NAME/log.txt, its library logs OUT/runs/NAME/train.log. A child that fails does
    not stop the others. Returns {name: why} of the failed children.
    """
    queue, running, failed = list(pending), {}, {}
    while queue or running:
        free = [s for s in range(jobs) if s not in running]
        while queue and free:
            spec, slot = queue.pop(0), free.pop(0)
            os.makedirs(os.path.join(out, "runs", spec.name), exist_ok=True)
            logfile = open(os.path.join(out, "runs", spec.name, "log.txt"), "a")  # noqa: SIM115
            cmd = _child_command(argv, spec.name)
            env = _worker_env(slot, jobs)
            proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env)
            running[slot] = (spec, proc, logfile)
            print(f"started {spec.name} (slot {slot}): {' '.join(cmd)}", flush=True)
        time.sleep(1.0)
        for slot, (spec, proc, logfile) in list(running.items()):
            if proc.poll() is not None:
                logfile.close()
                del running[slot]
                status = "done" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
                print(f"{status}: {spec.name}", flush=True)
                if proc.returncode != 0:
                    log_path = os.path.join(out, "runs", spec.name, "log.txt")
                    failed[spec.name] = f"exit status {proc.returncode}, see {log_path}"
    return failed


def run_sequential(
    base: Mapping[str, Any],
    pending: Sequence[RunSpec],
    out: str,
    plateau: float | None,
    first: int,
    total: int,
) -> dict[str, str]:
    """Trains `pending` here one after another; a run that raises is reported (with its
    traceback) and the next one starts. Returns {name: why} of the failed runs. A SIGTERM
    (SystemExit) or Ctrl-C still stops the whole grid."""
    failed = {}
    for i, spec in enumerate(pending):
        print(f"[{first + i + 1}/{total}] {spec.name}", flush=True)
        try:
            run_one(base, spec, out, plateau, extend=load_result(out, spec) is not None)
        except Exception as err:  # noqa: BLE001 (one run's failure must not stop the grid)
            if not isinstance(err, UserError):  # a user error's message says it all
                traceback.print_exc()
            failed[spec.name] = f"{type(err).__name__}: {err}"
            print(f"FAILED: {spec.name}: {failed[spec.name]}", flush=True)
    return failed


def run_grid(
    base: Mapping[str, Any],
    specs: Sequence[RunSpec],
    out: str,
    *,
    plateau: float | None = None,
    jobs: int = 1,
    argv: Sequence[str] = (),
    extend: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Trains every run of `specs` without a stored result, and continues the finished runs
    named by the `extend` patterns to the config's total_steps; returns all stored results.

    With `jobs` > 1 the runs go to subprocesses (`argv` is this command line, re-run per run
    with --only=NAME); otherwise they run here one after another. A failed run does not stop
    the others: once all have had their turn, `RunsFailed` names the failed ones (and carries
    the finished runs' results).
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate run names in the grid: {names}")
    for spec in specs:  # every config is checked before anything trains
        run_config(base, spec)
    pending = [s for s in specs if needs_training(base, s, out, extend)]
    longer = sum(load_result(out, s) is not None for s in pending)
    done = len(specs) - len(pending)
    print(
        f"{len(specs)} runs: {done} done, {len(pending)} to run ({longer} extended), in {out}",
        flush=True,
    )
    if jobs > 1 and len(pending) > 1:
        failed = run_parallel(pending, argv, jobs, out)
    else:
        failed = run_sequential(base, pending, out, plateau, done, len(specs))
    results = collect(specs, out, plateau)
    if failed:
        raise RunsFailed(failed, results, out)
    return results


def collect(
    specs: Sequence[RunSpec], out: str, plateau: float | None = None
) -> list[dict[str, Any]]:
    """The results of the finished runs of `specs`, summarised afresh from their metrics
    (so that a changed summary rule applies to old runs too); a run whose folder keeps only its
    result.json (a study's committed records) is taken as stored, its "stuck" judged against
    `plateau`; unfinished runs are left out."""
    results = []
    for spec in specs:
        stored = load_result(out, spec)
        workdir = os.path.join(out, "runs", spec.name)
        if stored is not None and not read_metrics(workdir):
            if "bleu_curve" in stored:
                stored["stuck"] = stuck(stored["final_nll"], stored["diverged"], plateau)
            results.append(stored)
        elif stored is not None:
            error = stored.get("error")
            if error is None and stored.get("diverged_reason", "").startswith("non-finite loss"):
                error = stored["diverged_reason"]
            fresh = summarize_run(spec, workdir, error, plateau)
            results.append({**stored, **fresh, "error": error})
    return results
