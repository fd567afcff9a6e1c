"""One process trains a workdir at a time: WORKDIR/train.lock holds the trainer's pid."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ln_jax.validate import UserError

LOCK_FILE = "train.lock"


class RunLockedError(UserError):
    """Another live process is training the run in this directory."""


@contextlib.contextmanager
def run_lock(workdir: str) -> Iterator[None]:
    """Holds WORKDIR/train.lock (this process's pid) while a run trains, so that two
    processes (two `train.py` calls, two studies over the same --out) never train one workdir
    at once; a lock whose process is gone (killed) is taken over, and a lock this process
    already holds is held again (re-entrant: a study's runner, then the trainer). A remote
    workdir ("gs://...") is not locked: the lock is a local file.

    Raises:
      RunLockedError: a live process holds the lock.
    """
    if "://" in workdir:
        yield
        return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_FILE)
    if _pid_in(path) == os.getpid():  # already ours: the outer holder releases it
        yield
        return
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _lock_holder(path)
            if holder is not None:
                raise _locked(workdir, holder, path) from None
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return
    raise RunLockedError(f"could not take {path}; another process keeps recreating it.")


def check_free(workdir: str) -> None:
    """Raises what `run_lock` would for a workdir a live process trains, before a command
    builds anything (a second run on a busy workdir was refused after 22 s of set-up). Only a
    first look: `run_lock` is what holds the workdir.

    Raises:
      RunLockedError: a live process holds the lock.
    """
    if "://" in workdir:
        return
    path = os.path.join(workdir, LOCK_FILE)
    holder = _lock_holder(path)
    if holder is not None:
        raise _locked(workdir, holder, path)


def _locked(workdir: str, holder: int, path: str) -> RunLockedError:
    return RunLockedError(
        f"{workdir} is being trained by process {holder} ({path}); wait for it or stop it. "
        f"If no process of yours trains it, delete {path}."
    )


def _pid_in(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return None


def _lock_holder(path: str) -> int | None:
    """The pid in a lock file if that process is alive (and not this one), else None."""
    pid = _pid_in(path)
    if pid is None or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        return pid
    return pid
