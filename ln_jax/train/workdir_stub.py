"""A workdir that a user error leaves holding nothing of value is removed again: train.py and
finetune.py run their set-up and training inside `no_stub_workdir(workdir)`."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

from ln_jax import console
from ln_jax.validate import UserError

# What a run writes into its workdir before its first checkpoint: a workdir holding only
# these (and empty folders) after a user error holds nothing of value.
STUB_FILES = ("train.log", "finetune.log", "train.lock")
_PROBE_PREFIX = ".ln_jax_write_probe."


@contextlib.contextmanager
def no_stub_workdir(workdir: str) -> Iterator[None]:
    """Removes `workdir` (and the empty folders above it) if this command created it and a
    user error (or an interrupt) stops the command before anything but a stub (`STUB_FILES`,
    empty folders) is in it: a mistyped dataset leaves no `train.log` and empty
    `checkpoints/` behind. A workdir that existed, a URL, or one holding anything else is
    left as it is; so is everything after an unexpected error (its log helps a bug report).
    """
    from ln_jax import paths
    from ln_jax.train.preemption import SetupSignals

    created = _first_missing(workdir) if not paths.is_url(workdir) else None

    def remove_stub() -> None:
        if created is not None and _only_stub(workdir):
            console.configure_logging()  # the log file goes: log to the terminal only
            _remove_stub(workdir, created)

    signals = SetupSignals.active
    if signals is not None:  # a SIGTERM during set-up removes it too
        signals.cleanups.append(remove_stub)
    try:
        yield
    except (UserError, KeyboardInterrupt):
        remove_stub()
        raise
    finally:
        if signals is not None:
            signals.cleanups.remove(remove_stub)


def _first_missing(path: str) -> str | None:
    """The outermost folder of `path` that does not exist yet (None if `path` exists)."""
    path = os.path.abspath(path)
    missing = None
    while not os.path.exists(path):
        missing, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _only_stub(workdir: str) -> bool:
    for _, _, files in os.walk(workdir):
        if any(f not in STUB_FILES and not f.startswith(_PROBE_PREFIX) for f in files):
            return False
    return True


def _remove_stub(workdir: str, created: str) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
    folder = os.path.dirname(os.path.abspath(workdir))
    while len(folder) >= len(created) and os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)
        folder = os.path.dirname(folder)
