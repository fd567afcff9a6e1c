"""The toy family's config (tests/toy_task.py): the typed configs' defaults
(`ln_jax.config.run.TrainConfig`, nothing of BERT's recipe) with the toy's task, its section
"toy" and the tests' sizes: 8 steps, a 2x2x2 mesh, width 16.

  python train.py --config=tests/toy_config.py --workdir=/tmp/toy
"""

from __future__ import annotations

from typing import Any

from ln_jax.config.run import TrainConfig

TOY = "tests.toy_task:ToyRegression"
SETTINGS = {
    "total_steps": 8,
    "log_every": 2,
    "eval_every": 4,
    "checkpoint_every": 4,
    "eval_batches": None,
    "grad_accum_steps": 1,
    "optim": {"peak_lr": 1e-2, "warmup_steps": 0},
    "data": {"global_batch_size": 16},
    "model": {"hidden_size": 16, "mlp_dim": 24, "hidden_dropout": 0.0},
    "mesh": {"data": 2, "fsdp": 2, "tensor": 2},
}


def get_config(variant: str | None = None) -> dict[str, Any]:
    """The toy's config as nested plain values (the typed defaults, then `SETTINGS`)."""
    if variant:
        raise ValueError(f"unknown config variant {variant!r}; the toy's config has none.")
    values = TrainConfig(task=TOY).to_dict()
    for key, value in SETTINGS.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) else value
    return values
