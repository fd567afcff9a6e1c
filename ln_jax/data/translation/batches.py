"""Translation batches: sentence pairs -> token ids -> token-budget batches in length buckets.

Entry point (what the translation task calls):

  make_translation_pipeline(data_cfg, split=, seed=, mesh=, max_tokens=, max_source_length=,
                            max_target_length=) -> (iterator, tokenizer)

A batch is a dict of global jax.Arrays sharded by `ln_jax.sharding.batch_sharding(mesh)`:
  src       int32 [B, S]    source ids + EOS, PAD after
  src_mask  int32 [B, S]    1 on the source tokens (EOS included), 0 on padding
  tgt_in    int32 [B, T]    BOS + target ids, PAD after (the decoder's input)
  tgt_out   int32 [B, T]    target ids + EOS, PAD after (the labels)
  tgt_mask  float32 [B, T]  1.0 on the labels of real rows, 0 elsewhere (loss weights)
  index     int32 [B]       (eval only) the pair's position in the split, -1 on padding rows

(S, T) comes from a few static buckets (`bucket_lengths`: 16, 32, 64, ... up to the max
lengths), so a run compiles one program per bucket. B is fixed per bucket: `max_tokens // L`
(`translation.max_tokens`; L = the bucket's length, so B * max(S, T) <= max_tokens, the papers'
"tokens per batch" counted on padded tokens), rounded down to a multiple of the data-parallel
device count, at least that count. Rows that only fill a bucket's last batch of an epoch repeat
the batch's first pair with `tgt_mask` 0 (and `index` -1), so no row is ever all padding.

Training: pairs whose source + EOS exceeds `max_source_length` or target + EOS exceeds
`max_target_length` are dropped (counted and logged). Epoch e is a permutation keyed by
(seed, e), grouped into the buckets' batches, whose order is shuffled too (keyed); global batch
i is a pure function of (seed, i), each process builds only its rows
(`ln_jax.data.batches.host_rows`), and the iterator's state is the number of the next batch:
resume is exact on any host count.
Evaluation: every pair of the split once (too-long sides truncated, not dropped), bucket by
bucket in split order; `.pairs` holds the raw (source, reference) strings in split order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from ln_jax import paths
from ln_jax import sharding as sharding_lib
from ln_jax.data import batches as batches_lib
from ln_jax.data import host_iterator, sources
from ln_jax.data.config import DataConfig
from ln_jax.data.translation import joint_tokenizer as tok_lib
from ln_jax.data.translation import parallel
from ln_jax.validate import ConfigError

DEFAULT_IDS = (tok_lib.PAD_ID, tok_lib.BOS_ID, tok_lib.EOS_ID)  # (pad, bos, eos)
log = logging.getLogger(__name__)

SMALLEST_BUCKET = 16
PIPELINE_VERSION = 1
Batch = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Token ids of a split
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
    """Token ids of a split's pairs, flat: pair k's source is `src[src_starts[k]:
    src_starts[k + 1]]` (no BOS/EOS), its target likewise."""

    src: np.ndarray  # int32 [total source tokens]
    src_starts: np.ndarray  # int64 [N + 1]
    tgt: np.ndarray  # int32 [total target tokens]
    tgt_starts: np.ndarray  # int64 [N + 1]

    FIELDS = ("src", "src_starts", "tgt", "tgt_starts")

    def __len__(self) -> int:
        return len(self.src_starts) - 1

    def source(self, k: int) -> np.ndarray:
        return self.src[self.src_starts[k] : self.src_starts[k + 1]]

    def target(self, k: int) -> np.ndarray:
        return self.tgt[self.tgt_starts[k] : self.tgt_starts[k + 1]]

    def head(self, n: int) -> EncodedPairs:
        """The first n pairs."""
        n = min(n, len(self))
        src_end, tgt_end = int(self.src_starts[n]), int(self.tgt_starts[n])
        return EncodedPairs(
            self.src[:src_end],
            self.src_starts[: n + 1],
            self.tgt[:tgt_end],
            self.tgt_starts[: n + 1],
        )

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) lengths with EOS: int64 [N] each."""
        return np.diff(self.src_starts) + 1, np.diff(self.tgt_starts) + 1


def _flat(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=starts[1:])
    flat = np.fromiter((i for s in seqs for i in s), np.int32, count=int(starts[-1]))
    return flat, starts


def encode_pairs(pairs: Sequence[tuple[str, str]], tokenizer: Any) -> EncodedPairs:
    """Both sides' ids (a tokenizer with `encode_target_batch`, e.g. Marian's with a source
    and a target sentencepiece model, encodes the targets with it)."""
    encode_target = getattr(tokenizer, "encode_target_batch", tokenizer.encode_batch)
    src, src_starts = _flat(tokenizer.encode_batch([s for s, _ in pairs]))
    tgt, tgt_starts = _flat(encode_target([t for _, t in pairs]))
    return EncodedPairs(src, src_starts, tgt, tgt_starts)


def _ids_folder(source: parallel.ParallelSource, split: str, tokenizer: Any, cache_dir):
    tag = hashlib.md5(f"{source.key}|{split}|{tokenizer.fingerprint}".encode()).hexdigest()[:12]
    folder = source.cache_dir
    if paths.is_url(folder):  # memory-mapped: a local folder of this host
        digest = hashlib.md5(str(folder).encode()).hexdigest()[:12]
        folder = sources.local_cache_root(cache_dir) / digest
    return pathlib.Path(os.fspath(folder)) / f"pair-ids-{tag}"


def cached_ids(source, split: str, tokenizer: Any, pairs, cache_dir=None) -> EncodedPairs:
    """The split's token ids, encoded once and cached beside the tokenizer (memory-mapped);
    the synthetic source is encoded in memory.

    Args:
      pairs: the split's pairs if already read (None = read on a cache miss).
    """
    if source.cache_dir is None:
        return encode_pairs(source.pairs(split) if pairs is None else pairs, tokenizer)
    folder = _ids_folder(source, split, tokenizer, cache_dir)
    if not (folder / "done").is_file():
        encoded = encode_pairs(source.pairs(split) if pairs is None else pairs, tokenizer)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name))
        for name in EncodedPairs.FIELDS:
            np.save(tmp / f"{name}.npy", getattr(encoded, name))
        (tmp / "done").write_text("")
        with contextlib.suppress(OSError):  # another process finished first: same files
            os.replace(tmp, folder)
        shutil.rmtree(tmp, ignore_errors=True)
    return EncodedPairs(*(np.load(folder / f"{n}.npy", mmap_mode="r") for n in EncodedPairs.FIELDS))


# --------------------------------------------------------------------------------------------
# Buckets
# --------------------------------------------------------------------------------------------


def bucket_lengths(max_source_length: int, max_target_length: int) -> tuple[int, ...]:
    """The buckets' lengths L: 16, 32, 64, ... below the longer max length, then it."""
    top = max(max_source_length, max_target_length)
    out, length = [], SMALLEST_BUCKET
    while length < top:
        out.append(length)
        length *= 2
    return (*out, top)


@dataclasses.dataclass(frozen=True)
class Buckets:
    """The static batch shapes of a run.

    Attributes:
      lengths: L of each bucket, ascending.
      rows: B of each bucket (a multiple of `multiple`).
      max_source_length, max_target_length: caps of S and T.
      max_tokens: the token budget the rows were made for (`translation.max_tokens`).
    """

    lengths: tuple[int, ...]
    rows: tuple[int, ...]
    max_source_length: int
    max_target_length: int
    max_tokens: int

    @classmethod
    def make(cls, max_tokens: int, max_source_length: int, max_target_length: int, multiple: int):
        """Buckets of `bucket_lengths`, B = max_tokens // L rounded down to `multiple` (>= it)."""
        if min(max_source_length, max_target_length) < 2:
            raise ConfigError("max_source_length and max_target_length must be >= 2 (EOS/BOS).")
        lengths = bucket_lengths(max_source_length, max_target_length)
        rows = tuple(max(multiple, max_tokens // n // multiple * multiple) for n in lengths)
        if rows[-1] * lengths[-1] > max_tokens:
            log.warning(
                "translation.max_tokens=%d is under %d rows x %d tokens: the longest bucket "
                "holds %d padded tokens", max_tokens, multiple, lengths[-1], rows[-1] * lengths[-1],
            )  # fmt: skip
        return cls(lengths, rows, max_source_length, max_target_length, max_tokens)

    def shape(self, bucket: int) -> tuple[int, int, int]:
        """(B, S, T) of a bucket."""
        n = self.lengths[bucket]
        return self.rows[bucket], min(n, self.max_source_length), min(n, self.max_target_length)

    def assign(self, encoded: EncodedPairs) -> np.ndarray:
        """Bucket of each pair (the first L >= max(source, target) + EOS): int64 [N]; pairs
        longer than the max lengths get the last bucket (training drops them first)."""
        src_len, tgt_len = encoded.lengths()
        longest = np.maximum(src_len, tgt_len)
        return np.minimum(np.searchsorted(self.lengths, longest), len(self.lengths) - 1)

    def fits(self, encoded: EncodedPairs) -> np.ndarray:
        """bool [N]: source + EOS <= max_source_length and target + EOS <= max_target_length."""
        src_len, tgt_len = encoded.lengths()
        return (src_len <= self.max_source_length) & (tgt_len <= self.max_target_length)


def build_rows(
    encoded: EncodedPairs, rows: np.ndarray, fill: int, s: int, t: int, ids: tuple = DEFAULT_IDS
) -> Batch:
    """Numpy rows of a batch (see the module docstring for the fields).

    Args:
      encoded: the split's ids.
      rows: int [b] pair indices, -1 for a padding row (which repeats pair `fill`, weight 0).
      fill: the pair a padding row repeats.
      s, t: S and T; longer sides are cut (source keeps its EOS, target keeps its EOS label).
      ids: the tokenizer's (pad, bos, eos) (`joint_tokenizer.specials`).
    """
    b, (pad, bos, eos) = len(rows), ids
    src = np.full((b, s), pad, np.int32)
    tgt_in = np.full((b, t), pad, np.int32)
    tgt_out = np.full((b, t), pad, np.int32)
    tgt_mask = np.zeros((b, t), np.float32)
    for r, k in enumerate(rows):
        pair = int(k) if k >= 0 else fill
        source = encoded.source(pair)[: s - 1]
        target = encoded.target(pair)[: t - 1]
        src[r, : len(source)] = source
        src[r, len(source)] = eos
        tgt_in[r, 0] = bos
        tgt_in[r, 1 : 1 + len(target)] = target
        tgt_out[r, : len(target)] = target
        tgt_out[r, len(target)] = eos
        tgt_mask[r, : len(target) + 1] = float(k >= 0)
    src_mask = np.zeros((b, s), np.int32)
    for r, k in enumerate(rows):  # pad may be a piece id (Marian's), so lengths, not values
        src_mask[r, : min(len(encoded.source(int(k) if k >= 0 else fill)), s - 1) + 1] = 1
    return {"src": src, "src_mask": src_mask, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "tgt_mask": tgt_mask}  # fmt: skip


def _chunks(members: np.ndarray, rows: int) -> list[np.ndarray]:
    """`members` in batches of `rows`, the last padded with -1."""
    out = []
    for start in range(0, len(members), rows):
        chunk = np.full(rows, -1, np.int64)
        part = members[start : start + rows]
        chunk[: len(part)] = part
        out.append(chunk)
    return out


# --------------------------------------------------------------------------------------------
# Training batches: a pure function of (seed, batch number)
# --------------------------------------------------------------------------------------------


class TrainPlan:
    """Which pairs global batch i holds: a pure function of (seed, i).

    Attributes:
      kept: int64 [K] the pairs that fit the max lengths.
      bucket: int64 [K] their buckets.
      batches_per_epoch: sum over buckets of ceil(pairs / B).
    """

    def __init__(self, encoded: EncodedPairs, buckets: Buckets, seed: int):
        fits = buckets.fits(encoded)
        self.kept = np.flatnonzero(fits)
        self.dropped = int(len(fits) - len(self.kept))
        if not len(self.kept):
            raise ConfigError(
                f"no training pair fits max_source_length={buckets.max_source_length} and "
                f"max_target_length={buckets.max_target_length} (tokens with EOS); raise them."
            )
        self.bucket = buckets.assign(encoded)[self.kept]
        self.buckets, self.seed = buckets, seed
        counts = np.bincount(self.bucket, minlength=len(buckets.lengths))
        per_bucket = [-(-c // r) for c, r in zip(counts, buckets.rows, strict=True)]
        self.batches_per_epoch = int(sum(per_bucket))
        self._epoch: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def epoch(self, e: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket, pair indices with -1 padding)] of epoch e, in the order they are served."""
        if self._epoch is None or self._epoch[0] != e:
            rng = np.random.default_rng([self.seed, e])
            order = rng.permutation(len(self.kept))
            batches = []
            for j, rows in enumerate(self.buckets.rows):
                members = self.kept[order[self.bucket[order] == j]]
                batches.extend((j, c) for c in _chunks(members, rows))
            served = rng.permutation(len(batches))
            self._epoch = (e, [batches[i] for i in served])
        return self._epoch[1]

    def batch(self, i: int) -> tuple[int, np.ndarray]:
        """(bucket, pair indices [B], -1 = padding) of global batch i."""
        e, position = divmod(int(i), self.batches_per_epoch)
        return self.epoch(e)[position]


@dataclasses.dataclass(eq=False)
class HostTranslationBatches:
    """Global batch number -> this process's rows of it (numpy), the grain map function.

    Attributes:
      encoded: the training split's ids.
      plan: the training plan.
      block, num_blocks: this process loads block `block` of `num_blocks` equal row blocks.
    """

    encoded: EncodedPairs
    plan: TrainPlan
    block: int
    num_blocks: int
    ids: tuple = DEFAULT_IDS

    def __call__(self, i: int) -> Batch:
        bucket, rows = self.plan.batch(i)
        b, s, t = self.plan.buckets.shape(bucket)
        mine = rows[batches_lib.host_rows(b, self.block, self.num_blocks)]
        return build_rows(self.encoded, mine, int(rows[0]), s, t, self.ids)


class TranslationBatchIterator(batches_lib.GlobalBatchIterator):
    """Training batches as global jax.Arrays (B = the bucket's rows): endless, with
    `get_state`/`set_state`/`close` (the state is the next global batch's number)."""

    def __init__(self, host: Any, mesh: jax.sharding.Mesh, num_blocks: int, prefetch: int = 0):
        super().__init__(host, mesh, 0, prefetch)
        self.num_blocks = num_blocks

    def global_rows(self, local: Batch) -> int:
        """Every host reads the same bucket's share: B = its rows x the hosts' blocks."""
        return len(local["src"]) * self.num_blocks


# --------------------------------------------------------------------------------------------
# Evaluation batches: every pair once
# --------------------------------------------------------------------------------------------


class TranslationEvalBatches:
    """The evaluation split: every pair once, bucket by bucket, in split order within a bucket;
    re-iterable. Batches carry `index` (position in the split, -1 on padding rows).

    Attributes:
      pairs: [(source, reference)] raw strings of the split, in split order.
      num_truncated: pairs with a side longer than the max lengths (cut in the batches).
    """

    def __init__(
        self, encoded, pairs, buckets: Buckets, block: int, num_blocks: int, mesh=None,
        ids: tuple = DEFAULT_IDS,
    ):  # fmt: skip
        self.encoded, self.pairs, self.buckets, self.ids = encoded, list(pairs), buckets, ids
        self.block, self.num_blocks, self.mesh = block, num_blocks, mesh
        assigned = buckets.assign(encoded)
        self.num_truncated = int(len(encoded) - buckets.fits(encoded).sum())
        self._batches = [
            (j, chunk)
            for j, rows in enumerate(buckets.rows)
            for chunk in _chunks(np.flatnonzero(assigned == j), rows)
        ]

    @property
    def sources(self) -> list[str]:
        return [s for s, _ in self.pairs]

    @property
    def references(self) -> list[str]:
        return [t for _, t in self.pairs]

    def __len__(self) -> int:
        return len(self._batches)

    def head(self, n: int) -> TranslationEvalBatches:
        """The same batching of the split's first n pairs (e.g. a fixed subset for BLEU)."""
        encoded, pairs = self.encoded.head(n), self.pairs[:n]
        return TranslationEvalBatches(
            encoded, pairs, self.buckets, self.block, self.num_blocks, self.mesh, self.ids
        )

    def host_batch(self, n: int) -> Batch:
        """This process's rows of eval batch n (numpy)."""
        bucket, rows = self._batches[n]
        b, s, t = self.buckets.shape(bucket)
        mine = rows[batches_lib.host_rows(b, self.block, self.num_blocks)]
        batch = build_rows(self.encoded, mine, int(rows[0]), s, t, self.ids)
        batch["index"] = mine.astype(np.int32)
        return batch

    def __iter__(self) -> Iterator[Batch]:
        for n in range(len(self._batches)):
            local = self.host_batch(n)
            if self.mesh is None:
                yield local
            else:
                yield batches_lib.to_global(local, self.mesh, len(local["src"]) * self.num_blocks)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SplitData:
    """A split read for batching: the source, its tokenizer, ids and (eval) raw pairs."""

    source: parallel.ParallelSource
    tokenizer: Any
    encoded: EncodedPairs
    pairs: list[tuple[str, str]] | None


def _split_name(cfg: DataConfig, split: str) -> str:
    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r}; use 'train' or 'eval'")
    return cfg.train_split if split == "train" else cfg.eval_split


def load_split(cfg: DataConfig, split: str) -> SplitData:
    """Opens `cfg.dataset`, gets (trains or loads) its tokenizer and the split's token ids."""
    source = parallel.open_parallel(cfg)
    tokenizer = tok_lib.translation_tokenizer(cfg, source, None)
    name = _split_name(cfg, split)
    pairs = source.pairs(name) if split == "eval" else None
    encoded = cached_ids(source, name, tokenizer, pairs, cfg.cache_dir)
    return SplitData(source, tokenizer, encoded, pairs)


def _identity(cfg: DataConfig, data: SplitData, buckets: Buckets, seed: int) -> dict[str, Any]:
    """What a saved iterator state must match."""
    return {
        "version": PIPELINE_VERSION,
        "dataset": cfg.dataset,
        "data": data.source.key,
        "split": cfg.train_split,
        "tokenizer": data.tokenizer.fingerprint,
        "seed": seed,
        "max_tokens": buckets.max_tokens,
        "lengths": list(buckets.lengths),
        "rows": list(buckets.rows),
        "max_source_length": buckets.max_source_length,
        "max_target_length": buckets.max_target_length,
        "pairs": len(data.encoded),
    }


def _host_pipeline(cfg, split, seed, data: SplitData, buckets, block, num_blocks, mesh=None):
    if split == "eval":
        ids = tok_lib.specials(data.tokenizer)
        return TranslationEvalBatches(
            data.encoded, data.pairs, buckets, block, num_blocks, mesh, ids
        )
    plan = TrainPlan(data.encoded, buckets, seed)
    if plan.dropped:
        log.info(
            "%s: %d of %d training pairs are longer than max_source_length=%d / "
            "max_target_length=%d tokens and are dropped", cfg.dataset, plan.dropped,
            len(data.encoded), buckets.max_source_length, buckets.max_target_length,
        )  # fmt: skip
    ids = tok_lib.specials(data.tokenizer)
    batches = HostTranslationBatches(data.encoded, plan, block, num_blocks, ids)
    identity = _identity(cfg, data, buckets, seed)
    return host_iterator.HostBatchIterator(batches, identity, threads=1, workers=0)


def make_host_translation_pipeline(
    data_cfg: DataConfig,
    *,
    split: str,
    seed: int,
    max_tokens: int,
    max_source_length: int,
    max_target_length: int,
    multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
):
    """The pipeline without devices: numpy batches of one process's rows (tests, benches).

    Args:
      max_tokens: padded tokens per batch (`translation.max_tokens`).
      multiple: B of every bucket is a multiple of this (the data-parallel device count).
      process_index, process_count: which equal block of each batch's rows to load.

    Returns:
      (iterator, tokenizer): for "train" a `HostBatchIterator` (endless, get_state/set_state),
      for "eval" a `TranslationEvalBatches` of numpy batches.
    """
    multiple = int(np.lcm(multiple, process_count))
    buckets = Buckets.make(max_tokens, max_source_length, max_target_length, multiple)
    data = load_split(data_cfg, split)
    args = (data_cfg, split, seed, data, buckets, process_index, process_count)
    return _host_pipeline(*args), data.tokenizer


def make_translation_pipeline(
    data_cfg: DataConfig,
    *,
    split: str,
    seed: int,
    mesh: jax.sharding.Mesh,
    max_tokens: int,
    max_source_length: int,
    max_target_length: int,
):
    """The translation task's data: batches of global jax.Arrays and the tokenizer.

    Args:
      data_cfg: the data config (dataset, vocab_size, tokenizer_type, splits).
      split: "train" (endless, shuffled, dropping too-long pairs) or "eval" (every pair of
        `data_cfg.eval_split` once).
      seed: keys the epochs' shuffles.
      mesh: batches are sharded by `batch_sharding(mesh)`; B is a multiple of its
        data x fsdp devices.
      max_tokens: padded tokens per batch, max(S, T) x B (`translation.max_tokens`).
      max_source_length, max_target_length: S and T caps, EOS (and BOS) included.

    Returns:
      (iterator, tokenizer). "train": a `TranslationBatchIterator` (infinite; get_state,
      set_state, close). "eval": a `TranslationEvalBatches` (re-iterable; `.pairs`, `.sources`,
      `.references` are the raw strings in split order; batch `index` maps rows to them).
      The tokenizer has encode(str) -> list[int], decode(ids) -> str, vocab_size.
    """
    multiple = sharding_lib.batch_divisor(mesh)
    buckets = Buckets.make(max_tokens, max_source_length, max_target_length, multiple)
    block, num_blocks = batches_lib.mesh_rows(mesh, multiple)
    data = batches_lib.prepare_once(lambda: load_split(data_cfg, split))
    args = (data_cfg, split, seed, data, buckets, block, num_blocks)
    if split == "eval":
        return _host_pipeline(*args, mesh=mesh), data.tokenizer
    host = _host_pipeline(*args)
    prefetch = batches_lib.device_prefetch(data_cfg, mesh)
    return TranslationBatchIterator(host, mesh, num_blocks, prefetch), data.tokenizer
