"""The input pipeline: grain over prepared TFDS data, per-host shares, global jax.Arrays.

Order of operations (train):

  tfds data source -> sentences -> token ids (once, cached on disk)
  -> pair index (once per seed, cached on disk, memory-mapped) -> global batch s = stream
  positions s*B .. s*B + B - 1 -> (dataset of the mix, example, epoch) of each (reshuffled
  every epoch) -> this process's rows, built as one numpy batch (masks depend on the epoch)
  -> [grain worker processes] -> global jax.Array per field [-> put on the devices ahead].

The global stream of examples depends only on the config and the seed: global batch `s` is
rows `s*B .. s*B + B - 1` of it whatever the number of processes or data workers, and process
`p` of `n` computes only rows `p*B/n .. (p+1)*B/n - 1` of each. The iterator's state is the
number of the next global batch, so a resumed run, even on another number of hosts or workers,
continues with exactly the batches an uninterrupted one would have seen.
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import grain
import jax
import numpy as np

from ln_jax import console
from ln_jax import sharding as sharding_lib
from ln_jax.data import pairs as pairs_lib
from ln_jax.data import pretraining
from ln_jax.data import sources as sources_lib
from ln_jax.data.config import DataConfig, PretrainingOptions
from ln_jax.data.host_iterator import (  # noqa: F401  (re-exported: loader's public names)
    STATE_VERSION,
    DataWorkerError,
    HostBatchIterator,
    read_options,
)
from ln_jax.data.stream import ExampleStream, HostBatches
from ln_jax.data.tokenizer import Tokenizer, get_tokenizer
from ln_jax.validate import ConfigError, UserError

SPLITS = ("train", "eval")
DEVICE_PREFETCH_ACCELERATOR = 2  # batches on the devices ahead of the step on GPU/TPU
_POLL_S = 1.0  # how often a waiting process looks for process 0's cache
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
# Examples of a split: token ids and pair indexes, cached
# --------------------------------------------------------------------------------------------


class CacheWaitError(UserError, TimeoutError):
    """A process waited too long for a cache that process 0 builds."""


def _split_name(cfg: DataConfig, split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; use one of {SPLITS}")
    return cfg.train_split if split == "train" else cfg.eval_split


def tokenized_corpus(
    source: sources_lib.TextSource, split_name: str, tokenizer: Tokenizer
) -> pretraining.TokenizedCorpus:
    """The split's token ids, computed once and cached in `source.cache_dir` (beside the
    prepared data; for a URL data dir, a local folder of this host)."""
    tag = hashlib.md5(split_name.encode()).hexdigest()[:8]
    folder = source.cache_dir / f"tokens-{tag}-{tokenizer.fingerprint[:12]}"
    if not (folder / "doc_starts.npy").is_file():
        corpus = pretraining.tokenize_documents(
            source.documents(split_name), tokenizer.encode, tokenizer.vocab_size
        )
        pretraining.save_corpus(corpus, folder)
    return pretraining.load_corpus(folder)


def pair_index_meta(
    cfg: DataConfig, examples: PretrainingOptions, split_name: str, tokenizer: Tokenizer, seed: int
) -> dict:
    """Everything a split's pair index depends on besides the dataset (its folder)."""
    return {
        "version": pairs_lib.PAIR_INDEX_VERSION,
        "split": split_name,
        "tokenizer": tokenizer.fingerprint,
        "seed": seed,
        "max_seq_length": cfg.max_seq_length,
        "nsp": examples.nsp,
        "short_seq_prob": examples.short_seq_prob if examples.nsp else None,
    }


def pair_index_folder(source: sources_lib.TextSource, meta: dict[str, Any]):
    """The cache folder of a pair index: beside the dataset's token ids (`source.cache_dir`),
    named by `meta`."""
    tag = hashlib.md5(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]
    return source.cache_dir / f"pairs-{tag}"


def pair_index(
    source: sources_lib.TextSource,
    corpus: pretraining.TokenizedCorpus,
    meta: dict[str, Any],
    *,
    builder: bool = True,
    timeout_s: float = 3600.0,
) -> pairs_lib.PairIndex:
    """The split's pair index, cached beside its token ids and memory-mapped.

    One process builds it (`builder`: process 0 of a multi-host job); the others wait for its
    file, up to `timeout_s`. Callers make every process a builder when the cache is per host
    (`source.per_host_cache`): a file of process 0 would never appear there.

    Raises:
      CacheWaitError: a waiting process timed out, naming the file and what to check.
    """
    folder = pair_index_folder(source, meta)
    if not pairs_lib.is_saved(folder):
        if builder:
            built = pairs_lib.build_pair_index(
                corpus, max_seq_length=meta["max_seq_length"], nsp=meta["nsp"],
                short_seq_prob=meta["short_seq_prob"] or 0.0, seed=meta["seed"],
            )  # fmt: skip
            pairs_lib.save_pair_index(built, folder, meta)
        else:
            _wait_for(folder, timeout_s)
    return pairs_lib.load_pair_index(folder)


def _wait_for(folder, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pairs_lib.is_saved(folder):
        if time.monotonic() > deadline:
            raise CacheWaitError(
                f"process {jax.process_index()} waited {timeout_s:.0f} s for the pair index "
                f"{folder}, which process 0 builds. Check process 0's log for an error and that "
                "data_dir is on a file system every host sees; a larger corpus may need a larger "
                "data.prepare_timeout_s."
            )
        time.sleep(_POLL_S)


def _corpora(cfg: DataConfig, split: str, per_host: bool = True):
    """Opens every dataset of the config: [(source, token ids, weight), ...] and the tokenizer.

    With `per_host=False` the token ids of sources whose caches are per host are left out
    (None): `make_pipeline` lets process 0 write only what the processes share first.
    """
    opened = sources_lib.open_sources(cfg)
    tokenizer = get_tokenizer(cfg, opened)
    name = _split_name(cfg, split)
    corpora = [
        (s, tokenized_corpus(s, name, tokenizer) if per_host or not s.per_host_cache else None, w)
        for s, w in opened
    ]
    return corpora, tokenizer


def _tokenize_rest(cfg: DataConfig, split: str, corpora, tokenizer):
    """`corpora` with the token ids `_corpora(per_host=False)` left out computed (or loaded)."""
    name = _split_name(cfg, split)
    return [
        (s, c if c is not None else tokenized_corpus(s, name, tokenizer), w) for s, c, w in corpora
    ]


def _components(cfg, examples, split, seed, corpora, tokenizer, builder: bool):
    spec = pretraining.masking_spec(tokenizer, examples)
    meta = pair_index_meta(cfg, examples, _split_name(cfg, split), tokenizer, seed)
    components = []
    for stream, (source, corpus, weight) in enumerate(corpora):
        builds = builder or source.per_host_cache  # a per-host cache: every process builds
        pairs = pair_index(source, corpus, meta, builder=builds, timeout_s=cfg.prepare_timeout_s)
        made = pretraining.PretrainingExamples(
            corpus, spec, max_seq_length=cfg.max_seq_length, nsp=examples.nsp, seed=seed,
            stream=stream, pairs=pairs,
        )  # fmt: skip
        components.append((made, weight))
    return components


def load_examples(
    cfg: DataConfig, split: str, seed: int, examples: PretrainingOptions | None = None
) -> tuple[list[tuple[pretraining.PretrainingExamples, float]], Tokenizer]:
    """Opens every dataset of the config and its examples for `split` ("train"|"eval"), made
    as `examples` says (None = `PretrainingOptions()`: BERT's defaults).

    Returns:
      [(examples, mix weight), ...] and the tokenizer.
    """
    examples = PretrainingOptions() if examples is None else examples
    corpora, tokenizer = _corpora(cfg, split)
    components = _components(cfg, examples, split, seed, corpora, tokenizer, builder=True)
    return components, tokenizer


def example_stream(components, *, seed: int, shuffle: bool = True) -> ExampleStream:
    """The endless global stream of examples: shuffled per epoch, masks per epoch, mixed."""
    return ExampleStream([c for c, _ in components], [w for _, w in components],
                         seed=seed, shuffle=shuffle)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Global batches
# --------------------------------------------------------------------------------------------


def to_global(batch: Batch, mesh: jax.sharding.Mesh, global_batch_size: int) -> Batch:
    """This process's rows of a batch -> global jax.Arrays sharded by `batch_sharding(mesh)`."""
    sharding = sharding_lib.batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (global_batch_size, *v.shape[1:]))
        for k, v in batch.items()
    }


class GlobalBatchIterator(Iterator[Batch]):
    """Batches as global jax.Arrays sharded by `batch_sharding(mesh)`, leading dim = B.

    With `prefetch` = k > 0 the next k batches are already put on the devices when a batch is
    returned (the transfers overlap the step). `get_state` describes the next batch returned,
    not the prefetched ones, so a checkpoint resumes exactly.
    """

    def __init__(
        self,
        host: HostBatchIterator,
        mesh: jax.sharding.Mesh,
        global_batch_size: int,
        prefetch: int = 0,
    ):
        self.host, self.mesh, self.global_batch_size = host, mesh, global_batch_size
        self.prefetch = prefetch
        self._ahead: collections.deque[tuple[dict[str, Any], Batch]] = collections.deque()

    def __next__(self) -> Batch:
        while len(self._ahead) <= self.prefetch:
            state = self.host.get_state()
            local = next(self.host)
            batch = to_global(local, self.mesh, self.global_rows(local))
            self._ahead.append((state, batch))
        return self._ahead.popleft()[1]

    def global_rows(self, local: Batch) -> int:
        """B of the global batch `local` (this host's rows) is part of."""
        return self.global_batch_size

    def get_state(self) -> dict[str, Any]:
        return self._ahead[0][0] if self._ahead else self.host.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._ahead.clear()
        self.host.set_state(state)

    def close(self) -> None:
        self._ahead.clear()
        self.host.close()


class EvalBatches:
    """A fixed, finite, deterministic sequence of eval batches; iterable any number of times.

    Examples come in corpus order (no shuffle) with the masks of epoch 0; when `num_batches`
    asks for more than one pass, later passes use the masks of epochs 1, 2, ...
    """

    def __init__(self, batches: HostBatches, num_batches: int, convert=None):
        self.batches, self.num_batches, self._convert = batches, num_batches, convert

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        ds = grain.MapDataset.range(self.num_batches).map(self.batches)
        for batch in ds.to_iter_dataset(read_options(1)):
            yield self._convert(batch) if self._convert else batch


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _identity(cfg: DataConfig, examples, split, seed: int, components, batch_size: int) -> dict:
    """What a saved iterator state must match: the data, the seed, the batch size."""
    dataset = cfg.dataset if isinstance(cfg.dataset, str) else [list(e) for e in cfg.dataset]
    return {
        "dataset": dataset,
        "split": _split_name(cfg, split),
        "seed": seed,
        "batch_size": batch_size,
        "max_seq_length": cfg.max_seq_length,
        "max_predictions_per_seq": examples.max_predictions_per_seq,
        "nsp": examples.nsp,
        "whole_word_masking": examples.whole_word_masking,
        "num_examples": [len(ex) for ex, _ in components],
    }


def _eval_num_batches(cfg: DataConfig, components, batch_size: int, requested: int | None) -> int:
    if requested is not None or cfg.eval_num_batches is not None:
        return int(requested if requested is not None else cfg.eval_num_batches)
    # One pass, the last batch completed from the next pass (the eval split may be tiny).
    return max(1, -(-sum(len(ex) for ex, _ in components) // batch_size))


def _build(cfg, examples, split, seed, block, num_blocks, num_batches, threads, workers,
           components, convert):  # fmt: skip
    train = split == "train"
    batch_size = cfg.global_batch_size if train else cfg.eval_batch_size or cfg.global_batch_size
    stream = example_stream(components, seed=seed, shuffle=train)
    batches = HostBatches(stream, batch_size, host_rows(batch_size, block, num_blocks))
    if train:
        identity = _identity(cfg, examples, split, seed, components, batch_size)
        workers = cfg.worker_count if workers is None else workers
        return HostBatchIterator(batches, identity, threads, workers)
    count = _eval_num_batches(cfg, components, batch_size, num_batches)
    return EvalBatches(batches, count, convert)


def make_host_pipeline(
    cfg: DataConfig,
    *,
    examples: PretrainingOptions | None = None,
    split: str = "train",
    seed: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    num_batches: int | None = None,
    threads: int = 1,
    workers: int | None = None,
) -> tuple[HostBatchIterator | EvalBatches, Tokenizer]:
    """The pipeline without devices: numpy batches of one process's rows.

    Args:
      cfg: the data config.
      examples: how examples are made (BERT's section "bert"); None = `PretrainingOptions()`.
      split: "train" (endless, shuffled, checkpointable) or "eval" (finite, fixed).
      seed: seed of pairs, shuffle and masks; None = cfg.seed.
      process_index: which process's rows to load (tests may fake it).
      process_count: number of processes sharing each global batch.
      num_batches: eval only; None = cfg.eval_num_batches or one pass.
      threads: grain read threads without workers (0 = compute each batch on `next`).
      workers: train only; data worker processes, None = cfg.worker_count.

    Returns:
      (iterator or EvalBatches, tokenizer); batches have leading dim
      global_batch_size // process_count.
    """
    seed = cfg.seed if seed is None else seed
    size = cfg.global_batch_size if split == "train" else cfg.eval_batch_size
    host_rows(size or cfg.global_batch_size, process_index, process_count)  # validates
    examples = PretrainingOptions() if examples is None else examples
    components, tokenizer = load_examples(cfg, split, seed, examples)
    args = (cfg, examples, split, seed, process_index, process_count, num_batches, threads, workers)
    return _build(*args, components, None), tokenizer


def device_prefetch(cfg: DataConfig, mesh: jax.sharding.Mesh) -> int:
    """Batches put on the devices ahead: cfg.device_prefetch, or by default 0 on CPU devices
    (their memory is the host's) and DEVICE_PREFETCH_ACCELERATOR on GPU/TPU."""
    if cfg.device_prefetch is not None:
        return cfg.device_prefetch
    on_cpu = all(d.platform == "cpu" for d in mesh.devices.flat)
    return 0 if on_cpu else DEVICE_PREFETCH_ACCELERATOR


_setup_log = console.file_only_logger(__name__)  # where a run's start went: train.log


def make_pipeline(
    cfg: DataConfig,
    *,
    examples: PretrainingOptions | None = None,
    split: str = "train",
    seed: int | None = None,
    mesh: jax.sharding.Mesh,
    num_batches: int | None = None,
    threads: int = 1,
    workers: int | None = None,
) -> tuple[GlobalBatchIterator | EvalBatches, Tokenizer]:
    """The trainer's pipeline: batches of global jax.Arrays sharded by `batch_sharding(mesh)`.

    Each process loads only its rows of each global batch and the global arrays are assembled
    with `jax.make_array_from_process_local_data`. On several processes, process 0 prepares the
    data, the tokenizer and the token ids first while the others wait (then find them in the
    shared data dir or rebuild them identically); then process 0 builds the pair indexes while
    the others wait for their files (`data.prepare_timeout_s`). For a data dir that is a URL
    the token ids and pair indexes are cached on each host (`TextSource.cache_dir`), so every
    process builds its own, identical ones; only the tokenizer is shared (in the data dir).

    Args:
      cfg: the data config.
      examples: how examples are made (BERT's section "bert"); None = `PretrainingOptions()`.
      split: "train" (endless, shuffled; `get_state`/`set_state`) or "eval" (finite, fixed).
      seed: seed of pairs, shuffle and masks; None = cfg.seed.
      mesh: the device mesh.
      num_batches: eval only; None = cfg.eval_num_batches or one pass.
      threads: grain read threads without workers (0 = compute each batch on `next`).
      workers: train only; data worker processes, None = cfg.worker_count.

    Raises:
      ValueError: if the batch size is not a multiple of batch_divisor(mesh) and of the
        process count.
    """
    seed = cfg.seed if seed is None else seed
    examples = PretrainingOptions() if examples is None else examples
    size = cfg.global_batch_size if split == "train" else cfg.eval_batch_size
    size = size or cfg.global_batch_size
    check_global_batch(size, sharding_lib.batch_divisor(mesh), jax.process_count())
    block, num_blocks = mesh_rows(mesh, size)
    clock = [time.perf_counter()]
    corpora, tokenizer = _prepare_once(lambda: _corpora(cfg, split, per_host=False))
    clock.append(time.perf_counter())
    corpora = _tokenize_rest(cfg, split, corpora, tokenizer)
    builder = jax.process_index() == 0
    components = _components(cfg, examples, split, seed, corpora, tokenizer, builder)
    clock.append(time.perf_counter())
    args = (cfg, examples, split, seed, block, num_blocks, num_batches, threads, workers)
    pipeline = _build(*args, components, lambda b: to_global(b, mesh, size))
    if split == "train":
        pipeline = GlobalBatchIterator(pipeline, mesh, size, device_prefetch(cfg, mesh))
    clock.append(time.perf_counter())
    _setup_log.info(
        "data pipeline %s: data and tokenizer %.1f s, token ids and pair index %.1f s, "
        "loader %.1f s",
        split,
        *np.diff(clock),
    )
    return pipeline, tokenizer


def _prepare_once(build):
    """Runs `build` on process 0 first, so that one process writes the shared caches."""
    if jax.process_count() == 1:
        return build()
    from jax.experimental import multihost_utils

    result = build() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices("ln_jax.data: prepared")
    return result if result is not None else build()
