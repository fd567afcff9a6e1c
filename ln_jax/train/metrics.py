"""Run metrics: `WORKDIR/metrics.jsonl`, TensorBoard event files, and a progress line."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import jax
import numpy as np

from ln_jax import paths

METRICS_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if isinstance(value, (np.ndarray, jax.Array)):
        value = np.asarray(value).item()
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl and mirrors scalars to TensorBoard.

    Only process 0 writes. Each record has `step`, `split` ("train" or "eval") and its
    scalars (e.g. `loss`, and for train `learning_rate` and `grad_norm`). A run resumed from
    step `resume_step` first drops the records past it (written after that checkpoint, before
    the interruption), so every step is recorded once; TensorBoard's event files are rebuilt
    from the kept records.

    The workdir may be a URL (gs://...): objects cannot be appended to, so both are written to
    a local copy and uploaded at most every `sync_secs` and on `close`
    (`ln_jax.paths.Staging`). TensorBoard is written that way too, rather than by
    tensorboardX's own gs:// writer: that one needs google-cloud-storage's client, knows only
    gs:// and s3://, and re-uploads each event file at every flush as well.
    """

    def __init__(
        self,
        workdir: str,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_step: int | None = None,
        sync_secs: float = paths.SYNC_SECS,
    ):
        self.enabled = enabled
        self._file: TextIO | None = None
        self._tb = None
        self._staging: paths.Staging | None = None
        if not enabled:
            return
        self._staging = paths.Staging(workdir, sync_secs)
        path = self._staging.fetch(METRICS_FILE)
        kept = prune_records(path, resume_step or 0) if path.exists() else []
        self._file = open(path, "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            self._staging.remove("tensorboard", "events.out.tfevents")
            self._tb = _tensorboard_writer(self._staging.local / "tensorboard", kept)
        self._staging.sync(force=True)

    def write(self, step: int, split: str, scalars: dict[str, Any]) -> dict[str, Any]:
        record = {"step": int(step), "split": split, **{k: _plain(v) for k, v in scalars.items()}}
        record["time"] = time.time()  # wall clock (unix seconds) when the record was written
        if self.enabled:
            self._file.write(json.dumps(record) + "\n")
            if self._tb is not None:
                _to_tensorboard(self._tb, record)
            self._staging.sync()
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._staging is not None:
            self._staging.close()


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a local path or a URL); a line cut short by a crash is
    skipped."""
    records = []
    for line in paths.as_path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def eval_records(workdir: str) -> list[dict[str, Any]]:
    """The "eval" records of the run in `workdir` (none without a metrics.jsonl)."""
    path = paths.as_path(workdir) / METRICS_FILE
    return [r for r in read_records(path) if r["split"] == "eval"] if path.exists() else []


def evaluated_at(workdir: str, step: int) -> bool:
    """Whether the run in `workdir` has an eval record of `step`: process 0's answer on every
    process (they must agree: an evaluation runs collectives; only process 0 writes)."""
    seen = any(r["step"] == step for r in eval_records(workdir))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        seen = bool(multihost_utils.broadcast_one_to_all(np.int32(seen)))
    return seen


def prune_records(path: str | os.PathLike, last_step: int) -> list[dict[str, Any]]:
    """Rewrites metrics.jsonl without the records past `last_step` (atomically); returns the
    records kept."""
    kept = [r for r in read_records(path) if r.get("step", 0) <= last_step]
    paths.write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _to_tensorboard(tb: Any, record: dict[str, Any]) -> None:
    for key, val in record.items():
        if key not in ("step", "split", "time") and isinstance(val, (int, float)):
            tb.add_scalar(f"{record['split']}/{key}", val, record["step"], walltime=record["time"])


def _summary_writer_class() -> type:
    """tensorboardX's SummaryWriter, imported without PyTorch.

    tensorboardX imports torch, when installed, only to recognise its tensors (3.5-4 s at
    every start of a run on the test machine); ln_jax writes Python floats. While it imports,
    `torch` is marked absent unless something imported it already.
    """
    import sys

    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which it catches
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


def _tensorboard_writer(directory: pathlib.Path, records: list[dict[str, Any]]) -> Any:
    """A fresh TensorBoard writer in the local `directory` holding `records` (the caller
    removed the earlier event files, so no step shows twice after a resume)."""
    tb = _summary_writer_class()(str(directory), flush_secs=30)
    for record in records:
        _to_tensorboard(tb, record)
    return tb


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {text}" if days else text


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where a run stands in a larger job (a fine-tuning grid), for its progress line.

    Attributes:
      label: shown before the step, e.g. "lr0.0005_bs32_ep3 seed 1 (run 2/6)".
      after: given this run's ETA in seconds, the seconds of the job's runs after this one
        (None: unknown yet); the line then shows the job's ETA too.
    """

    label: str = ""
    after: Callable[[float], float | None] | None = None


class GridClock:
    """Times a grid's runs for the progress line's ETA of all of them (`Scope.after`)."""

    def __init__(self, runs: int):
        self.runs = runs
        self.durations: list[float] = []  # of the runs finished in this process
        self.started: float | None = None

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Times one run (its set-up and compilation included)."""
        self.started = time.perf_counter()
        yield
        self.durations.append(time.perf_counter() - self.started)
        self.started = None

    def after(self, run_eta: float) -> float | None:
        """Seconds of the runs after the current one, given its ETA: the median duration of
        the finished runs, or before one has finished, the current run's (elapsed + ETA),
        times the runs left; None when no run follows."""
        left = self.runs - len(self.durations) - 1
        if left <= 0 or self.started is None:
            return None
        per_run = (
            statistics.median(self.durations)
            if self.durations
            else time.perf_counter() - self.started + run_eta
        )
        return left * per_run


class Progress:
    """A progress line: step, steps/s, tokens/s, ETA, the latest loss and the last
    evaluation's headline (`evaluated`), behind the label of its `Scope` if it has one.

    A window (the steps since the previous line) in which something other than steady
    training took time, say compiling a program (the first step of a process, the first step
    of the train step without measurements after a measured one) or an evaluation, is
    *disturbed* (`disturb`): its line shows the window's time and what it included, and it
    does not count for the ETA. The ETA is the remaining steps times the median seconds per
    step of the last `window` steady windows, so one slow window does not swing it; before
    the first steady window there is none.
    """

    def __init__(
        self,
        total_steps: int,
        tokens_per_step: int,
        start_step: int = 0,
        stream: TextIO | None = None,
        enabled: bool = True,
        window: int = 20,
        scope: Scope | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.scope = scope or Scope()
        self.clock = clock
        self._last_eval = ""  # "eval loss 2.3456 (step 40)"
        self.total = total_steps
        self.tokens_per_step = tokens_per_step
        self.stream = stream if stream is not None else sys.stdout  # the one of now
        self.enabled = enabled
        self._first_step = start_step + 1
        self._mark_step = start_step
        self._mark_time = clock()
        self._steady: collections.deque[float] = collections.deque(maxlen=window)
        self._pending: list[str] = []  # what disturbs the window being measured
        self._shown: list[str] = []  # what disturbed the window `rates` closed last
        self._window = (0, 0.0)  # (steps, seconds) of that window

    def disturb(self, reason: str) -> None:
        """Marks the current window as not steady: `reason` ("compilation", "evaluation")
        took time in it."""
        if reason not in self._pending:
            self._pending.append(reason)

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        """Shows the headline of an eval record from now on: its `score` (a task's summary
        metric, e.g. fine-tuning's) if it has one, else its `loss`."""
        key = "score" if "score" in record else "loss"
        if isinstance(record.get(key), (int, float)):
            self._last_eval = f"eval {key} {record[key]:.4f} (step {step})"

    def rates(self, step: int) -> tuple[float, float]:
        """(steps/s, tokens/s) since the previous call; resets the window (a steady one
        counts for the ETA)."""
        now = self.clock()
        steps = step - self._mark_step
        elapsed = max(now - self._mark_time, 1e-9)
        self._mark_step, self._mark_time = step, now
        self._shown, self._pending = self._pending, []
        self._window = (steps, elapsed)
        if not self._shown and step != self._first_step and steps > 0:
            self._steady.append(elapsed / steps)
        return steps / elapsed, steps * self.tokens_per_step / elapsed

    def eta(self, step: int, steps_per_s: float | None = None) -> float | None:
        """Seconds to the last step from the steady windows (None before the first one);
        `steps_per_s`: the rate of a steady window not yet recorded by `rates`."""
        per_step = list(self._steady)
        if not per_step and steps_per_s:
            per_step = [1.0 / steps_per_s]
        if not per_step:
            return None
        return (self.total - step) * float(np.median(per_step))

    def line(self, step: int, steps_per_s: float, tokens_per_s: float, loss: float) -> str:
        """The progress line of `step`, given the rates of the window ending there."""
        head = f"step {step:>{len(str(self.total))}}/{self.total}"
        took = 1.0 / steps_per_s if steps_per_s > 0 else float("inf")
        if step == self._first_step:
            compiled = " (compilation included)" * ("compilation" in self._shown)
            parts = [head, f"first step {took:.1f} s{compiled}", f"loss {loss:.4f}"]
        elif self._shown:  # a disturbed window: its time, and the ETA of the steady ones
            steps, seconds = self._window
            what = " and ".join(self._shown)
            parts = [head, f"{steps} step{'s' * (steps != 1)} in {seconds:.1f} s ({what} included)"]
            parts += [f"loss {loss:.4f}", self._eta_text(self.eta(step))]
        else:
            eta = self.eta(step, steps_per_s if not self._steady else None)
            parts = [head, f"{steps_per_s:6.2f} steps/s", f"{tokens_per_s:9.0f} tokens/s"]
            parts += [f"loss {loss:.4f}", self._eta_text(eta) or "ETA ?"]
        return " | ".join(p for p in [self.scope.label, *parts, self._last_eval] if p)

    def _eta_text(self, eta: float | None) -> str:
        """ "ETA h:mm:ss", with the job's (`Scope.after`) when known; "" without an ETA."""
        if eta is None or not np.isfinite(eta):
            return ""
        text = f"ETA {format_duration(eta)}"
        later = self.scope.after(eta) if self.scope.after is not None else None
        if later is not None:
            text += f" (all runs {format_duration(eta + later)})"
        return text

    def note(self, text: str) -> None:
        """A line of its own between the progress lines (what a long evaluation does, and
        how long it took), behind the scope's label."""
        if self.enabled:
            self.stream.write(" | ".join(p for p in [self.scope.label, text] if p) + "\n")
            self.stream.flush()

    def show(self, step: int, steps_per_s: float, tokens_per_s: float, loss: float) -> None:
        if self.enabled:
            self.stream.write(self.line(step, steps_per_s, tokens_per_s, loss) + "\n")
            self.stream.flush()
