"""What the test suite may and may not write: the environment that keeps it out of the checkout
and out of the user's folders, and the check that it did.

`point_defaults_at(home)` sets the variables ln_jax, TFDS and libtpu read for their default
folders (the workdirs of runs given no `--workdir`, the TFDS data dir, ln_jax's local cache,
libtpu's logs) to folders of `home`; subprocesses inherit them. `tree_state(root)` records
what programs write in a checkout (every file under `workdirs/`, with its size and
modification time, and the paths git ignores); `tree_changes(before, after)` lists what a
test session changed there. Python's bytecode and the caches of pytest and ruff are left out:
they are not output of the tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HOME_ENV = "LN_JAX_TESTS_HOME"
# Variable -> folder of the tests' home it points at.
DEFAULTS = {
    "LN_JAX_WORKDIRS": "workdirs",  # ln_jax.paths.default_workdir
    "TFDS_DATA_DIR": "tensorflow_datasets",  # tfds.core.constants.get_default_data_dir
    "LN_JAX_CACHE_DIR": "cache",  # ln_jax.data.sources.local_cache_root
    "TPU_LOG_DIR": "tpu_logs",  # libtpu's logs (/tmp/tpu_logs), in the deviceless TPU tests
}
WATCHED = "workdirs"  # the checkout's folder of default workdirs, watched file by file
_NOT_OUTPUT = ("__pycache__", ".pytest_cache", ".ruff_cache", ".egg-info")


def point_defaults_at(home: str) -> None:
    """Points every default folder of ln_jax and TFDS into `home` (this process and its
    children)."""
    os.environ[HOME_ENV] = home
    for variable, folder in DEFAULTS.items():
        os.environ[variable] = os.path.join(home, folder)
    os.makedirs(os.environ["TPU_LOG_DIR"], exist_ok=True)  # else libtpu says so, logs nowhere


def _is_output(relative: str) -> bool:
    return not any(part.endswith(_NOT_OUTPUT) for part in Path(relative).parts)


def _watched_files(root: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for folder, _, files in os.walk(root / WATCHED):
        for name in files:
            path = Path(folder, name)
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed while walking
                continue
            found[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def _ignored_paths(root: Path) -> set[str]:
    """What git ignores in `root` (a folder once, as `dir/`); empty outside a git checkout."""
    if not (root / ".git").exists():  # a copy: git would answer for a checkout above it
        return set()
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--ignored=matching", "--untracked-files=normal"],
            cwd=root, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line[3:] for line in out.stdout.splitlines() if line.startswith("!! ")}


def tree_state(root: str | os.PathLike) -> dict[str, tuple[int, int] | None]:
    """Path -> (size, mtime) for the files under `workdirs/`, -> None for the other ignored
    paths, outputs only."""
    root = Path(root)
    state: dict[str, tuple[int, int] | None] = dict.fromkeys(_ignored_paths(root))
    state = {path: None for path in state if not path.startswith(f"{WATCHED}/")}
    state.update(_watched_files(root))
    return {path: value for path, value in state.items() if _is_output(path)}


def tree_changes(before: dict, after: dict) -> list[str]:
    """`new PATH`, `changed PATH` and `removed PATH` lines, sorted by path."""
    lines = [f"new {p}" for p in after.keys() - before.keys()]
    lines += [f"removed {p}" for p in before.keys() - after.keys()]
    lines += [f"changed {p}" for p in after.keys() & before.keys() if after[p] != before[p]]
    return sorted(lines, key=lambda line: line.split(" ", 1)[1])
