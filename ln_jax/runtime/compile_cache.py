"""JAX's persistent compilation cache for runs (`TrainConfig.compilation_cache`).

A run compiles several programs: the train step per length bucket (translation has one per
bucket), the measured step of the monitor, evaluation and decoding. On one H100 each took 35-60 s
(`docs/results/gpu/journal.md`, "session 15"), so a resumed run, a rerun or a study's next run of
the same shapes spent minutes compiling what it had compiled before. With the cache, compiled
executables are written to a folder and the next process that compiles the same program (same
HLO, same jax and XLA versions, same device kind and flags: JAX's cache key) reads it instead.
The train step's program does not depend on the run's seed or schedule numbers
(`steps.run_values` are its inputs), so the runs of a learning-rate, warm-up or seed grid share
it too.

`compilation_cache`:
  "auto": `$LN_JAX_CACHE_DIR/jax_compilation` (else `~/.cache/ln_jax/jax_compilation`) on a GPU
    or TPU; off on a CPU, where programs compile in seconds and tests must not share state;
  "off": no cache;
  a folder (local or gs://...): that folder.
`$JAX_COMPILATION_CACHE_DIR`, if set, wins over all three: JAX reads it itself.

The cache is on while `train_and_evaluate` runs (`use`), and JAX's previous setting is restored
after it, so a library caller's own settings are kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import jax

log = logging.getLogger(__name__)
AUTO, OFF = "auto", "off"
ENV = "JAX_COMPILATION_CACHE_DIR"
CACHE_ROOT_ENV = "LN_JAX_CACHE_DIR"
SUBDIR = "jax_compilation"


def default_folder() -> str:
    """`$LN_JAX_CACHE_DIR/jax_compilation`, else `~/.cache/ln_jax/jax_compilation`."""
    root = os.environ.get(CACHE_ROOT_ENV) or os.path.join("~", ".cache", "ln_jax")
    return os.path.join(os.path.expanduser(root), SUBDIR)


def resolve(value: str, platform: str) -> str:
    """The config's value -> a folder or "off" ("auto" decided by `platform`: cpu/gpu/tpu)."""
    if value == AUTO:
        return OFF if platform == "cpu" else default_folder()
    if not value:
        raise ValueError('compilation_cache="" : use "auto", "off" or a folder.')
    return value


@contextlib.contextmanager
def use(value: str) -> Iterator[str | None]:
    """JAX's persistent cache in folder `value` (a resolved config value) while the block runs.

    Yields the folder in use (`$JAX_COMPILATION_CACHE_DIR` if set), or None when off.
    """
    if os.environ.get(ENV):
        yield os.environ[ENV]
        return
    if value == OFF:
        yield None
        return
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", value)
    compilation_cache.reset_cache()  # takes effect even after earlier compilations
    log.info("persistent compilation cache: %s", value)
    try:
        yield value
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()
