"""The input pipeline: grain over prepared TFDS data, per-host shares, global jax.Arrays.

Order of operations (train):

  tfds data source -> sentences -> token ids (once, cached on disk)
  -> pair structure (once per seed) -> grain MapDataset.range(E).shuffle.repeat (reshuffled
  every epoch) -> example(index, epoch) (masks depend on the epoch) -> [mix by weight]
  -> batch(rows per process) -> this process's batches -> global jax.Array per field.

The global stream of examples depends only on the config and the seed: global batch `s` is
rows `s*B .. s*B + B - 1` of it whatever the number of processes, and process `p` of `n`
computes only rows `p*B/n .. (p+1)*B/n - 1` of each. The iterator's state is grain's (the
number of batches taken), so a resumed run, even on another number of hosts, continues with
exactly the batches an uninterrupted one would have seen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import grain
import jax
import numpy as np

from ln_jax import sharding as sharding_lib
from ln_jax.data import pretraining
from ln_jax.data import sources as sources_lib
from ln_jax.data.config import DataConfig
from ln_jax.data.tokenizer import Tokenizer, get_tokenizer
from ln_jax.validate import ConfigError

SPLITS = ("train", "eval")
STATE_VERSION = 1
Batch = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Batch sizes and per-host shares
# --------------------------------------------------------------------------------------------


def check_global_batch(global_batch_size: int, divisor: int, process_count: int) -> None:
    """Raises a ConfigError unless the global batch splits over the devices and processes.

    Args:
      global_batch_size: B.
      divisor: `ln_jax.sharding.batch_divisor(mesh)` (data x fsdp devices).
      process_count: number of JAX processes.
    """
    for what, n in (("batch_divisor(mesh) (data x fsdp devices)", divisor),
                    ("the process count", process_count)):  # fmt: skip
        if global_batch_size % n:
            raise ConfigError(
                f"global_batch_size={global_batch_size} is not a multiple of {what} = {n}; "
                f"use a multiple of {np.lcm(divisor, process_count)}."
            )


def host_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
    """Rows of each global batch that process `process_index` of `process_count` loads.

    Raises:
      ValueError: if `global_batch_size` is not a multiple of `process_count`.
    """
    if global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of the process count "
            f"{process_count}"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    per_host = global_batch_size // process_count
    return slice(process_index * per_host, (process_index + 1) * per_host)


def mesh_rows(mesh: jax.sharding.Mesh, global_batch_size: int) -> tuple[int, int]:
    """(block, num_blocks): which equal block of each global batch this process must load.

    Read from the batch sharding itself, so the rows a process loads are the rows its devices
    hold. Processes whose devices hold the same rows (replicas) get the same block.
    """
    shape = (global_batch_size,)
    index_map = sharding_lib.batch_sharding(mesh).devices_indices_map(shape)
    spans: dict[int, set[tuple[int, int]]] = {}
    for device, idx in index_map.items():
        rows = idx[0].indices(global_batch_size)[:2]
        spans.setdefault(device.process_index, set()).add(rows)
    per_process = {p: (min(a for a, _ in s), max(b for _, b in s)) for p, s in spans.items()}
    mine = per_process[jax.process_index()]
    blocks = sorted(set(per_process.values()))
    size = mine[1] - mine[0]
    if any(b - a != size for a, b in blocks) or size * len(blocks) != global_batch_size:
        raise ValueError(f"each process must hold one equal block of rows; got {blocks}")
    return blocks.index(mine), len(blocks)


# --------------------------------------------------------------------------------------------
# Examples of a split
# --------------------------------------------------------------------------------------------


def _split_name(cfg: DataConfig, split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; use one of {SPLITS}")
    return cfg.train_split if split == "train" else cfg.eval_split


def tokenized_corpus(
    source: sources_lib.TextSource, split_name: str, tokenizer: Tokenizer
) -> pretraining.TokenizedCorpus:
    """The split's token ids, computed once and cached beside the prepared data."""
    tag = hashlib.md5(split_name.encode()).hexdigest()[:8]
    folder = source.cache_dir / f"tokens-{tag}-{tokenizer.fingerprint[:12]}"
    if not (folder / "doc_starts.npy").is_file():
        corpus = pretraining.tokenize_documents(
            source.documents(split_name), tokenizer.encode, tokenizer.vocab_size
        )
        pretraining.save_corpus(corpus, folder)
    return pretraining.load_corpus(folder)


def load_examples(
    cfg: DataConfig, split: str, seed: int
) -> tuple[list[tuple[pretraining.PretrainingExamples, float]], Tokenizer]:
    """Opens every dataset of the config and builds its examples for `split` ("train"|"eval").

    Returns:
      [(examples, mix weight), ...] and the tokenizer.
    """
    opened = sources_lib.open_sources(cfg)
    tokenizer = get_tokenizer(cfg, opened)
    spec = pretraining.masking_spec(tokenizer, cfg)
    components = []
    for stream, (source, weight) in enumerate(opened):
        corpus = tokenized_corpus(source, _split_name(cfg, split), tokenizer)
        examples = pretraining.PretrainingExamples(
            corpus,
            spec,
            max_seq_length=cfg.max_seq_length,
            short_seq_prob=cfg.short_seq_prob,
            nsp=cfg.nsp,
            seed=seed,
            stream=stream,
        )
        components.append((examples, weight))
    return components, tokenizer


# --------------------------------------------------------------------------------------------
# grain datasets
# --------------------------------------------------------------------------------------------


def _shuffle_seed(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, stream, 0x5EED]).generate_state(1)[0] >> 1)


def example_stream(
    components: list[tuple[pretraining.PretrainingExamples, float]],
    *,
    seed: int,
    shuffle: bool = True,
) -> grain.MapDataset:
    """The endless global stream of examples: shuffled per epoch, masks per epoch, mixed."""
    streams = []
    for k, (examples, _) in enumerate(components):
        n = len(examples)
        ds = grain.MapDataset.range(n)
        if shuffle:
            ds = ds.shuffle(seed=_shuffle_seed(seed, k))
        # repeat() reshuffles every epoch; the position g in the stream gives the epoch.
        ds = ds.repeat(None).map_with_index(
            lambda g, i, ex=examples, n=n: ex.example(int(i), epoch=g // n)
        )
        streams.append(ds)
    if len(streams) == 1:
        return streams[0]
    return grain.MapDataset.mix(streams, [w for _, w in components])


def host_batches(
    stream: grain.MapDataset, global_batch_size: int, block: int, num_blocks: int
) -> grain.MapDataset:
    """Batches of this process's rows: block `block` of `num_blocks` of every global batch."""
    rows = host_rows(global_batch_size, block, num_blocks)
    per_host = rows.stop - rows.start
    return stream.batch(per_host, drop_remainder=True)[block::num_blocks]


def _read_options(threads: int) -> grain.ReadOptions:
    # In-process reading: on 2 cores, worker processes and grain's 16 default threads were
    # slower. One thread prefetching a few batches overlaps loading with the train step.
    return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 if threads else 0)


# --------------------------------------------------------------------------------------------
# Iterators
# --------------------------------------------------------------------------------------------


class HostBatchIterator(Iterator[Batch]):
    """Numpy batches of this process's rows, with checkpointable state.

    Each batch: input_ids, segment_ids, attention_mask int32 [b, T]; masked_positions,
    masked_ids int32 [b, P]; masked_weights float32 [b, P]; nsp_label int32 [b], where b is this
    process's share of the global batch.
    """

    def __init__(self, batches: grain.MapDataset, identity: dict[str, Any], threads: int = 1):
        self._batches, self._identity, self._threads = batches, identity, threads
        self._it = iter(batches.to_iter_dataset(_read_options(threads)))

    def __next__(self) -> Batch:
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable state: grain's position plus the identity of the pipeline."""
        return {"version": STATE_VERSION, "pipeline": self._identity, "grain": self._it.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a `get_state()` of the same pipeline (any process count).

        Raises:
          ValueError: if the state belongs to a pipeline with other data, seed or batch size.
        """
        if state.get("version") != STATE_VERSION or state.get("pipeline") != self._identity:
            raise ValueError(
                "iterator state is from a different data pipeline:\n"
                f"  saved:   {json.dumps(state.get('pipeline'), sort_keys=True)}\n"
                f"  current: {json.dumps(self._identity, sort_keys=True)}"
            )
        self._it.set_state(state["grain"])


def to_global(batch: Batch, mesh: jax.sharding.Mesh, global_batch_size: int) -> Batch:
    """This process's rows of a batch -> global jax.Arrays sharded by `batch_sharding(mesh)`."""
    sharding = sharding_lib.batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (global_batch_size, *v.shape[1:]))
        for k, v in batch.items()
    }


class GlobalBatchIterator(Iterator[Batch]):
    """Batches as global jax.Arrays sharded by `batch_sharding(mesh)`, leading dim = B."""

    def __init__(self, host: HostBatchIterator, mesh: jax.sharding.Mesh, global_batch_size: int):
        self.host, self.mesh, self.global_batch_size = host, mesh, global_batch_size

    def __next__(self) -> Batch:
        return to_global(next(self.host), self.mesh, self.global_batch_size)

    def get_state(self) -> dict[str, Any]:
        return self.host.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.host.set_state(state)


class EvalBatches:
    """A fixed, finite, deterministic sequence of eval batches; iterable any number of times.

    Examples come in corpus order (no shuffle) with the masks of epoch 0; when `num_batches`
    asks for more than one pass, later passes use the masks of epochs 1, 2, ...
    """

    def __init__(self, batches: grain.MapDataset, num_batches: int, convert=None):
        self._batches = batches[:num_batches]
        self.num_batches, self._convert = num_batches, convert

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        for batch in self._batches.to_iter_dataset(_read_options(1)):
            yield self._convert(batch) if self._convert else batch


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _identity(cfg: DataConfig, split: str, seed: int, components, batch_size: int) -> dict:
    """What a saved iterator state must match: the data, the seed, the batch size."""
    dataset = cfg.dataset if isinstance(cfg.dataset, str) else [list(e) for e in cfg.dataset]
    return {
        "dataset": dataset,
        "split": _split_name(cfg, split),
        "seed": seed,
        "batch_size": batch_size,
        "max_seq_length": cfg.max_seq_length,
        "max_predictions_per_seq": cfg.max_predictions_per_seq,
        "nsp": cfg.nsp,
        "whole_word_masking": cfg.whole_word_masking,
        "num_examples": [len(ex) for ex, _ in components],
    }


def _eval_num_batches(cfg: DataConfig, components, batch_size: int, requested: int | None) -> int:
    if requested is not None or cfg.eval_num_batches is not None:
        return int(requested if requested is not None else cfg.eval_num_batches)
    # One pass, the last batch completed from the next pass (the eval split may be tiny).
    return max(1, -(-sum(len(ex) for ex, _ in components) // batch_size))


def _build(cfg, split, seed, block, num_blocks, num_batches, threads, components, convert):
    train = split == "train"
    batch_size = cfg.global_batch_size if train else cfg.eval_batch_size or cfg.global_batch_size
    stream = example_stream(components, seed=seed, shuffle=train)
    batches = host_batches(stream, batch_size, block, num_blocks)
    if train:
        return HostBatchIterator(
            batches, _identity(cfg, split, seed, components, batch_size), threads
        )
    count = _eval_num_batches(cfg, components, batch_size, num_batches)
    return EvalBatches(batches, count, convert)


def make_host_pipeline(
    cfg: DataConfig,
    *,
    split: str = "train",
    seed: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    num_batches: int | None = None,
    threads: int = 1,
) -> tuple[HostBatchIterator | EvalBatches, Tokenizer]:
    """The pipeline without devices: numpy batches of one process's rows.

    Args:
      cfg: the data config.
      split: "train" (endless, shuffled, checkpointable) or "eval" (finite, fixed).
      seed: seed of pairs, shuffle and masks; None = cfg.seed.
      process_index: which process's rows to load (tests may fake it).
      process_count: number of processes sharing each global batch.
      num_batches: eval only; None = cfg.eval_num_batches or one pass.
      threads: grain read threads (0 = compute each batch on `next`).

    Returns:
      (iterator or EvalBatches, tokenizer); batches have leading dim
      global_batch_size // process_count.
    """
    seed = cfg.seed if seed is None else seed
    size = cfg.global_batch_size if split == "train" else cfg.eval_batch_size
    host_rows(size or cfg.global_batch_size, process_index, process_count)  # validates
    components, tokenizer = load_examples(cfg, split, seed)
    args = (cfg, split, seed, process_index, process_count, num_batches, threads)
    return _build(*args, components, None), tokenizer


def make_pipeline(
    cfg: DataConfig,
    *,
    split: str = "train",
    seed: int | None = None,
    mesh: jax.sharding.Mesh,
    num_batches: int | None = None,
    threads: int = 1,
) -> tuple[GlobalBatchIterator | EvalBatches, Tokenizer]:
    """The trainer's pipeline: batches of global jax.Arrays sharded by `batch_sharding(mesh)`.

    Each process loads only its rows of each global batch and the global arrays are assembled
    with `jax.make_array_from_process_local_data`. On several processes, process 0 prepares the
    data and the tokenizer first; the others then find them in the (shared) data dir or
    rebuild them identically.

    Args:
      cfg: the data config.
      split: "train" (endless, shuffled; `get_state`/`set_state`) or "eval" (finite, fixed).
      seed: seed of pairs, shuffle and masks; None = cfg.seed.
      mesh: the device mesh.
      num_batches: eval only; None = cfg.eval_num_batches or one pass.
      threads: grain read threads (0 = compute each batch on `next`).

    Raises:
      ValueError: if the batch size is not a multiple of batch_divisor(mesh) and of the
        process count.
    """
    seed = cfg.seed if seed is None else seed
    size = cfg.global_batch_size if split == "train" else cfg.eval_batch_size
    size = size or cfg.global_batch_size
    check_global_batch(size, sharding_lib.batch_divisor(mesh), jax.process_count())
    block, num_blocks = mesh_rows(mesh, size)
    components, tokenizer = _prepare_once(lambda: load_examples(cfg, split, seed))
    args = (cfg, split, seed, block, num_blocks, num_batches, threads)
    pipeline = _build(*args, components, lambda b: to_global(b, mesh, size))
    if split == "train":
        pipeline = GlobalBatchIterator(pipeline, mesh, size)
    return pipeline, tokenizer


def _prepare_once(build):
    """Runs `build` on process 0 first, so that one process writes the shared caches."""
    if jax.process_count() == 1:
        return build()
    from jax.experimental import multihost_utils

    result = build() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices("ln_jax.data: prepared")
    return result if result is not None else build()
