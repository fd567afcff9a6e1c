"""Test set-up: 8 fake CPU devices, so that 2x2x2 meshes are really exercised.

Compiled programs are shared through JAX's persistent compilation cache in a directory that
lives for one test session (or in JAX_COMPILATION_CACHE_DIR if it is set already). Its key is
the program itself, so the many tests that build the same tiny model or train step, in this
process or in the `train.py` subprocesses (which inherit the variables), compile it once:
on 2 CPU cores compiling, not running, is most of the suite's time.
"""

import atexit
import os
import shutil
import tempfile

from tests.xla_env import xla_flags

# Must be set before JAX initialises its backends (first jax import anywhere in the session).
# 8 devices unless XLA_FLAGS names a count; fast-compile flags added (see tests/xla_env.py).
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = xla_flags(None if "device_count" in _flags else 8, _flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="ln_jax_tests_jit_cache_")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
# Programs that compile faster than this are not worth a file (JAX's default is 1 s).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
