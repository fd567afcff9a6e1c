"""`train.py` with a simulated failure, for tests/test_run_output.py (what the terminal shows).

`python tests/run_output_worker.py MODE [train.py arguments]`, MODE one of:
- `plain`: train.py as it is;
- `full_disk`: orbax's JSON writes fail with ENOSPC in its background threads (as
  tests/test_checkpoint_failures.py simulates a full disk);
- `stray_reads`: a checkpoint whose files cannot be read fails the way tensorstore fails: the
  error carries its JSON spec (with a `<bound method pybind11_...>` repr in it) and the failed
  restore leaves STRAY reads behind, coroutines that report "Event loop is closed" when they
  are collected: half of them just after the restore, half at exit (what orbax's leftover
  reads do on a large model).
"""

from __future__ import annotations

import errno
import os
import runpy
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STRAY = 200
SPEC = (
    ' [tensorstore_spec=\'{"context":{"cache_pool":{},"file_io_concurrency":'
    "<bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx"
    '.__call__ of <tensorstore.Spec object at 0x7f>>},"driver":"zarr"}\']'
)
_kept: list = []  # the stray reads collected at exit


async def _read(loop_closed: list) -> None:
    """A read whose result comes back after its event loop has closed."""
    try:
        await _Pending()
    finally:
        if loop_closed:
            raise RuntimeError("Event loop is closed")


class _Pending:
    def __await__(self):
        yield


def _leave_stray_reads() -> None:
    """STRAY suspended reads: half collected 0.2 s from now, half at exit."""
    closed = [True]
    reads = []
    for _ in range(STRAY):
        coro = _read(closed)
        coro.send(None)  # started, suspended at its await
        reads.append(coro)
    _kept.extend(reads[STRAY // 2 :])
    later = reads[: STRAY // 2]
    threading.Timer(0.2, later.clear).start()


def _simulate_stray_reads() -> None:
    from ln_jax.train import checkpoint

    real = checkpoint._stored_tree

    def stored_tree(item_dir):
        try:
            return real(item_dir)
        except Exception as err:
            _leave_stray_reads()
            raise ValueError(f"DATA_LOSS: Error reading {item_dir}: {err}{SPEC}") from None

    checkpoint._stored_tree = stored_tree


async def _no_space(self, item, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))


def main(mode: str, args: list[str]) -> None:
    if mode == "full_disk":
        import orbax.checkpoint as ocp

        ocp.JsonCheckpointHandler._save_fn = _no_space
    elif mode == "stray_reads":
        _simulate_stray_reads()
    sys.argv = [str(ROOT / "train.py"), *args]
    os.chdir(ROOT)
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
