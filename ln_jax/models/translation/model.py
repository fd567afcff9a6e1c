"""The encoder-decoder Transformer for translation, on the same placement table as BERT.

`Translator(cfg, options)`: a shared source/target vocabulary with tied embeddings and output
projection (optionally untied), embeddings (`ln_jax.nn.embed`) scaled by sqrt(d), sinusoidal
positions (Vaswani et al.; learned as an option), an `Encoder` of `cfg.num_layers` and a
`Decoder` of `options.decoder_layers` layers (`ln_jax.nn.stack`), each with every placement
row (Pre-LN: a final norm on each stack; DeepNorm: the encoder-decoder constants; Admin: 2 and
3 sub-layers per layer). Special ids from the options (ln_jax's vocabularies: PAD 0, UNK 1,
BOS 2, EOS 3; an imported Marian model its own); an optional output bias (Marian's
final_logits_bias).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax import sharding
from ln_jax.config.run import ModelConfig
from ln_jax.models.translation.loss import token_losses
from ln_jax.models.translation.options import TranslationOptions
from ln_jax.nn.blocks import DecoderLayer, EncoderLayer, Record, StackDepth
from ln_jax.nn.embed import Embed
from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import Dense, float32_einsum, split_key
from ln_jax.nn.stack import Decoder, Encoder, StackView
from ln_jax.nn.tokens import TokenLayout
from ln_jax.sharding import constrain

Array = jax.Array
MASKED_LOGIT = -1e9  # the logit of a padded vocabulary row


class Translator(nnx.Module):
    """Encoder-decoder Transformer (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, options: TranslationOptions, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.options = options
        n, m = cfg.num_layers, options.decoder_layers
        # one table for source and target (and, tied, the output projection): word,
        # position (learned positions only), norm (`ln_jax.nn.embed`)
        self.embed = Embed(
            cfg,
            rngs=rngs,
            positions=options.positions,
            scale=float(cfg.hidden_size**0.5) if options.scale_embeddings else 1.0,
            pad_id=options.pad_id,
        )
        self.encoder = Encoder(cfg, rngs=rngs, depth=StackDepth.of("encoder", n, m))
        self.decoder = Decoder(
            options.decoder_config(cfg), rngs=rngs, depth=StackDepth.of("decoder", n, m)
        )
        d, v = cfg.hidden_size, cfg.padded_vocab_size
        self.output = (
            None
            if options.tie_output
            else Dense(
                (d,),
                (v,),
                ("embed", "vocab"),
                init=init_scheme(cfg),
                dtype=cfg.compute_dtype,
                rngs=rngs,
                use_bias=False,
            )
        )
        self.bias = (
            nnx.Param(jnp.zeros((v,), jnp.float32), out_sharding=("vocab",))
            if options.output_bias
            else None
        )
        self.vocab_size = cfg.vocab_size
        self.skip_padding = options.skip_padding == "on"

    def layout(self, mask: Array) -> TokenLayout | None:
        """The real tokens of mask [batch, length] (`ln_jax.nn.tokens`), or None if
        `skip_padding` is off: then every position is computed."""
        if not self.skip_padding:
            return None
        return TokenLayout.of(mask, sharding.batch_shards(mask.shape[0]))

    def encode(
        self, src: Array, src_mask: Array, key: Array | None = None, record: bool = False
    ) -> tuple[Array, Record]:
        """src, src_mask [batch, src_len] -> (memory [batch, src_len, embed], records)."""
        k_emb, k_enc = split_key(key, 2)
        x = self.embed(src, dropout_key=k_emb)
        inputs = {"mask": src_mask}
        if (layout := self.layout(src_mask)) is not None:
            inputs["layout"] = layout
        return self.encoder(x, dropout_key=k_enc, record=record, **inputs)

    def decode(
        self,
        tgt_in: Array,
        memory: Array | None,
        src_mask: Array | None,
        key: Array | None = None,
        record: bool = False,
        offset: Array | int = 0,
        project: bool = True,
    ) -> tuple[Array, Record]:
        """tgt_in [batch, t] (BOS then the target shifted right; positions offset..) ->
        (float32 logits [batch, t, vocab_padded] with padded rows masked, records); with
        `project=False` the decoder's output h [batch, t, embed] instead (for `loss_sums`).
        While decoding (`ln_jax.nn.stack.init_decoding`) memory and src_mask are in the
        caches."""
        k_emb, k_dec = split_key(key, 2)
        y = self.embed(tgt_in, dropout_key=k_emb, offset=offset)
        inputs: dict[str, Any] = {}
        if memory is not None:  # the training form (decoding keeps memory in its caches)
            inputs = {"memory": memory, "memory_mask": src_mask}
            positions = jnp.arange(tgt_in.shape[1])[None, :]
            real = (tgt_in != self.options.pad_id) | (positions == 0)  # BOS may be pad
            if (layout := self.layout(real)) is not None:
                inputs["layout"] = layout
        h, rec = self.decoder(y, dropout_key=k_dec, record=record, **inputs)
        return (self.logits(h) if project else h), rec

    def logits(self, h: Array) -> Array:
        """h [batch, t, embed] (or [tokens, embed]) -> float32 logits [batch, t, vocab_padded]
        (or [tokens, vocab_padded]; padded rows at MASKED_LOGIT)."""
        if self.output is None:
            table = self.embed.word[...].astype(h.dtype)
            out = tied_projection(h, table)
        else:
            out = self.output(h).astype(jnp.float32)
        if self.bias is not None:
            out = out + self.bias[...]
        if out.ndim == 3:
            out = constrain(out, ("act_batch", "act_length", "act_vocab"))
        if out.shape[-1] == self.vocab_size:  # no padded rows to mask
            return out
        real = jnp.arange(out.shape[-1]) < self.vocab_size
        return jnp.where(real, out, MASKED_LOGIT)

    def loss_sums(
        self, h: Array, targets: Array, weights: Array, epsilon: float
    ) -> tuple[Array, Array]:
        """The output projection and fairseq's label-smoothed loss of h [batch, t, embed]
        against targets [batch, t] weighted by weights [batch, t] -> (smoothed loss sum, nll
        sum); with `skip_padding` only the weighted tokens' chunks are projected."""

        def per_token(h: Array, targets: Array) -> Array:  # [..., embed], [...] -> [..., 2]
            loss, nll = token_losses(self.logits(h), targets, epsilon, self.vocab_size)
            return jnp.stack([loss, nll], axis=-1)

        layout = self.layout(weights)
        both = per_token(h, targets) if layout is None else layout.apply(per_token, h, targets)
        sums = (both * weights.astype(jnp.float32)[..., None]).sum(axis=(0, 1))
        return sums[0], sums[1]

    def __call__(
        self,
        src: Array,
        src_mask: Array,
        tgt_in: Array,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
        hidden: bool = False,
    ) -> dict[str, Any]:
        """Teacher-forced forward pass: {"logits": [batch, tgt_len, vocab_padded] float32 (or,
        with `hidden`, "hidden": the decoder's output [batch, tgt_len, embed] for
        `loss_sums`), "intermediates": {"encoder": ..., "decoder": ...} and "memory" (if
        record)}."""
        k_enc, k_dec = split_key(dropout_key, 2)
        memory, rec_enc = self.encode(src, src_mask, k_enc, record)
        h, rec_dec = self.decode(tgt_in, memory, src_mask, k_dec, record, project=not hidden)
        out: dict[str, Any] = {"hidden" if hidden else "logits": h}
        if record:
            out["intermediates"] = {"encoder": rec_enc, "decoder": rec_dec}
            out["memory"] = memory
        return out

    # `ln_jax.nn.stack.Stacked`: Admin's profiling, the monitor and the analyses see both.
    def stack_views(self) -> list[StackView]:
        return translator_views(self.cfg, self.options)

    def stack_records(self, batch: dict, dropout_key: Array | None) -> dict[str, Record]:
        out = self(
            batch["src"], batch["src_mask"], batch["tgt_in"], dropout_key=dropout_key, record=True
        )
        return out["intermediates"]


def translator_views(cfg: ModelConfig, options: TranslationOptions) -> list[StackView]:
    """The views of the encoder and the decoder (`ln_jax.nn.stack.StackView`), named
    "encoder" and "decoder" in the monitor's names."""
    return [
        StackView.of(cfg, EncoderLayer, ("encoder", "layers"), "encoder"),
        StackView.of(options.decoder_config(cfg), DecoderLayer, ("decoder", "layers"), "decoder"),
    ]


def tied_projection(h: Array, table: Array) -> Array:
    """h [..., embed] x table [vocab, embed] -> float32 logits [..., vocab], as one 2-D matmul
    [tokens, embed] x [embed, vocab]: XLA's CPU backend then computes the table's gradient
    without transposing the whole [tokens, vocab] logits' gradient (that copy took 600 ms of a
    2.7 s `configs/mt.py:small` step on one core). The backward multiplies in h's dtype
    (`float32_einsum`): autodiff's two float32 products were the only float32 GEMMs of the bf16
    step lowered for a GPU."""
    lead, d = h.shape[:-1], h.shape[-1]
    out = float32_einsum("td,vd->tv", h.reshape(-1, d), table)
    return out.reshape(*lead, -1)
