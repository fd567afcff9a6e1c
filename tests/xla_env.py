"""XLA flags of the test processes and of the subprocesses they start.

On 2 CPU cores most of the suite's time is compiling. LLVM at optimisation level 0 (and
without its expensive passes) compiles the tests' tiny programs about 40% faster in CPU time
(measured on `tests/test_models.py::test_scan_matches_loop_and_layers_stay_addressable`:
46-50 s -> 28-30 s of user time) and runs them a little slower, which at the tests' sizes
costs less than it saves. XLA:CPU's older loop emitters in place of its MLIR fusion emitters
(`--xla_cpu_use_fusion_emitters=false`) cut another third: `tests/test_models.py` took 121 s
of CPU time with them, 75 s without (median of 3 each, in turn, `farm-bench`, 2026-11-28).
Fast-math stays off, but these settings may round differently in the last bit (e.g.
truncated-normal initialisers), so a test comparing with what users get at XLA's defaults
asks for them in `compiler_options` (tests/test_sharding.py);
LN_JAX_TEST_OPTIMIZED_COMPILE=1 keeps XLA's defaults everywhere.

An XLA that does not know a flag aborts at start-up, so the session checks them once
(`check_fast_compile`: one process that starts XLA:CPU with them) and keeps those it accepts
in LN_JAX_TEST_FAST_COMPILE, which the tests' processes inherit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
CHECKED_ENV = "LN_JAX_TEST_FAST_COMPILE"  # the flags of FAST_COMPILE this XLA accepts
_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\S+")


def _starts(flags: tuple[str, ...]) -> bool:
    """Whether XLA:CPU starts with `flags` (a fresh process: an unknown flag aborts it)."""
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


def check_fast_compile() -> list[str]:
    """Puts the FAST_COMPILE flags this XLA accepts in $LN_JAX_TEST_FAST_COMPILE (once: a set
    value is kept); returns those it refused."""
    if CHECKED_ENV in os.environ:
        return []
    kept = FAST_COMPILE
    if not _starts(kept):
        kept = tuple(f for f in FAST_COMPILE if _starts((f,)))
    os.environ[CHECKED_ENV] = " ".join(kept)
    return [f for f in FAST_COMPILE if f not in kept]


def fast_compile() -> tuple[str, ...]:
    """The fast-compile flags: those checked for this XLA, else all of FAST_COMPILE."""
    checked = os.environ.get(CHECKED_ENV)
    return FAST_COMPILE if checked is None else tuple(checked.split())


def xla_flags(devices: int | None = None, base: str | None = None) -> str:
    """`base` (default: $XLA_FLAGS) with the fast-compile flags and, if given, `devices` fake
    CPU devices in place of any device count already there."""
    flags = os.environ.get("XLA_FLAGS", "") if base is None else base
    if devices is not None:
        flags = f"{_DEVICES.sub('', flags)} --xla_force_host_platform_device_count={devices}"
    if os.environ.get("LN_JAX_TEST_OPTIMIZED_COMPILE") != "1":
        flags += "".join(f" {f}" for f in fast_compile() if f.split("=")[0] not in flags)
    return " ".join(flags.split())
