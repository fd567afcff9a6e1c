"""What the tests of compiling without the accelerator share (tests/test_deviceless.py for GPUs,
tests/test_deviceless_tpu.py for TPU slices): a skip marker for a missing compiler, the
command run in this process, and Python without the two extras."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ln_jax.xla import compile_check, deviceless


def needs(check: Callable[[], object]) -> pytest.MarkDecorator:
    """Skips a test where `check` (`deviceless.plugin`, `deviceless.libtpu`) raises
    DevicelessError, with its message (what to install) as the reason."""
    try:
        check()
    except deviceless.DevicelessError as err:
        return pytest.mark.skipif(True, reason=str(err))
    return pytest.mark.skipif(False, reason="")


def run_compile_check(*argv: str) -> int:
    """`python -m ln_jax.compile_check ARGV` in this process; its exit code."""
    try:
        compile_check.run(list(argv))
    except SystemExit as done:
        return int(done.code or 0)
    return 0


ROOT = Path(__file__).resolve().parents[1]
EXTRAS_MODULES = ("jax_plugins", "libtpu")  # what gpu-compile and tpu-compile install
# Run first in a `python -c`: every finder answers "not here" for the extras' modules, as on
# a machine where `pip install -e ".[test]"` installed neither (CI installs both).
HIDE_THE_EXTRAS = f"""
import sys

class _WithoutTheExtras:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_MODULES!r}:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self.finder, name)

sys.meta_path[:] = [_WithoutTheExtras(f) for f in sys.meta_path]
"""


def without_the_extras(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -c CODE` in the checkout, as if neither extra were installed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", HIDE_THE_EXTRAS + code],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
