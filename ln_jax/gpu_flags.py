"""XLA flags ln_jax needs on NVIDIA GPUs, added to XLA_FLAGS when ln_jax is imported (before
JAX initialises its backends; JAX reads XLA_FLAGS then, once).

`--xla_gpu_enable_command_buffer=-CUDNN` keeps cuDNN calls out of XLA's CUDA graphs. With it in
them, cuDNN's fused attention with dropout aborts the process the first time a step runs
(jax 0.11.2 on an H200, 2026-11-26: `Check failed: local_device_ordinal.has_value()` in
`CudnnGraph::PackOperands`, recording the call into a command buffer; cuDNN attention without
dropout runs either way). The cost is a few kernel launches per step outside the graph.

A user's own `--xla_gpu_enable_command_buffer` is kept; `cudnn_dropout_safe()` says whether
the flag in effect keeps cuDNN out, so the config can refuse cuDNN dropout (with the fix) rather
than let the process abort.
"""

from __future__ import annotations

import os
import re
import sys

KEEP_CUDNN_OUT = "--xla_gpu_enable_command_buffer=-CUDNN"
_FLAG = re.compile(r"--xla_gpu_enable_command_buffer=(\S*)")
_state = {"safe": False}


def _keeps_cudnn_out(value: str) -> bool:
    """Whether a --xla_gpu_enable_command_buffer value leaves cuDNN calls out of graphs."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    if any(x.startswith(("+", "-")) for x in items):
        return "-CUDNN" in items
    return "CUDNN" not in items  # an explicit list (or none: graphs off)


def apply() -> None:
    """Adds KEEP_CUDNN_OUT to XLA_FLAGS unless the user set the flag or JAX already started."""
    flags = os.environ.get("XLA_FLAGS", "")
    given = _FLAG.findall(flags)
    if given:
        _state["safe"] = _keeps_cudnn_out(given[-1])
        return
    if _backends_started():
        _state["safe"] = False
        return
    os.environ["XLA_FLAGS"] = f"{flags} {KEEP_CUDNN_OUT}".strip()
    _state["safe"] = True


def cudnn_dropout_safe() -> bool:
    """True when the XLA flags JAX started with keep cuDNN out of CUDA graphs."""
    return _state["safe"]


def _backends_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()
