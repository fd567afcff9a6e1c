"""Checkpoint failures: a save that fails (in the calling thread or in orbax's background
threads) stops the run with a CheckpointError and lets the process exit; an incompatible
checkpoint is told apart from a corrupt one; a corrupt one fails quietly.

The process-level checks run tests/checkpoint_failure_worker.py in a subprocess, since a hang
(orbax's threads) shows at interpreter shutdown and stray reports at exit.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ln_jax.config.run import CheckpointConfig
from ln_jax.train.checkpoint import Checkpointer, CheckpointError
from tests.xla_env import xla_flags

WORKER = Path(__file__).with_name("checkpoint_failure_worker.py")
EXIT_WITHIN_S = 60  # the old code hung for orbax's 300 s coordination timeout


def run_worker(mode: str, directory: Path) -> subprocess.CompletedProcess:
    """Runs the worker; fails the test if it has not exited within EXIT_WITHIN_S."""
    start = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKER), mode, str(directory)],
            capture_output=True,
            text=True,
            timeout=EXIT_WITHIN_S,
            env={**os.environ, "XLA_FLAGS": xla_flags(1)},
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"{mode}: the process did not exit within {EXIT_WITHIN_S} s: {hung.stdout}")
    print(f"{mode}: {time.time() - start:.1f} s\n{proc.stdout}\n{proc.stderr}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RETURNED" in proc.stdout
    return proc


def state() -> dict:
    return {"a": jnp.arange(4.0), "b": {"c": jnp.ones((2, 3))}}


def save_one(directory: Path, step: int = 1, **cfg) -> None:
    ckpt = Checkpointer(directory, CheckpointConfig(**cfg))
    ckpt.save(step, state(), {"position": step}, {"name": "t"})
    ckpt.close()


async def _no_space(self, item, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))


# --------------------------------------------------------------------------- failed saves


def test_process_whose_directory_became_unwritable_exits_with_checkpoint_error(tmp_path):
    directory = tmp_path / "checkpoints"
    out = run_worker("dir_replaced", directory).stdout
    assert f"ERROR CheckpointError: cannot save checkpoint {directory / '20'}" in out
    assert "NotADirectoryError" in out and "writable" in out


def test_process_whose_save_fails_in_background_exits_with_checkpoint_error(tmp_path):
    directory = tmp_path / "checkpoints"
    out = run_worker("background", directory).stdout
    assert f"ERROR CheckpointError: cannot save checkpoint {directory / '20'}" in out
    assert "No space left on device" in out


def test_background_failure_is_raised_by_close(tmp_path, monkeypatch):
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _no_space)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    ckpt.save(20, state(), {"position": 20}, {"name": "t"})  # the write fails later
    with pytest.raises(CheckpointError, match=f"{tmp_path / '20'}: OSError: .*No space left"):
        ckpt.close()
    assert not (tmp_path / "20").exists()


async def _commit_timed_out(self, item, directory):
    # What orbax raises when its commit threads outlive its limit (wall time: a process paused
    # with SIGSTOP during a save ran into it on resuming).
    raise TimeoutError("Thread write_metadata_after_commits did not complete within 1200 s")


def test_a_timed_out_save_says_to_rerun_not_to_check_the_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _commit_timed_out)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    ckpt.save(20, state(), {"position": 20}, {"name": "t"})
    with pytest.raises(CheckpointError, match=f"{tmp_path / '20'}: TimeoutError") as raised:
        ckpt.close()
    message = str(raised.value)
    assert "time limit" in message and "rerun the same command" in message
    assert "writable" not in message


def test_background_failure_is_raised_by_the_next_save_and_only_once(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _no_space)
    ckpt.save(20, state(), {"position": 20}, {"name": "t"})
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=f"cannot save checkpoint {tmp_path / '20'}:"):
        ckpt.save(30, state(), {"position": 30}, {"name": "t"})
    ckpt.close()


def test_close_while_an_error_propagates_logs_the_save_failure(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _no_space)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    ckpt.save(20, state(), {"position": 20}, {"name": "t"})
    with pytest.raises(KeyError, match="first"), caplog.at_level(logging.ERROR):
        try:
            raise KeyError("first")
        finally:
            ckpt.close()
    assert f"cannot save checkpoint {tmp_path / '20'}" in caplog.text


@pytest.mark.parametrize("async_save", [True, False])
def test_unwritable_directory_fails_at_save(tmp_path, async_save):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=async_save))
    directory.rmdir()
    directory.write_text("not a directory")
    with pytest.raises(CheckpointError, match=f"{directory / '7'}: NotADirectoryError"):
        ckpt.save(7, state(), {"position": 7}, {"name": "t"})
    ckpt.close()


# ------------------------------------------------------------------- incompatible checkpoints


@pytest.mark.parametrize(
    "target",
    [
        {"a": jnp.zeros(5), "b": {"c": jnp.ones((2, 3))}},  # another size
        {"x": jnp.zeros(4), "b": {"c": jnp.ones((2, 3))}},  # another parameter
        {"a": jnp.zeros(4), "b": {"c": jnp.ones((2, 3), jnp.bfloat16)}},  # another dtype
    ],
    ids=["shape", "structure", "dtype"],
)
def test_incompatible_checkpoint_asks_for_a_new_workdir_and_is_kept(tmp_path, target):
    save_one(tmp_path, step=1)
    save_one(tmp_path, step=2)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(fallback=True))
    with pytest.raises(CheckpointError) as raised:
        ckpt.restore(target)
    ckpt.close()
    message = str(raised.value)
    assert f"checkpoint {tmp_path / '2'} was written by a different model config" in message
    assert "--workdir" in message and "delete" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_incompatibility_names_the_parameters(tmp_path):
    save_one(tmp_path)
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(CheckpointError, match=r"a is float32\[4\] there, float32\[5\] here"):
        ckpt.restore({"a": jnp.zeros(5), "b": {"c": jnp.ones((2, 3))}})
    with pytest.raises(CheckpointError, match="not in the checkpoint: x; not in this model: a"):
        ckpt.restore({"x": jnp.zeros(4), "b": {"c": jnp.ones((2, 3))}})
    ckpt.close()


# ------------------------------------------------------------------------ corrupt checkpoints


def corrupt(step_dir: Path) -> None:
    for f in (step_dir / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")


def test_corrupt_checkpoint_names_its_path_and_is_set_aside_with_fallback(tmp_path):
    save_one(tmp_path, step=1)
    save_one(tmp_path, step=2)
    corrupt(tmp_path / "2")
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(CheckpointError, match=f"cannot restore checkpoint {tmp_path / '2'}: "):
        ckpt.restore(state())
    ckpt.close()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(fallback=True))
    step, restored, data_state = ckpt.restore(state())
    ckpt.close()
    assert step == 1 and data_state == {"position": 1}
    np.testing.assert_array_equal(restored["a"], np.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "corrupt_2"]


@pytest.mark.parametrize("mode", ["corrupt_all", "corrupt_data"])
def test_corrupt_checkpoint_fails_quietly(tmp_path, mode):
    directory = tmp_path / "checkpoints"
    proc = run_worker(mode, directory)
    assert f"ERROR CheckpointError: cannot restore checkpoint {directory / '2'}" in proc.stdout
    assert "RESTORED step 1 {'position': 1}" in proc.stdout  # with fallback
    assert "Event loop is closed" not in proc.stderr
    assert len(proc.stderr.splitlines()) < 20, proc.stderr


def test_an_orphaned_read_report_leaves_a_bare_root_handler_and_goes_to_the_log():
    """asyncio's report of a leftover tensorstore read is re-logged at INFO on the stray-read
    logger; a root handler without a level (as `logging.basicConfig` leaves, where the CI run
    printed 131 such lines) must not see it at any level. Other asyncio errors pass."""
    from ln_jax.train import checkpoint

    seen: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = seen.append
    root = logging.getLogger()
    before = root.level
    root.addHandler(catcher)
    root.setLevel(logging.INFO)
    try:
        checkpoint._demote_orphaned_read_errors()
        asyncio_log = logging.getLogger("asyncio")
        asyncio_log.error(
            "Future exception was never retrieved\nfuture: <Future finished exception="
            "ValueError('DATA_LOSS: Error reading \"w10/.zarray\" [tensorstore_spec=...]')>"
        )
        asyncio_log.error("Task exception was never retrieved: something else")
    finally:
        root.removeHandler(catcher)
        root.setLevel(before)
    by_logger = [(r.name, r.levelname, r.getMessage()[:40]) for r in seen]
    assert by_logger == [
        ("tensorstore", "INFO", "ignored after a failed checkpoint read: "),
        ("asyncio", "ERROR", "Task exception was never retrieved: some"),
    ]


@pytest.mark.parametrize("at_exit", [True, False])
def test_the_stray_read_hook_survives_its_module_torn_down(monkeypatch, at_exit):
    """At interpreter exit Python clears module globals while a failed restore's leftover reads
    are still collected; the hook then reported its own TypeError once a read (406 lines on a
    resumed run's terminal). Now a report it cannot classify is dropped at exit and passed on
    before it."""
    import types

    from ln_jax.train import checkpoint

    passed_on = []
    monkeypatch.setattr(sys, "is_finalizing", lambda: at_exit)
    hook = checkpoint._stray_reads_to_log(passed_on.append)
    monkeypatch.setattr(checkpoint, "_is_stray_read_report", None)  # as at exit
    monkeypatch.setattr(checkpoint, "inspect", None)
    report = types.SimpleNamespace(  # not "Event loop is closed": the check needs `inspect`
        exc_value=ValueError("a read's error"),
        object=None,
        err_msg=None,
        exc_traceback=None,
    )
    hook(report)
    assert passed_on == ([] if at_exit else [report])
