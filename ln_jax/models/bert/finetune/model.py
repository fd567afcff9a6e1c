"""The [CLS] classifier of fine-tuning and its loss (`GlueClassification.build` and `.loss`).

`BertClassifier` = `BertEncoder` (any placement, per-layer lists, Admin's omega, scan_layers:
the encoder's own config) + BERT's pooler (dense + tanh on [CLS], taken from the pretrained
NSP head when there is one) + dropout + a linear classifier. Every parameter carries logical
axis names: the pooler ("embed", "embed_proj"), the classifier ("embed_proj", "classes").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ln_jax.config.run import ModelConfig
from ln_jax.models.bert.model import BertEncoder
from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import Dense, dropout, split_key

Array = jax.Array


class BertClassifier(nnx.Module):
    """BERT for sequence classification (or regression, `num_labels=1`)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        classifier_dropout: float,
        *,
        rngs,
        type_vocab_size: int = 2,
    ):
        d = cfg.hidden_size
        self.cfg = cfg
        self.bert = BertEncoder(cfg, rngs=rngs, type_vocab_size=type_vocab_size)
        kw = dict(init=init_scheme(cfg), dtype=cfg.compute_dtype, rngs=rngs)
        self.pooler = Dense((d,), (d,), ("embed", "embed_proj"), **kw)
        self.classifier = Dense((d,), (num_labels,), ("embed_proj", "classes"), **kw)
        self.dropout_rate = classifier_dropout

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array,
        attention_mask: Array,
        *,
        dropout_key: Array | None = None,
    ) -> Array:
        """input_ids, segment_ids, attention_mask: [batch, length] -> float32 [batch, labels]."""
        k_encoder, k_head = split_key(dropout_key, 2)
        hidden, _ = self.bert(input_ids, segment_ids, attention_mask, dropout_key=k_encoder)
        pooled = jnp.tanh(self.pooler(hidden[:, 0]))
        pooled = dropout(pooled, self.dropout_rate, k_head)
        return self.classifier(pooled).astype(jnp.float32)


def classification_loss(
    logits: Array, labels: Array, regression: bool, count: Array | float | None = None
) -> dict[str, Array]:
    """{"loss", and "accuracy" for classes}: logits [B, labels] f32, labels [B] int (classes)
    or float (regression: squared error of logits[:, 0]), summed and divided by `count` (the
    whole batch's examples under accumulation; None = B)."""
    count = logits.shape[0] if count is None else count
    if regression:
        loss = jnp.sum(jnp.square(logits[:, 0] - labels.astype(jnp.float32))) / count
        return {"loss": loss}
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (logits.argmax(-1) == labels).astype(jnp.float32)
    return {"loss": nll.sum() / count, "accuracy": correct.sum() / count}
