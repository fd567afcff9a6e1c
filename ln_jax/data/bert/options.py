"""How BERT pretraining's examples are made from the token ids: the data half of BERT's config
section "bert" (`ln_jax.models.bert.options.BertOptions` adds the model's fields), read by
`ln_jax.data.bert.pipeline` and `ln_jax.data.bert.examples`.
"""

from __future__ import annotations

import dataclasses

from ln_jax.data.config import check_minimum, check_types, out_of_range

# The config section of BERT's own fields (`ln_jax.models.bert.options`), named in errors.
PRETRAINING_SECTION = "bert"


@dataclasses.dataclass(frozen=True)
class PretrainingOptions:
    """How BERT pretraining's examples are made: `--config.bert.FIELD` (with `BertOptions`'
    model fields).

    Attributes:
      max_predictions_per_seq: P, masked positions per example (BERT: 20 at 128, 80 at 512).
      masked_lm_prob: fraction of tokens to predict.
      short_seq_prob: probability that a document uses a random shorter target length.
      whole_word_masking: mask all pieces of a word together.
      nsp: sentence pairs with next-sentence labels; False = RoBERTa-style packed full
        sentences (segment ids and `nsp_label` all 0).
    """

    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    whole_word_masking: bool = False
    nsp: bool = True

    def __post_init__(self) -> None:
        check_types(self, PRETRAINING_SECTION)
        check_minimum(self, PRETRAINING_SECTION, {"max_predictions_per_seq": 1})
        for name in ("masked_lm_prob", "short_seq_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise out_of_range(self, name, "must be in [0, 1]", PRETRAINING_SECTION)
