"""The README's two commands, in order, as a newcomer runs them (issue 32, item 1): the main job
of the first command fills the checkout's `workdirs/` and the TFDS data dir, then the second
command's suite must pass without touching either.

Both run in a copy of the checkout (the tests never write into this one), with ln_jax imported
from the copy. The install part of the first command is not repeated: the interpreter running
the tests has the packages. The main job runs as written (its 120 steps on the embedded corpus,
prepared on first use in a fresh TFDS data dir: about 70 s on 2 cores). Of the suite, the trust
tests that start `train.py` on no prepared corpus run: the command-line errors of `test_5_*` (the
traceback one once met the README's run in `workdirs/bert_preln_tiny`) and `test_10_*`, which
reads the README. The others train in-process in their own temporary workdirs, or prepare the
tests' corpus first (the `data_dir` fixture, about 15 s); the whole file would add two minutes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import hermetic

ROOT = Path(__file__).resolve().parents[1]
# Outputs and caches of a checkout: not part of a fresh clone.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", "workdirs", "studies", "build", ".gl", ".whl", "__pycache__", ".pytest_cache",
    ".ruff_cache", "*.egg-info",
)  # fmt: skip
TRUST_TESTS = [
    "tests/test_run_trust.py", "-k",
    "test_5_the_traceback or test_5_config_path or test_5_every_user_error_class or test_10",
]  # fmt: skip


def readme_commands() -> tuple[list[str], int]:
    """(the first command's main job as argv, the step count the README says it trains)."""
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    first = block.splitlines()[0].split("#", 1)[0]
    install, job = (part.strip() for part in first.split("&&"))
    assert install.startswith("pip install"), first
    argv = shlex.split(job)
    assert argv[:2] == ["python", "train.py"], job
    steps = int(re.search(r"for (\d+) steps", section).group(1))
    return [sys.executable, *argv[1:]], steps


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime) of every file under `folder`."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def user_env(copy: Path, tfds_dir: Path) -> dict[str, str]:
    """A newcomer's environment: ln_jax from `copy`, the TFDS data dir given, and none of the
    variables the test session sets for itself (its home, its default folders, its XLA_FLAGS).

    Without XLA_FLAGS a CPU is one device and XLA compiles at its default optimisation, as for
    a newcomer, not at the suite's fast-compile level (tests/xla_env.py): the main job's 120
    steps then take 26.5 s instead of 39.0 s (measured 2026-11-27, 2 cores, prepared corpus).
    """
    drop = {hermetic.HOME_ENV, hermetic.PROTECTED_ENV, *hermetic.DEFAULTS, "XLA_FLAGS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(copy), TFDS_DATA_DIR=str(tfds_dir))
    return env


@pytest.mark.slow
def test_the_readme_main_job_then_the_trust_tests_in_a_fresh_copy(tmp_path):
    copy, tfds_dir = tmp_path / "ln_jax", tmp_path / "tensorflow_datasets"
    shutil.copytree(ROOT, copy, ignore=NOT_IN_A_CLONE)
    env = user_env(copy, tfds_dir)
    main_job, steps = readme_commands()

    job = subprocess.run(main_job, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
    run = copy / "workdirs" / "bert_preln_tiny"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records if r["split"] == "train") == steps
    assert f"final eval at step {steps}" in job.stdout, job.stdout[-2000:]
    workdirs, prepared = files_of(copy / "workdirs"), files_of(tfds_dir)
    assert prepared, "the main job prepared nothing in the TFDS data dir"

    # the suite's own settings: tests/conftest.py sets 8 fake devices and its XLA flags
    cmd = [sys.executable, "-m", "pytest", *TRUST_TESTS, "-p", "no:cacheprovider", "-n", "0"]
    suite = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert suite.returncode == 0, suite.stdout[-4000:] + suite.stderr[-2000:]
    passed = re.search(r"(\d+) passed", suite.stdout)
    assert passed and int(passed.group(1)) == 5, suite.stdout[-2000:]
    assert files_of(copy / "workdirs") == workdirs  # the README's run, untouched
    assert files_of(tfds_dir) == prepared  # the newcomer's TFDS data dir, untouched
