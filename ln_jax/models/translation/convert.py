"""HuggingFace Marian checkpoints -> the ln_jax translation model (`Translator`).

A Marian model (`transformers.MarianMTModel`, e.g. a downloaded `Helsinki-NLP/opus-mt-de-en`
folder) is ln_jax's "post" placement in both stacks: LN(x + F(x)) in every sub-layer, no
embedding LayerNorm, no final norms, sinusoidal positions with the sines in the first half,
token embeddings scaled by sqrt(d) (`scale_embedding`), one table for source, target and the
output projection, and a `final_logits_bias`. Its special ids differ from ln_jax's own
vocabularies (pad = vocab - 1, eos = 0, the decoder starts with pad), so they become
`TranslationOptions.pad_id / bos_id / eos_id`. Only local files are read.

Usage::

    from ln_jax.models.translation import convert

    model = convert.load_marian("opus-mt-de-en")         # Translator, options from config.json
    cfg, options = convert.marian_config(json.load(open("opus-mt-de-en/config.json")))

`hf:PATH` names such a folder wherever ln_jax takes a translation model: `python -m
ln_jax.translate --workdir=hf:PATH` (with the folder's own tokenizer, `ln_jax.data.
marian_vocab`), `--config=configs/mt.py:hf:PATH` to fine-tune it with `train.py`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from ln_jax.config.run import ModelConfig
from ln_jax.models import hf_io
from ln_jax.models.translation.model import Translator
from ln_jax.models.translation.options import TranslationOptions
from ln_jax.nn.embed import sinusoidal

HF_PREFIX = "hf:"
_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu",
                "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}  # fmt: skip
# Fields that must agree between Marian's two stacks for ln_jax's one ModelConfig.
_SAME = (("encoder_attention_heads", "decoder_attention_heads"),
         ("encoder_ffn_dim", "decoder_ffn_dim"))  # fmt: skip
_ATTENTION = (("q_proj", "query", 1, "flat"), ("k_proj", "key", 1, "flat"),
              ("v_proj", "value", 1, "flat"), ("out_proj", "out", 2, "copy"))  # fmt: skip
_SUBLAYERS = {  # Marian's sub-layer -> (ln_jax sub-layer, Marian's LayerNorm after it)
    "encoder": (("self_attn", "attention", "self_attn_layer_norm"),),
    "decoder": (
        ("self_attn", "self_attention", "self_attn_layer_norm"),
        ("encoder_attn", "cross_attention", "encoder_attn_layer_norm"),
    ),
}
# Copies of the shared table that a checkpoint may hold (checked equal, not loaded twice).
_TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
_POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


class MarianError(ValueError):
    """The folder is not a Marian model ln_jax can hold (the message says why)."""


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The `config.json` of a Marian folder (a one-line error if it is absent or not Marian)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise MarianError(
            f"hf:{path}: no config.json there; give a folder written by "
            "MarianMTModel.save_pretrained (e.g. a downloaded Helsinki-NLP/opus-mt-de-en)."
        )
    config = json.loads(file.read_text())
    if config.get("model_type") != "marian":
        raise MarianError(
            f"hf:{path}: model_type {config.get('model_type')!r}; only 'marian' models convert."
        )
    return config


def marian_config(hf: Mapping[str, Any], **model_fields: Any) -> tuple[ModelConfig, dict]:
    """(ModelConfig, the "translation" section's fields) of a Marian config.json;
    `model_fields` override the model's (e.g. scan_layers, dtype, vocab_multiple).

    Raises:
      MarianError: an activation ln_jax lacks, unequal encoder/decoder widths, separate
        source and target vocabularies.
    """
    act = hf.get("activation_function", "gelu")
    if act not in _ACTIVATIONS:
        raise MarianError(f"activation_function {act!r} has no ln_jax equivalent.")
    for enc, dec in _SAME:
        if hf.get(enc) != hf.get(dec):
            raise MarianError(
                f"{enc}={hf.get(enc)} != {dec}={hf.get(dec)}: ln_jax's stacks share one width."
            )
    if not hf.get("share_encoder_decoder_embeddings", True):
        raise MarianError("separate source and target vocabularies: ln_jax shares one table.")
    cfg = ModelConfig(
        size="custom",
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["d_model"]),
        num_layers=int(hf["encoder_layers"]),
        num_heads=int(hf["encoder_attention_heads"]),
        mlp_dim=int(hf["encoder_ffn_dim"]),
        placement="post",
        activation=_ACTIVATIONS[act],
        hidden_dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        embedding_layernorm=False,
        layer_norm_eps=1e-5,  # torch.nn.LayerNorm's
        max_position_embeddings=int(hf["max_position_embeddings"]),
        init="xavier",
        **{"vocab_multiple": 8, **model_fields},
    )
    pad, longest = int(hf["pad_token_id"]), cfg.max_position_embeddings - 1
    options = {
        **dataclasses.asdict(TranslationOptions()),
        "decoder_layers": int(hf["decoder_layers"]),
        "positions": "sinusoidal",
        "scale_embeddings": bool(hf.get("scale_embedding", False)),
        "tie_output": bool(hf.get("tie_word_embeddings", True)),
        "pad_id": pad,
        "bos_id": int(hf.get("decoder_start_token_id", pad)),
        "eos_id": int(hf["eos_token_id"]),
        "output_bias": True,
        "max_source_length": min(TranslationOptions.max_source_length, longest),
        "max_target_length": min(TranslationOptions.max_target_length, longest),
    }
    return cfg, options


Entry = tuple[str, tuple, Any, "int | None"]


def _entries(cfg: ModelConfig, options: TranslationOptions) -> Iterator[Entry]:
    """Every (HF key, ln_jax parameter path, layout, layer index or None)."""
    yield "model.shared.weight", ("embed", "word"), "copy", None
    yield "final_logits_bias", ("bias",), "flat", None
    if not options.tie_output:
        yield "lm_head.weight", ("output", "kernel"), 1, None
    for stack, depth in (("encoder", cfg.num_layers), ("decoder", options.decoder_layers)):
        for i in range(depth):
            hf = f"model.{stack}.layers.{i}."
            ln = (stack, "layers") + (() if cfg.scan_layers else (i,))
            for path, kind in _layer(stack):
                yield hf + path[0], ln + path[1], kind, i


def _layer(stack: str) -> Iterator[tuple[tuple[str, tuple], Any]]:
    """((HF key under the layer, ln_jax path under the layer), layout) of one layer."""
    for hf_sub, ln_sub, norm in _SUBLAYERS[stack]:
        for hf_name, ln_name, kind, bias_kind in _ATTENTION:
            yield (f"{hf_sub}.{hf_name}.weight", (ln_sub, "branch", ln_name, "kernel")), kind
            yield (f"{hf_sub}.{hf_name}.bias", (ln_sub, "branch", ln_name, "bias")), bias_kind
        yield from _norm(norm, ln_sub)
    for hf_name, ln_name in (("fc1", "wi"), ("fc2", "wo")):
        yield (f"{hf_name}.weight", ("ffn", "branch", ln_name, "kernel")), 1
        yield (f"{hf_name}.bias", ("ffn", "branch", ln_name, "bias")), "copy"
    yield from _norm("final_layer_norm", "ffn")


def _norm(hf: str, ln_sub: str) -> Iterator[tuple[tuple[str, tuple], Any]]:
    yield (f"{hf}.weight", (ln_sub, "post_norm", "scale")), "copy"
    yield (f"{hf}.bias", (ln_sub, "post_norm", "bias")), "copy"


def read_marian_state(path: str | Path) -> hf_io.Arrays:
    """The checkpoint's arrays, keys in `MarianMTModel` form (a bare `MarianModel`'s keys get
    the `model.` prefix)."""
    arrays = hf_io.read_state_dict(path)
    bare = ("shared.", "encoder.", "decoder.")
    return {("model." + k if k.startswith(bare) else k): v for k, v in arrays.items()}


def load_marian(
    path: str | Path,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules: Any = None,
    **model_fields: Any,
) -> Translator:
    """Loads a local Marian folder (config.json + model.safetensors / pytorch_model.bin) into
    a `Translator` (float32 arrays; `model_fields` override the ModelConfig, e.g.
    scan_layers=True). With `mesh`, each array is placed in its parameter's sharding.

    Raises:
      MarianError: missing or unexpected keys (listed), an array whose shape differs, tied
        copies that differ, positions that are not Marian's sinusoids.
    """
    cfg, values = marian_config(read_hf_config(path), **model_fields)
    options = TranslationOptions.from_mapping(values, cfg)
    hf = read_marian_state(path)
    build = lambda: Translator(cfg, options, rngs=nnx.Rngs(params=0))  # noqa: E731
    model = hf_io.target_model(build, mesh, rules)
    hf_io.assign(model, marian_arrays(cfg, options, hf, hf_io.param_shapes(model)))
    return model


def marian_arrays(
    cfg: ModelConfig, options: TranslationOptions, hf: hf_io.Arrays, shapes: Mapping[tuple, tuple]
) -> dict[tuple, np.ndarray]:
    """{ln_jax path: float32 array} of a Marian state dict, checked key by key."""
    entries = list(_entries(cfg, options))
    _check_keys(hf, {key for key, *_ in entries}, options)
    out: dict[tuple, np.ndarray] = {}
    stacked: dict[tuple, list[np.ndarray]] = {}
    for key, path, kind, layer in entries:
        shape = shapes[path][1:] if cfg.scan_layers and layer is not None else shapes[path]
        rows = shape[0] if path in (("embed", "word"), ("bias",)) else None
        if rows is not None:
            shape = (cfg.vocab_size, *shape[1:])  # ln_jax pads the vocabulary
        x = np.asarray(hf[key], np.float32)
        if key == "final_logits_bias":
            x = x.reshape(-1)
        hf_io.check_shape(key, x.shape, kind, shape)
        x = hf_io.to_ln(x, kind, shape)
        if rows is not None:
            x = np.concatenate([x, np.zeros((rows - x.shape[0], *x.shape[1:]), x.dtype)])
        if cfg.scan_layers and layer is not None:
            stacked.setdefault(path, []).append(x)
        else:
            out[path] = x
    out.update({path: np.stack(xs) for path, xs in stacked.items()})
    return out


def _check_keys(hf: hf_io.Arrays, expected: set[str], options: TranslationOptions) -> None:
    ignored = set(_TIED) | set(_POSITIONS) | ({"lm_head.weight"} if options.tie_output else set())
    missing, unexpected = sorted(expected - hf.keys()), sorted(hf.keys() - expected - ignored)
    if missing or unexpected:
        raise MarianError(
            f"the checkpoint does not match its config.json: missing keys {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}; unexpected keys {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}."
        )
    table = hf["model.shared.weight"]
    copies = list(_TIED) + (["lm_head.weight"] if options.tie_output else [])
    for key in copies:
        if key in hf and not np.array_equal(hf[key], table):
            raise MarianError(f"{key!r} differs from model.shared.weight: ln_jax ties them.")
    for key in _POSITIONS:
        if key in hf:
            n, d = hf[key].shape
            if not np.allclose(hf[key], np.asarray(sinusoidal(n, d)), atol=1e-5):
                raise MarianError(f"{key!r} is not Marian's sinusoidal table (ln_jax's).")
