"""Post-LN BERT (the original), with learning-rate warm-up (Devlin et al.).

10k steps of linear warm-up to 1e-4, then linear decay; the small variants keep the warm-up at
1% of the run, as 10k is of BERT's 1M steps.

  python train.py --config=configs/bert_postln.py         # BERT-base (GPU/TPU)
  python train.py --config=configs/bert_postln.py:mini    # BERT-mini, minutes on a CPU
  python train.py --config=configs/bert_postln.py:tiny    # about a minute on a CPU
"""

from configs import common


def get_config(variant: str | None = None):
    variant = variant or "base"
    c = common.base_config()
    c.name = f"bert_postln_{variant}"
    c.model.placement = "post"
    c.optim.schedule = "warmup_linear_decay"
    c.optim.peak_lr = 1e-4
    c = common.apply_variant(c, variant)
    common.recipe_warmup(c, 0.01)
    return c
