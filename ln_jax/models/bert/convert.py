"""HuggingFace BERT checkpoints <-> the ln_jax Post-LN model.

HuggingFace BERT is exactly ln_jax's "post" placement (LN(x + F(x)) in every sub-layer, a
LayerNorm after the embeddings, erf GELU, eps 1e-12). Only local files are read; nothing is
downloaded.

Usage::

    from ln_jax.models.bert import convert

    # A directory written by `BertForPreTraining.save_pretrained(...)` (config.json plus
    # model.safetensors or pytorch_model.bin), or a single weights file beside a config.json.
    model = convert.load_hf_bert("checkpoints/bert-tiny")        # scan_layers=True, mesh=...
    out = model(input_ids, segment_ids, attention_mask, masked_positions)

    # Back to HuggingFace: model.safetensors + config.json, for
    # `transformers.BertForPreTraining.from_pretrained("exported/")`.
    convert.export_hf_bert(model, "exported/")

Key layout: HF torch `Linear` weights are [out, in]; ln_jax kernels are [in..., out...] with
the attention projections split per head (q/k/v [D, heads, head_dim], output
[heads, head_dim, D]). The MLM decoder is tied to the word embeddings in both libraries, so the
duplicate keys `cls.predictions.decoder.{weight,bias}` are checked against their originals on
load and not written on export (`from_pretrained` re-ties them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from ln_jax.config.run import ModelConfig
from ln_jax.models import hf_io
from ln_jax.models.bert.model import BertEncoder, BertForPreTraining
from ln_jax.models.bert.options import BertOptions
from ln_jax.models.hf_io import WEIGHT_FILES, Arrays, ParamPath  # noqa: F401 (re-exported)
from ln_jax.models.hf_io import assign as _assign
from ln_jax.models.hf_io import hf_shape as _hf_shape
from ln_jax.models.hf_io import param_shapes as _param_shapes
from ln_jax.models.hf_io import to_hf as _to_hf
from ln_jax.models.hf_io import to_ln as _to_ln

_ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
_ACTIVATIONS_TO_HF = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}
# transformers.BertConfig's defaults, which HF itself applies to fields a config.json omits.
_HF_DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
}

# Buffers (not parameters) that some HF versions store in the state dict.
_BUFFER_KEYS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
# Tied copies: key -> the key whose value it must equal.
_TIED_KEYS = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
_BARE_PREFIXES = ("embeddings.", "encoder.", "pooler.")
_HEAD_PREFIXES = ("cls.", "bert.pooler.")  # not part of a BertEncoder
_NSP = ("cls.seq_relationship.", "bert.pooler.")  # not part of a model without NSP head

# A conversion "kind" says how an HF array becomes an ln_jax array:
#   "copy": same shape;  "flat": HF keeps it flat, ln_jax splits it per head;
#   1 or 2: a torch Linear weight [out, in] -> a kernel whose first 1 or 2 axes are the input.
_EMBEDDINGS = (
    ("bert.embeddings.word_embeddings.weight", ("bert", "embeddings", "word"), "copy"),
    ("bert.embeddings.position_embeddings.weight", ("bert", "embeddings", "position"), "copy"),
    ("bert.embeddings.token_type_embeddings.weight", ("bert", "embeddings", "segment"), "copy"),
    ("bert.embeddings.LayerNorm.weight", ("bert", "embeddings", "norm", "scale"), "copy"),
    ("bert.embeddings.LayerNorm.bias", ("bert", "embeddings", "norm", "bias"), "copy"),
)
_MLM_HEAD = (
    ("cls.predictions.transform.dense.weight", ("mlm", "transform", "kernel"), 1),
    ("cls.predictions.transform.dense.bias", ("mlm", "transform", "bias"), "copy"),
    ("cls.predictions.transform.LayerNorm.weight", ("mlm", "norm", "scale"), "copy"),
    ("cls.predictions.transform.LayerNorm.bias", ("mlm", "norm", "bias"), "copy"),
    ("cls.predictions.bias", ("mlm", "bias"), "copy"),
)
_NSP_HEAD = (
    ("bert.pooler.dense.weight", ("nsp", "pooler", "kernel"), 1),
    ("bert.pooler.dense.bias", ("nsp", "pooler", "bias"), "copy"),
    ("cls.seq_relationship.weight", ("nsp", "classifier", "kernel"), 1),
    ("cls.seq_relationship.bias", ("nsp", "classifier", "bias"), "copy"),
)


def _layer_entries() -> Iterator[tuple[str, ParamPath, Any]]:
    """(HF key under `bert.encoder.layer.{i}.`, ln_jax path under the layer, kind)."""
    for name in ("query", "key", "value"):
        yield f"attention.self.{name}.weight", ("attention", "branch", name, "kernel"), 1
        yield f"attention.self.{name}.bias", ("attention", "branch", name, "bias"), "flat"
    yield "attention.output.dense.weight", ("attention", "branch", "out", "kernel"), 2
    yield "attention.output.dense.bias", ("attention", "branch", "out", "bias"), "copy"
    for hf, ln in (("intermediate", "wi"), ("output", "wo")):
        yield f"{hf}.dense.weight", ("ffn", "branch", ln, "kernel"), 1
        yield f"{hf}.dense.bias", ("ffn", "branch", ln, "bias"), "copy"
    for hf, ln in (("attention.output", "attention"), ("output", "ffn")):
        yield f"{hf}.LayerNorm.weight", (ln, "post_norm", "scale"), "copy"
        yield f"{hf}.LayerNorm.bias", (ln, "post_norm", "bias"), "copy"


def _entries(
    cfg: ModelConfig, encoder_only: bool = False, nsp_head: bool = True
) -> Iterator[tuple[str, ParamPath, Any, int | None]]:
    """Every (HF key, ln_jax parameter path, kind, layer index or None) of the model (with
    the NSP head's if `nsp_head`).

    With `cfg.scan_layers` a layer parameter's path has no index (the layer is the leading axis
    of the stacked array); otherwise the index follows "layers", as in an `nnx.List`. With
    `encoder_only` the paths are those of a `BertEncoder` (no leading "bert", no heads).
    """
    for key, path, kind in _EMBEDDINGS:
        yield key, path[encoder_only:], kind, None
    for i in range(cfg.num_layers):
        prefix = ("bert", "encoder", "layers")[encoder_only:] + (() if cfg.scan_layers else (i,))
        for key, path, kind in _layer_entries():
            yield f"bert.encoder.layer.{i}.{key}", prefix + path, kind, i
    if not encoder_only:
        for key, path, kind in _MLM_HEAD + (_NSP_HEAD if nsp_head else ()):
            yield key, path, kind, None


# ---------------------------------------------------------------------------------------------
# Configuration


def config_from_hf(hf_config: Mapping[str, Any] | Any) -> ModelConfig:
    """Builds the Post-LN `ModelConfig` of a HuggingFace BERT config.

    Args:
      hf_config: the contents of a `config.json` (or a `transformers.BertConfig`); absent
        fields take `BertConfig`'s defaults, as in HF.

    Returns:
      A `ModelConfig` with placement "post" and size "custom" (the segment table's rows are
      BERT's own field: `options_from_hf`).

    Raises:
      ValueError: for an activation, position embedding type or model type ln_jax lacks.
    """
    c = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    if c.get("model_type", "bert") != "bert":
        raise ValueError(f"model_type {c['model_type']!r} is not BERT; only 'bert' converts.")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type {c['position_embedding_type']!r}: ln_jax has only "
            "learned absolute positions."
        )
    act = c.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS_FROM_HF:
        raise ValueError(
            f"hidden_act {act!r} has no ln_jax equivalent; supported: "
            f"{', '.join(_ACTIVATIONS_FROM_HF)}."
        )
    c = {**_HF_DEFAULTS, **c}
    return ModelConfig(
        size="custom",
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"],
        mlp_dim=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"],
        placement="post",
        activation=_ACTIVATIONS_FROM_HF[act],
        layer_norm_eps=c["layer_norm_eps"],
        hidden_dropout=c["hidden_dropout_prob"],
        attention_dropout=c["attention_probs_dropout_prob"],
        init_std=c["initializer_range"],
    )


def options_from_hf(hf_config: Mapping[str, Any] | Any) -> BertOptions:
    """BERT's own fields (`BertOptions`) of a HuggingFace BERT config: its segment table's
    rows (`type_vocab_size`, BertConfig's default 2) and the NSP head."""
    c = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
    return BertOptions(type_vocab_size=c.get("type_vocab_size", _HF_DEFAULTS["type_vocab_size"]))


def config_to_hf(cfg: ModelConfig, options: BertOptions | None = None) -> dict[str, Any]:
    """The HuggingFace `BertConfig` fields (a `config.json` dict) of a Post-LN `ModelConfig`
    and BERT's own fields (`options`, default BERT's)."""
    _check_convertible(cfg)
    options = BertOptions() if options is None else options
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": _ACTIVATIONS_TO_HF[cfg.activation],
        "hidden_dropout_prob": cfg.hidden_dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": options.type_vocab_size,
        "initializer_range": cfg.init_std,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def _check_convertible(cfg: ModelConfig) -> None:
    if cfg.placement != "post":
        raise ValueError(
            f"placement {cfg.placement!r}: HuggingFace BERT is Post-LN (LayerNorm after each "
            "residual add), so only placement='post' maps onto its weights."
        )
    if not cfg.embedding_layernorm:
        raise ValueError("embedding_layernorm=False: HuggingFace BERT has an embedding LayerNorm.")
    if cfg.qk_norm:
        raise ValueError("qk_norm=True: HuggingFace BERT has no query/key norms.")


# ---------------------------------------------------------------------------------------------
# Reading checkpoints


def load_hf_state_dict(path: str | os.PathLike) -> Arrays:
    """Reads a HuggingFace BERT state dict from a local file or directory into numpy arrays.

    Args:
      path: see `ln_jax.models.hf_io.read_state_dict`.

    Returns:
      {key: array}, keys in `BertForPreTraining` form: a bare `BertModel`'s keys get the
      `bert.` prefix and TF-era `LayerNorm.gamma/beta` become `weight/bias`.
    """
    return {_normalise_key(k): v for k, v in hf_io.read_state_dict(path).items()}


def _normalise_key(key: str) -> str:
    if key.startswith(_BARE_PREFIXES):
        key = "bert." + key
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    return key


# ---------------------------------------------------------------------------------------------
# HF -> ln_jax


def load_hf_bert(
    path: str | os.PathLike,
    config: ModelConfig | Mapping[str, Any] | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    scan_layers: bool | None = None,
    rules: Any = None,
    options: BertOptions | None = None,
) -> BertForPreTraining:
    """Loads a local HuggingFace `BertForPreTraining` checkpoint into the ln_jax Post-LN model.

    Args:
      path: a checkpoint directory or weights file (see `load_hf_state_dict`).
      config: a `ModelConfig` (placement "post"), an HF config dict, or None to read
        `config.json` beside the weights (the head count cannot be inferred from shapes).
      mesh: build the model sharded on this mesh (logical `rules`, default
        `ln_jax.sharding.DEFAULT_RULES`) and place each array in its parameter's sharding.
      scan_layers: stack the layers for `lax.scan`; None keeps the config's setting.
      rules: logical axis rules used with `mesh`.
      options: BERT's own fields (`BertOptions`); None: the checkpoint's segment table's rows
        and the NSP head (`nsp_head=False` drops a checkpoint's NSP weights).

    Returns:
      The model with every parameter taken from the checkpoint.

    Raises:
      ValueError: non-"post" placement; missing or unexpected keys (all listed); the first
        key whose shape differs (both shapes, in HF layout); an untied MLM decoder.
      FileNotFoundError: no checkpoint or no config at `path`.
    """
    return _load(BertForPreTraining, path, config, mesh, scan_layers, rules, options)


def load_hf_encoder(
    path: str | os.PathLike,
    config: ModelConfig | Mapping[str, Any] | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    scan_layers: bool | None = None,
    rules: Any = None,
) -> BertEncoder:
    """Loads the embeddings and encoder of a `BertModel` or `BertForPreTraining` checkpoint.

    The pooler and the pretraining heads, if present, are ignored. Arguments, errors and the
    result's sharding are as in `load_hf_bert`.

    Returns:
      An ln_jax `BertEncoder` (ids -> `(hidden [batch, length, hidden], intermediates)`).
    """
    return _load(BertEncoder, path, config, mesh, scan_layers, rules)


def _load(
    cls: type, path: Any, config: Any, mesh: Any, scan_layers: Any, rules: Any, options=None
) -> Any:
    cfg = _resolve_config(Path(path), config)
    if scan_layers is not None:
        cfg = cfg.replace(scan_layers=scan_layers)
    _check_convertible(cfg)
    hf = load_hf_state_dict(path)
    if options is None:  # the checkpoint's segment rows (a missing table: _check_keys says so)
        segment = hf.get(_EMBEDDINGS[2][0])
        options = BertOptions(type_vocab_size=2 if segment is None else segment.shape[0])
    encoder_only = cls is BertEncoder

    def build() -> Any:
        if encoder_only:
            return cls(cfg, rngs=nnx.Rngs(params=0), type_vocab_size=options.type_vocab_size)
        return cls(cfg, rngs=nnx.Rngs(params=0), options=options)

    model = hf_io.target_model(build, mesh, rules)
    arrays = _ln_arrays(cfg, hf, _param_shapes(model), encoder_only, options.nsp_head)
    _assign(model, arrays)
    return model


def _resolve_config(path: Path, config: ModelConfig | Mapping[str, Any] | None) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    if config is not None:
        return config_from_hf(config)
    file = (path if path.is_dir() else path.parent) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"no config.json at {str(file)!r}; pass `config=` (a ModelConfig or HF config dict)."
        )
    return config_from_hf(json.loads(file.read_text()))


def _is_vocab_table(path: ParamPath) -> bool:
    """The word embeddings and the MLM bias: ln_jax's may have `padded_vocab_size` rows."""
    return path[-2:] == ("embeddings", "word") or path == ("mlm", "bias")


def _pad_vocab(x: np.ndarray, rows: int) -> np.ndarray:
    """HF's [vocab_size, ...] table with zero rows appended up to `rows` (never looked up)."""
    return np.concatenate([x, np.zeros((rows - x.shape[0], *x.shape[1:]), x.dtype)])


def _ln_arrays(
    cfg: ModelConfig,
    hf: Arrays,
    shapes: Mapping[ParamPath, tuple[int, ...]],
    encoder_only: bool = False,
    nsp_head: bool = True,
) -> dict[ParamPath, np.ndarray]:
    """Checks the HF keys and shapes and converts them to {ln_jax path: float32 array}."""
    entries = list(_entries(cfg, encoder_only, nsp_head))
    _check_keys(cfg, hf, {key for key, *_ in entries}, encoder_only, encoder_only or not nsp_head)
    per_layer: dict[ParamPath, list[np.ndarray]] = {}
    out: dict[ParamPath, np.ndarray] = {}
    for key, path, kind, layer in entries:
        stacked = cfg.scan_layers and layer is not None
        shape = shapes[path][1:] if stacked else shapes[path]
        padded = _is_vocab_table(path) and shape[0] != cfg.vocab_size
        if padded:
            shape, padded_rows = (cfg.vocab_size, *shape[1:]), shape[0]
        want = _hf_shape(kind, shape)
        if tuple(hf[key].shape) != want:
            raise ValueError(
                f"shape mismatch at {key!r}: the checkpoint has {tuple(hf[key].shape)}, "
                f"the model expects {want} (HF layout)."
            )
        x = _to_ln(np.asarray(hf[key], np.float32), kind, shape)
        if padded:
            x = _pad_vocab(x, padded_rows)
        if stacked:
            per_layer.setdefault(path, []).append(x)
        else:
            out[path] = x
    out.update({path: np.stack(xs) for path, xs in per_layer.items()})
    return out


def _check_keys(
    cfg: ModelConfig, hf: Arrays, expected: set[str], encoder_only: bool, headless: bool
) -> None:
    """Raises ValueError listing missing and unexpected keys; checks tied duplicates.
    `headless`: the module has no NSP head (or, `encoder_only`, no heads)."""
    ignored = set(_BUFFER_KEYS) | set(_TIED_KEYS)
    if headless:  # heads the module lacks are dropped on purpose
        ignored |= {k for k in hf if k.startswith(_HEAD_PREFIXES if encoder_only else _NSP)}
    missing = sorted(expected - hf.keys())
    unexpected = sorted(hf.keys() - expected - ignored)
    if missing or unexpected:
        hint = ""
        if missing and all(k.startswith(_HEAD_PREFIXES) for k in missing):
            hint = " A bare BertModel checkpoint has no pretraining heads: use load_hf_encoder."
        raise ValueError(
            f"checkpoint does not match the model ({cfg.num_layers} layers): "
            f"missing keys {missing}; unexpected keys {unexpected}.{hint}"
        )
    for copy, original in () if encoder_only else _TIED_KEYS.items():
        if copy in hf and not np.array_equal(hf[copy], hf[original]):
            raise ValueError(
                f"{copy!r} differs from {original!r}: ln_jax ties the MLM decoder to the word "
                "embeddings and cannot hold an untied decoder."
            )


# ---------------------------------------------------------------------------------------------
# ln_jax -> HF


def to_hf_state_dict(model: BertForPreTraining, *, tied: bool = False) -> Arrays:
    """The HuggingFace `BertForPreTraining` state dict of an ln_jax Post-LN model.

    Args:
      model: an ln_jax `BertForPreTraining` with placement "post" (list or scanned layers).
      tied: also emit the tied duplicates `cls.predictions.decoder.{weight,bias}`, as
        `torch_model.state_dict()` has them (needed by `load_state_dict(strict=True)`).

    Returns:
      {HF key: float32 numpy array} in torch layout. The parameters must be fully addressable
      from this process (gather them first on a multi-host mesh).
    """
    cfg = model.cfg
    _check_convertible(cfg)
    state = nnx.to_flat_state(nnx.state(model, nnx.Param))
    host = {path: np.asarray(jax.device_get(var.get_value())) for path, var in state}
    out: Arrays = {}
    for key, path, kind, layer in _entries(cfg, nsp_head=model.options.nsp_head):
        x = host[path][layer] if cfg.scan_layers and layer is not None else host[path]
        if _is_vocab_table(path):
            x = x[: cfg.vocab_size]  # padded rows are not part of the vocabulary
        out[key] = np.ascontiguousarray(_to_hf(np.array(x, np.float32), kind))  # a copy
    if tied:
        out.update({copy: out[original].copy() for copy, original in _TIED_KEYS.items()})
    return out


def export_hf_bert(model: BertForPreTraining, path: str | os.PathLike) -> Path:
    """Writes `model.safetensors` and `config.json` for `BertForPreTraining.from_pretrained`.

    The tied decoder keys are left out, as `save_pretrained` does; `from_pretrained` re-ties
    them without reporting missing keys. A model built without the NSP head has no pooler or
    `cls.seq_relationship` to write (`from_pretrained` would initialise them afresh).

    Args:
      model: an ln_jax Post-LN `BertForPreTraining`.
      path: output directory (created if needed).

    Returns:
      The directory.
    """
    from safetensors.numpy import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(to_hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(
        json.dumps(config_to_hf(model.cfg, model.options), indent=2) + "\n"
    )
    return out
