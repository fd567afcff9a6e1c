"""BERT's own model fields: the config section "bert" (`TrainConfig.options` of the task
"bert_pretraining", `--config.bert.FIELD`).

The encoder's stack (width, depth, heads, placement, norm, dropout, dtype, init, embeddings) is
the shared `ModelConfig`'s; what only BERT has (its segment embeddings and its next-sentence
head) lives here. Until 2026-12-06 these two were `model.type_vocab_size` and `model.nsp_head`
(`ln_jax.validate.MOVED_MODEL_FIELDS`): the old flags are a one-line error naming the new ones,
and `ln_jax.task.moved_options` reads a config.json of then.
"""

from __future__ import annotations

import dataclasses

SECTION = "bert"  # the config section of these fields (`BertPretraining.options_section`)


@dataclasses.dataclass(frozen=True)
class BertOptions:
    """BERT's own fields.

    Attributes:
      type_vocab_size: rows of the segment embedding (2: sentence A / B).
      nsp_head: build the next-sentence-prediction head (pooler + 2-way classifier); its loss
        counts only when `data.nsp` is True.
    """

    type_vocab_size: int = 2
    nsp_head: bool = True

    def __post_init__(self) -> None:
        if int(self.type_vocab_size) <= 0:
            raise ValueError(f"{SECTION}.type_vocab_size={self.type_vocab_size} must be positive.")
