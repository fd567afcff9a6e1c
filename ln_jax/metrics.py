"""Run metrics: `WORKDIR/metrics.jsonl`, TensorBoard event files, and a progress line."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import jax
import numpy as np


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
    scalars (e.g. `loss`, and for train `learning_rate` and `grad_norm`).
    """

    def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self._file: TextIO | None = None
        self._tb = None
        if not enabled:
            return
        self._file = open(f"{workdir}/metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(f"{workdir}/tensorboard", flush_secs=30)

    def write(self, step: int, split: str, scalars: dict[str, Any]) -> dict[str, Any]:
        record = {"step": int(step), "split": split, **{k: _plain(v) for k, v in scalars.items()}}
        record["time"] = time.time()  # wall clock (unix seconds) when the record was written
        if self.enabled:
            self._file.write(json.dumps(record) + "\n")
            if self._tb is not None:
                for key, val in record.items():
                    if key not in ("step", "split", "time") and isinstance(val, (int, float)):
                        self._tb.add_scalar(f"{split}/{key}", val, step)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {text}" if days else text


class Progress:
    """A progress line: step, steps/s, tokens/s, ETA and the latest loss."""

    def __init__(
        self,
        total_steps: int,
        tokens_per_step: int,
        start_step: int = 0,
        stream: TextIO = sys.stdout,
        enabled: bool = True,
    ):
        self.total = total_steps
        self.tokens_per_step = tokens_per_step
        self.stream = stream
        self.enabled = enabled
        self._mark_step = start_step
        self._mark_time = time.perf_counter()

    def rates(self, step: int) -> tuple[float, float]:
        """(steps/s, tokens/s) since the previous call; resets the window."""
        now = time.perf_counter()
        steps = step - self._mark_step
        elapsed = max(now - self._mark_time, 1e-9)
        self._mark_step, self._mark_time = step, now
        return steps / elapsed, steps * self.tokens_per_step / elapsed

    def show(self, step: int, steps_per_s: float, tokens_per_s: float, loss: float) -> None:
        if not self.enabled:
            return
        eta = (self.total - step) / steps_per_s if steps_per_s > 0 else float("inf")
        eta_text = format_duration(eta) if np.isfinite(eta) else "?"
        width = len(str(self.total))
        self.stream.write(
            f"step {step:>{width}}/{self.total} | {steps_per_s:6.2f} steps/s | "
            f"{tokens_per_s:9.0f} tokens/s | loss {loss:.4f} | ETA {eta_text}\n"
        )
        self.stream.flush()
