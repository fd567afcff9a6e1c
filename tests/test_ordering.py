"""The suite's file order (tests/ordering.py): longest first, each file's tests together."""

from __future__ import annotations

from pathlib import Path

from tests import ordering

ROOT = Path(__file__).resolve().parents[1]


def test_longest_files_first_each_file_together_unknown_files_as_the_median():
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t", "tests/d.py::t"]
    seconds = {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/d.py": 20.0, "tests/e.py": 1.0}
    order = [ids[i] for i in ordering.longest_first(ids, seconds)]
    # median of (50, 20, 5, 1) is 12.5: c.py (unknown) goes between d.py and a.py
    assert order == [
        "tests/b.py::t1", "tests/d.py::t", "tests/c.py::t", "tests/a.py::t1", "tests/a.py::t2"
    ]  # fmt: skip
    assert ordering.longest_first(ids, {}) == [0, 2, 1, 3, 4]  # no table: collection order


def test_the_recorder_writes_the_table_it_reads(tmp_path):
    rec = ordering.Recorder(str(tmp_path / "d.json"))
    for nodeid, seconds in [("tests/a.py::x", 1.0), ("tests/b.py::y", 2.5), ("tests/a.py::z", 3.0)]:
        rec.add(nodeid, seconds)
    rec.write()
    assert ordering.read_table(tmp_path / "d.json") == {"tests/a.py": 4.0, "tests/b.py": 2.5}


def test_the_table_names_the_test_files_there_are():
    table = ordering.read_table()
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    assert set(table) <= files, f"stale entries in tests/durations.json: {set(table) - files}"
    assert len(table) >= len(files) - 3, "refresh tests/durations.json (tests/ordering.py)"
