"""ln_jax: LayerNorm placement in Transformers (Post-LN, Pre-LN, ...) in JAX / Flax NNX.

The names below import on first use (PEP 562), so that `import ln_jax.data...` in a data
worker process does not load JAX and Flax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BertEncoder": "ln_jax.bert",
    "BertForPreTraining": "ln_jax.bert",
    "create_model": "ln_jax.bert",
    "PLACEMENTS": "ln_jax.placements",
    "SIZES": "ln_jax.config",
    "ModelConfig": "ln_jax.config",
    "model_config": "ln_jax.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ln_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
