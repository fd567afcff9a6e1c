"""Stopping a run cleanly on preemption (SIGTERM) or Ctrl-C: after a step, with a checkpoint.

Used by pretraining (`ln_jax.train.trainer`) and fine-tuning (`ln_jax.models.bert.finetune.run`):
the loop asks
`stop_after(step)` after every step, saves, and returns with the signal's name; rerunning the
same command resumes from that step.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from jax.experimental import multihost_utils


class Preemption:
    """Turns SIGTERM (preemption) and Ctrl-C into a stop after a step (then: save, exit 0); a
    second Ctrl-C aborts at once.

    The processes of a multi-process job must stop after the same step: one that stopped alone
    would wait in the checkpoint's barrier while the others wait in the next all-reduce. There
    SIGTERM is left to JAX's preemption service, which tells every process the same step to stop
    after (`multihost_utils.reached_preemption_sync_point`), and Ctrl-C becomes a SIGTERM to it.
    """

    def __init__(self, shared: bool):
        self.shared = shared
        self.requested: str | None = None  # the signal's name, once the run is to stop
        self._received: str | None = None  # a signal this process received
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        # Outside the main thread signals cannot be caught: preemption is the caller's business.
        if threading.current_thread() is threading.main_thread():
            caught = (signal.SIGINT,) if self.shared else (signal.SIGTERM, signal.SIGINT)
            self._previous = {sig: signal.signal(sig, self._handle) for sig in caught}
        return self

    def _handle(self, signum, frame):
        del frame
        if self._received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: abort without saving
        self._received = signal.Signals(signum).name
        if signum == signal.SIGINT:
            print("\nCtrl-C: saving after this step (Ctrl-C again aborts)", flush=True)
            if self.shared:
                os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier

    def stop_after(self, step: int) -> str | None:
        """The signal's name if the run stops after `step` (alike on every process)."""
        if not self.shared:
            self.requested = self._received
        elif multihost_utils.reached_preemption_sync_point(step):
            self.requested = self._received or "SIGTERM"
        return self.requested

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
