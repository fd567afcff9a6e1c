"""Pre-LN BERT, trained WITHOUT learning-rate warm-up (Xiong et al. 2020, section 4.1).

Adam with a linear decay from 3e-4 at step 0, as Xiong et al. train Pre-LN BERT.

  python train.py --config=configs/bert_preln.py          # BERT-base (GPU/TPU)
  python train.py --config=configs/bert_preln.py:mini     # BERT-mini, minutes on a CPU
  python train.py --config=configs/bert_preln.py:tiny     # about a minute on a CPU
"""

from configs import common


def get_config(variant: str | None = None):
    variant = variant or "base"
    c = common.base_config()
    c.name = f"bert_preln_{variant}"
    c.model.placement = "pre"
    c.optim.schedule = "linear_decay"  # from peak_lr at step 0 down to end_lr
    c.optim.peak_lr = 3e-4
    c.optim.warmup_steps = 0
    return common.apply_variant(c, variant)
