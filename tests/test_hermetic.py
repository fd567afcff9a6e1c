"""The suite stays out of the checkout and the user's folders (tests/hermetic.py): its default
folders point into the session's temporary home, here and in the subprocesses the tests start;
a test's run in the checkout's workdirs/ fails that test; and the session's check of the tree
names what a test would have left elsewhere in it, never the user's own runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ln_jax import paths
from ln_jax.data import sources
from ln_jax.train import run_identity
from tests import hermetic

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS_CODE = (
    "from ln_jax import paths; from ln_jax.data import sources; "
    "print(paths.default_workdir('bert_preln_tiny')); print(sources.default_data_dir(None)); "
    "print(sources.local_cache_root())"
)


def _outside_the_user_folders(path: str) -> bool:
    home = Path(os.environ[hermetic.HOME_ENV]).resolve()
    resolved = Path(path).resolve()
    return resolved.is_relative_to(home) and not resolved.is_relative_to(ROOT)


def test_the_default_folders_point_into_the_sessions_home():
    home = Path(os.environ[hermetic.HOME_ENV])
    assert home.is_dir() and not home.resolve().is_relative_to(ROOT)
    found = [
        paths.default_workdir("bert_preln_tiny"),
        sources.default_data_dir(None),
        str(sources.local_cache_root()),
    ]
    assert found == [
        str(home / "workdirs" / "bert_preln_tiny"),
        str(home / "tensorflow_datasets"),
        str(home / "cache"),
    ]
    assert all(_outside_the_user_folders(path) for path in found), found


def test_subprocesses_inherit_the_default_folders(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", DEFAULTS_CODE],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = out.stdout.split()
    assert len(found) == 3 and all(_outside_the_user_folders(path) for path in found), found


def test_the_default_workdir_without_the_variable_is_workdirs_in_the_working_directory(
    monkeypatch,
):
    monkeypatch.delenv(paths.WORKDIRS_ENV)
    assert paths.default_workdir("glue_mrpc") == os.path.join("workdirs", "glue_mrpc")
    monkeypatch.setenv(paths.WORKDIRS_ENV, "gs://bucket/runs")
    assert paths.default_workdir("glue_mrpc") == "gs://bucket/runs/glue_mrpc"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)


def test_the_tree_check_names_what_a_test_left_in_a_checkout_not_the_user_s_runs(tmp_path):
    repo = tmp_path / "checkout"
    (repo / "workdirs" / "readme_run").mkdir(parents=True)
    (repo / ".gitignore").write_text("/workdirs/\n__pycache__/\n/studies/\n/build/\n/.venv/\n")
    (repo / "train.py").write_text("print('train')\n")
    (repo / "workdirs" / "readme_run" / "train.log").write_text("the README's run\n")
    (repo / "build").mkdir()
    _git(repo, "init", "-q")
    _git(repo, "add", ".gitignore", "train.py")
    before = hermetic.tree_state(repo)
    assert before == {"build/"}

    (repo / "train.py").write_text("print('edited')\n")  # a source edit: not the tests' output
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (repo / ".venv" / "bin").mkdir(parents=True)  # the user's venv
    # The user's own runs, while the suite runs: a second run, and the first one resumed.
    with open(repo / "workdirs" / "readme_run" / "train.log", "a") as log:
        log.write("a second run appended\n")
    (repo / "workdirs" / "glue_mrpc" / "checkpoints").mkdir(parents=True)
    (repo / "workdirs" / "glue_mrpc" / "finetune.log").write_text("the user's fine-tuning\n")
    (repo / "studies" / "depth").mkdir(parents=True)
    (repo / "studies" / "depth" / "results.json").write_text("{}\n")
    (repo / "build").rmdir()
    assert hermetic.tree_changes(before, hermetic.tree_state(repo)) == [
        "removed build/",
        "new studies/",
    ]
    assert hermetic.tree_changes(before, before) == []
    assert hermetic.tree_state(tmp_path) == set()  # a copy without git: nothing to compare


def test_a_run_a_test_would_write_into_the_checkout_s_workdirs_fails_that_test(tmp_path):
    """The checkout's workdirs/ holds the user's runs: a test's run there (a relative
    --workdir from the checkout, say) is refused before anything is written, in this process
    and in the commands the tests start."""
    assert os.environ[paths.PROTECTED_ENV] == str(ROOT / "workdirs")
    probe = ROOT / "workdirs" / "hermetic_probe"
    with pytest.raises(run_identity.WorkdirError, match="protects the checkout's workdirs/"):
        run_identity.prepare_workdir(str(probe))
    code = (
        "from ln_jax.train import run_identity\n"
        "try:\n    run_identity.prepare_workdir('workdirs/hermetic_probe')\n"
        "except run_identity.WorkdirError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "is inside" in out.stdout and paths.PROTECTED_ENV in out.stdout, out.stderr[-2000:]
    assert not probe.exists()
    run_identity.prepare_workdir(str(tmp_path / "run"))  # elsewhere: as ever
    assert (tmp_path / "run").is_dir()
    assert paths.protecting("gs://bucket/workdirs/x") is None


def test_test_flags_an_xla_refuses_are_left_out(monkeypatch):
    """tests/xla_env.py: a flag this XLA does not know is dropped (not every test aborting)."""
    from tests import xla_env

    wanted = [*xla_env.FAST_COMPILE, *xla_env.PATIENT]
    assert os.environ[xla_env.CHECKED_ENV].split() == wanted  # this XLA knows them all
    assert all(f in os.environ["XLA_FLAGS"].split() for f in wanted)
    bogus, starts = "--xla_no_such_flag=true", xla_env._starts
    assert starts(("--xla_backend_optimization_level=0",)) and not starts((bogus,))
    monkeypatch.setattr(xla_env, "FAST_COMPILE", (*xla_env.FAST_COMPILE[:2], bogus))
    monkeypatch.setattr(xla_env, "_starts", lambda flags: bogus not in flags)
    monkeypatch.delenv(xla_env.CHECKED_ENV)
    assert xla_env.check_flags() == [bogus]
    assert xla_env.fast_compile() == xla_env.FAST_COMPILE[:2]
    assert bogus not in xla_env.xla_flags(8, "") and xla_env.PATIENT[0] in xla_env.xla_flags(8, "")
    monkeypatch.setenv("LN_JAX_TEST_OPTIMIZED_COMPILE", "1")
    assert xla_env.xla_flags(8, "").split()[1:] == list(xla_env.PATIENT)
    assert xla_env.check_flags() == []  # checked once a session
