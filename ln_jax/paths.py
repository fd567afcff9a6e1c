"""Paths that may be URLs: a workdir, data dir or model file on `gs://` (or on any filesystem
`etils.epath` opens: `s3://`, ...) as well as a local folder.

`pathlib` and `os.path.normpath` turn `gs://b/x` into `gs:/b/x`, and `open`/`os.makedirs` on a
URL create a local folder named `gs:`: whatever may be a URL goes through `epath.Path` (what TFDS
and orbax use). Object stores have no append and no rename-over; two helpers cover what ln_jax
needs of them:

- `write_atomic`: a local file is written beside its name and renamed over it; an object store
  publishes an object only once its upload is complete, so the object is written directly.
- `Staging`: files that grow (metrics.jsonl, train.log, TensorBoard events) are written to a
  local copy and uploaded whole at most every `sync_secs` and when closed. A local folder is
  written in place.

A run given no `--workdir` goes to `default_workdir(name)`: `$LN_JAX_WORKDIRS/<name>`, else
`workdirs/<name>` in the working directory (the test suite points the variable at a temporary
folder, so that it never writes into a checkout's own `workdirs/`). A run is never written
inside a folder that `$LN_JAX_PROTECTED_DIRS` names (`protecting`): the test suite protects
the checkout's `workdirs/`, which holds the user's own runs, so a test that would write there
fails itself, by name.

This module imports nothing from ln_jax.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from etils import epath

log = logging.getLogger(__name__)
SYNC_SECS = 30.0  # how often staged files are uploaded at most (and always when closed)
# What gs:// needs beyond ln_jax's own dependencies: epath reads and writes through gcsfs
# (through TensorFlow's gfile instead where TensorFlow is installed); orbax asks the bucket's
# layout through google-cloud-storage.
GCS_PACKAGES = {"gcsfs": "gcsfs", "google.cloud.storage": "google-cloud-storage"}
GCS_AUTH_HINT = (
    "authenticate with `gcloud auth application-default login`, or set "
    "GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key (on a Cloud TPU or GCE VM "
    "the VM's service account is used: give it write access to the bucket)"
)
WORKDIRS_ENV = "LN_JAX_WORKDIRS"  # the folder of the default workdirs (else ./workdirs)
PROTECTED_ENV = "LN_JAX_PROTECTED_DIRS"  # folders (os.pathsep-separated) no run is written in
_MAX_CAUSE = 300
# Loggers of the cloud clients: a failing first request logs tracebacks (gcsfs: one per retry).
_CLOUD_LOGGERS = ("gcsfs", "fsspec", "google", "urllib3", "aiohttp")


def is_url(path: str | os.PathLike) -> bool:
    """True for `scheme://...` (gs://, s3://, ...), False for a local path."""
    return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
    """An epath.Path: a URL as it is, a local path with `~` expanded."""
    if is_url(path):
        return epath.Path(os.fspath(path))
    return epath.Path(os.path.expanduser(os.fspath(path)))


def default_workdir(name: str) -> str:
    """The workdir of run `name` when none is given: `$LN_JAX_WORKDIRS/name` (a folder or a
    URL), else `workdirs/name` relative to the working directory."""
    return os.path.join(os.environ.get(WORKDIRS_ENV) or "workdirs", name)


def protecting(path: str | os.PathLike) -> str | None:
    """The folder of `$LN_JAX_PROTECTED_DIRS` (os.pathsep-separated) that holds the local
    `path` (or is it), else None; a URL is never protected."""
    if is_url(path):
        return None
    resolved = pathlib.Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
    for folder in filter(None, os.environ.get(PROTECTED_ENV, "").split(os.pathsep)):
        if resolved.is_relative_to(os.path.realpath(folder)):
            return folder
    return None


def cause(err: BaseException) -> str:
    """`Type: message` on one line, bounded (cloud clients' messages run long)."""
    text = " ".join(str(err).split())
    if len(text) > _MAX_CAUSE:
        text = text[:_MAX_CAUSE] + " [...]"
    return f"{type(err).__name__}: {text}"


@contextlib.contextmanager
def quiet_cloud_logs() -> Iterator[None]:
    """Silences the cloud clients' loggers: while a start-up check fails, the one-line error
    that follows says it all (without this, gcsfs printed ~90 lines of tracebacks first)."""
    loggers = [logging.getLogger(name) for name in _CLOUD_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Writes `data` so that no reader ever sees half of it (concurrent runs, hosts).

    A local file is written to a temporary name in its folder and renamed over `path`; an
    object (URL) is uploaded directly: object stores show it only once the upload completes.
    """
    raw = data.encode() if isinstance(data, str) else data
    target = as_path(path)
    if is_url(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
        return
    local = pathlib.Path(target)
    local.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=local.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    os.replace(tmp, local)


def _importable(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def missing_packages(path: str | os.PathLike) -> list[str]:
    """The pip packages `path` needs that are not installed (only gs:// needs any)."""
    if not os.fspath(path).startswith("gs://"):
        return []
    needed = dict(GCS_PACKAGES)
    if _importable("tensorflow"):  # epath uses TensorFlow's gfile then, not gcsfs
        needed.pop("gcsfs")
    return [pkg for module, pkg in needed.items() if not _importable(module)]


def credentials_problem(path: str | os.PathLike) -> str | None:
    """Why gs:// `path` cannot be authenticated (None if it can, or is not gs://).

    Asks google-auth for Application Default Credentials: offline and in well under a second
    here. Without them gcsfs falls back to anonymous access, which fails at the first write.
    """
    if not os.fspath(path).startswith("gs://") or not _importable("google.auth"):
        return None
    import google.auth  # installed with gcsfs and google-cloud-storage

    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError as err:
        return cause(err)
    return None


def access_hint(path: str | os.PathLike) -> str:
    """What to do when `path` cannot be written."""
    if os.fspath(path).startswith("gs://"):
        return f"check that the bucket exists and {GCS_AUTH_HINT}"
    if is_url(path):
        return "check the URL and that this machine may write there"
    return "give a writable directory with --workdir=PATH"


class Staging:
    """The files one writer keeps in a folder that may be a URL.

    For a local folder, `local` is the folder itself and `sync` does nothing. For a URL,
    `local` is a temporary folder; `fetch` downloads a file to append to, `sync` uploads the
    files that changed since the last upload (at most every `sync_secs`, unless forced), and
    `close` uploads the rest and deletes the local copy (kept, and named in a warning, if that
    last upload fails).
    """

    def __init__(self, folder: str | os.PathLike, sync_secs: float = SYNC_SECS):
        self.remote = as_path(folder)
        self.is_url = is_url(folder)
        self.sync_secs = sync_secs
        if self.is_url:
            self.local = pathlib.Path(tempfile.mkdtemp(prefix="ln_jax_staging_"))
        else:
            self.local = pathlib.Path(self.remote)
            self.local.mkdir(parents=True, exist_ok=True)
        self._sent: dict[str, tuple[int, int]] = {}  # relative name -> (size, mtime) uploaded
        self._last_sync = time.monotonic()
        self._syncing = False

    def fetch(self, name: str) -> pathlib.Path:
        """The local path of `name`, holding the remote file's content if it exists."""
        local = self.local / name
        if self.is_url and (self.remote / name).exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes((self.remote / name).read_bytes())
            self._sent[name] = self._signature(local)
        return local

    def remove(self, folder: str, prefix: str) -> None:
        """Deletes the files `folder/prefix*`, here and (for a URL) remotely."""
        roots = [self.local / folder] + ([self.remote / folder] if self.is_url else [])
        for root in roots:
            if root.is_dir():
                for child in list(root.iterdir()):
                    if child.name.startswith(prefix):
                        child.unlink()
        self._sent = {k: v for k, v in self._sent.items() if not k.startswith(f"{folder}/")}

    def sync(self, force: bool = False) -> None:
        """Uploads the local files that changed (a URL only; at most every `sync_secs`).

        A failed periodic upload is logged and tried again at the next one; a forced one
        raises.
        """
        due = force or time.monotonic() - self._last_sync >= self.sync_secs
        if not self.is_url or not due or self._syncing:
            return
        self._syncing = True  # a cloud client logging inside a log handler's sync re-enters
        try:
            self._upload_changed()
        except Exception as err:
            if force:
                raise
            log.warning("could not upload to %s (will retry): %s", self.remote, cause(err))
        finally:
            self._last_sync = time.monotonic()
            self._syncing = False

    def _upload_changed(self) -> None:
        for local in sorted(p for p in self.local.rglob("*") if p.is_file()):
            name = local.relative_to(self.local).as_posix()
            signature = self._signature(local)
            if self._sent.get(name) != signature:
                write_atomic(self.remote / name, local.read_bytes())
                self._sent[name] = signature

    def close(self) -> None:
        """The last upload; deletes the local copy once everything is uploaded."""
        if not self.is_url:
            return
        try:
            self.sync(force=True)
        except Exception as err:  # the run is over: say where its files are, do not mask
            log.warning("could not upload %s to %s (%s)", self.local, self.remote, cause(err))
            return
        shutil.rmtree(self.local, ignore_errors=True)

    @staticmethod
    def _signature(path: pathlib.Path) -> tuple[int, int]:
        stat = path.stat()
        return stat.st_size, stat.st_mtime_ns
