"""Orbax checkpoints of a run: train state, data-iterator state and the config, per step.

Layout: `WORKDIR/checkpoints/<step>/{state, data_iter, config}`. Saves are asynchronous; a
restore goes straight into the sharded layout of an abstract target, so a run may resume on a
different mesh.

Failures are `CheckpointError`s that name the step directory and the cause:
- a save that fails, in the calling thread or in orbax's background threads, is raised by the
  next `save`, by `wait` or by `close` ("check that the workdir is writable and has space");
- a checkpoint whose arrays do not match the model (another placement, size or dtype) is
  *incompatible*: it is left as it is and the error asks for a new workdir;
- a checkpoint whose files cannot be read is *corrupt*: with `fallback` the previous one is
  restored and the corrupt one is renamed `corrupt_<step>`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from ln_jax import paths
from ln_jax.config.run import CheckpointConfig
from ln_jax.train import flat
from ln_jax.train.run_identity import fresh_workdir
from ln_jax.validate import Fix, UserError

log = logging.getLogger(__name__)
ITEMS = ("state", "data_iter", "config")
KEPT_FILE = "kept_steps.json"  # steps never deleted by `keep` (early warnings; a JSON list)
_MAX_CAUSE = 400  # characters of an orbax/tensorstore message kept (they embed JSON specs)
_MAX_NAMES = 6  # mismatching parameter names listed in an incompatibility error


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be saved, or that exists but cannot be restored: the message
    names the step directory, the cause and the fix (command lines print it alone)."""


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a pytree of arrays: a restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


# Parts of tensorstore's messages that say nothing to a user: the JSON spec of the store and
# C++ source locations, and the Python reprs inside such specs (`<bound method pybind11_...>`).
_SPEC_JUNK = re.compile(r"\s*\[(?:tensorstore_spec|source locations)=.*?'\]", re.DOTALL)
_REPR_START = "<bound method "


def _without_reprs(text: str) -> str:
    """`text` without `<bound method ...>` reprs (nested angle brackets included)."""
    while (start := text.find(_REPR_START)) >= 0:
        depth, end = 0, len(text)
        for i in range(start, len(text)):
            depth += {"<": 1, ">": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        text = text[:start] + "<...>" + text[end:]
    return text


def _cause(err: BaseException) -> str:
    """`Type: message`, on one line and bounded, without tensorstore's spec dumps."""
    text = _without_reprs(_SPEC_JUNK.sub("", str(err)))
    text = " ".join(text.split(" [tensorstore_spec=")[0].split())  # a spec cut short
    if len(text) > _MAX_CAUSE:
        text = text[:_MAX_CAUSE] + " [...]"
    return f"{type(err).__name__}: {text}"


def _save_hint(err: BaseException) -> str:
    """What to do about a failed save: a timeout (orbax waits at most 1,200 s for its commit
    threads, in wall time: a process paused with SIGSTOP or a disk that stalls runs out) is
    not a full or read-only disk."""
    if isinstance(err, TimeoutError) or isinstance(err.__cause__, TimeoutError):
        return (
            "the background save ran past orbax's time limit (was the process paused, or the "
            "disk stalled?); rerun the same command: it resumes from the last complete "
            "checkpoint."
        )
    return "check that the workdir is writable and has space."


def _write_replicated_arrays_once() -> None:
    """Orbax splits the writing of replicated arrays between replicas with an eager slice per
    array shape; on CPU those compilations cost ~20 s for a small model's first save (measured:
    27 s vs 0.8 s). GPU backends already turn it off. Registered quietly: orbax warns at every
    override of its default handler, on the console of every run."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
        )
    finally:
        absl_logger.setLevel(level)


class Checkpointer:
    """Saves and restores {state, data_iter, config} with an orbax CheckpointManager."""

    def __init__(self, directory: str | epath.Path, cfg: CheckpointConfig):
        if jax.default_backend() == "cpu":
            _write_replicated_arrays_once()
        if not paths.is_url(directory):  # orbax refuses relative paths (at the first save)
            directory = os.path.abspath(os.path.expanduser(directory))
        self.directory = epath.Path(directory)
        self.cfg = cfg
        self.kept = self._read_kept()
        preserve = ocp.checkpoint_managers
        options = ocp.CheckpointManagerOptions(
            # The last `keep` steps, and the steps `keep_before` protected.
            preservation_policy=preserve.AnyPreservationPolicy(
                [preserve.LatestN(cfg.keep), _KeptSteps(self.kept)]
            ),
            enable_async_checkpointing=cfg.async_save,
            create=True,
            # Step directories are made in the calling thread. Made in orbax's background
            # threads (its default), a failure to make one (read-only or full filesystem) left
            # every writer thread waiting for a "directory created" signal that never came, for
            # orbax's 300 s coordination timeout; the interpreter's exit waited for them.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._pending: int | None = None  # the step whose save may still run in the background

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def keep_before(self, step: int) -> int | None:
        """Protects the latest saved checkpoint before `step` from deletion by `keep` (for
        good: the protected steps are listed in `<directory>/kept_steps.json`); returns its
        step, None if there is none."""
        self.wait()
        earlier = [s for s in self.manager.all_steps() if s < step]
        if not earlier:
            return None
        kept = max(earlier)
        if kept not in self.kept:
            self.kept.add(kept)
            if jax.process_index() == 0:
                paths.write_atomic(self.directory / KEPT_FILE, json.dumps(sorted(self.kept)))
        return kept

    def _read_kept(self) -> set[int]:
        path = self.directory / KEPT_FILE
        return set(json.loads(path.read_text())) if path.exists() else set()

    def save(self, step: int, state: Any, data_state: dict, config: dict) -> None:
        """Starts saving `step` (async); returns once the arrays are safe to donate.

        Raises:
          CheckpointError: if this save cannot start, or the previous one failed in the
            background.
        """
        self._finish_pending()
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(flat.as_tree(state)),
            data_iter=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as err:
            raise self._save_error(step, err) from err
        self._pending = step

    def check(self) -> None:
        """Raises CheckpointError if the last background save has failed; never blocks (the
        trainer calls it at every logged step, so a failure stops the run within seconds)."""
        if self._pending is not None and not self.manager.is_saving_in_progress():
            self._finish_pending()

    def wait(self) -> None:
        """Blocks until the last save is on disk; raises CheckpointError if it failed."""
        self._finish_pending()

    def close(self) -> None:
        """Waits for the last save and releases orbax's threads and files.

        A failed save is raised as CheckpointError, except while another exception is
        propagating (`close` in a `finally`): then it is logged, and the first error is the one
        the caller sees.
        """
        propagating = sys.exc_info()[1] is not None
        try:
            self._finish_pending()
        except CheckpointError as err:
            if not propagating:
                raise
            log.error("%s", err)
        finally:
            self.manager.close()

    def _finish_pending(self) -> None:
        """Waits for the background save, if any; its failure becomes a CheckpointError."""
        step, self._pending = self._pending, None
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as err:
            raise self._save_error(step, err) from err

    def _save_error(self, step: int | None, err: Exception) -> CheckpointError:
        path = self.directory if step is None else self.directory / str(step)
        return CheckpointError(f"cannot save checkpoint {path}: {_cause(err)}; {_save_hint(err)}")

    def restore(self, target: Any) -> tuple[int, Any, dict] | None:
        """Restores the latest checkpoint into `target`'s shapes and shardings.

        Returns:
          (step, state, data_iter_state), or None when the directory holds no checkpoint.

        Raises:
          CheckpointError: naming the checkpoint's path, if its arrays do not match `target`'s
            (nothing is moved or tried further), or if it cannot be read (and, with `fallback`,
            neither can any earlier one).
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        target = flat.as_tree(target)
        errors, broken = [], []
        for step in steps if self.cfg.fallback else steps[:1]:
            path = self.directory / str(step)
            try:
                with _quiet_stray_reads():  # both read the arrays' metadata with tensorstore
                    mismatch = _mismatch(_stored_tree(path / "state"), target)
                    restored = None if mismatch else (step, *self._restore_step(step, target))
            except Exception as err:  # orbax raises many types for a bad file
                errors.append(f"{path}: {_cause(err)}")
                broken.append(step)
                if self.cfg.fallback:  # without it, the error below says the same
                    log.warning("checkpoint %s could not be read: %s", path, _cause(err))
                continue
            if mismatch:
                raise _incompatible_error(path, mismatch)
            self._set_aside(broken)
            return restored
        message = "cannot restore checkpoint " + "; ".join(errors)[:2000] + "."
        if self.cfg.fallback:
            raise CheckpointError(message + " No earlier checkpoint can be read either.")
        raise CheckpointError(
            message + " Set --config.checkpoint.fallback=True to set it aside and resume from "
            "the previous checkpoint (or delete the broken step directory).",
            fix=Fix(set={"--config.checkpoint.fallback": "True"}),
        )

    def restore_step(self, step: int, target: Any) -> Any:
        """The state of checkpoint `step` (not necessarily the latest) in `target`'s shapes and
        shardings, e.g. to fine-tune from a step along a pretraining run.

        Raises:
          CheckpointError: no checkpoint `step` (the saved steps are listed), arrays that do
            not match `target`, or files that cannot be read.
        """
        saved = sorted(self.manager.all_steps())
        path = self.directory / str(step)
        target = flat.as_tree(target)
        if step not in saved:
            raise CheckpointError(
                f"no checkpoint {path}: the saved steps are {saved or 'none'}; name one of them."
            )
        try:
            with _quiet_stray_reads():
                mismatch = _mismatch(_stored_tree(path / "state"), target)
                state = None if mismatch else self._restore_step(step, target)[0]
        except Exception as err:
            raise CheckpointError(f"cannot restore checkpoint {path}: {_cause(err)}.") from err
        if mismatch:
            raise _incompatible_error(path, mismatch)
        return state

    def _set_aside(self, steps: list[int]) -> None:
        """Renames unrestorable step directories to `corrupt_<step>` (kept for inspection),
        so that training can go on past them."""
        for step in steps:
            (self.directory / str(step)).rename(self.directory / f"corrupt_{step}")
            log.warning("moved unrestorable checkpoint %s aside to corrupt_%d", step, step)
        if steps:
            self.manager.reload()

    def _restore_step(self, step: int, target: Any) -> tuple[Any, dict]:
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_like(target)),
            data_iter=ocp.args.JsonRestore(),
        )
        restored = self.manager.restore(step, args=args)
        return restored["state"], restored["data_iter"]

    def restore_config(self, step: int) -> dict:
        """The run's config saved with checkpoint `step` (one saved before 2026-12-05 with the
        task's fields read into its section: `ln_jax.task.moved_options`)."""
        from ln_jax.task import moved_options

        args = ocp.args.Composite(config=ocp.args.JsonRestore())
        return moved_options(self.manager.restore(step, args=args)["config"])


class _KeptSteps(ocp.checkpoint_managers.PreservationPolicy):
    """Orbax preservation policy: preserve the steps of a set that may grow during the run."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        del context
        return [c.step in self.steps for c in checkpoints]


def _stored_tree(item_dir: epath.Path) -> Any:
    """The saved state's tree of array metadata (shape, dtype), read from its metadata file
    only. Raises whatever orbax raises when that file cannot be read (a corrupt checkpoint)."""
    handler = ocp.StandardCheckpointHandler()
    try:
        return handler.metadata(item_dir).tree
    finally:
        handler.close()


def _spec(leaf: Any) -> str | None:
    """`float32[2, 3]` for anything with a shape and a dtype, else None (not compared)."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        dtype = np.dtype(dtype).name
    except TypeError:  # extended dtypes (PRNG keys)
        dtype = str(dtype)
    return f"{dtype}{list(shape)}"


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_NAMES])
    return shown + (f" (+{len(keys) - _MAX_NAMES} more)" if len(keys) > _MAX_NAMES else "")


def _mismatch(stored: Any, target: Any) -> str:
    """How the saved arrays differ from `target`'s (names, shapes, dtypes); "" if they match."""
    saved = ocp.tree.to_flat_dict(stored, sep=".")
    wanted = ocp.tree.to_flat_dict(target, sep=".")
    parts = []
    if missing := sorted(wanted.keys() - saved.keys()):
        parts.append(f"not in the checkpoint: {_names(missing)}")
    if extra := sorted(saved.keys() - wanted.keys()):
        parts.append(f"not in this model: {_names(extra)}")
    specs = {key: (_spec(saved[key]), _spec(wanted[key])) for key in saved.keys() & wanted.keys()}
    differ = [
        f"{key} is {there} there, {here} here"
        for key, (there, here) in sorted(specs.items())
        if there and here and there != here
    ]
    if differ:
        parts.append(_names(differ))
    return "; ".join(parts)


def _incompatible_error(path: epath.Path, mismatch: str) -> CheckpointError:
    fresh = fresh_workdir(str(path.parent.parent))  # WORKDIR/checkpoints/<step>
    return CheckpointError(
        f"checkpoint {path} was written by a different model config (another placement, size "
        f"or dtype): {mismatch}. It reads fine and was left as it is. To train this config, "
        f"use a new --workdir (e.g. --workdir={fresh}); to resume that run, use the config it "
        "was started with.",
        fix=Fix(set={"--workdir": fresh}),
    )


_stray_log = logging.getLogger("tensorstore")  # another library: train.log, not the terminal


def _is_stray_read_report(unraisable: Any) -> bool:
    """Whether an unraisable report is one of a failed restore's leftover reads: "Event loop
    is closed", or any exception ignored in a coroutine (orbax's reads are coroutines)."""
    err = unraisable.exc_value
    closed = isinstance(err, RuntimeError) and str(err) == "Event loop is closed"
    return closed or inspect.iscoroutine(unraisable.object)


def _stray_reads_to_log(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """An unraisable hook that logs stray-read reports (to train.log, one line each with
    the traceback in the file; dropped at interpreter exit, when logging is gone) and passes
    on the rest."""

    # Bound here: at interpreter exit this module's globals may already be cleared (None)
    # while the leftover reads are still being collected.
    is_stray, finalizing = _is_stray_read_report, sys.is_finalizing

    def hook(unraisable: Any) -> None:
        try:
            stray = is_stray(unraisable)
        except Exception:  # the check's own modules torn down: only at exit
            stray = finalizing()
        if not stray:
            previous(unraisable)
            return
        if finalizing():  # at exit: the log file is closed, logging half torn down
            return
        err = unraisable.exc_value
        # A report of a discarded read is not worth a failure of its own.
        with contextlib.suppress(Exception):
            _stray_log.info(
                "ignored after a failed checkpoint read: %s %r",
                unraisable.err_msg or "Exception ignored in",
                unraisable.object,
                exc_info=(type(err), err, unraisable.exc_traceback) if err else None,
            )

    hook.logs_stray_reads = True
    return hook


class _OrphanedReadFilter(logging.Filter):
    """Moves asyncio's "Task/Future exception was never retrieved" reports of tensorstore
    reads to the stray-read log at INFO (train.log, not the terminal): the same leftover reads
    of a failed restore as below, when their task is collected before the loop closes (the
    restore's own error already names the checkpoint). Re-logged rather than demoted in
    place: asyncio's logger has already passed the record at ERROR, and a root handler
    without a level (`logging.basicConfig`) would print it at any level."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "exception was never retrieved" in text and "tensorstore" in text:
            _stray_log.info("ignored after a failed checkpoint read: %s", text[:300])
            return False
        return True


def _demote_orphaned_read_errors() -> None:
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrphanedReadFilter) for f in logger.filters):
        logger.addFilter(_OrphanedReadFilter())


@contextlib.contextmanager
def _quiet_stray_reads() -> Iterator[None]:
    """Sends the reports of a failed restore's leftover reads to the log file.

    Orbax runs a restore's tensorstore reads (and those of its metadata: the arrays' shapes and
    dtypes) in an event loop of its own and closes that loop as soon as one read fails; the
    reads still in flight finish afterwards and, unable to hand their results to the closed
    loop, each is reported as an unraisable exception ignored in a coroutine (thousands for a
    model, many after the restore has returned: a fallback restores the previous checkpoint
    while they come, some come at exit). Their results were to be discarded anyway. The hook
    that logs them is set while a restore runs and, once one has failed, for the rest of the
    process; every other unraisable report is passed on.
    """
    _demote_orphaned_read_errors()
    previous = sys.unraisablehook
    if getattr(previous, "logs_stray_reads", False):
        yield
        return
    sys.unraisablehook = hook = _stray_reads_to_log(previous)
    yield  # an exception propagates from here and leaves the hook in place
    if sys.unraisablehook is hook:
        sys.unraisablehook = previous
