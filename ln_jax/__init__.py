"""ln_jax: LayerNorm placement in Transformers (Post-LN, Pre-LN, ...) in JAX / Flax NNX.

The names below import on first use (PEP 562), so that `import ln_jax.data...` in a data
worker process does not load JAX and Flax.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

_EXPORTS = {
    "BertEncoder": "ln_jax.models.bert.model",
    "BertForPreTraining": "ln_jax.models.bert.model",
    "create_model": "ln_jax.models.bert.model",
    "PLACEMENTS": "ln_jax.nn.placements",
    "SIZES": "ln_jax.config",
    "ModelConfig": "ln_jax.config",
    "model_config": "ln_jax.config",
}
# Modules the README names as `from ln_jax import X` / `ln_jax.X.f` before they moved into
# nn/, train/ and models/bert/ (issue 31): importable from the package as before.
_MODULES = {
    "admin": "ln_jax.nn.admin",
    "bert": "ln_jax.models.bert.model",
    "blocks": "ln_jax.nn.blocks",
    "convert": "ln_jax.models.bert.convert",
    "layers": "ln_jax.nn.layers",
    "sharding": "ln_jax.sharding",
    "steps": "ln_jax.train.steps",
    "trainer": "ln_jax.train.trainer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'ln_jax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_MODULES])


# Files an NVIDIA driver creates; without them no process on this host can run on a GPU.
NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
_CUDA_PLUGIN_ERROR = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"


def _quiet_cuda_plugin_without_a_driver() -> bool:
    """Drops the CUDA plugin's start-up traceback on a host with no NVIDIA driver.

    JAX's CUDA plugin installed on a CPU host (the `gpu-compile` extra, for compiling the step
    for a GPU without one: `ln_jax.deviceless`) fails its cuDNN check when a JAX process starts
    its backends and logs a 20-line traceback, in every process, for a GPU the host cannot
    have. There JAX runs on the CPU as it would without the plugin, and compiling for a GPU
    does not need the check; so the record is dropped. With a driver present it is kept: there
    it names a real installation problem. Returns whether the filter was installed."""
    if any(os.path.exists(f) for f in NVIDIA_DRIVER_FILES):
        return False
    logging.getLogger("jax._src.xla_bridge").addFilter(_not_the_cuda_plugin_error)
    return True


def _not_the_cuda_plugin_error(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_CUDA_PLUGIN_ERROR)


_quiet_cuda_plugin_without_a_driver()
