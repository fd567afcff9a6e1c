"""xdist's file-by-file scheduling, made to survive a worker that crashes.

The suite runs with `-n 2 --dist loadfile` (pyproject.toml). In pytest-xdist 3.8, when a
worker dies (an abort in native code, say), its scheduler puts back every file that worker was
ever given, finished ones included; a finished file handed to the new worker is an empty list
of tests, and the new worker waits for work that never comes: the session hangs until
something kills it (CI's 90-minute limit, on 2026-11-29). And the new worker is given one
file at a time: a worker runs a test only once it holds the next one (or is told to stop),
so a file of one test, given alone, waits as well. Here the crashed test is reported as
failed once (xdist ran it again on each new worker, up to its restart limit), only the
unfinished tests go back into the queue, a worker is topped up to two tests and told to stop
once the queue is empty: the session ends, with that failure in its summary (pytest-xdist
issues #784, #1323 and #1327).

Loaded by tests/conftest.py; `-p tests.xdist_scheduling` loads it into any pytest run. It
subclasses xdist's LoadFileScheduling and uses its internals (`assigned_work`, `workqueue`,
`_pending_of`, `_assign_work_unit`): pyproject.toml keeps pytest-xdist below 4, and
tests/test_xdist_scheduling.py runs it through a crash.
"""

from __future__ import annotations

import contextlib

import pytest
from xdist.scheduler import LoadFileScheduling


class CrashSafeLoadFile(LoadFileScheduling):
    """LoadFileScheduling that re-queues only the unfinished files of a crashed worker and
    keeps each worker holding two tests while there are any."""

    def remove_node(self, node):
        """Forgets `node`; if it crashed, returns the test it was running (xdist reports it
        as failed; it is not run again) and re-queues its files' other unfinished tests."""
        workload = self.assigned_work.pop(node)  # a KeyError is xdist's "not a worker"
        pending = [(s, t) for s, tests in workload.items() for t, done in tests.items() if not done]
        if not pending:
            return None
        scope, crashed = pending[0]  # tests run in the order they were sent
        workload[scope][crashed] = True
        unfinished = {s: tests for s, tests in workload.items() if not all(tests.values())}
        self.workqueue.update(unfinished)
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def _reschedule(self, node):
        """Tops `node` up to two tests, or tells it to stop once the queue is empty. A worker
        that crashed may still report its last finished test before its end is known; sending
        it work then fails ("cannot send (already closed?)": its pipe is gone; seen once in a
        precheck, an INTERNALERROR that ended the session): the work stays assigned to it and
        `remove_node` re-queues it when xdist reports the crash."""
        with contextlib.suppress(OSError):
            self._top_up(node)

    def _top_up(self, node):
        super()._reschedule(node)
        if node.shutting_down:
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The crash-safe scheduler for `--dist loadfile`; xdist's own for any other mode."""
    if config.getvalue("dist") == "loadfile":
        return CrashSafeLoadFile(config, log)
    return None
