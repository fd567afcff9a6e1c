"""What the test suite may and may not write: the environment that keeps it out of the checkout
and out of the user's folders, and the checks that it did.

`point_defaults_at(home)` sets the variables ln_jax, TFDS and libtpu read for their default
folders (the workdirs of runs given no `--workdir`, the TFDS data dir, ln_jax's local cache,
libtpu's logs) to folders of `home`; `protect(root)` makes the checkout's `workdirs/` a folder
no run of the tests may be written in (`$LN_JAX_PROTECTED_DIRS`, `ln_jax.paths.protecting`):
a test that tries fails itself, by name, while the user's own runs there (one may train while
the suite runs) are nobody's business of the tests. Subprocesses inherit all of it.

`tree_state(root)` records what else programs leave in a checkout (the paths git ignores,
outside `workdirs/`); `tree_changes(before, after)` lists what a test session changed there.
Python's bytecode and the caches of pytest and ruff are left out: they are not output of the
tests.
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
PROTECTED_ENV = "LN_JAX_PROTECTED_DIRS"  # ln_jax.paths.PROTECTED_ENV
RUNS = "workdirs"  # the checkout's folder of default workdirs: the user's runs, protected
# Not the tests' output: bytecode, the tools' caches, the package's metadata, the README's venv.
_NOT_OUTPUT = ("__pycache__", ".pytest_cache", ".ruff_cache", ".egg-info", ".venv")


def point_defaults_at(home: str) -> None:
    """Points every default folder of ln_jax and TFDS into `home` (this process and its
    children)."""
    os.environ[HOME_ENV] = home
    for variable, folder in DEFAULTS.items():
        os.environ[variable] = os.path.join(home, folder)
    os.makedirs(os.environ["TPU_LOG_DIR"], exist_ok=True)  # else libtpu says so, logs nowhere


def protect(root: str | os.PathLike) -> None:
    """Keeps the runs of this process and its children out of `root`'s `workdirs/`."""
    os.environ[PROTECTED_ENV] = os.path.join(os.path.abspath(root), RUNS)


def _is_output(relative: str) -> bool:
    return not any(part.endswith(_NOT_OUTPUT) for part in Path(relative).parts)


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


def tree_state(root: str | os.PathLike) -> set[str]:
    """The ignored paths of `root` that are outputs, outside `workdirs/` (`protect` guards it)."""
    return {
        path
        for path in _ignored_paths(Path(root))
        if _is_output(path) and path.split("/", 1)[0] != RUNS
    }


def tree_changes(before: set[str], after: set[str]) -> list[str]:
    """`new PATH` and `removed PATH` lines, sorted by path."""
    lines = [f"new {p}" for p in after - before] + [f"removed {p}" for p in before - after]
    return sorted(lines, key=lambda line: line.split(" ", 1)[1])
