"""CPU-scale settings of the translation studies (issue 35; docs/results/studies/PLAN_MT.md has the
plan, the measured cost per step and the commands). Not a recipe of its own: every arm of a study
sets its placement, optimiser, warm-up and depth on top of this.

  python -m ln_jax.experiments mt_warmup --out=studies/mt_warmup    # configs/study_mt.py:warmup
  python -m ln_jax.experiments mt_depth --out=studies/mt_depth      # configs/study_mt.py:depth

Variants: "warmup" (Xiong et al.'s Fig. 2 grid), "depth" (Liu et al.'s Table 2 depths, set per
run), "deep_encoder" (Wang et al.'s deep encoders, 6-layer decoder) and "gradients" (Fig. 3 at
initialisation), all at width 128 (FFN 512, 4 heads: the width the CPU budget paid for 6-6 to
18-18 stacks in issue 35, PLAN_MT.md); "gate" (issue 64: the healthy-baseline gate and the
studies on it, width 256, FFN 1,024, 2,000 steps, docs/results/studies/PLAN_MT2.md). All:
`configs/mt.py:small`'s data and model family (the offline `ln_jax_gettext/de-en` corpus, an
8,000-piece joint BPE, 2,048 tokens a batch, tied output, sinusoidal positions, Xavier init,
ReLU, label smoothing 0.1); Adam (0.9, 0.98), no weight
decay, no gradient clipping, the inverse square root after the warm-up; dropout 0.1; greedy
BLEU on the whole validation split (292 pairs) at every evaluation; the monitor every 100 steps
(per-layer gradient norms of both stacks, collapse, Admin's omega).
"""

from configs import mt

VARIANTS = ("warmup", "depth", "deep_encoder", "gradients", "gate")
# variant: (encoder layers, decoder layers, total_steps, eval_every); depths are set per run
SHAPES = {
    "warmup": (6, 6, 1200, 100),
    "depth": (6, 6, 600, 200),
    "deep_encoder": (18, 6, 600, 200),
    "gradients": (6, 6, 1, 1),
    "gate": (6, 6, 2000, 200),
}
# variant: (width, FFN); issue 64's gated protocol runs at `configs/mt.py:small`'s width 256
# (docs/results/studies/PLAN_MT2.md), the issue-35 studies at 128
WIDTHS = {"gate": (256, 1024)}


def get_config(variant: str | None = None):
    variant = variant or "warmup"
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; valid: {', '.join(VARIANTS)}.")
    enc, dec, steps, every = SHAPES[variant]
    c = mt.get_config("small")
    c.name = f"study_mt_{variant}"
    c.total_steps, c.eval_every = steps, every
    c.checkpoint_every = every  # a killed study resumes from the last evaluation
    c.eval_batches = None  # BLEU and NLL on the whole validation split
    c.log_every = 20
    c.nan_policy = "stop"  # a non-finite loss ends the run, recorded as diverged
    c.dropout_rng = "threefry"  # the studies' runs were recorded with it (then the CPU default)
    c.monitor.every = 100

    m = c.model
    width, ffn = WIDTHS.get(variant, (128, 512))
    m.num_layers, m.hidden_size, m.mlp_dim, m.num_heads = enc, width, ffn, 4
    m.hidden_dropout = m.attention_dropout = 0.1
    c.translation.decoder_layers = dec
    c.translation.label_smoothing = 0.1
    c.translation.eval_beam = 1

    o = c.optim
    o.optimizer, o.b1, o.b2, o.weight_decay = "adam", 0.9, 0.98, 0.0
    o.schedule, o.peak_lr, o.warmup_steps = "warmup_rsqrt", 1e-3, 0  # each arm sets its own
    o.clip_norm = 0.0
    return c
