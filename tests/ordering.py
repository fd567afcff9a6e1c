"""The order the test files run in: the longest first, from their measured durations.

xdist's `loadfile` hands each file to a worker as a whole, and by default in order of the
number of tests in it, so the files with one long test (the README's commands, the multihost
pair, the accelerator suite) went last, and one worker ran them alone while the other sat idle
(measured 2026-11-27 on 2 cores: workers done at 850 s and 950 s). Longest first, the files
left at the end are short and the two workers finish together (simulated from the same run's
timeline: 865 s each). `pyproject.toml` passes `--no-loadscope-reorder` so xdist keeps this
order; within a file the order is the file's own.

`tests/durations.json` holds each file's seconds (setup + call + teardown of all its tests, as
run in a full suite); a file missing from it counts as the median. It only orders the run:
a stale table makes the suite slower, never wrong. Refresh it with
`LN_JAX_RECORD_DURATIONS=tests/durations.json python -m pytest tests`.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")
RECORD_ENV = "LN_JAX_RECORD_DURATIONS"


def file_of(nodeid: str) -> str:
    """'tests/test_x.py::test_y[z]' -> 'tests/test_x.py'."""
    return nodeid.split("::", 1)[0]


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The indices of `nodeids` with the files of most `seconds` first (unknown files: the
    median), each file's tests together and in their order, ties in collection order."""
    typical = statistics.median(seconds.values()) if seconds else 0.0
    first_seen = {}
    for i, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), i)

    def key(i: int) -> tuple[float, int, int]:
        path = file_of(nodeids[i])
        return (-seconds.get(path, typical), first_seen[path], i)

    return sorted(range(len(nodeids)), key=key)


def read_table(path: Path = TABLE) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


class Recorder:
    """Sums each file's test durations over a session and writes them as the table."""

    def __init__(self, path: str):
        self.path, self.seconds = Path(path), collections.defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[file_of(nodeid)] += duration

    def write(self) -> None:
        table = {k: round(v, 1) for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        self.path.write_text(json.dumps(table, indent=1) + "\n")


def recorder() -> Recorder | None:
    """A `Recorder` when $LN_JAX_RECORD_DURATIONS names the table to write, else None."""
    path = os.environ.get(RECORD_ENV)
    return Recorder(path) if path else None
