"""What the tests of compiling without the accelerator share (tests/test_deviceless.py for GPUs,
tests/test_deviceless_tpu.py for TPU slices): a skip marker for a missing compiler, and the
command run in this process."""

from collections.abc import Callable

import pytest

from ln_jax import compile_check, deviceless


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
