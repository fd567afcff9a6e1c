"""Machine translation: the encoder-decoder on the placement table (task "translation").

  python train.py --config=configs/mt.py              # iwslt: fairseq's transformer_iwslt_de_en
  python train.py --config=configs/mt.py:small        # minutes on a CPU
  python train.py --config=configs/mt.py:tiny         # about a minute on a CPU

Variants: iwslt (6-6, 512/1024, 4 heads, dropout 0.3, weight decay 1e-4, Adam (0.9, 0.98), 5e-4,
4,000-step warm-up then inverse sqrt, 4,096 tokens: Xiong et al.'s IWSLT14 setting), wmt_base
(6-6, 512/2048, 8 heads), wmt_deep (Liu et al.'s 18-18 with Admin, RAdam, 1e-3, 8,000-step
warm-up), wang_deep (Wang et al.'s 30-6 Pre-LN with DLCL, beta2 0.997, 16,000-step warm-up to
2e-3), small and tiny; hf:PATH fine-tunes a local HuggingFace Marian folder (e.g. a downloaded
opus-mt-de-en): its shape, special ids, vocabulary (vocab.json + source/target.spm) and
parameters, Adam (0.9, 0.98) at 5e-5 with a short warm-up. Post-LN unless the variant says
otherwise; `--config.model.placement` changes it. Every variant reads the offline corpus
`ln_jax_gettext/de-en` (German -> English, built from the gettext catalogues installed on the
machine) unless `--config.data.dataset` names another (`wmt14_translate/de-en`,
`paralleltext:PREFIX`, ...).
"""

from __future__ import annotations

import dataclasses

from ml_collections.config_dict import placeholder

from configs import common
from ln_jax.models.translation.options import TranslationOptions

HF_VARIANT = "hf:"  # configs/mt.py:hf:PATH fine-tunes a HuggingFace Marian folder
VARIANTS = ("iwslt", "wmt_base", "wmt_deep", "wang_deep", "small", "tiny")

# variant: (encoder, decoder, width, ffn, heads, dropout, max_tokens, vocab, steps, eval_every)
SHAPES = {
    "iwslt": (6, 6, 512, 1024, 4, 0.3, 4096, 10_000, 50_000, 2_000),
    "wmt_base": (6, 6, 512, 2048, 8, 0.1, 8192, 32_000, 100_000, 5_000),
    "wmt_deep": (18, 18, 512, 2048, 8, 0.1, 8192, 32_000, 100_000, 5_000),
    "wang_deep": (30, 6, 512, 2048, 8, 0.1, 8192, 32_000, 50_000, 5_000),
    "small": (3, 3, 256, 1024, 4, 0.1, 2048, 8_000, 1_200, 300),
    "tiny": (2, 2, 64, 256, 4, 0.1, 1024, 2_000, 300, 100),
}


def get_config(variant: str | None = None):
    variant = variant or "iwslt"
    if variant.startswith(HF_VARIANT):
        return _pretrained(variant[len(HF_VARIANT) :])
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown config variant {variant!r}; valid: {', '.join(VARIANTS)}, or "
            "hf:PATH (a HuggingFace Marian folder)."
        )
    enc, dec, d, ffn, heads, drop, tokens, vocab, steps, every = SHAPES[variant]
    c = common.base_config()
    c.name = f"mt_{variant}"
    c.task = "translation"
    del c.bert  # BERT's own section
    # translation's own fields (ln_jax/models/translation/options.py), every one overridable
    c.translation = {
        **dataclasses.asdict(TranslationOptions()),
        "decoder_layers": dec,
        "max_tokens": tokens,  # padded tokens per batch (the papers' tokens per batch)
    }
    c.translation.init_from = placeholder(str)  # a translation workdir or hf:PATH
    c.total_steps, c.eval_every, c.checkpoint_every = steps, every, every
    c.log_every = 10 if variant in ("small", "tiny") else 100
    c.eval_batches = None  # the whole validation split (loss and BLEU)
    c.grad_accum_steps = 1

    m = c.model
    m.size = "custom"
    m.num_layers, m.hidden_size, m.mlp_dim, m.num_heads = enc, d, ffn, heads
    m.placement = "post"  # fairseq's default (normalize_before=False)
    m.init = "xavier"  # Xavier projections, N(0, 1/d) embeddings; fairseq: init="fairseq"
    m.activation = "relu"
    m.hidden_dropout = drop
    m.attention_dropout = 0.1 if variant == "iwslt" else drop
    m.embedding_layernorm = False
    m.layer_norm_eps = 1e-5
    m.max_position_embeddings = 256
    m.vocab_multiple = 8

    c.data.dataset = "ln_jax_gettext/de-en"
    c.data.vocab_size = vocab
    c.data.tokenizer_type = "bpe"

    o = c.optim
    o.optimizer, o.b1, o.b2, o.eps = "adamw", 0.9, 0.98, 1e-8
    o.schedule, o.peak_lr, o.warmup_steps = "warmup_rsqrt", 5e-4, 4_000
    o.weight_decay = 1e-4 if variant == "iwslt" else 0.0
    o.clip_norm = 0.0  # fairseq's default: no clipping (the papers report none)
    _recipe(c, variant)
    return c


def _recipe(c, variant: str) -> None:
    """The papers' optimiser settings of each variant, warm-ups scaled to short CPU runs."""
    o = c.optim
    if variant == "wmt_base":
        o.peak_lr = 7e-4
    elif variant == "wmt_deep":  # Liu et al. 2020: Admin, RAdam, 1e-3, 8k warm-up
        c.model.placement = "admin"
        o.optimizer, o.peak_lr, o.warmup_steps = "radam", 1e-3, 8_000
    elif variant == "wang_deep":  # Wang et al. 2019: deep Pre-LN encoder with DLCL
        c.model.placement, c.model.dlcl = "pre", True
        o.b2, o.peak_lr, o.warmup_steps = 0.997, 2e-3, 16_000
    elif variant in ("small", "tiny"):
        o.peak_lr = 1e-3
        # 10% of the run: of the total_steps given on the command line too
        o.warmup_steps = common.from_total_steps(c, lambda steps: max(1, steps // 10))


def _pretrained(path: str):
    """`hf:PATH`: fine-tune a HuggingFace Marian folder (shape, ids, vocabulary, parameters
    from it) on `data.dataset`, starting from `small`'s schedule at a fine-tuning rate."""
    from ln_jax.models.translation import convert

    hf = convert.read_hf_config(path)
    model, options = convert.marian_config(hf)
    c = get_config("small")
    c.name = "mt_hf_" + path.rstrip("/").split("/")[-1]
    for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
                  "activation", "hidden_dropout", "attention_dropout", "max_position_embeddings",
                  "vocab_multiple", "layer_norm_eps", "placement"):  # fmt: skip
        setattr(c.model, field, getattr(model, field))
    # the model's fields; the batch budget stays the preset's
    c.translation.update({k: v for k, v in options.items() if k not in ("init_from", "max_tokens")})
    c.translation.init_from = convert.HF_PREFIX + path
    c.data.tokenizer_model = convert.HF_PREFIX + path
    c.data.vocab_size = model.vocab_size
    c.optim.peak_lr, c.optim.warmup_steps = 5e-5, 100
    return c
