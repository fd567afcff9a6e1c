"""What a placement needs before step 0, behind one call that names no placement.

A placement whose parameters depend on data (Admin's omega is profiled on a batch) registers a
set-up hook here: `hook(model, peek_batch, key, workdir)`, run on the freshly initialised model
before a checkpoint is restored. The trainer and `ln_jax.analysis` call `setup_placements`
blindly, so a new placement with a set-up is a new entry of `SETUP_HOOKS`, not a new branch in
the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from ln_jax.nn import admin

Hook = Callable[[Any, Callable[[], Mapping[str, Any]], "jax.Array | None", "str | None"], None]

# placement name -> its set-up hook
SETUP_HOOKS: dict[str, Hook] = {"admin": admin.setup_admin}


def setup_placements(
    model: Any,
    peek_batch: Callable[[], Mapping[str, Any]],
    key: jax.Array | None,
    workdir: str | None = None,
) -> list[str]:
    """Runs the set-up hook of every placement `model` uses; returns the placements set up.

    Args:
      model: a freshly initialised model (inside the mesh context if it is sharded) whose
        `cfg` attribute is its ModelConfig; a model without one has nothing to set up.
      peek_batch: returns one training batch without consuming it.
      key: the dropout key of a training-mode forward pass (None = deterministic).
      workdir: the run's folder, where a hook keeps what a resumed run must reuse; None keeps
        nothing.
    """
    cfg = getattr(model, "cfg", None)  # a model exposes its ModelConfig as `cfg` (BERT does)
    names = sorted(set(getattr(cfg, "layer_placements", ())) & set(SETUP_HOOKS))
    for name in names:
        SETUP_HOOKS[name](model, peek_batch, key, workdir)
    return names
