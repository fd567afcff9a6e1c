"""What a command line shows: the progress line, ln_jax's own messages, and one line per
user error; every library's INFO log goes to a file instead (`WORKDIR/train.log`).

Errors the user must fix (`ln_jax.validate.UserError`: config, mesh, dataset, workdir,
checkpoint, a workdir holding another run) print as `error: ...` and exit 2; the traceback is
shown only on request (`--traceback`, or LN_JAX_TRACEBACK=1).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable

from ln_jax.validate import UserError

EXIT_USER_ERROR = 2
TRACEBACK_ENV = "LN_JAX_TRACEBACK"
_FILE_FORMAT = "%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] %(message)s"


class _ConsoleFilter(logging.Filter):
    """ln_jax's INFO and above; every other library's WARNING and above."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] == "ln_jax":
            return record.levelno >= logging.INFO
        return record.levelno >= logging.WARNING


def configure_logging(log_file: str | None = None) -> None:
    """Sends every log record at INFO and above to `log_file` (appended) and only what
    `_ConsoleFilter` passes to stderr; replaces absl's and earlier handlers on the root."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(_ConsoleFilter())
    console.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(console)
    if log_file is not None:
        to_file = logging.FileHandler(log_file)
        to_file.setFormatter(logging.Formatter(_FILE_FORMAT))
        root.addHandler(to_file)


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
    except KeyboardInterrupt:
        print("aborted (nothing saved since the last checkpoint)", file=sys.stderr)
        return 130


def _report(err: BaseException, status: int, show_traceback: bool) -> int:
    if wants_traceback(show_traceback):
        traceback.print_exception(err)
    print(f"error: {err}", file=sys.stderr, flush=True)
    return status
