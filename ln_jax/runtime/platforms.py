"""The platform a program is built for: JAX's backend, or the one `lowering_for` names.

A config's "auto" fields (`ln_jax.config.run`) and the Pallas kernel's interpreter switch
(`ln_jax.nn.flash`) ask `current()`. Inside `lowering_for("gpu")` they answer as on a GPU, so
a CPU host can build and lower the program a GPU or TPU would run (`ln_jax.compile_check
--platform`), without its devices:

    with platforms.lowering_for("tpu") as target:      # target == "tpu"
        cfg = build_config(values)                     # dtype "auto" -> bfloat16
        lowered = jitted.trace(*args).lower(lowering_platforms=(target,))
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

PLATFORMS = ("cpu", "gpu", "tpu")
# JAX's platform name for `lowering_platforms` (an NVIDIA GPU lowers as "cuda").
LOWERING_NAMES = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("ln_jax_target", default=None)


def current() -> str:
    """The platform built for, "cpu", "gpu" or "tpu": the `lowering_for` target if one is
    set, else JAX's default backend (which initialises JAX's backends)."""
    target = _TARGET.get()
    if target is not None:
        return target
    import jax

    return jax.default_backend()


def check_platform(name: str) -> str:
    """`name` if it is one of PLATFORMS.

    Raises:
      ValueError: naming the platforms there are.
    """
    if name not in PLATFORMS:
        raise ValueError(f"platform {name!r} is not one of {', '.join(PLATFORMS)}.")
    return name


@contextlib.contextmanager
def lowering_for(name: str) -> Iterator[str]:
    """Within: `current()` answers `name`; yields JAX's lowering platform name for it.

    Raises:
      ValueError: if `name` is not one of PLATFORMS.
    """
    token = _TARGET.set(check_platform(name))
    try:
        yield LOWERING_NAMES[name]
    finally:
        _TARGET.reset(token)
