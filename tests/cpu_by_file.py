"""An opt-in pytest plugin: CPU seconds per test file, the test process's own and its waited-for
subprocesses' (issue 65: where the suite's CPU goes).

    LN_JAX_CPU_BY_FILE=DIR python -m pytest tests -p tests.cpu_by_file
    python -m tests.cpu_by_file DIR        # the table, largest first

Each process of the session (each xdist worker) writes DIR/cpu-<worker>.json:
{file: [own CPU s, subprocesses' CPU s, wall s, compile s]}, summed over the file's tests
(setup, call and teardown; a module fixture counts toward the test that first uses it). A
subprocess's CPU counts when it is waited for; data workers that outlive their test count
nowhere. "compile" is the wall seconds XLA spent compiling in the test process itself (JAX's
`/jax/core/compile/backend_compile_duration` events; with the other worker on the second core a
compile's wall time is more than its CPU time, so a file's can exceed its "own" CPU; a compile
of a background thread counts toward the test it ends in). The records of 2026-12-06's
morning and before have no compile column.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import sys
import time

import pytest

ENV = "LN_JAX_CPU_BY_FILE"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_ROWS: dict[str, list[float]] = {}
_COMPILING = [0.0]  # XLA's compile seconds in this process so far


def _count_compiles(event: str, duration: float, **_) -> None:
    if event == COMPILE_EVENT:
        _COMPILING[0] += duration


def pytest_configure(config):
    if os.environ.get(ENV):
        import jax

        jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, kids), start, compiling = _cpu(), time.perf_counter(), _COMPILING[0]
    yield
    (own_end, kids_end), end = _cpu(), time.perf_counter()
    row = _ROWS.setdefault(item.nodeid.split("::")[0], [0.0] * 4)
    row[0] += own_end - own
    row[1] += kids_end - kids
    row[2] += end - start
    row[3] += _COMPILING[0] - compiling


def pytest_sessionfinish(session):
    folder = os.environ.get(ENV)
    if folder and _ROWS:
        os.makedirs(folder, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"cpu-{worker}.json"), "w") as out:
            json.dump(_ROWS, out, indent=1, sort_keys=True)


def table(folder: str) -> str:
    """The files of every worker's record in `folder`, largest CPU first, with totals."""
    rows: dict[str, list[float]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "cpu-*.json"))):
        with open(path) as f:
            for name, values in json.load(f).items():
                values = [*values, 0.0][:4]  # an older record: no compile column
                rows[name] = [a + b for a, b in zip(rows.get(name, [0.0] * 4), values, strict=True)]
    own, kids, wall, xla = (sum(r[i] for r in rows.values()) for i in range(4))
    lines = [
        f"{len(rows)} files: own {own:.0f} s (XLA compiling {xla:.0f} s of wall), subprocesses "
        f"{kids:.0f} s, wall {wall:.0f} s"
    ]
    for name, (a, b, w, c) in sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        lines.append(
            f"{a + b:7.1f}  own {a:6.1f}  compiling {c:6.1f}  subprocesses {b:6.1f}  "
            f"wall {w:6.1f}  {name}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
