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

XLA:CPU ends the process (a fatal log line, then SIGABRT) when the threads of a collective,
one per device, have not all joined it within a minute (20 s to a warning, 40 more to the
abort; measured: a callback that holds one of 8 devices 70 s aborts the process at 60 s).
The tests' 8 fake devices share 2 cores with the other worker and the runs it starts; a worker
of the CI run of 2026-11-29 died of a SIGABRT in a non-Python thread while its test summed an
8-device mesh's parameters eagerly, its only message Python's "Fatal Python error: Aborted"
(the symptom of this abort under pytest's default capture, which kept XLA's lines in the
test's capture file: measured; pyproject.toml now captures at the sys level). Tests give the
threads ten more minutes (PATIENT, at every optimisation level): a slow host is not a
deadlock.

Tried for the suite's time and not kept (2026-11-29, 2 cores; the suite 953 s, 1,859 s of
test time, compiling most of it): one JAX compilation cache shared by every test process
(JAX_COMPILATION_CACHE_DIR) saved 3% of the test time (925 s), as few programs repeat, and the
tests would share state; Eigen single-threaded (`--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1`) took tests/test_trainer.py from 149 s to 174 s; the trainer
tests' 2x2x2 mesh as 8x1x1 took three of them from 35 s to 42 s.

An XLA that does not know a flag aborts at start-up, so the session checks them once
(`check_flags`: one process that starts XLA:CPU with them) and keeps those it accepts in
LN_JAX_TEST_XLA_FLAGS, which the tests' processes inherit.
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
PATIENT = ("--xla_cpu_collective_call_terminate_timeout_seconds=600",)
CHECKED_ENV = "LN_JAX_TEST_XLA_FLAGS"  # the flags of FAST_COMPILE and PATIENT this XLA accepts
_DEVICES = re.compile(r"--xla_force_host_platform_device_count=\S+")


def _starts(flags: tuple[str, ...]) -> bool:
    """Whether XLA:CPU starts with `flags` (a fresh process: an unknown flag aborts it)."""
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


def check_flags() -> list[str]:
    """Puts the flags of FAST_COMPILE and PATIENT this XLA accepts in $LN_JAX_TEST_XLA_FLAGS
    (once: a set value is kept); returns those it refused."""
    if CHECKED_ENV in os.environ:
        return []
    wanted = FAST_COMPILE + PATIENT
    kept = wanted if _starts(wanted) else tuple(f for f in wanted if _starts((f,)))
    os.environ[CHECKED_ENV] = " ".join(kept)
    return [f for f in wanted if f not in kept]


def _accepted(flags: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `flags` checked for this XLA (all of them before the check)."""
    checked = os.environ.get(CHECKED_ENV)
    return flags if checked is None else tuple(f for f in flags if f in checked.split())


def fast_compile() -> tuple[str, ...]:
    """The fast-compile flags this XLA accepts."""
    return _accepted(FAST_COMPILE)


def xla_flags(devices: int | None = None, base: str | None = None) -> str:
    """`base` (default: $XLA_FLAGS) with the fast-compile flags (unless
    LN_JAX_TEST_OPTIMIZED_COMPILE=1), the patient collectives and, if given, `devices` fake CPU
    devices in place of any device count already there."""
    flags = os.environ.get("XLA_FLAGS", "") if base is None else base
    if devices is not None:
        flags = f"{_DEVICES.sub('', flags)} --xla_force_host_platform_device_count={devices}"
    wanted = _accepted(PATIENT)
    if os.environ.get("LN_JAX_TEST_OPTIMIZED_COMPILE") != "1":
        wanted = fast_compile() + wanted
    flags += "".join(f" {f}" for f in wanted if f.split("=")[0] not in flags)
    return " ".join(flags.split())
