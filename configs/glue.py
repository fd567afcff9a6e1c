"""Fine-tuning on GLUE (or the offline pair task) from a pretraining workdir or a HF directory.

  python finetune.py --config=configs/glue.py:offline --config.init_from=workdirs/bert_preln_tiny
  python finetune.py --config=configs/glue.py:mrpc --config.init_from=WORKDIR --config.init_step=500
  python finetune.py --config=configs/glue.py:rte --config.init_from=hf:/path/to/bert-base-uncased

Variants are tasks: offline (default: sentence pairs in MRPC's format built from the embedded
corpus, no download), mrpc, rte, sst2, cola, qnli, stsb, qqp, mnli (TFDS `glue/<task>`: prepare it
once, the error gives the command). The recipe is BERT's: [CLS] pooler + classifier, AdamW,
linear warm-up over 10% of the steps then linear decay, evaluation on the dev split after every
epoch, every (learning rate, batch size, epochs) of the grid x every seed.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

VARIANTS = ("offline", "mrpc", "rte", "sst2", "cola", "qnli", "stsb", "qqp", "mnli")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    task = variant or "offline"
    if task not in VARIANTS:
        raise ValueError(f"unknown config variant {task!r}; valid: {', '.join(VARIANTS)}.")
    c = ml_collections.ConfigDict()
    c.name = f"glue_{task}"  # run name; the default workdir is workdirs/<name>_<init>
    c.task = task  # offline | mrpc | rte | sst2 | cola | qnli | stsb | qqp | mnli
    # a pretraining workdir of train.py, or hf:PATH (a local HuggingFace BERT directory)
    c.init_from = placeholder(str)
    c.init_step = placeholder(int)  # the workdir's checkpoint step (None = its latest)
    c.seeds = (0, 1, 2, 3, 4)  # one run per seed: median and spread are reported (HF: 5 runs)
    c.learning_rates = (2e-5,)  # peak learning rates of the grid (BERT: 2e-5 .. 5e-5)
    c.batch_sizes = (32,)  # batch sizes of the grid (BERT: 16, 32)
    c.epochs = (3,)  # epochs of the grid (BERT: 2 .. 4)
    c.warmup_fraction = 0.1  # linear warm-up over this fraction of the steps, then linear decay
    c.max_seq_length = 128  # tokens of [CLS] A [SEP] B [SEP]; longer pairs truncated
    c.eval_batch_size = 64  # dev batch (rounded up to a multiple of the data-parallel devices)
    c.hidden_dropout = placeholder(float)  # encoder dropout (None = the checkpoint's)
    c.attention_dropout = placeholder(float)  # attention dropout (None = the checkpoint's)
    c.classifier_dropout = placeholder(float)  # dropout on the pooled [CLS] (None = hidden)
    c.log_every = 10  # train metrics to metrics.jsonl every N steps (and at each epoch's end)
    c.nan_policy = "stop"  # non-finite loss/gradient: "stop" or "skip" (drop the update)
    c.dropout_rng = "auto"  # dropout PRNG: threefry, hash, rbg, unsafe_rbg, auto (hash)

    # the optimizer (OptimConfig, as train.py's); the grid sets its peak_lr (learning_rates),
    # warmup_steps (warmup_fraction) and total_steps (epochs) per run
    c.optim = ml_collections.ConfigDict()
    c.optim.optimizer = "adamw"  # adamw | adam | radam | sgd (ln_jax.train.optim)
    c.optim.schedule = "warmup_linear_decay"  # after the warm-up: linear decay to end_lr
    c.optim.end_lr = 0.0  # the learning rate at the last step
    c.optim.decay_step = 0  # decay_rsqrt's step of decay
    c.optim.decay_factor = 1.0  # decay_rsqrt's factor at decay_step
    c.optim.b1 = 0.9  # Adam beta1
    c.optim.b2 = 0.999  # Adam beta2
    c.optim.eps = 1e-6  # Adam epsilon
    c.optim.weight_decay = 0.01  # decoupled (adamw), on matrices and embeddings only
    c.optim.clip_norm = 1.0  # global gradient-norm clipping (0 = off)
    c.optim.momentum = 0.9  # SGD momentum

    c.data = ml_collections.ConfigDict()
    c.data.data_dir = placeholder(str)  # TFDS data dir (None = $TFDS_DATA_DIR or default)
    c.data.download = False  # let TFDS download and prepare glue/<task> from this process
    c.data.max_train_examples = placeholder(int)  # use the first N training examples (None = all)
    c.data.max_eval_examples = placeholder(int)  # use the first N dev examples (None = all)

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # data-parallel axis (-1 = all remaining devices)
    c.mesh.fsdp = 1  # parameter/optimizer-state sharding axis
    c.mesh.tensor = 1  # tensor-parallel axis (heads, mlp, vocab)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.keep = 1  # checkpoints kept per run (one is saved after every epoch)
    c.checkpoint.async_save = True  # save in the background while training continues
    c.checkpoint.fallback = False  # a corrupt latest checkpoint: try the previous ones
    if task == "offline":  # the CPU-scale default: a small model learns it in minutes
        c.learning_rates, c.batch_sizes, c.epochs, c.seeds = (5e-4,), (32,), (3,), (0, 1, 2)
        c.max_seq_length = 64
    return c
