"""BERT's own fields: the config section "bert" (`TrainConfig.options` of the task
"bert_pretraining", `--config.bert.FIELD`).

The encoder's stack (width, depth, heads, placement, norm, dropout, dtype, init, embeddings) is
the shared `ModelConfig`'s and the text, tokenizer and batch size the shared `DataConfig`'s; what
only BERT has lives here: how its examples are made (masks, sentence pairs:
`ln_jax.data.config.PretrainingOptions`, which the data pipeline reads) and its segment
embeddings and next-sentence head. Until 2026-12-06 these were `model.type_vocab_size`,
`model.nsp_head` and `data.max_predictions_per_seq`, `data.masked_lm_prob`,
`data.short_seq_prob`, `data.whole_word_masking`, `data.nsp` (`ln_jax.validate.FAMILY_FIELDS`):
the old flags are a one-line error naming the new ones, and `ln_jax.task.moved_options` reads a
config.json of then.
"""

from __future__ import annotations

import dataclasses

from ln_jax.data.bert.options import PRETRAINING_SECTION, PretrainingOptions
from ln_jax.data.config import check_minimum

SECTION = PRETRAINING_SECTION  # the config section of these fields (`BertPretraining`)


@dataclasses.dataclass(frozen=True)
class BertOptions(PretrainingOptions):
    """BERT's own fields: `PretrainingOptions`'s (max_predictions_per_seq, masked_lm_prob,
    short_seq_prob, whole_word_masking, nsp) and the model's.

    Attributes:
      type_vocab_size: rows of the segment embedding (2: sentence A / B).
      nsp_head: build the next-sentence-prediction head (pooler + 2-way classifier); its loss
        counts only when `nsp` is True.
    """

    type_vocab_size: int = 2
    nsp_head: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_minimum(self, SECTION, {"type_vocab_size": 1})
