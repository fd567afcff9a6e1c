"""The optimizer's and schedule's configuration (`OptimConfig`) and the names it accepts.

Below `ln_jax/train/`: the run config (`ln_jax.config.run`) holds an `OptimConfig`, and
`ln_jax.train.optim` builds the optax chain and the schedule from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ln_jax.validate import ConfigError, Fix, check_choice, reject_unknown_keys

OPTIMIZERS = ("adam", "adamw", "radam", "sgd")
SCHEDULES = (
    "linear_decay",
    "warmup_linear_decay",
    "warmup_cosine",
    "warmup_rsqrt",
    "decay_rsqrt",
    "constant",
)
# Schedules that accept warmup_steps > 0 (linear_decay is by definition without warm-up).
WARMUP_SCHEDULES = SCHEDULES[1:]
# The schedule's numbers: inputs of the compiled train step, not constants (`schedule_values`).
SCHEDULE_FIELDS = ("peak_lr", "end_lr", "warmup_steps", "total_steps", "decay_step", "decay_factor")
# A run's optim.total_steps is its total_steps unless set (`TrainConfig.from_mapping`).
TOTAL_STEPS_NOTE = " (it follows --config.total_steps unless set)."


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer and schedule hyper-parameters.

    Attributes:
        optimizer: One of ``OPTIMIZERS``. ``adamw`` adds decoupled weight decay after
            the Adam scaling; ``adam``, ``radam`` and ``sgd`` use no weight decay
            (``weight_decay`` is ignored for them; no L2-in-the-loss variant).
        peak_lr: Maximum learning rate (> 0).
        schedule: One of ``SCHEDULES``; formulas in ``make_schedule``.
        warmup_steps: Linear warm-up length W (>= 0, <= total_steps).
        total_steps: Training length T for the linear-decay and cosine schedules (> 0).
        end_lr: Final learning rate of the linear-decay and cosine schedules.
        decay_step: Step D at which ``decay_rsqrt`` decays (>= 0).
        decay_factor: Multiplier applied at ``decay_step`` by ``decay_rsqrt`` (> 0).
        b1: Adam/RAdam first-moment decay.
        b2: Adam/RAdam second-moment decay (Xiong et al. use 0.98 for MT).
        eps: Adam/RAdam epsilon.
        weight_decay: Decoupled weight-decay coefficient (adamw only).
        clip_norm: Global-norm clipping threshold; 0 or None disables clipping.
        momentum: SGD momentum; 0 gives plain SGD.
    """

    optimizer: str = "adamw"
    peak_lr: float = 1e-4
    schedule: str = "warmup_linear_decay"
    warmup_steps: int = 0
    total_steps: int = 10000
    end_lr: float = 0.0
    decay_step: int = 0
    decay_factor: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    clip_norm: float | None = 1.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("schedule", self.schedule, SCHEDULES)
        checks = [
            ("peak_lr", self.peak_lr > 0, "must be > 0"),
            ("total_steps", self.total_steps > 0, "must be > 0"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("end_lr", self.end_lr >= 0, "must be >= 0"),
            ("decay_step", self.decay_step >= 0, "must be >= 0"),
            ("decay_factor", self.decay_factor > 0, "must be > 0"),
            ("b1", 0 <= self.b1 < 1, "must be in [0, 1)"),
            ("b2", 0 <= self.b2 < 1, "must be in [0, 1)"),
            ("eps", self.eps >= 0, "must be >= 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("clip_norm", self.clip_norm is None or self.clip_norm >= 0, "must be >= 0 or None"),
            ("momentum", 0 <= self.momentum < 1, "must be in [0, 1)"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ConfigError(
                    f"optim.{name}={getattr(self, name)!r} {rule}: set --config.optim.{name}"
                    + (TOTAL_STEPS_NOTE if name == "total_steps" else ".")
                )
        if self.schedule in WARMUP_SCHEDULES and self.warmup_steps > self.total_steps:
            raise ConfigError(
                f"optim.warmup_steps={self.warmup_steps} must be <= optim.total_steps="
                f"{self.total_steps}: lower --config.optim.warmup_steps or raise "
                "--config.total_steps."
            )
        if self.schedule == "linear_decay" and self.warmup_steps > 0:
            # Silently ignoring a requested warm-up would invalidate a warm-up ablation.
            raise ConfigError(
                f"optim.warmup_steps={self.warmup_steps} needs a schedule with a warm-up; "
                "optim.schedule='linear_decay' has none: set "
                "--config.optim.schedule=warmup_linear_decay (or --config.optim.warmup_steps=0).",
                fix=Fix(set={"--config.optim.schedule": "warmup_linear_decay"}),
            )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> OptimConfig:
        """Builds a config from a mapping, rejecting unknown keys.

        Args:
            mapping: Field names to values; missing fields keep their defaults.

        Returns:
            The validated config.

        Raises:
            ValueError: On an unknown key (the message names the closest valid key)
                or on an invalid value.
        """
        reject_unknown_keys("optim", mapping, [f.name for f in dataclasses.fields(cls)])
        return cls(**dict(mapping))


def _check_choice(field: str, value: str, valid: tuple[str, ...]) -> None:
    shown = [repr(v) for v in valid]
    check_choice(f"optim.{field}", value, valid, config_field=f"optim.{field}", shown=shown)
