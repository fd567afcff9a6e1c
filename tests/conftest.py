"""Test set-up: 8 fake CPU devices, so that 2x2x2 meshes are really exercised.

Compiled programs are shared through JAX's persistent compilation cache in a directory that
lives for one test session (or in JAX_COMPILATION_CACHE_DIR if it is set already). Its key is
the program itself, so the many tests that build the same tiny model or train step, in this
process or in the `train.py` subprocesses (which inherit the variables), compile it once:
on 2 CPU cores compiling, not running, is most of the suite's time.

Nothing the tests run writes into the checkout or the user's folders: the default workdirs
(of `train.py` without `--workdir`), the TFDS data dir and ln_jax's cache point into a folder
that lives for one test session (tests/hermetic.py); a run a test would write into the
checkout's `workdirs/` fails that test (the user's own runs there, even one training while the
suite runs, are left alone); and the session fails, naming the paths, if it left a new ignored
file elsewhere in the tree.
"""

import atexit
import contextlib
import fcntl
import gc
import os
import shutil
import tempfile

import pytest

from tests import hermetic, ordering
from tests.xla_env import check_flags, xla_flags

# A hook for pytest-xdist (the test extra installs it; the GPU machine's image has its own).
with contextlib.suppress(ImportError):
    from tests.xdist_scheduling import pytest_xdist_make_scheduler  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Must be set before JAX initialises its backends (first jax import anywhere in the session).
# 8 devices unless XLA_FLAGS names a count; fast-compile flags added (see tests/xla_env.py).
_flags = os.environ.get("XLA_FLAGS", "")
for _refused in check_flags():
    print(f"tests/xla_env.py: this XLA does not know {_refused}; running without it")
os.environ["XLA_FLAGS"] = xla_flags(None if "device_count" in _flags else 8, _flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One OpenMP thread (PyTorch's, for the HuggingFace comparisons and the suite's PyTorch
# anchor; BLAS's): its threads spin while they wait, and on 2 cores shared with the other
# worker that was most of their CPU time (bench_torch_anchor.py's CPU mode under load: 24.5 s
# of CPU time, 8.6 s with one thread; 2026-12-05). XLA's own threads are not OpenMP's.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="ln_jax_tests_jit_cache_")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
# Programs that compile faster than this are not worth a file (JAX's default is 1 s).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# One home per session: xdist's workers (and the tests' subprocesses) inherit the controller's.
if hermetic.HOME_ENV not in os.environ:
    _home = tempfile.mkdtemp(prefix="ln_jax_tests_home_")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ[hermetic.HOME_ENV] = _home
hermetic.point_defaults_at(os.environ[hermetic.HOME_ENV])
hermetic.protect(ROOT)

# Python's garbage collector, tuned for a process that traces thousands of programs: its young
# generation is collected every 50,000 allocations (Python's default: 700) and what the
# session has imported once collection ends is frozen out of its full collections
# (`pytest_collection_finish`). Against Python's defaults, in one process (`-n 0`, `farm-bench`,
# 2026-12-06): tests/test_models.py 0.94 of the CPU time (0.92-0.98, 3 pairs), the same peak
# memory; tests/test_translation_model.py with tests/test_analysis.py 0.93 (0.92-0.94, 2 pairs).
gc.set_threshold(50_000, 20, 100)

_TREE_BEFORE = pytest.StashKey[set]()
_RECORDER = ordering.recorder()
_TREE_CHANGES = pytest.StashKey[list]()


def _checks_the_tree(config) -> bool:
    """Only the process that sees the whole session: not an xdist worker."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if _checks_the_tree(session.config):
        session.config.stash[_TREE_BEFORE] = hermetic.tree_state(ROOT)


def pytest_collection_modifyitems(config, items):
    """The longest test files first (tests/ordering.py), so that the workers end together."""
    order = ordering.longest_first([item.nodeid for item in items], ordering.read_table())
    items[:] = [items[i] for i in order]


def pytest_collection_finish(session):
    """The modules the tests import (JAX, Flax, TensorFlow, PyTorch ...) leave the garbage
    collector's full collections: they live as long as the process."""
    gc.collect()
    gc.freeze()


def pytest_runtest_logreport(report):
    if _RECORDER is not None:
        _RECORDER.add(report.nodeid, report.duration)


def pytest_sessionfinish(session, exitstatus):
    if _RECORDER is not None and _checks_the_tree(session.config):
        _RECORDER.write()
    before = session.config.stash.get(_TREE_BEFORE, None)
    if before is None:
        return
    changes = hermetic.tree_changes(before, hermetic.tree_state(ROOT))
    session.config.stash[_TREE_CHANGES] = changes
    if changes and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    changes = config.stash.get(_TREE_CHANGES, [])
    if changes:
        terminalreporter.section("the tests wrote into the checkout", red=True)
        for line in changes[:50]:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            "a test left these in the checkout (a relative path, a default folder): give it "
            "a tmp_path (tests/hermetic.py)."
        )


@pytest.fixture
def cpu_to_itself():
    """Runs the test while no other test that takes this fixture runs (a file lock in the
    session's home, shared by the xdist workers).

    For the tests that start several JAX processes at once (the two gloo-coupled processes of
    `test_multihost`, the accelerator suite's benchmarks): on 2 cores, side by side, they
    starved each other (a CI run of 2026-11-27: both past their 360 s limits, where alone they
    take 50-90 s). The other worker goes on with ordinary tests meanwhile.
    """
    path = os.path.join(os.environ[hermetic.HOME_ENV], "cpu_to_itself.lock")
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def fresh_programs():
    """For a test that counts compiles or the files a compile writes: the jitted steps that
    earlier tests of this worker left in the process (`ln_jax.train.steps`, which a run with
    the same program reuses, compiling nothing) are dropped first."""
    from ln_jax.train import steps

    steps.forget_programs()
