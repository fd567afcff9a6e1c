"""What the tests of compiling without the accelerator share (tests/test_deviceless.py for GPUs,
tests/test_deviceless_tpu.py for TPU slices): a skip marker for a missing compiler, the
command run in this process, and Python without the two extras."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ln_jax.train import steps
from ln_jax.xla import aot, compile_check, deviceless


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


def reuse_compile(monkeypatch, report: dict, build: Callable[[], Any], size: int) -> list:
    """Answers `aot`'s compile of `build()`'s program (`steps.program_key`, built inside the
    compile's own lowering context, so "auto" fields resolve as there) on a mesh of `size`
    devices with `report`, a fixture's: a compile for absent devices cannot be read back from
    JAX's cache, and each costs 10-40 s of the suite. Any other program compiles for real.

    Returns one (grad_accum_steps, mesh shape, device kinds, reused) per compile asked."""
    asked, real = [], aot._compile_report

    def compile_report(cfg, task, mesh, options):
        same = mesh.size == size and steps.program_key(cfg) == steps.program_key(build())
        kinds = {d.device_kind for d in mesh.devices.flat}
        asked.append((cfg.grad_accum_steps, dict(mesh.shape), kinds, same))
        return report if same else real(cfg, task, mesh, options)

    monkeypatch.setattr(aot, "_compile_report", compile_report)
    return asked


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
