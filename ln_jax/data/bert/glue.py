"""Downstream data: GLUE tasks from TFDS and the offline pair task, as token-id arrays.

* GLUE (`glue/mrpc`, `glue/rte`, ...) is read from a TFDS data dir through the same
  `ln_jax.data.sources.open_source` as pretraining data: a dataset that is not prepared is the
  same one-line error naming the data dir and the command that prepares it as array_record.
* `ln_jax_pairs` (`LnJaxPairs`) is a sentence-pair classification in MRPC's feature format
  (`sentence1`, `sentence2`, `label`: ClassLabel(not_equivalent, equivalent), `idx`), built
  locally from the embedded corpus: nothing is downloaded. Sentence 1 is a sentence of the
  corpus; sentence 2 is either a rewording of it (label 1: about 15% of its words dropped and
  two neighbouring words swapped) or the same rewording of the next sentence of its document
  (label 0: same topic, other content). The rewording marks neither label; lengths are not
  matched, so, as in MRPC (where a paraphrase is about as long as its source), comparing
  lengths gets a model part of the way, and the rest needs what the two sentences share.
  Half the examples are of each label, by a hash of the sentence's key. Documents go to
  `train` or `validation` by a hash of their key, 1 in 8 to validation. It is a TFDS
  `GeneratorBasedBuilder` writing array_record, read back with `as_data_source` like GLUE, so
  the offline task exercises the real path end to end.

`encode_examples` turns either into BERT inputs: `[CLS] A [SEP] B [SEP]`, segment ids 0/1,
pairs longer than `max_seq_length` truncated longest-first as in BERT.

Batches (what the fine-tuning task's `pipelines` return):
  train_iterator(arrays, ...) -> global batch s (0-based) = rows `batch_rows(n, B, seed, s)`:
      epoch s // (n // B) is a permutation of the examples keyed by (seed, epoch), the last
      partial batch dropped; read ahead by grain; state {"next_batch": s, ...}
      (`ln_jax.data.host_iterator.HostBatchIterator`), so a resume is exact on any host count.
  DevBatches(arrays, ...) -> the whole split in order, the last batch padded with repeated rows
      marked `valid` = 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds

from ln_jax.data import corpus, sources

PAIRS_NAME = "ln_jax_pairs"
PAIR_LABELS = ("not_equivalent", "equivalent")  # MRPC's class names
_VALIDATION_MODULUS = 8  # 1 document in 8 holds validation examples
_MAX_EXAMPLES = {"train": 4000, "validation": 800}
_MIN_WORDS, _MAX_WORDS = 5, 40
_DROP = 0.15  # fraction of words a rewording drops


def _hash(text: str) -> int:
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:8], 16)


def reword(sentence: str, key: str) -> str:
    """A deterministic rewording: ~15% of the words dropped (at least 3 kept), then two
    neighbouring words swapped; every choice is drawn from a hash of `key`."""
    words = sentence.split()
    rng = np.random.default_rng(_hash("reword:" + key))
    keep = rng.random(len(words)) >= _DROP
    if keep.sum() < 3:
        keep[:3] = True
    words = [w for w, k in zip(words, keep, strict=True) if k]
    if len(words) >= 2:
        i = int(rng.integers(0, len(words) - 1))
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def pair_examples(
    docs: Sequence[tuple[str, list[str]]], split: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, MRPC-format example) of `split` from (document key, sentences) pairs."""
    held_out = split == "validation"
    count = 0
    for doc_key, sentences in docs:
        if (_hash(doc_key) % _VALIDATION_MODULUS == 0) != held_out:
            continue
        for i, first in enumerate(sentences[:-1]):
            if not _MIN_WORDS <= len(first.split()) <= _MAX_WORDS or count >= _MAX_EXAMPLES[split]:
                continue
            key = f"{doc_key}#{i}"
            label = _hash(key) % 2
            second = first if label else sentences[i + 1]
            example = {"sentence1": first, "sentence2": reword(second, key), "label": label}
            yield key, {**example, "idx": count}
            count += 1


class LnJaxPairs(corpus._LocalBuilder):
    """The offline pair task (see the module docstring), built from the prepared corpus
    `ln_jax_pydocs` in the same data dir."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Rewordings vs. neighbouring sentences of the embedded corpus."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Sentence pairs from CPython's docstrings in GLUE MRPC's format.",
            features=tfds.features.FeaturesDict(
                {
                    "sentence1": tfds.features.Text(),
                    "sentence2": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(names=PAIR_LABELS),
                    "idx": np.int32,
                }
            ),
            supervised_keys=None,
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        source = sources.open_source(corpus.LnJaxPydocs.name, data_dir=self._data_dir_root)
        docs = [
            (f"{split}/{n}", sentences)
            for split in ("train", "validation")
            for n, sentences in enumerate(source.documents(split))
        ]
        return {split: pair_examples(docs, split) for split in ("train", "validation")}

    def _generate_examples(self, *args):  # the generators come from `_split_generators`
        raise NotImplementedError


def open_task_dataset(
    name: str, data_dir: str | None, download: bool = False
) -> tfds.core.DatasetBuilder:
    """The prepared builder of a task's dataset: `ln_jax_pairs` is built on first use; a TFDS
    name (glue/...) must be prepared or `download`ed, else DatasetNotPreparedError."""
    if name == PAIRS_NAME:
        return corpus.prepare(LnJaxPairs(data_dir=sources.default_data_dir(data_dir)))
    return sources.open_source(name, data_dir=data_dir, download=download).builder


@dataclasses.dataclass(frozen=True)
class Examples:
    """A split as texts and labels: `texts[k][i]` is text feature k of example i; labels [N]
    (int classes, or float scores for regression)."""

    texts: tuple[list[str], ...]
    labels: np.ndarray


def read_split(
    builder: tfds.core.DatasetBuilder,
    split: str,
    features: Sequence[str],
    max_examples: int | None = None,
) -> Examples:
    """The first `max_examples` (None = all) records of a split, by random access."""
    records = sources.TextSource(builder.name, builder).data_source(split)
    n = len(records) if max_examples is None else min(max_examples, len(records))
    rows = records.__getitems__(list(range(n))) if n else []
    text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
    texts = tuple([text(r[f]) for r in rows] for f in features)
    labels = np.asarray([r["label"] for r in rows])
    return Examples(texts, labels)


def _truncate(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """BERT's longest-first truncation: drop the last token of the longer one until it fits."""
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb]


def encode_examples(examples: Examples, tokenizer: Any, max_seq_length: int) -> dict:
    """BERT inputs of a split.

    Args:
      examples: one or two texts per example.
      tokenizer: has `encode(texts) -> list of int arrays` and `cls_id`, `sep_id`, `pad_id`.
      max_seq_length: T.

    Returns:
      {"input_ids", "segment_ids", "attention_mask": int32 [N, T], "label": [N]}.
    """
    encoded = [tokenizer.encode(texts) for texts in examples.texts]
    n, t = len(examples.labels), max_seq_length
    ids = np.full((n, t), tokenizer.pad_id, np.int32)
    segments = np.zeros((n, t), np.int32)
    for i in range(n):
        a = encoded[0][i]
        b = encoded[1][i] if len(encoded) > 1 else np.zeros((0,), np.int32)
        a, b = _truncate(a, b, t - 3 if len(encoded) > 1 else t - 2)
        row = [tokenizer.cls_id, *a, tokenizer.sep_id]
        second = [*b, tokenizer.sep_id] if len(encoded) > 1 else []
        ids[i, : len(row) + len(second)] = row + second
        segments[i, len(row) : len(row) + len(second)] = 1
    mask = (ids != tokenizer.pad_id).astype(np.int32)
    label = examples.labels.astype(np.float32 if examples.labels.dtype.kind == "f" else np.int32)
    return {"input_ids": ids, "segment_ids": segments, "attention_mask": mask, "label": label}


# --------------------------------------------------------------------------- batches


def batch_rows(num_examples: int, batch: int, seed: int, step: int) -> np.ndarray:
    """Rows of global batch `step` (0-based): epoch e = step // steps_per_epoch is a permutation
    of the examples keyed by (seed, e); the last partial batch of an epoch is dropped."""
    per_epoch = num_examples // batch
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return order[index * batch : (index + 1) * batch]


@dataclasses.dataclass(frozen=True, eq=False)
class TrainBatches:
    """Global batch number -> this process's rows of it (the grain map function).

    Attributes:
      arrays: `encode_examples` of the train split ([N, T] int32 arrays, label [N]).
      global_batch_size: B.
      seed: keys every epoch's permutation.
      rows: the rows of each global batch this process loads (`ln_jax.data.batches.host_rows`).
    """

    arrays: Mapping[str, np.ndarray]
    global_batch_size: int
    seed: int
    rows: slice

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        n = len(self.arrays["label"])
        rows = batch_rows(n, self.global_batch_size, self.seed, step)[self.rows]
        return {k: v[rows] for k, v in self.arrays.items()}


def train_iterator(
    arrays: Mapping[str, np.ndarray], batch: int, seed: int, mesh: Any, prefetch: int = 0
) -> Any:
    """The training batches as global jax.Arrays (`ln_jax.data.batches.GlobalBatchIterator`):
    endless, read ahead by a grain thread, with `get_state`/`set_state`/`close`.

    Raises:
      ConfigError: if `batch` does not split over the data x fsdp devices and the processes.
    """
    from ln_jax import sharding
    from ln_jax.data import batches, host_iterator

    batches.check_global_batch(batch, sharding.batch_divisor(mesh), jax.process_count())
    block, blocks = batches.mesh_rows(mesh, batch)
    host = TrainBatches(arrays, batch, seed, batches.host_rows(batch, block, blocks))
    identity = {
        "examples": len(arrays["label"]),
        "max_seq_length": int(arrays["input_ids"].shape[1]),
        "seed": seed,
        "batch_size": batch,
    }
    iterator = host_iterator.HostBatchIterator(host, identity, threads=1, workers=0)
    return batches.GlobalBatchIterator(iterator, mesh, batch, prefetch)


class DevBatches:
    """The evaluation split in order, in batches of `batch` (a multiple of the data x fsdp
    devices); the last batch is padded with repeated rows whose `valid` is 0. Iterable any
    number of times; each batch is put on the devices when it is reached.

    Batch keys: the arrays' (input_ids, segment_ids, attention_mask [B, T], label [B]) and
    valid int32 [B].
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], batch: int, mesh: Any):
        self.arrays, self.batch, self.mesh = arrays, batch, mesh
        self.num_examples = len(arrays["label"])

    def __len__(self) -> int:
        return -(-self.num_examples // self.batch)

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        from ln_jax.data import batches

        block, blocks = batches.mesh_rows(self.mesh, self.batch)
        mine = batches.host_rows(self.batch, block, blocks)
        n = self.num_examples
        for start in range(0, n, self.batch):
            rows = np.arange(start, start + self.batch)
            local = {k: v[rows[mine] % n] for k, v in self.arrays.items()}
            local["valid"] = (rows[mine] < n).astype(np.int32)
            yield batches.to_global(local, self.mesh, self.batch)
