"""GLUE fine-tuning's own settings: the config section "glue" (`TrainConfig.options` of the task
"glue_classification"), filled by `finetune.config.train_config` from the fine-tuning config."""

from __future__ import annotations

import dataclasses

SECTION = "glue"  # the config section of these fields (`GlueClassification.options_section`)


@dataclasses.dataclass(frozen=True)
class GlueOptions:
    """A fine-tuning run's own fields.

    Attributes:
      glue_task: a key of `ln_jax.models.bert.finetune.tasks.GLUE_TASKS` ("offline", "mrpc",
        "rte", ...); the task checks it when it is made.
      init_from: the pretrained source: a `train.py` workdir, or "hf:PATH" (a local
        HuggingFace BERT folder).
      init_step: the workdir's checkpoint step to start from (None = its latest).
      classifier_dropout: dropout on the pooled [CLS] vector (None = `model.hidden_dropout`).
      max_train_examples / max_eval_examples: the first N examples of each split (None = all).
      type_vocab_size: rows of the encoder's segment embedding: the pretrained source's
        (BERT's section "bert"; `model.type_vocab_size` until 2026-12-06).
    """

    glue_task: str | None = None
    init_from: str | None = None
    init_step: int | None = None
    classifier_dropout: float | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    type_vocab_size: int = 2
