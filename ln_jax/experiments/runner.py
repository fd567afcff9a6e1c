"""Grids of training runs: specs, resumable execution, per-run summaries.

A study is a list of `RunSpec`s, each a name plus dotted config overrides applied to one base
config. `run_grid` trains every run that has no result yet in `OUT/runs/NAME/result.json`
(a run cut off midway resumes from its own orbax checkpoint), optionally several at once in
subprocesses, and `collect` gathers the per-run results into `OUT/results.json`.

A grid whose runs share what its caller prepared (fine-tuning's: the pretrained encoder and
the task's data, `ln_jax.experiments.finetune`) runs them in the caller's process with a
`Session` (hooks, one `Preemption` around the grid, progress scopes), and a spec's `folder`
may place its run elsewhere than `runs/NAME` (fine-tuning's `<cell>/seed<k>`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ln_jax import console

# A run's result (re-exported: the studies and their tests read them as runner.NAME).
from ln_jax.experiments.run_result import (  # noqa: F401
    BLEU,
    COLLAPSE,
    MT_LOSS,
    MT_MOVED,
    MT_RENAMED,
    MT_TRACES,
    RECORD_KEYS,
    STUCK_MARGIN,
    TAIL,
    curve,
    diverged,
    steps_to_target,
    stuck,
    summarize_run,
    task_named,
    task_result,
    training_seconds,
    translation_fields,
)
from ln_jax.results import read_metrics, write_json
from ln_jax.train.metrics import GridClock, Scope
from ln_jax.train.workdir_lock import LOCK_FILE, RunLockedError, run_lock  # noqa: F401
from ln_jax.validate import UserError

log = logging.getLogger(__name__)

RESULT = "result.json"
LOG_FILE = "train.log"  # a run's library logs, as train.py's (`console.logging_to`)


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
      folder: the run's directory relative to OUT (None: runs/NAME).
    """

    name: str
    arm: str
    overrides: Mapping[str, Any]
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    folder: str | None = None

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


def run_dir(out: str, spec: RunSpec) -> str:
    """The run's directory: OUT/runs/NAME, or OUT/FOLDER for a spec with a `folder`."""
    return os.path.join(out, spec.folder or os.path.join("runs", spec.name))


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def result_path(out: str, spec: RunSpec) -> str:
    """OUT/runs/NAME/result.json of a spec (in its `folder` if it has one)."""
    return os.path.join(run_dir(out, spec), RESULT)


def load_result(out: str, spec: RunSpec) -> dict[str, Any] | None:
    """The stored result of `spec`, or None if it has none (or one for other overrides)."""
    path = result_path(out, spec)
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


class Preempted(SystemExit):
    """A run stopped on SIGTERM or Ctrl-C after saving a checkpoint: a stop, not an error (the
    command exits 0); rerunning the same command resumes from `step` of the run in
    `directory`."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(0)
        self.signal_name, self.step, self.directory = signal_name, step, directory

    def __str__(self) -> str:
        return f"{self.signal_name}: saved step {self.step} in {self.directory}"


@dataclasses.dataclass(frozen=True)
class Session:
    """A grid trained in its caller's process, around what the caller prepared (fine-tuning's
    pretrained encoder and data). Its runs accept the safe config changes the caller has
    checked (`train_and_evaluate(accept_changes=True)`), keep their config's compilation
    cache, and the grid stops at its first failure (a non-finite loss included).

    Attributes:
      hooks: `hook(step, run)` after every step of every run (`train_and_evaluate`'s).
      preemption: a `Preemption` the caller entered around the whole grid (None: each run's).
      scope: the run's place in the grid, for its progress line (`run_sequential` sets it).
    """

    hooks: Sequence[Callable] = ()
    preemption: Any = None
    scope: Any = None


def run_one(
    base: Mapping[str, Any],
    spec: RunSpec,
    out: str,
    plateau: float | None,
    extend: bool = False,
    session: Session | None = None,
) -> dict:
    """Trains one run (resuming its checkpoint if any) and stores its result; with `extend`, a
    finished run goes on from its last checkpoint to the config's total_steps.

    Raises:
      Preempted: after SIGTERM / Ctrl-C, once the step in flight is checkpointed (no result:
        rerun to resume).
    """
    from ln_jax.train.trainer import NonFiniteError, train_and_evaluate

    cfg = run_config(base, spec, out if session is None else None)
    workdir = run_dir(out, spec)
    if extend:
        check_extendable(cfg, workdir)
    error = None
    start = time.time()
    trainer_args: dict[str, Any] = {"accept_changes": extend}
    if session is not None:
        trainer_args = {"accept_changes": True, "hooks": session.hooks, "scope": session.scope}
        trainer_args["preemption"] = session.preemption
    try:
        with run_lock(workdir), console.logging_to(os.path.join(workdir, LOG_FILE)):
            outcome = train_and_evaluate(cfg, workdir, **trainer_args)
    except NonFiniteError as err:
        if session is not None:
            raise
        error, outcome = f"non-finite loss or gradient: {err}", {"preempted": False}
    if outcome.get("preempted"):
        raise Preempted(outcome["preempted"], outcome["step"], workdir)
    result = summarize_run(spec, workdir, error, plateau)
    result["error"] = error
    result["process_wall_s"] = time.time() - start
    result["code_version"] = _code_version()
    write_json(result_path(out, spec), result)
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
            os.makedirs(run_dir(out, spec), exist_ok=True)
            logfile = open(os.path.join(run_dir(out, spec), "log.txt"), "a")  # noqa: SIM115
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
                    log_path = os.path.join(run_dir(out, spec), "log.txt")
                    failed[spec.name] = f"exit status {proc.returncode}, see {log_path}"
    return failed


def run_sequential(
    base: Mapping[str, Any],
    pending: Sequence[RunSpec],
    out: str,
    plateau: float | None,
    first: int,
    total: int,
    session: Session | None = None,
) -> dict[str, str]:
    """Trains `pending` here one after another; a run that raises is reported (with its
    traceback) and the next one starts. Returns {name: why} of the failed runs. A SIGTERM
    (`Preempted`) or Ctrl-C still stops the whole grid; with a `session`, so does any failure
    (it is raised), and each run's progress line shows its place and the grid's ETA."""
    failed = {}
    clock = GridClock(len(pending))
    for i, spec in enumerate(pending):
        print(f"[{first + i + 1}/{total}] {spec.name}", flush=True)
        extend = load_result(out, spec) is not None
        if session is not None:
            scope = Scope(f"{spec.name} (run {i + 1}/{len(pending)})", clock.after)
            with clock.timing():
                run_one(base, spec, out, plateau, extend, dataclasses.replace(session, scope=scope))
            continue
        try:
            run_one(base, spec, out, plateau, extend=extend)
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
    session: Session | None = None,
) -> list[dict[str, Any]]:
    """Trains every run of `specs` without a stored result, and continues the finished runs
    named by the `extend` patterns to the config's total_steps; returns all stored results.

    With `jobs` > 1 the runs go to subprocesses (`argv` is this command line, re-run per run
    with --only=NAME); otherwise they run here one after another (with a `session`: in the
    caller's process, sharing what it prepared). A failed run does not stop the others: once
    all have had their turn, `RunsFailed` names the failed ones (and carries the finished
    runs' results).
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
    if jobs > 1 and len(pending) > 1 and session is None:
        failed = run_parallel(pending, argv, jobs, out)
    else:
        failed = run_sequential(base, pending, out, plateau, done, len(specs), session)
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
        workdir = run_dir(out, spec)
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
