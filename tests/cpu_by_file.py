"""An opt-in pytest plugin: CPU seconds per test file, the test process's own and its waited-for
subprocesses' (issue 65: where the suite's CPU goes).

    LN_JAX_CPU_BY_FILE=DIR python -m pytest tests -p tests.cpu_by_file
    python -m tests.cpu_by_file DIR        # the table, largest first

Each process of the session (each xdist worker) writes DIR/cpu-<worker>.json:
{file: [own CPU s, subprocesses' CPU s, wall s]}, summed over the file's tests (setup, call
and teardown; a module fixture counts toward the test that first uses it). A subprocess's CPU
counts when it is waited for; data workers that outlive their test count nowhere.
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
_ROWS: dict[str, list[float]] = {}


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, kids), start = _cpu(), time.perf_counter()
    yield
    (own_end, kids_end), end = _cpu(), time.perf_counter()
    row = _ROWS.setdefault(item.nodeid.split("::")[0], [0.0, 0.0, 0.0])
    row[0] += own_end - own
    row[1] += kids_end - kids
    row[2] += end - start


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
                rows[name] = [a + b for a, b in zip(rows.get(name, [0.0] * 3), values, strict=True)]
    own, kids, wall = (sum(r[i] for r in rows.values()) for i in range(3))
    lines = [f"{len(rows)} files: own {own:.0f} s, subprocesses {kids:.0f} s, wall {wall:.0f} s"]
    for name, (a, b, w) in sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        lines.append(f"{a + b:7.1f}  own {a:6.1f}  subprocesses {b:6.1f}  wall {w:6.1f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
