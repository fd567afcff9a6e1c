"""The pretraining-data configuration: one typed, frozen dataclass.

`dataset` names what to read:

* `"ln_jax_pydocs"` (default): the embedded corpus of CPython's own documentation, generated
  offline from the running interpreter (`ln_jax.data.corpus`).
* `"ln_jax_sitedocs"`: the docstrings of every installed distribution and the standard library
  (20+ MB; the studies' corpus), also generated offline, prepared on first use
  (`ln_jax.data.sitedocs`).
* `"name[/config][:version]"`: any TFDS dataset with a text feature, e.g.
  `"wikipedia/20230601.en"` or `"wikipedia/20230601.en:1.0.0"`. It must be prepared in
  `data_dir` (or `download=True` lets TFDS try to prepare it).
* `"textdir:/path/to/folder"`: a folder of `.txt` files, one document per file.
* Translation (parallel text, `ln_jax.data.translation.parallel`): `"ln_jax_gettext/de-en"`,
  `"ln_jax_gettext/fr-en"`, `"wmt14_translate/de-en"`, `"wmt_t2t_translate/de-en"`,
  `"wmt16_translate/de-en"`, `"paralleltext:PREFIX"`, `"synthetic:copy"`, `"synthetic:reverse"`.
* A weighted mix, as a string of comma-separated entries each ending in `:weight`
  (`"wikipedia/20230601.en:0.9,textdir:/data/books:0.1"`) or as a tuple of
  `(name, weight)` pairs. A trailing `:x.y.z` is a TFDS version, a trailing `:0.9` a weight.

Split names (`train_split`, `eval_split`) apply to every dataset of a mix and may use TFDS
slicing: Wikipedia has only `train`, so hold out its documents with
`train_split="train[:99.5%]"`, `eval_split="train[99.5%:]"` (199:1 as Xiong et al.).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from ln_jax.validate import ConfigError, check_choice, reject_unknown_keys

DEFAULT_DATASET = "ln_jax_pydocs"
TOKENIZER_TYPES = ("unigram", "bpe")
# Name prefixes of the parallel-text (translation) datasets of `ln_jax.data.translation.parallel`.
TRANSLATION_PREFIXES = ("ln_jax_gettext", "paralleltext:", "synthetic:")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")

DatasetSpec = str | tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What data the pretraining run reads and how examples are made.

    Attributes:
      dataset: dataset name, `textdir:` folder or weighted mix (see the module docstring).
      data_dir: TFDS data dir (a local folder or a URL such as gs://bucket/tfds); None =
        $TFDS_DATA_DIR or ~/tensorflow_datasets.
      cache_dir: local folder of the token-id and pair-index caches when `data_dir` is a URL
        (each host builds its own there); None = $LN_JAX_CACHE_DIR or ~/.cache/ln_jax. A local
        data dir keeps them beside the prepared data.
      train_split: TFDS split (or slice) of the training documents.
      eval_split: TFDS split (or slice) of the held-out documents.
      text_feature: feature holding the document text in external TFDS datasets.
      download: let TFDS try to download and prepare a named dataset that is not prepared.
      vocab_size: sentencepiece vocabulary size, special tokens included.
      tokenizer_model: path of a user-supplied sentencepiece `.model`; None = train and cache.
      tokenizer_type: "unigram" or "bpe".
      tokenizer_max_documents: at most this many training documents (evenly strided) feed the
        tokenizer trainer, so that a Wikipedia-size corpus stays tractable.
      max_seq_length: T, tokens per example (BERT: 128 in phase 1, 512 in phase 2).
      global_batch_size: examples per step over all hosts and devices.
      eval_batch_size: examples per eval batch; None = global_batch_size.
      eval_num_batches: eval batches; None = one pass over the eval split.
      seed: seed of the pair structure, the shuffle and the masks.
      worker_count: data worker processes per host building the training batches (grain
        multiprocessing); 0 = in the training process. The batches are the same for any count.
      device_prefetch: training batches put on the devices ahead of the step; None = 2 on
        GPU/TPU, 0 on CPU devices (whose memory is the host's).
      prepare_timeout_s: how long processes other than 0 wait for process 0 to write a pair
        index before they stop with an error.

    How BERT's examples are made from the text (masks, sentence pairs) is BERT's own section
    (`ln_jax.data.bert.options.PretrainingOptions`, in `BertOptions`), a translation batch's
    token budget translation's (`TranslationOptions.max_tokens`); they were fields here until
    2026-12-06 (`ln_jax.validate.FAMILY_FIELDS`).
    """

    dataset: DatasetSpec = DEFAULT_DATASET
    data_dir: str | None = None
    cache_dir: str | None = None
    train_split: str = "train"
    eval_split: str = "validation"
    text_feature: str = "text"
    download: bool = False
    vocab_size: int = 8000
    tokenizer_model: str | None = None
    tokenizer_type: str = "unigram"
    tokenizer_max_documents: int = 200_000
    max_seq_length: int = 128
    global_batch_size: int = 16
    eval_batch_size: int | None = None
    eval_num_batches: int | None = None
    seed: int = 0
    worker_count: int = 0
    device_prefetch: int | None = None
    prepare_timeout_s: float = 3600.0

    def __post_init__(self):
        check_types(self, "data")
        if isinstance(self.dataset, list):  # from YAML/JSON: store the hashable tuple form
            object.__setattr__(self, "dataset", tuple(tuple(e) for e in self.dataset))
        parse_dataset(self.dataset)  # raises on a malformed spec
        _check_ranges(self)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> DataConfig:
        """Builds a config from a dict, rejecting unknown keys.

        Raises:
          ValueError: for an unknown key, naming the closest valid one.
        """
        reject_unknown_keys("data", mapping, [f.name for f in dataclasses.fields(cls)])
        return cls(**dict(mapping))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def sources(self) -> tuple[tuple[str, float], ...]:
        """The dataset spec as ((name, weight), ...), weights summing to 1."""
        return parse_dataset(self.dataset)


def _allowed(tp: Any) -> tuple[type, ...]:
    # Runtime check of the simple annotations used above (str, int, float, bool, X | None).
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return tuple(t for a in typing.get_args(tp) for t in _allowed(a))
    if typing.get_origin(tp) is tuple or tp is tuple:
        return (tuple, list)
    if tp is type(None):
        return (type(None),)
    if tp is float:
        return (float, int)
    return (tp,)


def check_types(cfg: Any, section: str) -> None:
    """Raises a TypeError naming the first field of the dataclass `cfg` (the config section
    `section`) whose value is not of its annotated type."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, allowed = getattr(cfg, f.name), _allowed(hints[f.name])
        # bool is an int in Python; an int field given True is almost surely a mistake.
        bad_bool = isinstance(value, bool) and bool not in allowed
        if bad_bool or not isinstance(value, allowed):
            names = "/".join(t.__name__ for t in allowed)
            raise TypeError(
                f"{section}.{f.name} must be {names}, got {value!r}: set "
                f"--config.{section}.{f.name}."
            )


def _check_ranges(cfg: DataConfig) -> None:
    """Raises a ConfigError naming the first field out of its range as the user types it
    (`data.vocab_size=3 must be >= 6: set --config.data.vocab_size.`)."""
    check_choice(
        "data.tokenizer_type",
        cfg.tokenizer_type,
        TOKENIZER_TYPES,
        config_field="data.tokenizer_type",
    )
    minimum = {"vocab_size": 6, "max_seq_length": 8, "global_batch_size": 1}
    minimum |= {"tokenizer_max_documents": 1, "seed": 0, "worker_count": 0}
    minimum |= {"prepare_timeout_s": 0}
    check_minimum(cfg, "data", minimum)
    for name in ("eval_batch_size", "eval_num_batches"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise out_of_range(cfg, name, "must be >= 1 or None")
    if cfg.device_prefetch is not None and cfg.device_prefetch < 0:
        raise out_of_range(cfg, "device_prefetch", "must be >= 0 or None")


def check_minimum(cfg: Any, section: str, minimum: Mapping[str, float]) -> None:
    """Raises a ConfigError naming the first field of `cfg` (the config section `section`)
    under its minimum in `minimum` ({field: lowest allowed value})."""
    for name, low in minimum.items():
        if getattr(cfg, name) < low:
            raise out_of_range(cfg, name, f"must be >= {low}", section)


def out_of_range(cfg: Any, name: str, rule: str, section: str = "data") -> ConfigError:
    return ConfigError(
        f"{section}.{name}={getattr(cfg, name)!r} {rule}: set --config.{section}.{name}."
    )


def _split_weight(entry: str) -> tuple[str, float]:
    name, sep, last = entry.rpartition(":")
    if sep and name and not _VERSION.match(last):
        try:
            return name, float(last)
        except ValueError:
            pass  # a ':' that is part of the name (`textdir:/x`, a version)
    return entry, 1.0


def parse_dataset(spec: DatasetSpec) -> tuple[tuple[str, float], ...]:
    """Parses `DataConfig.dataset` into ((name, weight), ...) with weights normalised to sum 1.

    Raises:
      ValueError: for an empty spec, an empty name or a non-positive weight.
    """
    if isinstance(spec, str):
        entries = [_split_weight(e.strip()) for e in spec.split(",") if e.strip()]
    else:
        entries = [(str(name), float(weight)) for name, weight in spec]
    if not entries:
        raise ConfigError(f"data.dataset={spec!r} names no dataset: set --config.data.dataset.")
    for name, weight in entries:
        if not name or weight <= 0:
            raise ConfigError(
                f"data.dataset entry {name!r}:{weight} needs a name and a weight > 0: fix "
                "--config.data.dataset."
            )
    total = sum(w for _, w in entries)
    return tuple((name, w / total) for name, w in entries)
