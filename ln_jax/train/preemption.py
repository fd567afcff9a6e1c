"""Stopping a run cleanly on preemption (SIGTERM) or Ctrl-C: after a step, with a checkpoint.

Used by pretraining (`ln_jax.train.trainer`) and fine-tuning (`ln_jax.experiments.finetune`):
the loop asks
`stop_after(step)` after every step, saves, and returns with the signal's name; rerunning the
same command resumes from that step. Before the loop (set-up: data, compilation, restoring),
`SetupSignals` turns a SIGTERM into one line saying what was interrupted and that nothing was
saved, exit 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from jax.experimental import multihost_utils

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, the status a SIGTERM-killed process reports


class SetupSignals:
    """While a run sets up (before `Preemption` takes over), a SIGTERM prints one line naming
    `what` was interrupted and that nothing was saved, runs the registered `cleanups` (a stub
    workdir this command created goes) and exits `EXIT_SIGTERM` at once, instead of killing
    the process without a word. Once a `Preemption` has been entered, the run has saved what
    it will: a later SIGTERM ends the process as before.

    The handler exits rather than raising: an exception raised from a signal handler inside a
    garbage-collection callback (JAX has one) is printed and ignored, and set-up would go on.
    Only in the main thread of a single-process run: a multi-process job leaves SIGTERM to
    JAX's preemption service.
    """

    active: SetupSignals | None = None  # the one installed, for `Preemption` and cleanups

    def __init__(self, what: str, enabled: bool = True):
        self.what, self.enabled, self.loop_started = what, enabled, False
        self.cleanups: list[Callable[[], None]] = []
        self._previous: Any = None

    def message(self) -> str:
        return (
            f"SIGTERM while {self.what}, before the first step: nothing was saved (checkpoints "
            "already in the workdir are kept); run the same command to start or resume the run."
        )

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            SetupSignals.active = self
        return self

    def _handle(self, signum, frame):
        del frame
        if self.loop_started:  # the run has saved: end as an unhandled SIGTERM would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for cleanup in self.cleanups:
            with contextlib.suppress(Exception):
                cleanup()
        os.write(2, (self.message() + "\n").encode())
        os._exit(EXIT_SIGTERM)

    def __exit__(self, *exc):
        if SetupSignals.active is self:
            signal.signal(signal.SIGTERM, self._previous)
            SetupSignals.active = None


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
        self._aborted = False  # a second Ctrl-C
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        # Outside the main thread signals cannot be caught: preemption is the caller's business.
        if threading.current_thread() is threading.main_thread():
            caught = (signal.SIGINT,) if self.shared else (signal.SIGTERM, signal.SIGINT)
            self._previous = {sig: signal.signal(sig, self._handle) for sig in caught}
        if SetupSignals.active is not None:
            SetupSignals.active.loop_started = True
        return self

    def _handle(self, signum, frame):
        del frame
        if self._received and signum == signal.SIGINT:
            self._aborted = True
            raise KeyboardInterrupt  # the second Ctrl-C: abort without saving
        self._received = signal.Signals(signum).name
        if signum == signal.SIGINT:
            print("\nCtrl-C: saving after this step (Ctrl-C again aborts)", flush=True)
            if self.shared:
                os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier
        else:  # a step (or the evaluation in it) may take a while: say why the run goes on
            print("\nSIGTERM: saving after this step", flush=True)

    def stop_after(self, step: int) -> str | None:
        """The signal's name if the run stops after `step` (alike on every process).

        Raises:
          KeyboardInterrupt: a second Ctrl-C whose own exception Python dropped: a handler
            that runs inside a garbage-collector callback (JAX's) or a finalizer has its
            exception printed as "ignored", and the run would save and exit 0.
        """
        if self._aborted:
            raise KeyboardInterrupt
        if not self.shared:
            self.requested = self._received
        elif multihost_utils.reached_preemption_sync_point(step):
            self.requested = self._received or "SIGTERM"
        return self.requested

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
