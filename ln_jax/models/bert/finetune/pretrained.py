"""Where fine-tuning starts: a pretraining workdir (latest or named step) or a HF directory.

`load_pretrained` returns the encoder's config and parameters (and BERT's pooler when the
source has one: the pretrained NSP head's, or HF's `bert.pooler`) plus the tokenizer the
encoder was trained with:

* a workdir of `train.py`: the model config is the run's own (`WORKDIR/config.json`), so every
  placement it can train loads (per-layer lists, Admin with its learned omega, DeepNorm,
  scan_layers, ...); the arrays come from its orbax checkpoint, restored straight into their
  shardings on the fine-tuning mesh; the tokenizer is the run's (its data config);
* `hf:PATH`: `ln_jax.models.bert.convert.load_hf_encoder` (Post-LN), the WordPiece vocabulary of
  `PATH/vocab.txt` (needs the `tokenizers` package).

`cached_pretrained` keeps the last source loaded (every run of a grid starts from it: each
run's `GlueClassification.initialize` copies it into its classifier with `warm_start`);
`release` drops it. Every failure the user can fix is a `ConfigError`/`CheckpointError`
naming it and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from ln_jax import paths
from ln_jax.config.load import build_config
from ln_jax.config.run import CheckpointConfig, ModelConfig
from ln_jax.models.bert.finetune.config import HF_PREFIX, FinetuneConfig
from ln_jax.task import make_task
from ln_jax.train import run_identity, steps
from ln_jax.train.checkpoint import Checkpointer
from ln_jax.validate import ConfigError


@dataclasses.dataclass
class Pretrained:
    """A pretrained encoder, ready to be copied into a classifier.

    Attributes:
      model: the encoder's config.
      encoder: the `BertEncoder`'s parameters as a pure dict of (sharded) arrays.
      pooler: {"kernel" [D, D], "bias" [D]} if the source has BERT's pooler, else None.
      tokenizer: `encode(texts)`, `cls_id`, `sep_id`, `pad_id`, `vocab_size`.
      source: the workdir or hf:PATH.
      step: the pretraining step restored (None for HF).
    """

    model: ModelConfig
    encoder: dict
    pooler: dict | None
    tokenizer: Any
    source: str
    step: int | None

    @property
    def type_vocab_size(self) -> int:
        """Rows of the source's segment embedding (`BertOptions.type_vocab_size`)."""
        return int(self.encoder["embeddings"]["segment"].shape[0])


def load_pretrained(cfg: FinetuneConfig, mesh) -> Pretrained:
    """The encoder of `cfg.init_from` (and `cfg.init_step`), its arrays placed on `mesh`."""
    return load_source(cfg.init_from, cfg.init_step, mesh)


def load_source(init_from: str | None, init_step: int | None, mesh) -> Pretrained:
    """The encoder of a pretraining workdir (its step `init_step`, None = the latest) or of
    "hf:PATH", its arrays placed on `mesh`."""
    if not init_from:
        raise ConfigError(
            "config.init_from is not set: give a pretraining workdir "
            "(--config.init_from=workdirs/bert_preln_tiny) or a local HuggingFace BERT "
            "directory (--config.init_from=hf:PATH)."
        )
    if init_from.startswith(HF_PREFIX):
        return _from_hf(init_from[len(HF_PREFIX) :], mesh)
    return _from_workdir(init_from, init_step, mesh)


_LOADED: dict[tuple, Pretrained] = {}


def cached_pretrained(init_from: str | None, init_step: int | None, mesh) -> Pretrained:
    """`load_source`, kept until the next source is asked for (or `release`): found again
    under its resolved step too, so that "latest" and its number share one copy."""
    key = (init_from, init_step, mesh)
    if key not in _LOADED:
        release()
        found = load_source(init_from, init_step, mesh)
        _LOADED[key] = _LOADED[(init_from, found.step, mesh)] = found
    return _LOADED[key]


def release() -> None:
    """Drops the source `cached_pretrained` keeps."""
    _LOADED.clear()


def warm_start(model: Any, pre: Pretrained) -> None:
    """Sets a `BertClassifier`'s encoder (and pooler, if the source has one) to the source's
    arrays in place, in the classifier's shardings; its classifier layer stays as it is."""
    state = nnx.state(model, nnx.Param)
    values = nnx.to_pure_dict(state)
    values["bert"] = _placed_like(pre.encoder, values["bert"])
    if pre.pooler is not None:
        values["pooler"] = _placed_like(pre.pooler, values["pooler"])
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)


def _placed_like(source: dict, target: dict) -> dict:
    """`source`'s arrays in `target`'s shardings; a shape that differs is a ConfigError."""

    def place(path, new, old):
        if tuple(new.shape) != tuple(old.shape):
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            raise ConfigError(
                f"pretrained parameter {name} has shape {tuple(new.shape)}, the encoder of its "
                f"config {tuple(old.shape)}: the checkpoint does not fit its config."
            )
        return jax.device_put(new, old.sharding, may_alias=False)  # the step donates it

    return jax.tree_util.tree_map_with_path(place, source, target)


# --------------------------------------------------------------------------- ln_jax workdirs


def _workdir_config(workdir: str):
    """The TrainConfig a pretraining workdir was trained with."""
    if not paths.as_path(workdir).is_dir():
        raise ConfigError(
            f"init_from={workdir!r}: no such workdir; give a workdir written by train.py "
            "(e.g. workdirs/bert_preln_tiny) or hf:PATH for a HuggingFace directory."
        )
    stored = run_identity.read_config(workdir)
    if stored is None:
        raise ConfigError(
            f"init_from={workdir!r} holds no {run_identity.CONFIG_FILE}: it is not a workdir "
            "of train.py (or its run never started); give a pretraining workdir."
        )
    return build_config(stored)


def _from_workdir(workdir: str, step: int | None, mesh) -> Pretrained:
    pre = _workdir_config(workdir)
    folder = paths.as_path(workdir) / "checkpoints"
    if not folder.is_dir():
        raise ConfigError(
            f"init_from={workdir!r} has no checkpoints/ folder: train it first (train.py "
            f"--workdir={workdir})."
        )
    ckpt = Checkpointer(os.fspath(folder), CheckpointConfig(keep=1 << 30, async_save=False))
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"init_from={workdir!r} holds no checkpoint; train it first.")
        target = steps.abstract_state(make_task(pre), mesh).state
        params = nnx.to_pure_dict(ckpt.restore_step(step, target)["params"])
    finally:
        ckpt.close()
    from ln_jax.data.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(pre.data)
    _check_vocab(tokenizer.vocab_size, pre.model, workdir)
    pooler = params["nsp"]["pooler"] if "nsp" in params else None
    return Pretrained(pre.model, params["bert"], pooler, tokenizer, workdir, step)


def _check_vocab(tokenizer_size: int, model: ModelConfig, source: str) -> None:
    if tokenizer_size > model.vocab_size:
        raise ConfigError(
            f"init_from={source!r}: the tokenizer has {tokenizer_size} ids but the checkpoint's "
            f"embeddings only {model.vocab_size}; give the tokenizer the encoder was trained "
            "with (the checkpoint's own data config / vocab.txt)."
        )


# --------------------------------------------------------------------------- HuggingFace


class WordPieceTokenizer:
    """BERT's WordPiece vocabulary (`vocab.txt`) through the `tokenizers` package."""

    def __init__(self, vocab_file: Path, lowercase: bool):
        try:
            from tokenizers import BertWordPieceTokenizer
        except ImportError:
            raise ConfigError(
                "fine-tuning a HuggingFace checkpoint reads its vocab.txt with the `tokenizers` "
                "package: pip install tokenizers"
            ) from None
        self._tok = BertWordPieceTokenizer(str(vocab_file), lowercase=lowercase)
        self.vocab_size = self._tok.get_vocab_size()
        ids = {p: self._tok.token_to_id(p) for p in ("[CLS]", "[SEP]", "[PAD]")}
        if None in ids.values():
            missing = [p for p, i in ids.items() if i is None]
            raise ConfigError(f"{vocab_file} lacks BERT's special tokens {missing}.")
        self.cls_id, self.sep_id, self.pad_id = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Ids of each text, no special tokens: a list of int32 [n_i] arrays."""
        encoded = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encoded]


def _from_hf(path_text: str, mesh) -> Pretrained:
    from ln_jax.models.bert import convert

    path = Path(path_text).expanduser()
    where = f"init_from=hf:{path_text}"
    for need, what in (("config.json", "its config"), ("vocab.txt", "its WordPiece vocabulary")):
        if not (path / need).is_file():
            raise ConfigError(
                f"{where}: no {need} in {path} ({what}); give a directory written by "
                "save_pretrained holding config.json, vocab.txt and model.safetensors or "
                "pytorch_model.bin."
            )
    try:
        model_cfg = convert.config_from_hf(json.loads((path / "config.json").read_text()))
        encoder = convert.load_hf_encoder(path, mesh=mesh)
        arrays = convert.load_hf_state_dict(path)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"{where}: {err}") from None
    pooler = None
    if "bert.pooler.dense.weight" in arrays:
        pooler = {
            "kernel": arrays["bert.pooler.dense.weight"].T,
            "bias": arrays["bert.pooler.dense.bias"],
        }
    options = path / "tokenizer_config.json"
    lowercase = (
        json.loads(options.read_text()).get("do_lower_case", True) if options.is_file() else True
    )
    tokenizer = WordPieceTokenizer(path / "vocab.txt", lowercase)
    _check_vocab(tokenizer.vocab_size, model_cfg, f"hf:{path_text}")
    params = nnx.to_pure_dict(nnx.state(encoder, nnx.Param))
    return Pretrained(model_cfg, params, pooler, tokenizer, f"hf:{path_text}", None)


def check_sequence_length(model: ModelConfig, max_seq_length: int) -> None:
    if max_seq_length > model.max_position_embeddings:
        raise ConfigError(
            f"max_seq_length={max_seq_length} exceeds the encoder's "
            f"max_position_embeddings={model.max_position_embeddings}; set "
            f"--config.max_seq_length={model.max_position_embeddings} or less."
        )
