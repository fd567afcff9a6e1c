"""BERT for pretraining: embeddings, the encoder, and the masked-LM and next-sentence heads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ln_jax.config.run import ModelConfig
from ln_jax.models.bert.options import BertOptions
from ln_jax.nn.blocks import EncoderLayer, Record, StackDepth
from ln_jax.nn.embed import Embed
from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import Dense, activation, float32_einsum, logsumexp, split_key
from ln_jax.nn.norms import LayerNorm
from ln_jax.nn.stack import Encoder, StackView
from ln_jax.sharding import constrain

Array = jax.Array
# The logit of a padded vocabulary row: exp() of it is 0 after any softmax's max-subtraction,
# and unlike -inf it keeps 0 * logit finite (entropies, KL).
MASKED_LOGIT = -1e9


class BertEncoder(nnx.Module):
    """Embeddings + Transformer encoder: ids -> contextual vectors [batch, length, embed].

    `type_vocab_size`: rows of the segment embedding (`BertOptions.type_vocab_size`).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, type_vocab_size: int = 2):
        # token + position + segment (`ln_jax.nn.embed`): word, position, segment, norm
        self.embeddings = Embed(cfg, rngs=rngs, types=type_vocab_size)
        self.encoder = Encoder(cfg, rngs=rngs)

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array | None = None,
        attention_mask: Array | None = None,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
    ) -> tuple[Array, Record]:
        """input_ids, segment_ids, attention_mask: [batch, length] -> ([batch, length, embed], rec).

        `attention_mask` is 1 for real tokens and 0 for padding (None = no padding).
        """
        k_emb, k_enc = split_key(dropout_key, 2)
        x = self.embeddings(input_ids, segment_ids, dropout_key=k_emb)
        y, rec = self.encoder(x, mask=attention_mask, dropout_key=k_enc, record=record)
        if record:
            rec["embeddings"] = x
        return y, rec


class MlmHead(nnx.Module):
    """dense + activation + LayerNorm, then the decoder tied to the word embeddings, + bias."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        kw = dict(init=init_scheme(cfg), dtype=cfg.compute_dtype, rngs=rngs)
        self.transform = Dense((d,), (d,), ("embed", "embed_proj"), **kw)
        self.norm = LayerNorm(d, eps=cfg.layer_norm_eps, dtype=cfg.compute_dtype, name="embed_proj")
        self.bias = nnx.Param(jnp.zeros((cfg.padded_vocab_size,)), out_sharding=("vocab",))
        self.activation = cfg.activation
        self.dtype = cfg.compute_dtype
        self.vocab_size = cfg.vocab_size

    def __call__(self, hidden: Array, positions: Array, word_embeddings: Array) -> Array:
        """hidden [batch, length, embed], positions [batch, P] -> float32 logits [batch, P,
        padded vocab]; the logits of padding rows (>= vocab_size) are MASKED_LOGIT.

        Only the P given positions are transformed and decoded.
        """
        h = jnp.take_along_axis(hidden, positions[..., None].astype(jnp.int32), axis=1)
        h = self.norm(activation(self.activation, self.transform(h)))
        # Both operands replicated on the contracted dim: left to propagation, XLA's partitioner
        # gave wrong gradients on a data x fsdp x tensor mesh (measured in tests/test_sharding).
        h = constrain(h, ("act_batch", "act_predictions", "act_embed"))
        table = constrain(word_embeddings, ("vocab", "act_embed")).astype(self.dtype)
        logits = decode(h, table) + self.bias[...]
        if logits.shape[-1] > self.vocab_size:  # padded rows: never a prediction
            real = jnp.arange(logits.shape[-1]) < self.vocab_size
            logits = jnp.where(real, logits, MASKED_LOGIT)
        return constrain(logits, ("act_batch", "act_predictions", "act_vocab"))


def decode(h: Array, table: Array) -> Array:
    """float32 logits [batch, P, vocab] of h [batch, P, embed] against table [vocab, embed]:
    accumulated in float32 from operands in the compute dtype, never rounded; the backward
    multiplies in that dtype (`ln_jax.nn.layers.float32_einsum`; autodiff's float32 products
    took ~1.5 ms of BERT-base's bf16 step on an H200 as TF32 GEMMs)."""
    return float32_einsum("bpd,vd->bpv", h, table)


class NspHead(nnx.Module):
    """Pooler (dense + tanh on [CLS]) and a 2-way classifier."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        kw = dict(init=init_scheme(cfg), dtype=cfg.compute_dtype, rngs=rngs)
        self.pooler = Dense((d,), (d,), ("embed", "embed_proj"), **kw)
        self.classifier = Dense((d,), (2,), ("embed_proj", "classes"), **kw)

    def __call__(self, hidden: Array) -> Array:
        """hidden [batch, length, embed] -> float32 logits [batch, 2]."""
        pooled = jnp.tanh(self.pooler(hidden[:, 0]))
        return self.classifier(pooled).astype(jnp.float32)


class BertForPreTraining(nnx.Module):
    """BERT with masked-LM and (optionally) next-sentence-prediction heads.

    `cfg` is the encoder's stack, `options` BERT's own fields (segment embeddings, NSP head;
    the section "bert" of a config, default BERT's).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, options: BertOptions | None = None):
        self.cfg = cfg
        self.options = options = BertOptions() if options is None else options
        self.bert = BertEncoder(cfg, rngs=rngs, type_vocab_size=options.type_vocab_size)
        self.mlm = MlmHead(cfg, rngs=rngs)
        self.nsp = NspHead(cfg, rngs=rngs) if options.nsp_head else None

    def __call__(
        self,
        input_ids: Array,
        segment_ids: Array | None,
        attention_mask: Array | None,
        masked_positions: Array,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
    ) -> dict[str, Array | Record]:
        """Pretraining forward pass.

        Args:
          input_ids, segment_ids, attention_mask: [batch, length] int.
          masked_positions: [batch, P] int, the positions whose tokens the MLM head predicts.
          dropout_key: PRNG key for all dropout; None = deterministic (evaluation).
          record: also return the per-layer intermediates (see `Encoder`).

        Returns:
          {"mlm_logits": [batch, P, vocab] f32, "nsp_logits": [batch, 2] f32 (if the NSP head
          exists), "intermediates": {...} (if record)}.
        """
        hidden, rec = self.bert(
            input_ids, segment_ids, attention_mask, dropout_key=dropout_key, record=record
        )
        out: dict[str, Array | Record] = {
            "mlm_logits": self.mlm(hidden, masked_positions, self.bert.embeddings.word[...])
        }
        if self.nsp is not None:
            out["nsp_logits"] = self.nsp(hidden)
        if record:
            out["intermediates"] = rec
        return out

    def stack_views(self) -> list[StackView]:
        """The model's layer stacks in order (`ln_jax.nn.stack.Stacked`)."""
        return [encoder_view(self.cfg)]

    def stack_records(self, batch: dict, dropout_key: Array | None) -> dict[str, Record]:
        """A training-mode forward pass's records of each stack (`ln_jax.nn.stack.Stacked`);
        batch: input_ids, segment_ids, attention_mask [batch, length], masked_positions."""
        keys = ("input_ids", "segment_ids", "attention_mask", "masked_positions")
        out = self(*(batch[k] for k in keys), dropout_key=dropout_key, record=True)
        return {"encoder": out["intermediates"]}


def mlm_nll(logits: Array, ids: Array) -> Array:
    """-log softmax(logits)[ids]: logits [B, P, V] float32, ids [B, P] -> [B, P].

    In the logsumexp form with the target logit picked by a compare-and-sum, which XLA fuses
    into the reductions: neither the forward nor the backward pass writes a [B, P, V] array
    beyond the logits' own gradient (a gather's backward would scatter into one).
    """
    vocab = jnp.arange(logits.shape[-1], dtype=ids.dtype)
    target = jnp.sum(jnp.where(vocab == ids[..., None], logits, 0.0), axis=-1)
    return logsumexp(logits) - target


def pretraining_loss(
    outputs: dict,
    batch: dict[str, Array],
    use_nsp: bool,
    mlm_weight: Array | float | None = None,
    num_sequences: int | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Masked-LM (+ next-sentence) cross-entropy and accuracies of the heads above, float32.

    outputs["mlm_logits"] [B, P, V] with batch["masked_ids"/"masked_weights"] [B, P]: the MLM
    loss is sum(weights * nll) / `mlm_weight`; NSP (outputs["nsp_logits"] [B, 2],
    batch["nsp_label"] [B]) is sum(nll) / `num_sequences`.

    Args:
      mlm_weight: the MLM denominator; None = this batch's total weight (at least 1). A
        micro-batch of gradient accumulation passes the whole batch's, so that the micro-batch
        losses add up to the big batch's loss exactly.
      num_sequences: the NSP denominator; None = this batch's B.
    """
    logits = outputs["mlm_logits"].astype(jnp.float32)
    ids, weights = batch["masked_ids"], batch["masked_weights"].astype(jnp.float32)
    nll = mlm_nll(logits, ids)
    denom = jnp.maximum(weights.sum(), 1.0) if mlm_weight is None else mlm_weight
    metrics = {
        "mlm_loss": (nll * weights).sum() / denom,
        "mlm_accuracy": ((logits.argmax(-1) == ids) * weights).sum() / denom,
    }
    loss = metrics["mlm_loss"]
    if use_nsp:
        nsp_logits = outputs["nsp_logits"].astype(jnp.float32)
        labels = batch["nsp_label"]
        count = labels.shape[0] if num_sequences is None else num_sequences
        nsp_nll = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels)
        metrics["nsp_loss"] = nsp_nll.sum() / count
        metrics["nsp_accuracy"] = (nsp_logits.argmax(-1) == labels).sum() / count
        loss = loss + metrics["nsp_loss"]
    metrics["loss"] = loss
    return loss, metrics


def encoder_view(cfg: ModelConfig) -> StackView:
    """The encoder's view (`ln_jax.nn.stack.StackView`) in BertForPreTraining's parameters
    (and the classifier's: both hold the encoder under "bert")."""
    depth = StackDepth.of("encoder", cfg.num_layers)
    return StackView.of(cfg, EncoderLayer, ("bert", "encoder", "layers"), depth=depth)


def create_model(
    cfg: ModelConfig,
    *,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    options: BertOptions | None = None,
) -> BertForPreTraining:
    """Builds the model (`options`: BERT's own fields, default BERT's); under `mesh` every
    parameter is created directly in its shards."""
    from ln_jax import sharding

    options = BertOptions() if options is None else options

    def make(rngs: nnx.Rngs) -> BertForPreTraining:
        return BertForPreTraining(cfg, rngs=rngs, options=options)

    # Compiled once per (config, mesh, rules): another seed reuses the initialisers.
    return sharding.create_seeded(
        make,
        seed,
        cache_key=("BertForPreTraining", cfg, options),
        mesh=mesh,
        rules=rules or sharding.DEFAULT_RULES,
    )
