"""Translation's own settings: the config section "translation" (`TrainConfig.options` of the
task "translation", `--config.translation.FIELD`).

The layer-stack fields (width, heads, FFN, placement, norm, dropout, dtype, init, the encoder's
depth `num_layers`) are the shared `ModelConfig`'s; what only an encoder-decoder has lives here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ln_jax.validate import check_choice, reject_unknown_keys

if TYPE_CHECKING:  # ln_jax.config.run imports JAX: configs/mt.py reads these without it
    from ln_jax.config.run import ModelConfig

# Token ids of ln_jax's translation vocabularies (`ln_jax.data` builds its sentencepiece models
# so): the defaults of `TranslationOptions`' pad_id / bos_id / eos_id. An imported model
# (HuggingFace Marian: pad = vocab - 1, eos = 0, decoder start = pad) sets its own.
SECTION = "translation"  # the config section of these fields (`Translation.options_section`)
PAD, UNK, BOS, EOS = 0, 1, 2, 3
POSITIONS = ("sinusoidal", "learned")
SKIP_PADDING = ("auto", "on", "off")


class Specials(NamedTuple):
    """The ids the model and the search treat specially: pad (masked, never generated), bos
    (the decoder's first input, never generated), eos (ends a hypothesis)."""

    pad: int = PAD
    bos: int = BOS
    eos: int = EOS


@dataclasses.dataclass(frozen=True)
class TranslationOptions:
    """An encoder-decoder's own fields.

    Attributes:
      decoder_layers: decoder depth (None = the encoder's, `model.num_layers`).
      positions: "sinusoidal" (fairseq, Marian) or "learned" (`model.max_position_embeddings`
        rows either way bound the lengths).
      scale_embeddings: multiply token embeddings by sqrt(d) (fairseq, Marian).
      tie_output: the output projection is the embedding table (shared vocabulary).
      label_smoothing: epsilon of the label-smoothed cross-entropy (the papers: 0.1).
      max_tokens: padded tokens per global batch, max(source, target) length x rows (the
        papers' "tokens per batch"; `ln_jax.data.translation.batches`; `data.max_tokens` until
        2026-12-06).
      max_source_length / max_target_length: tokens (with EOS) kept per side in training.
      eval_bleu: decode the evaluation batches (`eval_batches` of the validation split) and
        report their corpus BLEU at each evaluation.
      eval_beam: beam of that decoding (1 = greedy); eval_lenpen its length penalty.
      pad_id, bos_id, eos_id: the special ids (`Specials`); ln_jax's vocabularies use 0, 2, 3.
        bos_id may equal pad_id (Marian starts decoding with its pad token).
      output_bias: a bias [vocab] added to the output logits (Marian's final_logits_bias).
      init_from: start training from this model's parameters: a translation workdir of
        `train.py` (its latest checkpoint) or "hf:PATH", a local HuggingFace Marian folder
        (`ln_jax.models.translation.convert`; use `--config=configs/mt.py:hf:PATH`, which
        takes the model's shape, vocabulary and ids from it). Fresh runs only.
      skip_padding: "on": the feed-forward layers and the output projection with its loss run
        on the real tokens only, in chunks that are skipped once they hold only padding
        (`ln_jax.nn.tokens`; the same values to float round-off); "off": on every position;
        "auto" (resolved when the config is built, recorded in config.json): "on" on a CPU,
        "off" on a GPU or TPU (a while loop there reads its predicate on the host; unmeasured).
    """

    decoder_layers: int | None = None
    positions: str = "sinusoidal"
    scale_embeddings: bool = True
    tie_output: bool = True
    label_smoothing: float = 0.1
    max_tokens: int = 4096
    max_source_length: int = 64
    max_target_length: int = 64
    eval_bleu: bool = True
    eval_beam: int = 1
    eval_lenpen: float = 1.0
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    output_bias: bool = False
    init_from: str | None = None
    skip_padding: str = "auto"
    # Fields a resumed run may change without asking (`ln_jax.task.free_fields`): computing
    # the padded positions or not gives the real tokens the same values (test_skip_padding.py).
    FREE_ON_RESUME: ClassVar[tuple[str, ...]] = ("skip_padding",)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, cfg: ModelConfig) -> TranslationOptions:
        """The section's fields from a mapping (a misspelt key names the valid ones),
        `resolved` for the model `cfg`."""
        values = dict(values or {})
        reject_unknown_keys(SECTION, values, [f.name for f in dataclasses.fields(cls)])
        return cls(**values).resolved(cfg)

    def resolved(self, cfg: ModelConfig) -> TranslationOptions:
        """These options checked against the model `cfg`, the decoder depth filled from the
        model's and an "auto" `skip_padding` resolved for the platform."""
        out = self
        if out.decoder_layers is None:
            out = dataclasses.replace(out, decoder_layers=cfg.num_layers)
        if out.skip_padding == "auto":
            from ln_jax.config.run import platform

            out = dataclasses.replace(out, skip_padding=auto_skip_padding(platform()))
        out.check(cfg)
        return out

    @property
    def specials(self) -> Specials:
        return Specials(self.pad_id, self.bos_id, self.eos_id)

    def check(self, cfg: ModelConfig) -> None:
        check_choice(f"{SECTION}.positions", self.positions, POSITIONS)
        check_choice(f"{SECTION}.skip_padding", self.skip_padding, SKIP_PADDING)
        for name, value in zip(("pad_id", "bos_id", "eos_id"), self.specials, strict=True):
            if not 0 <= value < cfg.vocab_size:
                raise ValueError(
                    f"{SECTION}.{name}={value} is not an id of the {cfg.vocab_size}-token "
                    "vocabulary (model.vocab_size)."
                )
        if self.eos_id in (self.pad_id, self.bos_id):
            raise ValueError(
                f"{SECTION}.eos_id={self.eos_id} must differ from pad_id and bos_id "
                f"({self.pad_id}, {self.bos_id})."
            )
        if self.decoder_layers <= 0:
            raise ValueError(f"{SECTION}.decoder_layers={self.decoder_layers} must be > 0.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"{SECTION}.label_smoothing={self.label_smoothing}: use [0, 1).")
        if self.max_tokens < 1:
            raise ValueError(
                f"{SECTION}.max_tokens={self.max_tokens} must be >= 1: set "
                f"--config.{SECTION}.max_tokens."
            )
        longest = max(self.max_source_length, self.max_target_length + 1)
        if longest > cfg.max_position_embeddings:
            raise ValueError(
                f"{SECTION}.max_source_length/max_target_length ({longest} positions with "
                f"BOS) exceed model.max_position_embeddings={cfg.max_position_embeddings}; "
                "raise it or shorten them."
            )
        if cfg.scan_layers and len(set(cfg.layer_placements)) > 1:
            raise ValueError("scan_layers needs one placement for every layer.")

    def decoder_config(self, cfg: ModelConfig) -> ModelConfig:
        """The decoder stack's ModelConfig: the model's, `decoder_layers` deep, no DLCL (Wang
        et al. combine the encoder's layers only); an encoder scanned as straight-line code
        (scan_unroll >= its depth) has a decoder scanned so too."""
        placement = cfg.placement
        if isinstance(placement, tuple) or "*" in str(placement) or "," in str(placement):
            placement = cfg.layer_placements[-1]  # a per-layer list describes the encoder
        unroll = cfg.scan_unroll
        if cfg.scan_layers and unroll >= cfg.num_layers:
            unroll = max(unroll, self.decoder_layers)
        return cfg.replace(
            num_layers=self.decoder_layers, dlcl=False, placement=placement, scan_unroll=unroll
        )


def auto_skip_padding(on: str) -> str:
    """skip_padding="auto": "on" on a CPU (the `small` train step against HuggingFace Marian,
    docs/translation.md), "off" on a GPU or TPU."""
    return "on" if on == "cpu" else "off"
