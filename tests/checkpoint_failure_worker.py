"""A process whose checkpoint save or restore fails, for tests/test_checkpoint_failures.py.

`python tests/checkpoint_failure_worker.py MODE DIRECTORY`, MODE one of:
- `dir_replaced`: after a good save, the checkpoints directory becomes a file (as if the
  filesystem had turned read-only), then a save is attempted;
- `background`: a save whose JSON items fail to write in orbax's background thread;
- `corrupt_all` / `corrupt_data`: step 2's state files (all of them / all but the metadata)
  are overwritten with garbage, then restored without and with fallback.

Each error is caught and printed as `ERROR <type>: <message>`; the script then returns, so a
process that does not exit promptly hangs at interpreter shutdown.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from ln_jax.config.run import CheckpointConfig  # noqa: E402
from ln_jax.train.checkpoint import Checkpointer  # noqa: E402

STATE = {f"w{i}": jnp.full((8, 4), float(i)) for i in range(48)} | {"step": jnp.asarray(3)}


def report(err: BaseException) -> None:
    print(f"ERROR {type(err).__name__}: {err}", flush=True)


def save_after_dir_replaced(directory: pathlib.Path) -> None:
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=True))
    ckpt.save(10, STATE, {"position": 10}, {"name": "w"})
    ckpt.wait()
    shutil.rmtree(directory)
    directory.write_text("not a directory")
    save_and_close(ckpt, 20)


def save_and_close(ckpt: Checkpointer, step: int) -> None:
    """Saves `step` and closes, reporting the error either raises."""
    try:
        try:
            ckpt.save(step, STATE, {"position": step}, {"name": "w"})
        finally:
            ckpt.close()
    except Exception as err:
        report(err)


async def _no_space(self, item, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))


def save_failing_in_background(directory: pathlib.Path) -> None:
    ocp.JsonCheckpointHandler._save_fn = _no_space
    save_and_close(Checkpointer(directory, CheckpointConfig(async_save=True)), 20)


def restore_corrupt(directory: pathlib.Path, keep_metadata: bool) -> None:
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=True))
    for step in (1, 2):
        ckpt.save(step, STATE, {"position": step}, {"name": "w"})
    ckpt.close()
    for f in (directory / "2" / "state").rglob("*"):
        if f.is_file() and not (keep_metadata and f.name in ("_METADATA", "_sharding")):
            f.write_bytes(b"garbage")
    for fallback in (False, True):
        ckpt = Checkpointer(directory, CheckpointConfig(fallback=fallback))
        try:
            step, _, data_state = ckpt.restore(STATE)
            print(f"RESTORED step {step} {data_state}", flush=True)
        except Exception as err:
            report(err)
        finally:
            ckpt.close()


def main(mode: str, directory: str) -> None:
    path = pathlib.Path(directory)
    if mode == "dir_replaced":
        save_after_dir_replaced(path)
    elif mode == "background":
        save_failing_in_background(path)
    else:
        restore_corrupt(path, keep_metadata=mode == "corrupt_data")
    print("RETURNED", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
