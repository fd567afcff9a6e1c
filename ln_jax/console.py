"""What a command line shows: the progress line, ln_jax's own messages, and one line per
user error; every library's INFO log goes to a file instead (`WORKDIR/train.log`).

Errors the user must fix (`ln_jax.validate.UserError`: config, mesh, dataset, workdir,
checkpoint, a workdir holding another run) print as `error: ...` and exit 2; the traceback is
shown only on request (`--traceback`, or LN_JAX_TRACEBACK=1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator

from ln_jax import paths
from ln_jax.validate import UserError

EXIT_USER_ERROR = 2
TRACEBACK_ENV = "LN_JAX_TRACEBACK"
_FILE_FORMAT = "%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] %(message)s"


# Libraries whose failures come back to ln_jax as exceptions it reports itself (orbax's
# failed saves and restores: `CheckpointError`): their log records go to the file only. A full
# disk made orbax log ~530 lines of tracebacks on the terminal before that one-line error.
FILE_ONLY_PACKAGES = ("orbax", "tensorstore")


# ln_jax's records for the log file only, under this logger (`file_only_logger`): e.g. the
# early-warning notes, states that healthy runs pass through too, which the terminal would
# show as alarms.
FILE_ONLY_LOGGER = "ln_jax.log_file_only"


def file_only_logger(name: str) -> logging.Logger:
    """A logger of ln_jax whose records go to the log file (`WORKDIR/train.log`), never to the
    terminal: `ln_jax.log_file_only.<name>`."""
    return logging.getLogger(f"{FILE_ONLY_LOGGER}.{name}")


def _file_only(record: logging.LogRecord) -> bool:
    return record.name == FILE_ONLY_LOGGER or record.name.startswith(FILE_ONLY_LOGGER + ".")


def _package(record: logging.LogRecord) -> str:
    """The top-level package a record comes from: its logger's name, or for absl's shared
    logger (used by orbax, TFDS, ...) the package of the file that logged it."""
    top = record.name.split(".")[0]
    if top != "absl":
        return top
    parts = record.pathname.replace(os.sep, "/").split("/site-packages/")
    return parts[-1].split("/")[0] if len(parts) > 1 else top


class _ConsoleFilter(logging.Filter):
    """ln_jax's INFO and above, except its file-only records (`file_only_logger`); every
    other library's WARNING and above, except those of `FILE_ONLY_PACKAGES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        package = _package(record)
        if package == "ln_jax":
            return record.levelno >= logging.INFO and not _file_only(record)
        return record.levelno >= logging.WARNING and package not in FILE_ONLY_PACKAGES


class _ConsoleFormatter(logging.Formatter):
    """`LEVEL message`; another library's record shows its first line only (its traceback
    and the rest are in the log file)."""

    def format(self, record: logging.LogRecord) -> str:
        if _package(record) == "ln_jax":
            return super().format(record)
        first = record.getMessage().strip().splitlines() or [""]
        more = " (more in the log file)" if record.exc_info or len(first) > 1 else ""
        return f"{record.levelname} {first[0]}{more}"


@contextlib.contextmanager
def absl_level(level: int) -> Iterator[None]:
    """absl's logger (orbax, TFDS, JAX's backend lines) at `level` inside the block, as before
    after it: a command run in-process (the tests run several in one process) leaves the
    process's logging as it found it."""
    logger = logging.getLogger("absl")
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def configure_logging(log_file: str | None = None) -> None:
    """Sends every log record at INFO and above to `log_file` (appended; it may be a URL) and
    only what `_ConsoleFilter` passes to stderr, one line per record of another library;
    replaces absl's and earlier handlers on the root."""
    close_logging()
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(_ConsoleFilter())
    console.setFormatter(_ConsoleFormatter("%(levelname)s %(message)s"))
    root.addHandler(console)
    if log_file is not None:
        to_file = _log_file_handler(log_file)
        to_file.setFormatter(logging.Formatter(_FILE_FORMAT))
        root.addHandler(to_file)


@contextlib.contextmanager
def logging_to(log_file: str) -> Iterator[None]:
    """Every log record the process passes (INFO and above under `configure_logging`) also
    appended to `log_file` (it may be a URL) while the block runs: one run of a study, whose
    library logs go to its own `train.log` as `train.py`'s do."""
    handler = _log_file_handler(log_file)
    handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def close_logging() -> None:
    """Removes and closes the root's handlers (a log file on a URL gets its last upload) and
    leaves a `NullHandler`: a library thread still running after the command (orbax's, after
    a failed save) that logs through `logging.info(...)` would otherwise install
    `logging.basicConfig`'s stderr handler on the handler-less root, and its records, INFO
    included, would follow the command's last line on the terminal."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):
            handler.close()
    root.addHandler(logging.NullHandler())


def _log_file_handler(log_file: str) -> logging.FileHandler:
    """A FileHandler; for a URL, one writing a local copy that is uploaded periodically."""
    if not paths.is_url(log_file):
        return logging.FileHandler(log_file)
    folder, name = log_file.rsplit("/", 1)
    return _StagedFileHandler(paths.Staging(folder), name)


class _StagedFileHandler(logging.FileHandler):
    """Appends to a local copy of a log file on a URL (object stores cannot append) and
    uploads it at most every `Staging.sync_secs`, and on close (`close_logging`, or logging's
    own shutdown at exit)."""

    def __init__(self, staging: paths.Staging, name: str):
        self.staging = staging
        super().__init__(staging.fetch(name))

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.staging.sync()

    def close(self) -> None:
        super().close()
        self.staging.close()


def wants_traceback(flag: bool = False) -> bool:
    return flag or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def run_reporting_errors(
    main: Callable[[], int],
    show_traceback: bool = False,
    failures: tuple[type[BaseException], ...] = (),
) -> int:
    """Runs `main`; a UserError prints one line and returns 2, one of `failures` (e.g. a
    NaN stop) prints one line and returns 1. Anything else is a bug: its traceback shows."""
    try:
        return main()
    except UserError as err:
        return _report(err, EXIT_USER_ERROR, show_traceback)
    except failures as err:
        return _report(err, 1, show_traceback)
    except Exception as err:
        if not _out_of_memory(err):
            raise
        return _report(OutOfMemoryError(err), 1, show_traceback)
    except KeyboardInterrupt:
        print("aborted (nothing saved since the last checkpoint)", file=sys.stderr)
        return 130


class OutOfMemoryError(Exception):
    """A device ran out of memory: XLA's first line, then what to change."""

    def __init__(self, err: BaseException):
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        super().__init__(
            f"the device ran out of memory ({first}). The step does not fit: let ln_jax pick "
            "the micro-batches (--config.grad_accum_steps=0, auto), lower "
            "--config.data.global_batch_size, or recompute activations "
            "(--config.model.remat=dots, or =full); `python -m ln_jax.compile_check --config=...` "
            "estimates the memory ahead of time. The last checkpoint is kept."
        )


def _out_of_memory(err: BaseException) -> bool:
    """XLA's allocation failure (a JaxRuntimeError whose status is RESOURCE_EXHAUSTED)."""
    return type(err).__name__ == "JaxRuntimeError" and "RESOURCE_EXHAUSTED" in str(err)


def run_command(
    main: Callable[[], int],
    show_traceback: bool = False,
    failures: tuple[type[BaseException], ...] = (),
) -> int:
    """A command line's whole run (train.py, finetune.py): logging set up, `main` run as
    `run_reporting_errors` runs it, and the logs closed whatever happens (a log file on gs://
    gets its last upload there)."""
    configure_logging()
    try:
        return run_reporting_errors(main, show_traceback, failures=failures)
    finally:
        close_logging()


def _report(err: BaseException, status: int, show_traceback: bool) -> int:
    if wants_traceback(show_traceback):
        traceback.print_exception(err)
    print(f"error: {err}", file=sys.stderr, flush=True)
    return status
