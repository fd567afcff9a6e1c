"""The opt-in CPU plugin (tests/cpu_by_file.py): its table sums the workers' records, reads the
older ones without a compile column, and its compile seconds are XLA's."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from tests import cpu_by_file


def test_the_table_sums_the_workers_and_reads_records_without_a_compile_column(tmp_path):
    (tmp_path / "cpu-gw0.json").write_text(json.dumps({"tests/test_a.py": [10, 1, 12, 4]}))
    older = {"tests/test_a.py": [5, 0, 5], "tests/test_b.py": [1, 20, 22]}
    (tmp_path / "cpu-gw1.json").write_text(json.dumps(older))
    lines = cpu_by_file.table(str(tmp_path)).splitlines()
    assert lines[0] == (
        "2 files: own 16 s (XLA compiling 4 s of wall), subprocesses 21 s, wall 39 s"
    )
    assert lines[1].split() == [
        "21.0", "own", "1.0", "compiling", "0.0", "subprocesses", "20.0", "wall", "22.0",
        "tests/test_b.py",
    ]  # fmt: skip
    assert lines[2].split()[:5] == ["16.0", "own", "15.0", "compiling", "4.0"]


def test_the_compile_seconds_are_xla_s_and_a_cached_call_adds_none(monkeypatch):
    monkeypatch.setattr(cpu_by_file, "_COMPILING", [0.0])
    jax.monitoring.register_event_duration_secs_listener(cpu_by_file._count_compiles)
    try:
        f = jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())
        f(jnp.ones((3, 7))).block_until_ready()
        compiled = cpu_by_file._COMPILING[0]
        f(jnp.ones((3, 7))).block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(cpu_by_file._count_compiles)
    assert 0.0 < compiled == cpu_by_file._COMPILING[0]
