"""CPU-scale settings of the studies in `ln_jax.experiments` (not a recipe of their own: every
arm of a study sets its placement, optimizer and schedule on top of this;
docs/results/studies/PLAN.md has the plan and the commands).

  python -m ln_jax.experiments depth --out=results/depth     # uses configs/study.py:depth
  python -m ln_jax.experiments warmup --out=results/warmup   # uses configs/study.py:warmup

Variants: "depth" (Liu et al.'s 6/12/18-layer comparison; `num_layers` set per run, 128 wide)
and "warmup" (Xiong et al.'s warm-up grid on the depth study's 6-layer, 128-wide encoder: BERT-
mini's 4 x 256 costs about twice the CPU time per step, which the 12-core-hour budget of
PLAN.md cannot pay; `--config.model.size=mini --config.model.num_layers=4
--config.model.hidden_size=256 --config.model.mlp_dim=1024` restores it). Both read the
`ln_jax_sitedocs` corpus (the installed packages' docstrings, 20+ MB; `--config.data.dataset=
ln_jax_pydocs` for the small embedded one), a 2000-piece vocabulary, sequences of 64, batch 32,
no dropout; BERT's truncated normal scaled to the width, sigma = 0.02 * sqrt(768 / d) (Xavier
collapses Post-LN's token representations at d = 128, BERT's fixed 0.02 leaves the branches
nearly silent; PLAN.md has the comparison at initialisation); Adam (0.9, 0.98); a schedule
that does not depend on the run's length (linear warm-up, then constant), so steps to a target
mean the same whatever total_steps is. The depth study logs the monitor's collapse measure.
"""

from configs import common

VARIANTS = ("depth", "warmup")


def get_config(variant: str | None = None):
    variant = variant or "depth"
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; valid: {', '.join(VARIANTS)}.")
    c = common.apply_variant(common.base_config(), "tiny")
    c.name = f"study_{variant}"
    c.total_steps = 900 if variant == "depth" else 1100  # optimizer updates per run (PLAN.md)
    # validation curve resolution (steps to target are interpolated between evaluations)
    c.eval_every = 50 if variant == "depth" else 25
    c.eval_batches = 8  # 8 x 32 validation examples per evaluation
    c.checkpoint_every = 250  # a killed study resumes mid-run from here
    c.log_every = 10
    c.nan_policy = "stop"  # a non-finite loss ends the run, recorded as diverged
    c.dropout_rng = "threefry"  # the studies' runs were recorded with it (then the CPU default)
    # the collapse measure (monitor "collapse/output", step 1 = at initialisation) every N steps
    c.monitor.every = 100 if variant == "depth" else 0

    c.model.size = "tiny"
    c.model.num_layers = 6  # the depth study sets 6/12/18 per run
    c.model.hidden_size = 128
    c.model.num_heads = 4
    c.model.mlp_dim = 512
    c.model.init = "bert_scaled"  # sigma = 0.02 * sqrt(768 / d): 0.049 at d = 128
    c.model.vocab_multiple = 1  # as the recorded studies ran (a padded table draws other inits)
    c.model.hidden_dropout = 0.0  # short runs: no regularisation needed, less noise
    c.model.attention_dropout = 0.0
    c.model.max_position_embeddings = 64

    c.data.dataset = "ln_jax_sitedocs"  # 20+ MB of installed docstrings (ln_jax/data/sitedocs)
    c.data.vocab_size = 2000  # sentencepiece unigram pieces trained on the corpus
    c.data.max_seq_length = 64
    c.bert.max_predictions_per_seq = 10  # 15% of 64
    c.data.global_batch_size = 32

    c.optim.optimizer = "adam"
    c.optim.weight_decay = 0.0
    c.optim.b2 = 0.98  # Xiong's and Liu's beta2; every arm sets it too
    c.optim.peak_lr = 5e-4  # each arm sets its own
    c.optim.schedule = "constant"  # linear warm-up, then constant (each arm sets its warm-up)
    c.optim.warmup_steps = 0
    return c
