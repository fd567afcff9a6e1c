"""Typed model configuration: the placement table, the named sizes, validation.

The trainer's ml_collections config is turned into a frozen `ModelConfig` once; each module then
receives only the fields it needs.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from ln_jax.data.config import DEFAULT_DATASET, DataConfig
from ln_jax.optim import OptimConfig
from ln_jax.task import factory as task_factory
from ln_jax.validate import ConfigError, check_choice, closest, reject_unknown_keys

__all__ = [
    "PLACEMENTS",
    "SIZES",
    "CheckpointConfig",
    "CommandLine",
    "ConfigError",
    "MeshConfig",
    "ModelConfig",
    "MonitorConfig",
    "PlacementRule",
    "TrainConfig",
    "build_config",
    "check_choice",
    "load_config",
    "model_config",
    "override",
    "parse_command_line",
    "parse_placement",
    "reject_unknown_keys",
    "resolve_config_path",
]


@dataclasses.dataclass(frozen=True)
class PlacementRule:
    """Where a residual sub-layer normalises, as data.

    A sub-layer computes, in this order (skipping what the rule switches off):
      h = Norm(x) if pre_norm else x;  h = h / sqrt(l) if pre_norm_scale == "inv_sqrt_depth"
      f = F(h);  f = Norm(f) if branch_norm;  f = alpha * f if branch_gate
      s = skip_scale * x  (1, a learned per-channel omega, or a constant alpha)
      y = s + f;  y = Norm(y) if post_norm
    and the encoder applies a final Norm after the last layer if `final_norm`.

    Attributes:
      pre_norm: normalise the branch input (Pre-LN).
      post_norm: normalise after the residual add (Post-LN).
      branch_norm: normalise the branch output before the add (sandwich / Peri-LN).
      final_norm: the encoder ends with a Norm (needed when the residual stream is unnormalised).
      skip: "identity", "omega" (Admin: learned per-channel vector) or "alpha" (DeepNorm constant).
      branch_gate: scale the branch by a learned scalar initialised at 0 (ReZero).
      pre_norm_scale: "none", or "inv_sqrt_depth": the pre-norm output of layer l (1-based)
        is multiplied by 1/sqrt(l) (LayerNorm Scaling).
      norm_kind: "model" (every Norm is the model's `norm`) or "dyt": every Norm of the rule
        and the final one is DyT, gamma * tanh(alpha x) + beta (no statistics).
      init_scale: "none", or "deepnorm_beta": the branch's value, attention-output and FFN
        kernels are multiplied by beta = (8N)^(-1/4) at initialisation (DeepNet; N layers).
    """

    pre_norm: bool = False
    post_norm: bool = False
    branch_norm: bool = False
    final_norm: bool = False
    skip: str = "identity"
    branch_gate: bool = False
    pre_norm_scale: str = "none"
    norm_kind: str = "model"
    init_scale: str = "none"

    def __post_init__(self) -> None:
        check_choice("pre_norm_scale", self.pre_norm_scale, PRE_NORM_SCALES)
        check_choice("norm_kind", self.norm_kind, NORM_KINDS)
        check_choice("init_scale", self.init_scale, INIT_SCALES)
        if self.pre_norm_scale != "none" and not self.pre_norm:
            raise ValueError("PlacementRule: pre_norm_scale scales the pre-norm; set pre_norm.")


PRE_NORM_SCALES = ("none", "inv_sqrt_depth")
NORM_KINDS = ("model", "dyt")
INIT_SCALES = ("none", "deepnorm_beta")

# The one table of placements. "post" is exactly Xiong et al.'s Post-LN, LN(x + F(x)); a norm on
# the branch output is "sandwich", never "post".
PLACEMENTS: dict[str, PlacementRule] = {
    "post": PlacementRule(post_norm=True),
    "pre": PlacementRule(pre_norm=True, final_norm=True),
    # Liu et al. 2020 (Admin): LN(x * omega + F(x)), omega profiled or closed form.
    "admin": PlacementRule(post_norm=True, skip="omega"),
    # Wang et al. 2022 (DeepNet): LN(alpha x + F(x)), alpha = (2N)^(1/4); beta-scaled init.
    "deepnorm": PlacementRule(post_norm=True, skip="alpha", init_scale="deepnorm_beta"),
    # DeepNorm's two changes apart: the alpha skip alone (plain init), and Post-LN with only
    # the beta init scaling (which of them keeps DeepNorm out of the collapse).
    "deepnorm_alpha": PlacementRule(post_norm=True, skip="alpha"),
    "deepnorm_beta": PlacementRule(post_norm=True, init_scale="deepnorm_beta"),
    # Peri-LN: x + LN(F(LN(x))), then a final LN.
    "sandwich": PlacementRule(pre_norm=True, branch_norm=True, final_norm=True),
    # Bachlechner et al. 2020 (ReZero): x + alpha F(x), alpha learned from 0, no norm at all.
    "rezero": PlacementRule(branch_gate=True),
    # OLMo 2's reordered norm: x + LN(F(x)), no input norm, then a final LN.
    "olmo2": PlacementRule(branch_norm=True, final_norm=True),
    # LayerNorm Scaling (Curse of Depth 2025): x + F(LN(x) / sqrt(l)) in layer l (1-based).
    "lns": PlacementRule(pre_norm=True, final_norm=True, pre_norm_scale="inv_sqrt_depth"),
    # Zhu et al. 2025 (DyT): Pre-LN with every norm gamma * tanh(alpha x) + beta, alpha from 0.5.
    "dyt": PlacementRule(pre_norm=True, final_norm=True, norm_kind="dyt"),
}

# nGPT (Loshchilov et al. 2025) is not a row: its residual step Norm(h + a * (Norm(F(h)) - h)) would
# fit the table, but the rest of it does not: every weight matrix is renormalised to the unit
# sphere after each optimizer update (a projection in the train step), and the sub-layers change
# inside (s_qk on normalised q and k with softmax scale sqrt(d_k), s_u and s_v in the FFN, s_z on
# the logits, normalised embeddings). A row with only the residual step would be misnamed.
NOT_ROWS = {
    "ngpt": "nGPT is not available: besides its residual step Norm(h + a*(Norm(F(h)) - h)) it "
    "renormalises every weight matrix after each optimizer update and rescales q/k, the FFN and "
    "the logits inside the sub-layers, which the placement table cannot express (README, "
    "'The library'). Closest rows: 'olmo2' (normalised branch output) or 'pre'."
}

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
INITS = ("bert", "bert_scaled", "xavier", "admin")
NORMS = ("layernorm", "rmsnorm")
ADMIN_OMEGAS = ("profile", "closed_form")


def parse_placement(placement: str | tuple[str, ...], num_layers: int) -> tuple[str, ...]:
    """The placement name of each layer, from one name or a per-layer list.

    Args:
      placement: a name from `PLACEMENTS`, a tuple of names (one per layer), or a string of
        comma-separated items `name` or `name*count`, e.g. "post*3,pre*9" (Mix-LN). "mixln" is
        Mix-LN's rule: Post-LN for the first quarter of the layers (rounded down), Pre-LN after.
      num_layers: layers of the encoder; a list must name exactly that many.

    Returns:
      A tuple of `num_layers` names from `PLACEMENTS`.
    """
    if placement == "mixln":
        quarter = num_layers // 4
        return ("post",) * quarter + ("pre",) * (num_layers - quarter)
    items = placement if isinstance(placement, tuple) else tuple(placement.split(","))
    names: list[str] = []
    for item in items:
        name, _, count = item.strip().partition("*")
        if name in NOT_ROWS:
            raise ValueError(f"model.placement={name!r}: {NOT_ROWS[name]}")
        check_choice("placement", name, (*PLACEMENTS, "mixln"))
        if name == "mixln":  # a rule for the whole stack, not one layer's placement
            raise ValueError(
                f"model.placement={placement!r}: 'mixln' names the whole stack's rule and "
                "cannot be an item of a per-layer list; give it alone, or list the layers "
                "(e.g. 'post*3,pre*9')."
            )
        if count and not (count.strip().isdigit() and int(count) > 0):
            raise ValueError(
                f"placement item {item.strip()!r}: the count after '*' must be a positive "
                f"integer (e.g. 'post*3,pre*9')."
            )
        names.extend([name] * (int(count) if count else 1))
    if len(names) == 1:
        return tuple(names) * num_layers
    if len(names) != num_layers:
        raise ValueError(
            f"model.placement={placement!r} names {len(names)} layers but model.num_layers="
            f"{num_layers}; give one name, or one per layer (e.g. 'post*3,pre*9')."
        )
    return tuple(names)


ATTENTION_IMPLS = ("xla", "cudnn")
RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}  # -> JAX's
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
AUTO = "auto"  # a field resolved by the platform when the typed config is built


def platform() -> str:
    """The platform JAX computes on ("cpu", "gpu", "tpu"): what "auto" fields resolve by.

    It initialises JAX's backends, so a multi-host program calls `jax.distributed.initialize`
    before building a config with "auto" fields (train.py does).
    """
    import jax

    return jax.default_backend()


def auto_dtype(on: str) -> str:
    """model.dtype="auto": bfloat16 on an accelerator, float32 on a CPU."""
    return "float32" if on == "cpu" else "bfloat16"


def auto_dropout_rng(on: str) -> str:
    """dropout_rng="auto": the TPU's bit generator ("rbg") on a TPU, the usual advice there;
    threefry (the same bits on every backend and mesh) elsewhere. On an H200 rbg was no faster
    for BERT-base (78.9 vs 78.0 ms a step, docs/gpu.md): the dropout's cost there is moving the
    masks, not drawing the bits."""
    return "rbg" if on == "tpu" else "threefry"


REMAT_POLICIES = ("none", "full", "dots")

# name -> (num_layers, hidden_size, num_heads, mlp_dim)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Frozen configuration of the BERT encoder and its pretraining heads.

    Attributes:
      size: named size the four shape fields came from ("custom" if overridden).
      vocab_size: token vocabulary (the MLM decoder is tied to the word embeddings).
      hidden_size: d, the residual width.
      num_layers: encoder layers, each with an attention and a feed-forward sub-layer.
      num_heads: attention heads; must divide hidden_size.
      mlp_dim: feed-forward inner width.
      max_position_embeddings: learned positions (longest sequence).
      type_vocab_size: segment ids (2 for sentence A/B).
      placement: LayerNorm placement name from `PLACEMENTS`, or a per-layer list (a tuple, or
        "post*3,pre*9", or "mixln"; see `parse_placement`). The encoder ends with a final norm
        if its last layer's rule has one; scan_layers needs a single placement.
      norm: the encoder's normaliser, "layernorm" or "rmsnorm" (scale only, statistics in
        float32); the embedding and MLM-head LayerNorms stay BERT's LayerNorms.
      admin_omega: with placement "admin": "profile" (omega from a profiling forward pass, which
        the trainer runs before step 0; see `ln_jax.admin`) or "closed_form" (every omega set to
        sqrt((N+1)/ln(N+1) - 1) at construction, N the number of residual sub-layers).
      qk_norm: normalise queries and keys per head, over head_dim, before the dot product
        (the encoder's `norm`, with a learned scale [kv] shared by the heads); any placement.
      dlcl: dynamic linear combination of layers (Wang et al. 2019), Pre-LN only, no scan: each
        layer's input is a learned weighted sum of the normalised outputs of all earlier layers.
      activation: feed-forward / MLM-transform activation: relu (papers), gelu (BERT), gelu_tanh.
      layer_norm_eps: epsilon inside every LayerNorm.
      embedding_layernorm: LayerNorm after summing the embeddings (BERT has one).
      hidden_dropout: dropout on embeddings and on each residual branch output.
      attention_dropout: dropout on attention probabilities.
      init: weight initialiser, "bert" (truncated normal, std init_std), "bert_scaled" (the
        same with std init_std * sqrt(768 / hidden_size): BERT-base's scale relative to its
        width, kept at other widths) or "xavier" (Xiong et al. section 3.3). "admin" is
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
        attention dropout) or "auto" (resolved when the config is built: "cudnn" on a GPU
        where it can run the config, else "xla"; see `auto_attention`). Both take the padding
        as sequence lengths of a right-padded mask. cuDNN's own attention dropout is refused:
        measured on an H200 (jax 0.11.2), it draws the same masks at every step.
      remat: "none", "full" (recompute each layer in the backward pass) or "dots".
      scan_layers: stack layer parameters [num_layers, ...] and lax.scan over them.
      nsp_head: build the next-sentence-prediction head.
    """

    size: str = "tiny"
    vocab_size: int = 8000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    mlp_dim: int = 512
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
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
    remat: str = "none"
    scan_layers: bool = False
    nsp_head: bool = True

    def __post_init__(self) -> None:
        check_choice("size", self.size, (*SIZES, "custom"))
        check_choice("norm", self.norm, NORMS)
        check_choice("admin_omega", self.admin_omega, ADMIN_OMEGAS)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("init", self.init, INITS)
        check_choice("dtype", self.dtype, (*DTYPES, AUTO))
        check_choice("attention_impl", self.attention_impl, (*ATTENTION_IMPLS, AUTO))
        check_choice("remat", self.remat, REMAT_POLICIES)
        self._check_shapes()
        self._resolve_admin_init()
        self._check_layouts()
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be in [0, 1).")
        self._resolve_auto()
        self._check_cudnn()

    def _resolve_auto(self) -> None:
        """dtype / attention_impl "auto" -> the platform's choice (only asked if needed)."""
        if AUTO not in (self.dtype, self.attention_impl):
            return
        on = platform()
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
            # Measured (jax 0.11.2, H200; bench/cudnn_dropout_facts.py): cuDNN draws the same
            # masks at every step of a jitted program, and aborts XLA inside CUDA graphs.
            return (
                "its attention dropout is not usable (cuDNN repeats the same masks at every "
                "step; docs/gpu.md); set --config.model.attention_dropout=0"
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
        if self.dlcl and (set(names) != {"pre"} or self.scan_layers):
            raise ValueError(
                "model.dlcl is for Pre-LN without scan_layers (the combination needs every "
                f"earlier layer's output); got placement={self.placement!r}, "
                f"scan_layers={self.scan_layers}."
            )

    def _check_shapes(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "mlp_dim",
            "max_position_embeddings",
            "type_vocab_size",
            "vocab_multiple",
        ):
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
    def num_sublayers(self) -> int:
        return 2 * self.num_layers

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
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a named `size` plus field overrides.

        The four shape fields (num_layers, hidden_size, num_heads, mlp_dim) come from `size`
        unless given explicitly; overriding one of them keeps the size name for the others.
        """
        values = dict(values)
        reject_unknown_keys("model", values, [f.name for f in dataclasses.fields(cls)])
        size = values.get("size", cls.size)
        check_choice("size", size, (*SIZES, "custom"))
        if size != "custom":
            layers, hidden, heads, mlp = SIZES[size]
            shape = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, mlp_dim=mlp)
            for key, val in shape.items():
                if values.get(key) is None:
                    values[key] = val
        return cls(**{k: v for k, v in values.items() if v is not None})


def auto_attention(cfg: ModelConfig, on: str) -> str:
    """attention_impl="auto": cuDNN's fused attention on a GPU where it can run `cfg`
    (`ModelConfig.cudnn_problem`: bf16/fp16, head_dim, no attention dropout), else XLA's."""
    return "cudnn" if on == "gpu" and cfg.cudnn_problem() is None else "xla"


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
    """Training-time measurements per layer (`ln_jax.monitor`) and the early-warning rule
    (`ln_jax.early_warning`).

    Attributes:
      every: measure every N steps (and at steps 1 and the last); None = at the logging
        cadence (`log_every`); 0 = off. Only those steps run the measured train step.
      window: how many earlier logged values the spike rules compare with.
      loss_spike: warn when the loss exceeds the median of the window by this many robust
        standard deviations (1.4826 x the median absolute deviation, at least 1% of the
        median); 0 = off.
      grad_jump: warn when a gradient norm (global or a sub-layer's) exceeds this multiple of
        its median over the window; 0 = off.
      collapse: warn when a layer's mean cosine between positions crosses this value upwards
        (rank collapse); 0 = off.
      keep_checkpoint: on a warning, keep the latest checkpoint from before it from the
        deletion of old checkpoints (`checkpoint.keep`).
    """

    every: int | None = None
    window: int = 20
    loss_spike: float = 6.0
    grad_jump: float = 10.0
    collapse: float = 0.99
    keep_checkpoint: bool = True

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 0:
            raise ValueError(f"monitor.every={self.every}: use 0 (off), N > 0 or None.")
        if self.window < 2:
            raise ValueError(f"monitor.window={self.window} must be at least 2.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs, typed and validated once from the ml_collections config.

    Attributes:
      name: config name and variant (e.g. "bert_preln_mini"); names the default workdir.
      task: the model family and objective (`ln_jax.task`): "bert_pretraining", or a
        "module:attribute" Task class defined outside ln_jax.
      seed: seed of the parameters and of dropout (the data has its own, data.seed).
      total_steps: optimizer updates.
      eval_every / checkpoint_every / log_every: intervals in steps (0 = only at the end).
      eval_batches: evaluation batches (None = one pass over the validation split).
      grad_accum_steps: micro-batches per update (the global batch is split into them);
        0 = "auto": the fewest that fit the device's memory by XLA's estimate.
      dropout_rng: PRNG of the dropout masks: "threefry" (JAX's default: the same bits on every
        backend and sharding), "rbg" or "unsafe_rbg" (the accelerator's bit generator: far
        cheaper for BERT-base's ~1.2e9 dropout bits per step; bits depend on the backend), or
        "auto" (resolved when the config is built: rbg on a TPU, threefry elsewhere).
      nan_policy: on a non-finite loss or gradient: "stop" (message naming the step; the
        last good checkpoint is kept) or "skip" (drop that update and go on).
      monitor: per-layer measurements and early warnings (`MonitorConfig`).
    """

    name: str = "run"
    task: str = "bert_pretraining"
    seed: int = 0
    total_steps: int = 100
    eval_every: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    eval_batches: int | None = None
    grad_accum_steps: int = 1
    nan_policy: str = "stop"
    dropout_rng: str = AUTO
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
        check_choice("nan_policy", self.nan_policy, ("stop", "skip"))
        task_factory(self.task)  # an unknown or unimportable task is an error here
        check_choice("dropout_rng", self.dropout_rng, (*RNG_IMPLS, AUTO))
        if self.dropout_rng == AUTO:
            object.__setattr__(self, "dropout_rng", auto_dropout_rng(platform()))
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

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Builds the typed config from a (nested) dict, e.g. `ConfigDict.to_dict()`.

        Unknown fields anywhere are errors naming the closest valid field. The optimizer's
        total_steps follows the run's, and the model's vocabulary the data's, unless set.
        """
        values = dict(values)
        reject_unknown_keys("config", values, [f.name for f in dataclasses.fields(cls)])
        data = dict(values.pop("data", {}))
        if data.get("vocab_size") is None:
            # The embedded corpus (1.5 MB) supports ~10k pieces; BERT's size for real corpora.
            embedded = data.get("dataset", DEFAULT_DATASET) == DEFAULT_DATASET
            data["vocab_size"] = 8000 if embedded else 30522
        data = DataConfig.from_mapping(data)
        optim = dict(values.pop("optim", {}))
        if optim.get("total_steps") is None:
            optim["total_steps"] = values.get("total_steps", cls.total_steps)
        model = dict(values.pop("model", {}))
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


# --------------------------------------------------------------------------- the config front
#
# Every command line (train.py, ln_jax.experiments, ln_jax.analysis, ln_jax.compile_check) and
# the tests read configs through these functions, so a field that works in one works in all:
#   --config=FILE[:variant]            a .py file whose get_config(variant) returns the config
#   --config.SECTION.FIELD=VALUE       an override of a field the config declares

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_PREFIX = "--config."


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A command line split into the config's arguments and the command's own.

    Attributes:
      spec: the `--config=FILE[:variant]` given, or the command's default.
      overrides: dotted field -> raw text, from `--config.SECTION.FIELD=VALUE` in order.
      rest: every other argument, for the command's own flag parser.
    """

    spec: str | None
    overrides: dict[str, str]
    rest: list[str]


def parse_command_line(argv: Sequence[str], default_spec: str | None = None) -> CommandLine:
    """Takes `--config=...` / `--config ...` and `--config.A.B=V` / `--config.A.B V` out of argv."""
    spec, overrides, rest = default_spec, {}, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--config" or arg.startswith("--config="):
            spec = _flag_value(arg, args, "--config")
        elif arg.startswith(CONFIG_PREFIX):
            key = arg[len(CONFIG_PREFIX) :].partition("=")[0]
            overrides[key] = _flag_value(arg, args, CONFIG_PREFIX + key)
        else:
            rest.append(arg)
    return CommandLine(spec, overrides, rest)


def _flag_value(arg: str, following: list[str], name: str) -> str:
    if "=" in arg:
        return arg.split("=", 1)[1]
    if not following or following[0].startswith("--"):
        raise ConfigError(f"{name} needs a value: {name}=VALUE.")
    return following.pop(0)


def resolve_config_path(path: str) -> pathlib.Path:
    """A config file's path: as given (absolute, or relative to the working directory), else
    relative to the ln_jax checkout, so `configs/bert_preln.py` works from any directory."""
    given = pathlib.Path(path).expanduser()
    for candidate in (given, REPO_ROOT / given):
        if candidate.is_file():
            return candidate.resolve()
    places = dict.fromkeys([os.getcwd(), str(REPO_ROOT)])  # once each, in order
    raise ConfigError(
        f"--config={path!r}: no such file (looked in {' and '.join(places)}); give a "
        "config file such as configs/bert_preln.py:tiny."
    )


def load_config(spec: str) -> dict[str, Any]:
    """`FILE[:variant]` -> the nested dict of FILE's `get_config(variant)`.

    Raises:
      ConfigError: a missing file, a file without `get_config`, or an unknown variant.
    """
    path_text, _, variant = spec.partition(":")
    path = resolve_config_path(path_text)
    root = str(path.parent.parent)  # configs/*.py import their siblings as `configs.common`
    if root not in sys.path:
        sys.path.insert(0, root)
    module_spec = importlib.util.spec_from_file_location(f"_ln_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config={spec!r}: {path} defines no get_config(variant).")
    try:
        config = module.get_config(variant or None)
    except ValueError as err:
        raise ConfigError(f"--config={spec!r}: {err}") from None
    return _plain(config)


def _plain(config: Any) -> dict[str, Any]:
    """A deep, plain-dict copy of a ConfigDict or mapping."""
    values = config.to_dict() if hasattr(config, "to_dict") else config
    return {
        k: _plain(v) if isinstance(v, Mapping) or hasattr(v, "to_dict") else copy.deepcopy(v)
        for k, v in values.items()
    }


def override(config: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` (nested mapping or ConfigDict) with dotted `overrides` set.

    Only fields the config declares can be set (configs/common.py declares every field of the
    typed configs). A value given as text (from a command line) is parsed to the type of the
    field's current value: "1e-3" for a float, "true"/"False" for a bool, "None" for an
    optional field; text for a field whose default is None is read as a Python literal when it
    is one ("12", "(1, 2)") and kept as text otherwise.

    Raises:
      ConfigError: naming an unknown field and the closest declared one, a section set as a
        value, or a value that does not parse as the field's type.
    """
    out = _plain(config)
    for dotted, value in overrides.items():
        node, path = out, dotted.split(".")
        for depth, key in enumerate(path):
            if not isinstance(node, dict) or key not in node:
                raise ConfigError(_unknown_field(path[:depth], key, node))
            if depth < len(path) - 1:
                node = node[key]
        leaf = path[-1]
        if isinstance(node[leaf], dict):
            first = next(iter(node[leaf]), "FIELD")
            raise ConfigError(
                f"config.{dotted} is a section, not a field; set its fields, e.g. "
                f"--config.{dotted}.{first}=VALUE."
            )
        node[leaf] = parse_value(dotted, value, node[leaf])
    return out


def _unknown_field(parents: list[str], key: str, node: Any) -> str:
    where = ".".join(parents)
    if not isinstance(node, dict):
        return f"config.{where} is a field, not a section: it has no field {key!r}."
    near = closest(key, node)
    full = lambda name: ".".join([*parents, name])
    hint = f" Did you mean {full(near)!r}?" if near else ""
    return (
        f"unknown config field {full(key)!r}.{hint} The fields of "
        f"{where or 'the config'} are: {', '.join(node)} (see configs/common.py)."
    )


def parse_value(field: str, value: Any, current: Any) -> Any:
    """`value` (text from a command line, or a Python value) as the type of `current`."""
    if not isinstance(value, str) or isinstance(current, str):
        return value
    if value.strip() == "None":
        return None
    if isinstance(current, bool):
        flag = {"true": True, "1": True, "false": False, "0": False}.get(value.strip().lower())
        if flag is None:
            raise ConfigError(f"config.{field}={value!r}: give True or False.")
        return flag
    kind = type(current) if isinstance(current, int | float) else None
    if kind is not None:
        try:
            return kind(value) if kind is float else int(value, 10)
        except ValueError:
            raise ConfigError(f"config.{field}={value!r}: give a {kind.__name__}.") from None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value  # text such as a placement name or a path


def build_config(values: Mapping[str, Any]) -> TrainConfig:
    """The typed, validated `TrainConfig` of a nested config mapping.

    Raises:
      ConfigError: any invalid field or combination, with the typed configs' message.
    """
    try:
        return TrainConfig.from_mapping(_plain(values))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from None


def config_from_command_line(
    argv: Sequence[str], default_spec: str | None = None, defaults: Mapping[str, Any] = ()
) -> tuple[dict[str, Any], CommandLine]:
    """The nested config of a command line: FILE[:variant], then `defaults`, then overrides.

    Returns:
      (the nested config mapping, the parsed command line).

    Raises:
      ConfigError: no `--config` and no default, or any error of `load_config`/`override`.
    """
    line = parse_command_line(argv, default_spec)
    if line.spec is None:
        raise ConfigError("give a config: --config=FILE[:variant], e.g. configs/bert_preln.py.")
    values = override(load_config(line.spec), dict(defaults))
    return override(values, line.overrides), line
