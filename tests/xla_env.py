"""XLA flags of the test processes and of the subprocesses they start.

On 2 CPU cores most of the suite's time is compiling. LLVM at optimisation level 0 (and
without its expensive passes) compiles the tests' tiny programs about 40% faster in CPU time
(measured on `tests/test_models.py::test_scan_matches_loop_and_layers_stay_addressable`:
46-50 s -> 28-30 s of user time) and runs them a little slower, which at the tests' sizes
costs less than it saves. Fast-math stays off, but level 0 may round differently in the last
bit (e.g. truncated-normal initialisers), so a test comparing with what users get at XLA's
defaults asks for them in `compiler_options` (tests/test_sharding.py);
LN_JAX_TEST_OPTIMIZED_COMPILE=1 keeps XLA's defaults everywhere.
"""

from __future__ import annotations

import os
import re

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\S+")


def xla_flags(devices: int | None = None, base: str | None = None) -> str:
    """`base` (default: $XLA_FLAGS) with the fast-compile flags and, if given, `devices` fake
    CPU devices in place of any device count already there."""
    flags = os.environ.get("XLA_FLAGS", "") if base is None else base
    if devices is not None:
        flags = f"{_DEVICES.sub('', flags)} --xla_force_host_platform_device_count={devices}"
    if os.environ.get("LN_JAX_TEST_OPTIMIZED_COMPILE") != "1":
        flags += "".join(f" {f}" for f in FAST_COMPILE if f.split("=")[0] not in flags)
    return " ".join(flags.split())
