"""ln_jax: LayerNorm placement in Transformers (Post-LN, Pre-LN, ...) in JAX / Flax NNX.

The names below import on first use (PEP 562), so that `import ln_jax.data...` in a data
worker process does not load JAX and Flax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BertEncoder": "ln_jax.models.bert.model",
    "BertForPreTraining": "ln_jax.models.bert.model",
    "BertOptions": "ln_jax.models.bert.options",
    "create_model": "ln_jax.models.bert.model",
    "PLACEMENTS": "ln_jax.nn.placements",
    "SIZES": "ln_jax.config.run",
    "ModelConfig": "ln_jax.config.run",
    "model_config": "ln_jax.config.run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'ln_jax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


# JAX's CUDA plugin and libtpu, installed on a host that cannot run them (the deviceless
# compiles' extras), start quietly: `ln_jax.runtime.host`.
from ln_jax.runtime import host as _host  # noqa: E402  (no JAX import: data workers stay light)

_host.quiet_plugins()
