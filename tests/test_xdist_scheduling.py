"""A worker that crashes mid-suite fails its test and the session still ends
(tests/xdist_scheduling.py): a small suite in a temporary folder, run by pytest-xdist with
this suite's options and scheduling, where one test aborts its worker after another file has
finished, and what native code wrote before the abort is in the session's output."""

import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from tests import xdist_scheduling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = {
    "test_a_done_first.py": "def test_a1():\n    pass\n\ndef test_a2():\n    pass\n",
    "test_b_aborts.py": """
        import os

        def test_b1():
            pass

        def test_b2_aborts():
            os.write(2, b"native code's last words\\n")  # as XLA's fatal log line is written
            os.abort()

        def test_b3():
            pass
        """,
    "test_c_alone.py": "def test_c1():\n    pass\n",
    "test_d_last.py": "def test_d1():\n    pass\n\ndef test_d2():\n    pass\n",
    "test_e_hangs.py": "import time\n\ndef test_e1_hangs():\n    time.sleep(600)\n",
}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashed_worker_fails_its_test_once_and_the_rest_still_run(tmp_path, workers):
    """Without the scheduler xdist 3.8 hangs here: it hands the new worker the finished
    file again (an empty batch) and the one-test file alone (held back, never run). A test
    that hangs past the time limit ends its worker (pytest-timeout, as pyproject.toml sets
    it with 15 minutes) and fails the same way."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        options = dict(re.findall(r'^(addopts|timeout_method) = "(.*)"$', f.read(), re.M))
    argv = [*shlex.split(options["addopts"]), "-p", "tests.xdist_scheduling", "-n", str(workers)]
    argv += ["-p", "no:cacheprovider", "-rA", "-q", str(tmp_path)]
    argv += ["--timeout=5", f"--timeout-method={options['timeout_method']}"]
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONFAULTHANDLER="")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    failed = sorted(line.split()[1] for line in lines if line.startswith("FAILED "))
    passed = sorted(line.split()[1].split("::")[1] for line in lines if line.startswith("PASSED "))
    assert done.returncode == 1, done.stdout[-3000:]
    assert failed == ["test_b_aborts.py::test_b2_aborts", "test_e_hangs.py::test_e1_hangs"]
    assert passed == ["test_a1", "test_a2", "test_b1", "test_b3", "test_c1", "test_d1", "test_d2"]
    assert "crashed while running 'test_b_aborts.py::test_b2_aborts'" in done.stdout
    assert "crashed while running 'test_e_hangs.py::test_e1_hangs'" in done.stdout
    assert "native code's last words" in done.stderr  # lost with a test's capture of fd 2


def test_this_suite_schedules_with_it(request):
    """tests/conftest.py registers the hook, so `pytest tests` (the README's command) uses
    the crash-safe scheduler whenever it runs with `--dist loadfile`."""
    hook = request.config.pluginmanager.hook.pytest_xdist_make_scheduler
    impls = [impl.function for impl in hook.get_hookimpls()]
    assert xdist_scheduling.pytest_xdist_make_scheduler in impls
