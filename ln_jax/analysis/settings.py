"""What every measurement shares: the base config, seeds, batches, setting, and the arms.

An *arm* is one model family under measurement: fresh initialisations of a `ModelConfig` (one
model per seed), or one trained checkpoint. Two settings exist:

* "bert": the BERT model of `config.model` on real corpus batches (or random tokens), with the
  placement and depth of each arm. The analysis defaults use Xavier initialisation at CPU width
  (d = 128): with BERT's fixed sigma = 0.02 the residual branches start nearly silent at small
  width and the papers' effects vanish (see docs/analysis.md).
* "theory": Xiong et al.'s (2020, section 3.3) setting: single-head attention with
  W^Q = W^K = 0, d x d FFN matrices, ReLU, Xavier weights, zero biases, Gaussian input vectors
  x ~ N(0, I_d) fed straight into the encoder stack (no embeddings), softmax loss over a fixed
  random output embedding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ln_jax.config.load import build_config, defaults_for, load_config, override
from ln_jax.config.run import ModelConfig, TrainConfig, check_choice
from ln_jax.data.config import DataConfig
from ln_jax.nn.placements import PLACEMENTS, parse_placement

# The config of every analysis unless --config names another.
DEFAULT_CONFIG = "configs/bert_preln.py:tiny"
SETTINGS = ("bert", "theory")
DATA_SOURCES = ("corpus", "random")
# Vocabulary of the theory setting's output softmax (its loss only needs some fixed W^emb).
THEORY_VOCAB = 512

# Applied on top of any config: Xavier weights (see the module docstring) and short sequences
# so that every subcommand runs in minutes on a CPU. Explicit overrides win.
ANALYSIS_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {
        "size": "tiny",
        "init": "xavier",
        "max_position_embeddings": 128,
        "scan_layers": True,
        "scan_unroll": 1,  # one layer a scan iteration: one program whatever the depth
    },
    "data": {"max_seq_length": 64, "global_batch_size": 16},
    "bert": {"max_predictions_per_seq": 10},  # a config of another family has no "bert"
}


def analysis_defaults() -> dict[str, Any]:
    """`ANALYSIS_DEFAULTS` as dotted fields ("model.init": "xavier", ...)."""
    return {
        f"{section}.{k}": v
        for section, fields in ANALYSIS_DEFAULTS.items()
        for k, v in fields.items()
    }


def analysis_config(
    base: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> TrainConfig:
    """The typed run config of an analysis.

    Args:
      base: a nested config (e.g. `get_config("tiny")`); None = `DEFAULT_CONFIG`'s.
      overrides: dotted fields to values ("model.hidden_size": 64), applied last (through
        `ln_jax.config.load.override`, as on every command line).

    Returns:
      `TrainConfig` of `base` with `ANALYSIS_DEFAULTS` and then `overrides` applied.
    """
    values = load_config(DEFAULT_CONFIG) if base is None else base
    values = override(override(values, defaults_for(values, analysis_defaults())), overrides or {})
    return build_config(values)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every measurement shares.

    Attributes:
      config: the base run config: model (each arm sets placement and num_layers), data
        (batch size, sequence length, corpus) and optim (the Adam steps of `layers`).
      seeds: initialisation seeds, one fresh model per seed (the paper uses 10).
      batches: mini-batches each model is measured on; every model sees the same batches.
      setting: "bert" or "theory" (see the module docstring).
      data: "corpus" (real batches of `config.data`) or "random" (uniform random tokens and
        masks); the theory setting always uses Gaussian inputs.
      checkpoint: a trained run (its workdir, or the checkpoints/ folder in it) measured as an
        extra arm labelled "checkpoint" beside the fresh initialisations; bert setting only.
    """

    config: TrainConfig = dataclasses.field(default_factory=analysis_config)
    seeds: tuple[int, ...] = tuple(range(10))
    batches: int = 4
    setting: str = "bert"
    data: str = "corpus"
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        check_choice("setting", self.setting, SETTINGS)
        check_choice("data", self.data, DATA_SOURCES)
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not self.seeds:
            raise ValueError("no seeds given; use at least one, e.g. --seeds=10 (seeds 0..9).")
        if self.batches < 1:
            raise ValueError(f"batches={self.batches}; measure at least one mini-batch.")
        if self.checkpoint and self.setting == "theory":
            raise ValueError(
                "a checkpoint is a trained BERT model; measure it with --setting=bert "
                "(the theory setting has no trained counterpart)."
            )

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One model family under measurement.

    Attributes:
      label: the key in the results: the placement, or "checkpoint".
      model: the model config (for a checkpoint: the config it was trained with).
      data: batch shapes and corpus of the arm's batches.
      checkpoint: checkpoint path, or None for fresh initialisations (one per seed).
      options: the task's own fields of the arm (a checkpoint's with the analysis's masked
        positions); None = those of the config the arm is measured in.
    """

    label: str
    model: ModelConfig
    data: DataConfig
    checkpoint: str | None = None
    options: Any = None


def check_placements(placements: Sequence[str]) -> tuple[str, ...]:
    """Validates the placements to compare; raises ValueError naming the bad one and the fix.

    Each item is one arm: a placement name or a per-layer list ("post*3,pre*3"); a bare
    string is one arm.
    """
    placements = (placements,) if isinstance(placements, str) else placements
    names = tuple(p.strip() for p in placements if p.strip())
    if not names:
        raise ValueError(
            "no placement given; name at least one, e.g. --placements=post,pre "
            f"(valid: {', '.join(PLACEMENTS)}, or a per-layer list such as 'post*3,pre*3')."
        )
    for name in names:
        for item in name.split(","):
            base = item.strip().partition("*")[0]
            if base not in (*PLACEMENTS, "mixln"):
                raise ValueError(
                    f"unknown placement {base!r} in --placements; valid names: "
                    f"{', '.join(sorted((*PLACEMENTS, 'mixln')))}."
                )
    return names


def check_depths(num_layers: Sequence[int], *, single: bool = False) -> tuple[int, ...]:
    """Validates a list of encoder depths (positive, non-empty; one value if `single`)."""
    depths = tuple(int(n) for n in num_layers)
    if not depths:
        raise ValueError("the layer list is empty; give depths, e.g. --num_layers=6,8,10,12,14.")
    bad = [n for n in depths if n < 1]
    if bad:
        raise ValueError(f"--num_layers has non-positive depths {bad}; every depth must be >= 1.")
    if single and len(depths) != 1:
        raise ValueError(f"this measurement takes one depth, got --num_layers={list(depths)}.")
    return depths


def one_depth(num_layers: int | Sequence[int]) -> int:
    """The single depth of a per-layer measurement (an int, or a list of one)."""
    values = [num_layers] if isinstance(num_layers, int) else list(num_layers)
    return check_depths(values, single=True)[0]


def arm_model(settings: Settings, placement: str, num_layers: int) -> ModelConfig:
    """The ModelConfig of one arm: the base model, or the theory setting, at this depth."""
    base = settings.config.model
    parse_placement(placement, num_layers)  # a per-layer list must name num_layers layers
    # A scanned stack compiles once whatever the depth; it needs one placement for all layers.
    scan = base.scan_layers and len(set(parse_placement(placement, num_layers))) == 1
    if settings.setting == "bert":
        scan = scan and not base.dlcl
        return base.replace(
            placement=placement,
            num_layers=num_layers,
            scan_layers=scan,
            scan_unroll=base.scan_unroll if scan else 1,
        )
    cfg = ModelConfig(
        size="custom",
        vocab_size=THEORY_VOCAB,
        hidden_size=base.hidden_size,
        num_layers=num_layers,
        num_heads=1,
        mlp_dim=base.hidden_size,
        placement=placement,
        norm=base.norm,
        admin_omega=base.admin_omega,
        activation="relu",
        layer_norm_eps=base.layer_norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init="xavier",
        scan_layers=scan,
    )
    if cfg.admin_omega == "profile" and "admin" in cfg.layer_placements:
        raise ValueError(
            "Admin's omega is profiled on the BERT model; in the theory setting use "
            "--config.model.admin_omega=closed_form, or measure Admin with --setting=bert."
        )
    return cfg


def make_arms(settings: Settings, placements: Sequence[str], num_layers: int) -> list[Arm]:
    """One arm per placement at `num_layers` layers (the checkpoint arm is added separately)."""
    return [
        Arm(p, arm_model(settings, p, num_layers), settings.config.data)
        for p in check_placements(placements)
    ]


def depth_arms(
    settings: Settings, placements: Sequence[str], num_layers: Sequence[int]
) -> dict[str, dict[int, Arm]]:
    """{placement: {depth: arm}}, every arm validated before anything is measured."""
    depths = check_depths(num_layers)
    return {
        p: {n: Arm(p, arm_model(settings, p, n), settings.config.data) for n in depths}
        for p in check_placements(placements)
    }


def describe(settings: Settings, **extra: Any) -> dict[str, Any]:
    """The "config" section of a result: everything needed to reproduce the numbers."""
    model = dataclasses.asdict(settings.config.model)
    model.pop("placement")
    model.pop("num_layers")
    data = settings.config.data
    if settings.setting == "theory":
        inputs = "Gaussian vectors x ~ N(0, I_d) fed to the encoder stack"
    elif settings.data == "corpus":
        inputs = f"real batches of the corpus {data.dataset!r} (MLM + NSP loss)"
    else:
        inputs = "random tokens (uniform ids, random masked positions and labels)"
    out = {
        "setting": settings.setting,
        "inputs": inputs,
        "seeds": list(settings.seeds),
        "batches_per_model": settings.batches,
        "batch_size": data.global_batch_size,
        "seq_length": data.max_seq_length,
        "init": settings.config.model.init if settings.setting == "bert" else "xavier",
        "hidden_size": settings.config.model.hidden_size,
        "dropout": "off: deterministic forward passes (the model rates below are unused)",
        "model": model if settings.setting == "bert" else _theory_description(settings),
        "checkpoint": settings.checkpoint,
    }
    out.update(extra)
    return out


def _theory_description(settings: Settings) -> dict[str, Any]:
    d = settings.config.model.hidden_size
    return {
        "hidden_size": d,
        "num_heads": 1,
        "mlp_dim": d,
        "attention": "W^Q = W^K = 0 (uniform attention)",
        "activation": "relu",
        "init": "xavier (variance 2/(fan_in+fan_out) = 1/d), zero biases",
        "norm": settings.config.model.norm,
        "output": f"softmax over a fixed W^emb [{THEORY_VOCAB}, d] ~ N(0, 1/d), random labels",
    }
