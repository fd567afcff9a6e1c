"""CPU-scale settings of the studies in `ln_jax.experiments` (not a recipe of their own: every
arm of a study sets its placement, optimizer and schedule on top of this).

  python -m ln_jax.experiments depth --out=results/depth     # uses configs/study.py:depth
  python -m ln_jax.experiments warmup --out=results/warmup   # uses configs/study.py:warmup

Variants: "depth" (Liu et al.'s 6/12/18-layer comparison; `num_layers` set per run, 128 wide)
and "warmup" (Xiong et al.'s warm-up grid on BERT-mini: 4 layers, 256 wide). Both are sized so
that the good arms leave the unigram plateau within a few hundred steps on a 2-core CPU: Xavier
initialisation (the setting of Xiong et al.'s theory; BERT's sigma = 0.02 leaves the residual
branches nearly silent at this width), a 2000-piece vocabulary, sequences of 64, batch 32, no
dropout.
"""

from configs import common

VARIANTS = ("depth", "warmup")


def get_config(variant: str | None = None):
    variant = variant or "depth"
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; valid: {', '.join(VARIANTS)}.")
    c = common.apply_variant(common.base_config(), "tiny")
    c.name = f"study_{variant}"
    c.total_steps = 600  # optimizer updates per run
    c.eval_every = 50  # validation curve resolution (steps to target are interpolated)
    c.eval_batches = 8  # 8 x 32 validation examples per evaluation
    c.checkpoint_every = 100  # a killed study resumes mid-run from here
    c.log_every = 10
    c.nan_policy = "stop"  # a non-finite loss ends the run, recorded as diverged

    c.model.size = "tiny"
    c.model.num_layers = 6  # the depth study sets 6/12/18 per run
    c.model.hidden_size = 128
    c.model.num_heads = 4
    c.model.mlp_dim = 512
    c.model.init = "xavier"  # sigma ~ 1/sqrt(d), the papers' theoretical setting
    c.model.vocab_multiple = 1  # as the recorded studies ran (a padded table draws other inits)
    c.model.hidden_dropout = 0.0  # short runs: no regularisation needed, less noise
    c.model.attention_dropout = 0.0
    c.model.max_position_embeddings = 64

    c.data.vocab_size = 2000  # sentencepiece unigram pieces trained on the embedded corpus
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10  # 15% of 64
    c.data.global_batch_size = 32

    c.optim.optimizer = "adam"
    c.optim.weight_decay = 0.0
    c.optim.peak_lr = 1e-3  # each arm sets its own
    c.optim.schedule = "linear_decay"
    c.optim.warmup_steps = 0
    if variant == "warmup":  # BERT-mini's shape
        c.model.size, c.model.num_layers, c.model.hidden_size = "mini", 4, 256
        c.model.mlp_dim = 1024
    return c
