"""Downstream fine-tuning (GLUE and the offline pair task) of pretrained ln_jax encoders.

  from ln_jax.experiments.finetune import finetune
  from ln_jax.models.bert.finetune import build_finetune_config
  summary = finetune(build_finetune_config(values), "workdirs/glue_mrpc")

Modules: `config` (the typed config and one run's TrainConfig), `tasks` (task table, metrics),
`pretrained` (start from a workdir step or hf:PATH), `model` (the [CLS] classifier and its loss),
`task` (`GlueClassification`: fine-tuning as a `ln_jax.task.Task`, "glue_classification", with
the warm start), `run` (the set-up every run shares, one cell x seed's TrainConfig, the
summary). The grid x seeds is a study on the one runner: `ln_jax.experiments.finetune`.
Data: `ln_jax.data.bert.glue`.
"""

from ln_jax.models.bert.finetune.config import FinetuneConfig, build_finetune_config
from ln_jax.models.bert.finetune.run import format_summary
from ln_jax.models.bert.finetune.tasks import GLUE_TASKS, task_scores

__all__ = [
    "GLUE_TASKS",
    "FinetuneConfig",
    "build_finetune_config",
    "format_summary",
    "task_scores",
]
