"""The shared BERT pretraining config; `bert_preln.py` and `bert_postln.py` set the recipe.

Variants (after a colon on the command line): "base" (default: the papers' BERT-base setting),
"mini" (BERT-mini, minutes on a laptop CPU) and "tiny" (about a minute). Every variant reads the
embedded offline corpus unless `--config.data.dataset=...` names another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

VARIANTS = ("base", "mini", "tiny")

# Where base_config() departs from the typed configs' defaults (ln_jax/config/run.py and its
# sections), which are the one source of every other value: the BERT-base pretraining recipe
# (Devlin et al. phase 1 at batch 256, 10k warm-up) and its cadences. A test compares them.
RECIPE = {
    "name": "bert",
    "total_steps": 1_000_000,
    "eval_every": 10_000,
    "checkpoint_every": 10_000,
    "log_every": 100,
    "eval_batches": 50,
    "grad_accum_steps": 0,  # auto: the fewest micro-batches that fit (the dataclass: 1)
    "model.size": "base",
    "model.vocab_multiple": 128,  # GPU/TPU tiles (the library's modules: unpadded, 1)
    "model.scan_layers": "auto",  # stacked on a GPU (the library's modules: a list, False)
    "model.scan_unroll": "auto",  # straight-line when stacked (the library's modules: 1)
    "data.global_batch_size": 256,
    "optim.warmup_steps": 10_000,
}


def base_config() -> ml_collections.ConfigDict:
    """BERT-base pretraining (Devlin et al. phase 1) with every field the trainer reads."""
    c = ml_collections.ConfigDict()
    c.name = "bert"  # run name; the default workdir is workdirs/<name>
    # model family and objective (ln_jax/task.py): bert_pretraining, or "module:Class"
    # of a Task
    c.task = "bert_pretraining"
    # a task's own fields are its own section, declared by its config (BERT's c.bert below,
    # configs/mt.py's c.translation)
    c.seed = 0  # parameter initialisation and dropout
    c.total_steps = 1_000_000  # optimizer updates (BERT: 1M at batch 256)
    c.eval_every = 10_000  # evaluate on the validation split every N steps (0 = at the end)
    c.checkpoint_every = 10_000  # save every N steps (0 = only at the end / on SIGTERM)
    c.log_every = 100  # progress line, metrics.jsonl and TensorBoard every N steps
    c.steps_per_epoch = 0  # N > 0: eval records carry epoch = step // N (0 = no epochs counted)
    c.eval_batches = 50  # validation batches per evaluation (None = one pass)
    c.grad_accum_steps = 0  # micro-batches per update; 0 = auto: the fewest that fit in memory
    # dropout PRNG: threefry (portable bits), hash (portable, fused into its consumer), rbg,
    # unsafe_rbg, or auto (hash; on a TPU rbg before 2026-11-28); config.json records which
    c.dropout_rng = "auto"
    c.nan_policy = "stop"  # non-finite loss/gradient: "stop" (keep last checkpoint) or "skip"
    # JAX's persistent compilation cache: auto ($LN_JAX_CACHE_DIR/jax_compilation on a GPU/TPU,
    # off on a CPU), off, or a folder; a resumed or repeated run reads its compiled programs
    c.compilation_cache = "auto"

    c.model = ml_collections.ConfigDict()
    c.model.size = "base"  # tiny | mini | base | large: sets the four shape fields below
    # LayerNorm placement: post | pre | admin | deepnorm | deepnorm_alpha | deepnorm_beta |
    # sandwich | rezero | olmo2 | lns | dyt, a per-layer list ("post*3,pre*9") or mixln; see the
    # table in ln_jax/nn/placements.py
    c.model.placement = "pre"
    c.model.norm = "layernorm"  # the encoder's normaliser: layernorm | rmsnorm
    # placement admin: "profile" (omega from a forward pass before step 0, kept in
    # WORKDIR/admin_profile.json) | "closed_form" (sqrt((N+1)/ln(N+1) - 1), no profiling)
    c.model.admin_omega = "profile"
    c.model.qk_norm = False  # normalise queries and keys over head_dim (model.norm), any placement
    c.model.dlcl = False  # Wang et al.'s dynamic linear combination of layers (Pre-LN, no scan)
    c.model.num_layers = placeholder(int)  # None = from size
    c.model.hidden_size = placeholder(int)  # None = from size
    c.model.num_heads = placeholder(int)  # None = from size
    c.model.mlp_dim = placeholder(int)  # None = from size
    c.model.vocab_size = placeholder(int)  # None = data.vocab_size
    c.model.vocab_multiple = 128  # embedding/decoder rows padded to this (GPU/TPU tiles)
    c.model.max_position_embeddings = 512  # learned positions
    c.model.activation = "gelu"  # gelu (BERT) | relu (the papers' theory) | gelu_tanh
    # bert (truncated normal, init_std) | bert_scaled (std init_std * sqrt(768 / hidden_size),
    # BERT-base's scale relative to width) | xavier (Xiong et al. 3.3) | fairseq (xavier, q/k/v
    # as fairseq's packed [3d, d] projection: Var 1/(2d))
    c.model.init = "bert"
    c.model.init_std = 0.02  # std of the "bert" initialiser (at width 768 for "bert_scaled")
    c.model.layer_norm_eps = 1e-12  # epsilon in every LayerNorm (BERT: 1e-12)
    c.model.embedding_layernorm = True  # LayerNorm after the summed embeddings (BERT has one)
    c.model.hidden_dropout = 0.1  # dropout on embeddings and residual branches
    c.model.attention_dropout = 0.1  # dropout on attention probabilities
    # compute dtype: float32 | bfloat16 | float16 | auto (bfloat16 on GPU/TPU, float32 on CPU);
    # parameters stay float32; config.json records the resolved one
    c.model.dtype = "auto"
    c.model.residual_float32 = False  # with bf16: keep the residual sum in float32
    # xla | cudnn (cuDNN's fused attention: NVIDIA GPU, bf16/fp16, attention_dropout=0) | auto
    # (cudnn on a GPU where it can run the config, else xla)
    c.model.attention_impl = "auto"
    # xla (XLA picks memory layouts) | row_major (the residual stream pinned row-major) | auto
    # (row_major on a GPU, measured faster there, docs/results/gpu/journal.md; xla elsewhere)
    c.model.activation_layout = "auto"
    c.model.remat = "none"  # none | full | dots: recompute activations in the backward pass
    # the layers' parameters stacked [num_layers, ...] under lax.scan (True) or a list (False);
    # auto: stacked on a GPU (measured faster on an H200, docs/gpu.md) unless a per-layer
    # placement list or dlcl needs a list; a list on a CPU or TPU. config.json records the
    # choice, and a workdir resumes with the layout its run recorded
    c.model.scan_layers = FieldReference("auto", field_type=object)  # True | False | auto
    # with scan_layers: layers per scan iteration; num_layers = straight-line code on stacked
    # parameters (fewer optimizer kernels on a GPU); 1 = a loop (fastest compile); auto:
    # num_layers when stacked, else 1
    c.model.scan_unroll = FieldReference("auto", field_type=object)  # N | auto

    # BERT's own fields (ln_jax/models/bert/options.py; model.* and data.* until 2026-12-06);
    # another family's config replaces this section with its own (configs/mt.py: c.translation)
    c.bert = ml_collections.ConfigDict()
    c.bert.max_predictions_per_seq = 20  # masked positions per example (20 at 128)
    c.bert.masked_lm_prob = 0.15  # fraction of tokens predicted
    c.bert.short_seq_prob = 0.1  # chance of a shorter random target length
    c.bert.whole_word_masking = False  # mask all pieces of a word together
    c.bert.nsp = True  # sentence pairs with next-sentence labels (False: packed sentences)
    c.bert.type_vocab_size = 2  # segment ids (sentence A / B)
    c.bert.nsp_head = True  # build the NSP head (its loss counts only when bert.nsp is True)

    c.optim = ml_collections.ConfigDict()
    c.optim.optimizer = "adamw"  # adam | adamw | radam | sgd
    c.optim.peak_lr = 1e-4  # the schedule's maximum
    c.optim.schedule = "warmup_linear_decay"  # or warmup_cosine, ...: optim.make_schedule
    c.optim.warmup_steps = 10_000  # linear warm-up length (0 = none)
    c.optim.total_steps = placeholder(int)  # None = total_steps
    c.optim.end_lr = 0.0  # learning rate at the end of a linear decay
    c.optim.decay_step = 0  # decay_rsqrt: the step of the decay
    c.optim.decay_factor = 1.0  # decay_rsqrt: the factor applied at decay_step
    c.optim.b1 = 0.9  # Adam beta1
    c.optim.b2 = 0.999  # Adam beta2 (Xiong et al. use 0.98 for translation)
    c.optim.eps = 1e-6  # Adam epsilon (BERT: 1e-6)
    c.optim.weight_decay = 0.01  # decoupled, on matrices and embeddings only (adamw)
    c.optim.clip_norm = 1.0  # global gradient-norm clipping (0 = off)
    c.optim.momentum = 0.9  # sgd only

    c.data = ml_collections.ConfigDict()
    c.data.dataset = "ln_jax_pydocs"  # embedded corpus; or e.g. "wikipedia/20230601.en"
    c.data.data_dir = placeholder(str)  # TFDS data dir (None = $TFDS_DATA_DIR or default)
    # token/pair-index caches of a gs:// data_dir, per host (None = $LN_JAX_CACHE_DIR or
    # ~/.cache/ln_jax); a local data_dir keeps them beside the data
    c.data.cache_dir = placeholder(str)
    c.data.train_split = "train"  # TFDS split of the training documents
    c.data.eval_split = "validation"  # TFDS split of the held-out documents
    c.data.text_feature = "text"  # text feature of external TFDS datasets
    c.data.download = False  # let TFDS download and prepare a named dataset
    # sentencepiece vocabulary; None = 8000 on the embedded corpus (it supports ~10k pieces),
    # else 30522 (BERT's WordPiece size)
    c.data.vocab_size = placeholder(int)
    c.data.tokenizer_model = placeholder(str)  # a user .model file (None = train and cache)
    c.data.tokenizer_type = "unigram"  # unigram | bpe
    c.data.tokenizer_max_documents = 200_000  # documents (evenly strided) the tokenizer sees
    c.data.max_seq_length = 128  # tokens per example (BERT phase 1: 128, phase 2: 512)
    c.data.global_batch_size = 256  # examples per update over all devices and hosts
    c.data.eval_batch_size = placeholder(int)  # None = global_batch_size
    # eval batches when `eval_batches` (above) is None; None = one pass over the eval split
    c.data.eval_num_batches = placeholder(int)
    c.data.seed = 0  # pairs, shuffle and masks
    c.data.worker_count = 0  # data worker processes per host (0 = in the training process)
    # training batches put on the devices ahead of the step (None = 2 on GPU/TPU, 0 on CPU)
    c.data.device_prefetch = placeholder(int)
    c.data.prepare_timeout_s = 3600.0  # other processes wait this long for process 0's pair index

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # data-parallel axis (-1 = all remaining devices)
    c.mesh.fsdp = 1  # parameter/optimizer-state sharding axis
    c.mesh.tensor = 1  # tensor-parallel axis (heads, mlp, vocab)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.keep = 3  # keep the last K checkpoints
    c.checkpoint.async_save = True  # save in the background while training continues
    c.checkpoint.fallback = False  # a corrupt latest checkpoint: try the previous ones

    # per-layer measurements during training (ln_jax/train/monitor.py) and early warnings
    c.monitor = ml_collections.ConfigDict()
    c.monitor.every = placeholder(int)  # measure every N steps; None = log_every; 0 = off
    c.monitor.window = 20  # earlier logged values the spike rules compare with
    # a warning: a WARNING in train.log and on the terminal, split "warning/<rule>"; a note (a
    # state healthy runs pass through): train.log only, split "note/<rule>"
    c.monitor.loss_spike = 6.0  # warn: loss > window median + this many robust stds (0 = off)
    # a gradient norm > this x its window median: a warning at a new high of the window, a
    # note below the high (0 = off)
    c.monitor.grad_jump = 10.0
    c.monitor.collapse = 0.9  # a layer's collapse >= this: a note; a warning if it persists (below)
    c.monitor.collapse_steps = 200  # ... for this many steps
    c.monitor.collapse_loss_drop = 0.05  # ... while the loss fell by less than this fraction
    c.monitor.keep_checkpoint = True  # on a warning, never delete the checkpoint before it
    return c


def apply_variant(c: ml_collections.ConfigDict, variant: str) -> ml_collections.ConfigDict:
    """Shrinks the base config for a laptop CPU ("mini", "tiny"); "base" leaves it."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; valid: {', '.join(VARIANTS)}.")
    if variant == "base":
        return c
    small = {
        # variant: (size, total_steps, batch, eval_every, eval_batches)
        "mini": ("mini", 1000, 16, 250, 8),
        "tiny": ("tiny", 120, 16, 60, 4),
    }[variant]
    c.model.size, c.total_steps, c.data.global_batch_size, c.eval_every, c.eval_batches = small
    c.checkpoint_every = c.eval_every
    c.grad_accum_steps = 1  # small enough for any device
    c.log_every = 10
    c.model.max_position_embeddings = 128
    return c


def recipe_warmup(c: ml_collections.ConfigDict, fraction: float) -> None:
    """Sets warm-up as a fraction of the run (BERT: 10k of 1M steps = 1%), of the
    `total_steps` the command line gives (`from_total_steps`)."""
    c.optim.warmup_steps = from_total_steps(c, lambda steps: max(1, round(fraction * steps)))


def from_total_steps(c: ml_collections.ConfigDict, rule: Callable[[int], int]) -> Any:
    """A field's value computed by `rule` from `c.total_steps` (a warm-up as a fraction of the
    run): an ml_collections reference, so it follows `total_steps` set later in the config,
    and `--config.total_steps=N` (ln_jax.config.load computes it again after the overrides,
    unless the field itself is given)."""
    return c.get_ref("total_steps")._apply_op(rule)
