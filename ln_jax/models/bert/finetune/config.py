"""The typed fine-tuning config (`configs/glue.py` declares every field, with a comment).

`FinetuneConfig.from_mapping` validates once; `train_config(cell, seed, ...)` turns one cell of
the lr x batch x epochs grid and one seed into the `TrainConfig` that the one trainer
(`ln_jax.train.trainer.train_and_evaluate`) runs: task "glue_classification" with its
section "glue" (`GlueOptions`: the GLUE task, the pretrained source and step, the classifier
dropout, the example limits), evaluation and a checkpoint every epoch, the optimizer (the
section `optim`, an `OptimConfig` as train.py's, with the cell's learning rate and the run's
warm-up and length), seed, mesh, NaN policy and dropout PRNG.

Until 2026-12-05 the optimizer's fields sat at the top of the config (`--config.weight_decay`);
`moved_optim` reads a workdir's config.json of then into the section `optim`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from ln_jax.config.optim import OptimConfig
from ln_jax.config.run import CheckpointConfig, MeshConfig, ModelConfig, MonitorConfig, TrainConfig
from ln_jax.data.config import DataConfig
from ln_jax.models.bert.finetune.options import GlueOptions
from ln_jax.models.bert.finetune.tasks import GLUE_TASKS
from ln_jax.validate import (
    MOVED_FIELDS,
    ConfigError,
    check_choice,
    moved_field_message,
    reject_unknown_keys,
)

HF_PREFIX = "hf:"
# The fields of `optim` that the grid sets per run: from learning_rates, warmup_fraction, epochs.
GRID_OPTIM = {"peak_lr": "learning_rates", "warmup_steps": "warmup_fraction"}
GRID_OPTIM["total_steps"] = "epochs"


@dataclasses.dataclass(frozen=True)
class GlueDataConfig:
    """Where the task's dataset is (see `ln_jax.data.bert.glue`).

    Attributes:
      data_dir: TFDS data dir (None = $TFDS_DATA_DIR or ~/tensorflow_datasets).
      download: let TFDS download and prepare a GLUE task that is not prepared.
      max_train_examples / max_eval_examples: use only the first N examples (None = all).
    """

    data_dir: str | None = None
    download: bool = False
    max_train_examples: int | None = None
    max_eval_examples: int | None = None


@dataclasses.dataclass(frozen=True)
class Cell:
    """One point of the grid: peak learning rate, batch size, epochs."""

    learning_rate: float
    batch_size: int
    epochs: int

    @property
    def name(self) -> str:
        return f"lr{self.learning_rate:g}_bs{self.batch_size}_ep{self.epochs}"


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning of a pretrained encoder with a [CLS] classifier (see `configs/glue.py`).

    Attributes:
      name: run name; the default workdir is workdirs/<name>.
      task: a key of `ln_jax.models.bert.finetune.tasks.GLUE_TASKS`.
      init_from: a pretraining workdir, or "hf:PATH" (a local HuggingFace BERT directory).
      init_step: the workdir's checkpoint to start from (None = its latest).
      seeds: one run per seed (classifier initialisation, dropout, example order).
      learning_rates / batch_sizes / epochs: the grid; every combination is run.
      warmup_fraction: warm-up over this fraction of the steps, then the schedule's decay.
      optim: the optimizer and schedule (`OptimConfig`: optimizer, b1, b2, eps, weight_decay,
        clip_norm, schedule, ...); the grid sets its peak_lr, warmup_steps and total_steps.
      max_seq_length: T of `[CLS] A [SEP] B [SEP]` (longer pairs are truncated).
      eval_batch_size: dev-set batch (rounded up to a multiple of the data-parallel devices).
      hidden_dropout / attention_dropout: the encoder's (None = the checkpoint's).
      classifier_dropout: dropout on the pooled [CLS] vector (None = hidden_dropout).
      log_every: train metrics every N steps (and at every epoch's end).
      nan_policy, dropout_rng: as in `TrainConfig`.
      data, mesh, checkpoint: sections (`GlueDataConfig`, `MeshConfig`, `CheckpointConfig`).
    """

    name: str = "glue_offline"
    task: str = "offline"
    init_from: str | None = None
    init_step: int | None = None
    seeds: tuple[int, ...] = (0,)
    learning_rates: tuple[float, ...] = (2e-5,)
    batch_sizes: tuple[int, ...] = (32,)
    epochs: tuple[int, ...] = (3,)
    warmup_fraction: float = 0.1
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    max_seq_length: int = 128
    eval_batch_size: int = 64
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    classifier_dropout: float | None = None
    log_every: int = 10
    nan_policy: str = "stop"
    dropout_rng: str = "auto"
    data: GlueDataConfig = dataclasses.field(default_factory=GlueDataConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        check_choice("task", self.task, GLUE_TASKS, config_field="task")
        for field in ("seeds", "learning_rates", "batch_sizes", "epochs"):
            value = getattr(self, field)
            value = tuple(value) if isinstance(value, list | tuple) else (value,)
            if not value:
                raise ValueError(f"{field} is empty; give at least one value.")
            object.__setattr__(self, field, value)
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1).")
        if min(self.batch_sizes) < 1 or min(self.epochs) < 1:
            raise ValueError("batch_sizes and epochs must be positive.")
        for field, grid in GRID_OPTIM.items():
            if getattr(self.optim, field) != getattr(OptimConfig, field):
                raise ValueError(f"optim.{field} is set by the grid's {grid}: give those.")

    @property
    def cells(self) -> list[Cell]:
        """Every (lr, batch, epochs) combination, in grid order."""
        grid = itertools.product(self.learning_rates, self.batch_sizes, self.epochs)
        return [Cell(float(lr), int(b), int(e)) for lr, b, e in grid]

    @property
    def is_hf(self) -> bool:
        return bool(self.init_from) and self.init_from.startswith(HF_PREFIX)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> FinetuneConfig:
        """The typed config of a nested mapping; unknown fields name the closest valid one."""
        values = dict(values)
        moved = [name for name in values if name in MOVED_FIELDS]
        if moved:
            raise ConfigError(moved_field_message(moved[0]))
        reject_unknown_keys("config", values, [f.name for f in dataclasses.fields(cls)])
        sections = {"data": GlueDataConfig, "mesh": MeshConfig, "checkpoint": CheckpointConfig}
        for key, kind in sections.items():
            given = dict(values.pop(key, {}))
            reject_unknown_keys(key, given, [f.name for f in dataclasses.fields(kind)])
            values[key] = kind(**given)
        values["optim"] = OptimConfig.from_mapping(dict(values.get("optim", {})))
        return cls(**values)


def moved_optim(values: Mapping[str, Any]) -> dict[str, Any]:
    """A fine-tuning config mapping (a workdir's config.json, "finetune") with the optimizer's
    fields of a config written before 2026-12-05, at the top, moved into its section `optim`
    (the others at their defaults, as the config then had them): such a workdir then resumes
    and compares as one written since. Other mappings are returned as given."""
    values = dict(values)
    old = {name: values.pop(name) for name in list(values) if name in MOVED_FIELDS}
    if not old:
        return values
    defaults = {f.name: getattr(OptimConfig(), f.name) for f in dataclasses.fields(OptimConfig)}
    values["optim"] = {**defaults, **dict(values.get("optim") or {}), **old}
    return values


def build_finetune_config(values: Mapping[str, Any]) -> FinetuneConfig:
    """`FinetuneConfig.from_mapping` with every invalid value a ConfigError (exit 2), keeping
    the error's fix of the command line."""
    from ln_jax.config.load import override

    try:
        return FinetuneConfig.from_mapping(override(values, {}))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err), fix=getattr(err, "fix", None)) from None


def train_config(
    cfg: FinetuneConfig,
    cell: Cell,
    seed: int,
    encoder: ModelConfig,
    init: tuple[str, int | None],
    steps_per_epoch: int,
    eval_batch_size: int,
    type_vocab_size: int = 2,
) -> TrainConfig:
    """The `TrainConfig` of one fine-tuning run: AdamW (by default), linear warm-up over
    `warmup_fraction` of the steps, then linear decay to 0; evaluation and a checkpoint after
    every epoch; no accumulation, no monitor.

    Args:
      encoder: the pretrained encoder's config (its dropouts replaced by the config's).
      init: (source, step) of the pretrained encoder (`GlueClassification.initialize`).
      steps_per_epoch: full batches of the training split.
      eval_batch_size: dev batch, a multiple of the data x fsdp devices.
      type_vocab_size: rows of the pretrained encoder's segment embedding.
    """
    total = cell.epochs * steps_per_epoch
    task = GLUE_TASKS[cfg.task]
    hidden = encoder.hidden_dropout if cfg.hidden_dropout is None else cfg.hidden_dropout
    attention = cfg.attention_dropout
    model = encoder.replace(
        hidden_dropout=hidden,
        attention_dropout=encoder.attention_dropout if attention is None else attention,
    )
    options = GlueOptions(
        glue_task=cfg.task,
        init_from=init[0],
        init_step=init[1],
        classifier_dropout=hidden if cfg.classifier_dropout is None else cfg.classifier_dropout,
        max_train_examples=cfg.data.max_train_examples,
        max_eval_examples=cfg.data.max_eval_examples,
        type_vocab_size=type_vocab_size,
    )
    data = DataConfig(
        dataset=task.dataset,
        data_dir=cfg.data.data_dir,
        download=cfg.data.download,
        train_split=task.train_split,
        eval_split=task.eval_split,
        vocab_size=model.vocab_size,
        max_seq_length=cfg.max_seq_length,
        global_batch_size=cell.batch_size,
        eval_batch_size=eval_batch_size,
        seed=seed,
    )
    return TrainConfig(
        name=f"{cfg.name}/{cell.name}/seed{seed}",
        task="glue_classification",
        options=options,
        seed=seed,
        total_steps=total,
        eval_every=steps_per_epoch,
        checkpoint_every=steps_per_epoch,
        log_every=cfg.log_every,
        steps_per_epoch=steps_per_epoch,
        nan_policy=cfg.nan_policy,
        dropout_rng=cfg.dropout_rng,
        model=model,
        optim=_optim(cfg, cell, total),
        data=data,
        mesh=cfg.mesh,
        checkpoint=cfg.checkpoint,
        monitor=MonitorConfig(every=0),
    )


def _optim(cfg: FinetuneConfig, cell: Cell, total: int) -> OptimConfig:
    """`cfg.optim` with the cell's peak learning rate and the run's warm-up and length."""
    warmup = round(cfg.warmup_fraction * total)
    return dataclasses.replace(
        cfg.optim, peak_lr=cell.learning_rate, warmup_steps=warmup, total_steps=total
    )
