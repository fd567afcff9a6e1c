"""Typed configuration: the model, mesh, checkpoint, monitor and run configs, the named sizes,
validation and the platform's "auto" choices.

The trainer's ml_collections config is turned into a frozen `TrainConfig` once (by
`ln_jax.config.load.build_config`); each module then receives only the fields it needs. The
placement table is `ln_jax.nn.placements`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from ln_jax import task as task_lib
from ln_jax import validate
from ln_jax.config.auto import (
    AUTO_CHOSEN,
    auto_activation_layout,
    auto_attention,
    auto_chosen,
    auto_dropout_rng,
    auto_dtype,
    resolve_layout,
)
from ln_jax.config.optim import OptimConfig
from ln_jax.data.config import DEFAULT_DATASET, DataConfig
from ln_jax.nn.placements import PLACEMENTS, PlacementRule, parse_placement
from ln_jax.runtime import compile_cache, platforms
from ln_jax.sharding import ACTIVATION_LAYOUTS
from ln_jax.validate import ConfigError, check_choice, moved_message, reject_unknown_keys

__all__ = [
    "SIZES",
    "CheckpointConfig",
    "ConfigError",
    "MeshConfig",
    "ModelConfig",
    "MonitorConfig",
    "TrainConfig",
    "check_choice",
    "model_config",
    "reject_unknown_keys",
]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
INITS = ("bert", "bert_scaled", "xavier", "fairseq", "admin")
NORMS = ("layernorm", "rmsnorm")
ADMIN_OMEGAS = ("profile", "closed_form")


ATTENTION_IMPLS = ("xla", "cudnn", "pallas")
# -> JAX's impl name ("hash": ln_jax.nn.random.HASH_PRNG, resolved by `prng_impl` there)
RNG_IMPLS = {
    "threefry": "threefry2x32",
    "rbg": "rbg",
    "unsafe_rbg": "unsafe_rbg",
    "hash": "ln_jax_hash",
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
AUTO = "auto"  # a field resolved by the platform when the typed config is built


def platform() -> str:
    """The platform JAX computes on ("cpu", "gpu", "tpu"), or the one a
    `ln_jax.runtime.platforms.lowering_for` block builds for: what "auto" fields resolve by.

    It initialises JAX's backends, so a multi-host program calls `jax.distributed.initialize`
    before building a config with "auto" fields (train.py does).
    """
    return platforms.current()


REMAT_POLICIES = ("none", "full", "dots")

# name -> (num_layers, hidden_size, num_heads, mlp_dim)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def _check_model_choice(field: str, value: Any, valid: tuple[Any, ...]) -> None:
    """`check_choice` of a model field, named as the user types it ("model.norm") and with
    the fix of the command line (`--config.model.norm=CLOSEST`)."""
    check_choice(f"model.{field}", value, valid, config_field=f"model.{field}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Frozen configuration of a layer stack and its embeddings, shared by every family (BERT's
    segment embeddings and NSP head are its section "bert": `ln_jax.models.bert.options`).

    Attributes:
      size: named size the four shape fields came from ("custom" if overridden).
      vocab_size: token vocabulary (the MLM decoder is tied to the word embeddings).
      hidden_size: d, the residual width.
      num_layers: encoder layers, each with an attention and a feed-forward sub-layer.
      num_heads: attention heads; must divide hidden_size.
      mlp_dim: feed-forward inner width.
      max_position_embeddings: learned positions (longest sequence).
      placement: LayerNorm placement name from `PLACEMENTS`, or a per-layer list (a tuple, or
        "post*3,pre*9", or "mixln"; see `parse_placement`). The encoder ends with a final norm
        if its last layer's rule has one; scan_layers needs a single placement.
      norm: the encoder's normaliser, "layernorm" or "rmsnorm" (scale only, statistics in
        float32); the embedding and MLM-head LayerNorms stay BERT's LayerNorms.
      admin_omega: with placement "admin": "profile" (omega from a profiling forward pass, which
        the trainer runs before step 0; see `ln_jax.nn.admin`) or "closed_form" (every omega set to
        sqrt((N+1)/ln(N+1) - 1) at construction, N the number of residual sub-layers).
      qk_norm: normalise queries and keys per head, over head_dim, before the dot product
        (the encoder's `norm`, with a learned scale [kv] shared by the heads); any placement.
      dlcl: dynamic linear combination of layers (Wang et al. 2019), Pre-LN only, no scan: each
        layer's input is a learned weighted sum of the normalised outputs of all earlier layers.
      activation: feed-forward / MLM-transform activation: relu (papers), gelu (BERT), gelu_tanh,
        silu (swish: HuggingFace Marian's).
      layer_norm_eps: epsilon inside every LayerNorm.
      embedding_layernorm: LayerNorm after summing the embeddings (BERT has one).
      hidden_dropout: dropout on embeddings and on each residual branch output.
      attention_dropout: dropout on attention probabilities.
      init: weight initialiser, "bert" (truncated normal, std init_std), "bert_scaled" (the
        same with std init_std * sqrt(768 / hidden_size): BERT-base's scale relative to its
        width, kept at other widths), "xavier" (Xiong et al. section 3.3: Var 1/d) or
        "fairseq" (the papers' translation code: Xavier, with q, k and v drawn as one packed
        [3d, d] matrix, Var 1/(2d); embeddings N(0, 1/d)). "admin" is
        accepted as shorthand for Admin initialisation: it needs placement "post" or "admin"
        and becomes placement="admin" with BERT's initialiser (for Admin on Xavier weights
        say placement="admin", init="xavier").
      init_std: standard deviation of the "bert" initialiser (at width 768 for "bert_scaled").
      dtype: compute dtype name ("float32", "bfloat16", "float16"), or "auto" (resolved when the
        config is built: bfloat16 on GPU/TPU, float32 on CPU); parameters are always float32.
      residual_float32: keep the residual stream (embedding output, every sub-layer's output,
        Post-LN's norm outputs) in float32 while the branches compute in `dtype`: each branch
        output is added to a float32 sum, so a deep Pre-LN stack does not round its running
        sum to bf16 at every sub-layer. No effect when dtype is float32.
      vocab_multiple: the word-embedding table and the MLM decoder have `padded_vocab_size`
        rows, vocab_size rounded up to a multiple of this (128 fills GPU/TPU matmul tiles);
        the padded rows are never looked up and their logits are masked (-1e9), so losses
        and predictions are those of the unpadded model. HF import/export use vocab_size rows.
      attention_impl: "xla", "cudnn" (cuDNN's fused attention: an NVIDIA GPU, bf16/fp16, no
        attention dropout), "pallas" (`ln_jax.nn.flash`: a fused attention whose dropout is
        keyed by the step's key; Triton on NVIDIA GPUs, Pallas's interpreter on CPU (slow,
        for tests), not on TPUs) or "auto" (resolved when the config is built: "cudnn" on a GPU
        where it can run the config, else "xla"; see `auto_attention`). Both take the padding
        as sequence lengths of a right-padded mask. cuDNN's own attention dropout is refused:
        measured on an H200 (jax 0.11.2), it draws the same masks at every step.
      activation_layout: "xla" (XLA picks memory layouts), "row_major" (the residual stream
        pinned row-major, forward and backward; same values; `sharding.activation_layout`) or
        "auto" (resolved when the config is built: `auto_activation_layout`).
      remat: "none", "full" (recompute each layer in the backward pass from its input) or
        "dots" (keep the projections' and the attention's outputs, XLA's, Pallas's or
        cuDNN's, and recompute the rest: the attention probabilities, norms, activations,
        dropout masks). Compiled for a v6e-1 and an H200 without them, BERT-base 256 x 128:
        "dots" needs less than half the temporaries (docs/tpu.md; a CPU's: docs/usage.md).
      scan_layers: stack layer parameters [num_layers, ...] and lax.scan over them; "auto": on
        a GPU stacked unless a per-layer placement list or DLCL needs a list, elsewhere a list
        (`ln_jax.config.auto.auto_scan_layers`: measured on an H200).
      scan_unroll: with scan_layers, the layers each iteration of the scan runs (lax.scan's
        `unroll`); num_layers or more runs them as straight-line code that keeps the stacked
        parameters, so the optimizer updates, casts and norms each one in a kernel for all
        layers, and the host launches a step faster (docs/results/gpu/journal.md); on a CPU in
        float32 the step itself is slower. 1: a loop (one compiled layer body: the fastest
        compile). "auto": num_layers when stacked, else 1.
    """

    size: str = "tiny"
    vocab_size: int = 8000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    mlp_dim: int = 512
    max_position_embeddings: int = 512
    placement: str | tuple[str, ...] = "pre"
    norm: str = "layernorm"
    admin_omega: str = "profile"
    qk_norm: bool = False
    dlcl: bool = False
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12
    embedding_layernorm: bool = True
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init: str = "bert"
    init_std: float = 0.02
    dtype: str = AUTO
    residual_float32: bool = False
    vocab_multiple: int = 1
    attention_impl: str = AUTO
    activation_layout: str = AUTO
    remat: str = "none"
    scan_layers: bool | str = False
    scan_unroll: int | str = 1

    def __post_init__(self) -> None:
        _check_model_choice("size", self.size, (*SIZES, "custom"))
        _check_model_choice("norm", self.norm, NORMS)
        _check_model_choice("admin_omega", self.admin_omega, ADMIN_OMEGAS)
        _check_model_choice("activation", self.activation, ACTIVATIONS)
        _check_model_choice("init", self.init, INITS)
        _check_model_choice("dtype", self.dtype, (*DTYPES, AUTO))
        _check_model_choice("attention_impl", self.attention_impl, (*ATTENTION_IMPLS, AUTO))
        _check_model_choice(
            "activation_layout", self.activation_layout, (*ACTIVATION_LAYOUTS, AUTO)
        )
        _check_model_choice("remat", self.remat, REMAT_POLICIES)
        self._check_shapes()
        self._resolve_admin_init()
        object.__setattr__(self, AUTO_CHOSEN, resolve_layout(self, platform))
        self._check_layouts()
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be in [0, 1).")
        self._resolve_auto()
        self._check_cudnn()

    def _resolve_auto(self) -> None:
        """dtype / attention_impl / activation_layout "auto" -> the platform's choice (only
        asked if needed)."""
        if AUTO not in (self.dtype, self.attention_impl, self.activation_layout):
            return
        on = platform()
        if self.activation_layout == AUTO:
            object.__setattr__(self, "activation_layout", auto_activation_layout(on))
        if self.dtype == AUTO:
            object.__setattr__(self, "dtype", auto_dtype(on))
        if self.attention_impl == AUTO:
            object.__setattr__(self, "attention_impl", auto_attention(self, on))

    def cudnn_problem(self) -> str | None:
        """Why cuDNN's fused attention cannot run this config (None if it can), as advice."""
        if self.dtype not in ("bfloat16", "float16"):
            return (
                f"it needs model.dtype bfloat16 or float16, not {self.dtype!r}; set "
                "--config.model.dtype=bfloat16"
            )
        if self.head_dim > 128 or self.head_dim % 8:
            return f"it needs a head_dim that is a multiple of 8 up to 128, not {self.head_dim}"
        if self.attention_dropout > 0.0:
            # Measured (jax 0.11.2, H200; bench/probes/cudnn_dropout_facts.py): cuDNN draws the same
            # masks at every step of a jitted program, and aborts XLA inside CUDA graphs.
            return (
                "its attention dropout is not usable (cuDNN repeats the same masks at every "
                "step; docs/results/gpu/journal.md); set --config.model.attention_dropout=0"
            )
        return None

    def _check_cudnn(self) -> None:
        """Settings cuDNN cannot run are errors, never a silent switch to another
        implementation (only "auto" chooses)."""
        if self.attention_impl != "cudnn":
            return
        problem = self.cudnn_problem()
        if problem:
            raise ValueError(
                f"model.attention_impl='cudnn' cannot run this config: {problem}, or use "
                "--config.model.attention_impl=xla (or auto)."
            )

    def _resolve_admin_init(self) -> None:
        """init="admin" -> placement="admin" with BERT's weight initialiser."""
        if isinstance(self.placement, list):
            object.__setattr__(self, "placement", tuple(self.placement))
        if self.init != "admin":
            return
        if self.placement not in ("post", "admin"):
            raise ValueError(
                f"model.init='admin' is Admin initialisation of Post-LN; it needs "
                f"model.placement 'post' or 'admin', not {self.placement!r}."
            )
        object.__setattr__(self, "placement", "admin")
        object.__setattr__(self, "init", "bert")

    def _check_layouts(self) -> None:
        names = self.layer_placements
        if self.scan_layers and len(set(names)) > 1:
            raise ValueError(
                f"model.scan_layers needs one placement for every layer, got "
                f"{self.placement!r}; set scan_layers=False for a per-layer placement."
            )
        if int(self.scan_unroll) < 1 or (self.scan_unroll != 1 and not self.scan_layers):
            raise ValueError(
                f"model.scan_unroll={self.scan_unroll} is the layers per iteration of a "
                "scanned stack: it needs model.scan_layers=True and a value >= 1 "
                "(num_layers unrolls fully); set scan_unroll=1 without scan_layers."
            )
        if self.dlcl and (set(names) != {"pre"} or self.scan_layers):
            raise ValueError(
                "model.dlcl is for Pre-LN without scan_layers (the combination needs every "
                f"earlier layer's output); got placement={self.placement!r}, "
                f"scan_layers={self.scan_layers}."
            )

    def _check_shapes(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
                     "max_position_embeddings", "vocab_multiple"):  # fmt: skip
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be positive.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_heads={self.num_heads}; choose heads that divide the width."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def layer_placements(self) -> tuple[str, ...]:
        """The placement name of each of the `num_layers` layers."""
        return parse_placement(self.placement, self.num_layers)

    def layer_rule(self, index: int) -> PlacementRule:
        return PLACEMENTS[self.layer_placements[index]]

    @property
    def rule(self) -> PlacementRule:
        """The rule of the last layer (the one that decides the final norm)."""
        return self.layer_rule(self.num_layers - 1)

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def residual_dtype(self) -> Any:
        """The residual stream's dtype: float32 with `residual_float32`, else compute_dtype."""
        return jnp.float32 if self.residual_float32 else self.compute_dtype

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word embeddings and MLM decoder: vocab_size rounded up to
        a multiple of `vocab_multiple`."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes`; the fields "auto" chose stay marked so (`auto_chosen`)."""
        new = dataclasses.replace(self, **changes)
        kept = auto_chosen(self) - set(changes)
        object.__setattr__(new, AUTO_CHOSEN, auto_chosen(new) | kept)
        return new

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a named `size` plus field overrides.

        The four shape fields (num_layers, hidden_size, num_heads, mlp_dim) come from `size`
        unless given explicitly; overriding one of them keeps the size name for the others.
        """
        values = dict(values)
        reject_unknown_keys("model", values, [f.name for f in dataclasses.fields(cls)])
        size = values.get("size", cls.size)
        _check_model_choice("size", size, (*SIZES, "custom"))
        if size != "custom":
            layers, hidden, heads, mlp = SIZES[size]
            shape = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, mlp_dim=mlp)
            for key, val in shape.items():
                if values.get(key) is None:
                    values[key] = val
        return cls(**{k: v for k, v in values.items() if v is not None})


def model_config(size: str = "tiny", **overrides: Any) -> ModelConfig:
    """Shorthand: `model_config("mini", placement="post")`."""
    return ModelConfig.from_mapping({"size": size, **overrides})


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh sizes over ('data', 'fsdp', 'tensor'); one may be -1 (= the rest)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpointing.

    Attributes:
      keep: keep the last `keep` checkpoints.
      async_save: save in a background thread while training goes on.
      fallback: if the latest checkpoint cannot be restored, try the previous ones.
    """

    keep: int = 3
    async_save: bool = True
    fallback: bool = False


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Training-time measurements per layer (`ln_jax.train.monitor`) and the early-warning rules
    (`ln_jax.train.early_warning`). A rule speaks as a warning (the run is likely failing: a
    WARNING in train.log, split "warning/<rule>") or as a note (a transient state healthy runs
    also show: INFO, split "note/<rule>"). The defaults are calibrated on recorded runs: they
    warn on the studies' failed runs and not on those that recovered
    (docs/results/monitor/calibration.md, `python -m ln_jax.train.warning_replay`).

    Attributes:
      every: measure every N steps (and at steps 1 and the last); None = at the logging
        cadence (`log_every`); 0 = off. Only those steps run the measured train step.
      window: how many earlier logged values the spike rules compare with.
      loss_spike: warn when the loss exceeds the median of the window by this many robust
        standard deviations (1.4826 x the median absolute deviation, at least 1% of the
        median); 0 = off.
      grad_jump: a gradient norm (global or a sub-layer's) above this multiple of its median
        over the window is a warning when it is also above every value of the window, a note
        when it returns to a level the window has seen; 0 = off.
      collapse: a layer's mean cosine between positions (rank collapse) at or above this value
        is a note when it crosses it; 0 = off.
      collapse_steps: ... and a warning when it has stayed there for this many steps (in every
        record) while the loss fell by less than `collapse_loss_drop`.
      collapse_loss_drop: the fraction of the loss level at the start of the collapse by which
        the loss must fall over it for a persistent collapse to stay a note (the level: median
        of the last 5 logged losses); 1 = warn on persistence alone.
      keep_checkpoint: on a warning (not a note), keep the latest checkpoint from before it from
        the deletion of old checkpoints (`checkpoint.keep`).
    """

    every: int | None = None
    window: int = 20
    loss_spike: float = 6.0
    grad_jump: float = 10.0
    collapse: float = 0.9
    collapse_steps: int = 200
    collapse_loss_drop: float = 0.05
    keep_checkpoint: bool = True

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 0:
            raise ValueError(f"monitor.every={self.every}: use 0 (off), N > 0 or None.")
        if self.window < 2:
            raise ValueError(f"monitor.window={self.window} must be at least 2.")
        if not 0 <= self.collapse <= 1:
            raise ValueError(f"monitor.collapse={self.collapse}: use a cosine in (0, 1], 0 = off.")
        if self.collapse_steps < 0:
            raise ValueError(f"monitor.collapse_steps={self.collapse_steps} must be >= 0.")
        if not 0 <= self.collapse_loss_drop <= 1:
            raise ValueError(
                f"monitor.collapse_loss_drop={self.collapse_loss_drop}: use a fraction in [0, 1]."
            )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs, typed and validated once from the ml_collections config.

    Attributes:
      name: config name and variant (e.g. "bert_preln_mini"); names the default workdir.
      task: the model family and objective (`ln_jax.task`): "bert_pretraining", or a
        "module:attribute" Task class defined outside ln_jax.
      options: the task's own fields, an instance of its `Task.options_class` (a mapping of
        them is made one): `BertOptions`, `TranslationOptions`, `GlueOptions`; None for a task
        with none. Set and recorded under the task's `options_section` (`to_dict`).
      seed: seed of the parameters and of dropout (the data has its own, data.seed).
      total_steps: optimizer updates.
      eval_every / checkpoint_every / log_every: intervals in steps (0 = only at the end).
      steps_per_epoch: 0, or the steps of one pass over the training data: then every eval
        record carries `epoch` = step // steps_per_epoch (fine-tuning evaluates per epoch).
      eval_batches: evaluation batches (None = one pass over the validation split).
      grad_accum_steps: micro-batches per update (the global batch is split into them);
        0 = "auto": the fewest that fit the device's memory by XLA's estimate.
      dropout_rng: PRNG of the dropout masks: "threefry" (JAX's default: the same bits on every
        backend and sharding), "rbg" or "unsafe_rbg" (the accelerator's bit generator: far
        cheaper for BERT-base's ~1.2e9 dropout bits per step; bits depend on the backend), or
        "hash" (threefry keys, bits from a counter hash of the element index that XLA fuses
        into the op using the mask: no bit array in memory; `ln_jax.nn.random`), or
        "auto" (resolved when the config is built: hash on every platform, a TPU included
        since 2026-11-28, where it was rbg; `auto_dropout_rng`).
      nan_policy: on a non-finite loss or gradient: "stop" (message naming the step; the
        last good checkpoint is kept) or "skip" (drop it, go on; step k still uses lr(k)).
      compilation_cache: JAX's persistent compilation cache while the run trains: "auto"
        (resolved when the config is built: $LN_JAX_CACHE_DIR/jax_compilation, else
        ~/.cache/ln_jax/jax_compilation, on a GPU/TPU; "off" on a CPU), "off", or a folder
        (`ln_jax.runtime.compile_cache`; $JAX_COMPILATION_CACHE_DIR wins if set).
      monitor: per-layer measurements and early warnings (`MonitorConfig`).
    """

    name: str = "run"
    task: str = "bert_pretraining"
    options: Any = None
    seed: int = 0
    total_steps: int = 100
    eval_every: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    steps_per_epoch: int = 0
    eval_batches: int | None = None
    grad_accum_steps: int = 1
    nan_policy: str = "stop"
    dropout_rng: str = AUTO
    compilation_cache: str = AUTO
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    monitor: MonitorConfig = dataclasses.field(default_factory=MonitorConfig)

    @property
    def monitor_every(self) -> int:
        """Steps between measurements (0 = off): `monitor.every`, or `log_every` if None."""
        every = self.monitor.every
        return self.log_every if every is None else every

    def __post_init__(self) -> None:
        check_choice("nan_policy", self.nan_policy, ("stop", "skip"), config_field="nan_policy")
        if self.steps_per_epoch < 0:
            raise ValueError(f"steps_per_epoch={self.steps_per_epoch}: use 0 (none) or more.")
        # an unknown or unimportable task is an error here; its own fields are typed and checked
        object.__setattr__(self, "options", task_lib.make_options(self.task, self.options))
        object.__setattr__(self, "options", task_lib.checked_options(self))
        check_choice(
            "dropout_rng", self.dropout_rng, (*RNG_IMPLS, AUTO), config_field="dropout_rng"
        )
        if self.dropout_rng == AUTO:
            object.__setattr__(self, "dropout_rng", auto_dropout_rng(platform()))
        if self.compilation_cache == AUTO:
            object.__setattr__(self, "compilation_cache", compile_cache.resolve(AUTO, platform()))
        compile_cache.resolve(self.compilation_cache, platform())  # "" is an error
        if self.total_steps <= 0:
            raise ValueError(f"total_steps={self.total_steps} must be positive.")
        if self.grad_accum_steps < 0:
            raise ValueError(f"grad_accum_steps={self.grad_accum_steps}: use 0 (auto) or more.")
        batch = self.data.global_batch_size
        if self.grad_accum_steps and batch % self.grad_accum_steps:
            raise ValueError(
                f"data.global_batch_size={batch} is not divisible by "
                f"grad_accum_steps={self.grad_accum_steps}."
            )
        if self.model.vocab_size != self.data.vocab_size:
            raise ValueError(
                f"model.vocab_size={self.model.vocab_size} differs from "
                f"data.vocab_size={self.data.vocab_size}; set them equal (or leave "
                "model.vocab_size unset to take the tokenizer's)."
            )

    @property
    def options_section(self) -> str | None:
        """The config section of the task's own fields ("translation"; None: it has none)."""
        return task_lib.options_section(self.task)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain values (as `from_mapping` reads and config.json holds
        it), the task's options under their section's name (`options_section`)."""
        values, section = dataclasses.asdict(self), self.options_section
        options = values.pop("options")
        return {**values, section: options} if section else values

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Builds the typed config from a (nested) dict, e.g. `ConfigDict.to_dict()`.

        Unknown fields anywhere are errors naming the closest valid field. The optimizer's
        total_steps follows the run's, and the model's vocabulary the data's, unless set.
        """
        values = dict(values)
        section = task_lib.options_section(values.get("task", cls.task))
        if task_lib.LEGACY_SECTION in values:
            raise ConfigError(moved_message(task_lib.LEGACY_SECTION, section))
        fields = [f.name for f in dataclasses.fields(cls) if f.name != "options"]
        reject_unknown_keys("config", values, fields + ([section] if section else []))
        if section is not None:
            values["options"] = values.pop(section, None)
        data = dict(values.pop("data", {}))
        validate.check_family_fields("data", data, section)
        if data.get("vocab_size") is None:
            # The embedded corpus (1.5 MB) supports ~10k pieces; BERT's size for real corpora.
            embedded = data.get("dataset", DEFAULT_DATASET) == DEFAULT_DATASET
            data["vocab_size"] = 8000 if embedded else 30522
        data = DataConfig.from_mapping(data)
        optim = dict(values.pop("optim", {}))
        if optim.get("total_steps") is None:
            optim["total_steps"] = values.get("total_steps", cls.total_steps)
        model = dict(values.pop("model", {}))
        validate.check_family_fields("model", model, section)
        if model.get("vocab_size") is None:
            model["vocab_size"] = data.vocab_size
        sections = {
            "mesh": (MeshConfig, values.pop("mesh", {})),
            "checkpoint": (CheckpointConfig, values.pop("checkpoint", {})),
            "monitor": (MonitorConfig, values.pop("monitor", {})),
        }
        typed = {}
        for key, (kind, given) in sections.items():
            reject_unknown_keys(key, given, [f.name for f in dataclasses.fields(kind)])
            typed[key] = kind(**given)
        return cls(
            **values,
            model=ModelConfig.from_mapping(model),
            optim=OptimConfig.from_mapping(optim),
            data=data,
            **typed,
        )
