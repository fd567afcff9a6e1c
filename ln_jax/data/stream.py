"""The global stream of examples: position g -> (dataset of the mix, example, epoch) -> batch.

The training stream is endless. Position g of it belongs to dataset k of the mix by a fixed
weighted interleaving (`Mix`), is position j of that dataset's own stream, which is example
`permute(j mod n_k)` of epoch `j // n_k`: every epoch is a new keyed permutation
(`keyed_random.permute`), and the masks depend on the epoch. Everything is a pure function of
(seed, position), computed for a whole batch of positions with numpy, so global batch s (positions
s*B .. s*B + B - 1) is the same whichever host, worker process or number of them computes it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ln_jax.data import keyed_random


class Examples(Protocol):
    """A dataset's examples as the stream reads them (BERT's `PretrainingExamples`): `len` and
    `batch(indices int [n], epochs int [n]) -> {key: array [n, ...]}`, a pure function of its
    arguments."""

    def __len__(self) -> int: ...

    def batch(self, indices: np.ndarray, epochs: np.ndarray) -> dict[str, np.ndarray]: ...


MIX_PERIOD = 10_000  # positions per period of the mix pattern: weights resolve to 1e-4
_SHUFFLE_SALT = 0x5EED


def mix_counts(weights: Sequence[float], period: int = MIX_PERIOD) -> np.ndarray:
    """Positions per period for each dataset: weights rounded (largest remainder), each >= 1."""
    exact = np.asarray(weights, np.float64) / np.sum(weights) * period
    counts = np.maximum(np.floor(exact).astype(np.int64), 1)
    short = period - counts.sum()
    if short > 0:  # the largest remainders get the rest
        counts[np.argsort(counts - exact, kind="stable")[:short]] += 1
    elif short < 0:  # weights below 1/period were raised to 1: take it from the largest
        counts[np.argmax(counts)] += short
    return counts


@dataclasses.dataclass(frozen=True, eq=False)
class Mix:
    """A fixed interleaving of K datasets: in each period dataset k gets counts[k] positions,
    spread evenly (smooth weighted round robin).

    Attributes:
      counts: int64 [K], positions per period of each dataset.
      pattern: int64 [L], the dataset of each position of a period (L = counts.sum()).
      rank: int64 [L], how often that dataset came earlier in the period.
    """

    counts: np.ndarray
    pattern: np.ndarray
    rank: np.ndarray

    @classmethod
    def from_weights(cls, weights: Sequence[float]) -> Mix:
        counts = mix_counts(weights) if len(weights) > 1 else np.ones(1, np.int64)
        period = int(counts.sum())
        pattern, rank = np.zeros(period, np.int64), np.zeros(period, np.int64)
        credit, seen = np.zeros(len(counts), np.int64), np.zeros(len(counts), np.int64)
        for position in range(period):
            credit += counts
            k = int(np.argmax(credit))
            credit[k] -= period
            pattern[position], rank[position] = k, seen[k]
            seen[k] += 1
        return cls(counts, pattern, rank)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset int64 [n], position in that dataset's stream int64 [n]) of positions [n]."""
        cycle, offset = np.divmod(positions, len(self.pattern))
        dataset = self.pattern[offset]
        return dataset, cycle * self.counts[dataset] + self.rank[offset]


class ExampleStream:
    """The endless stream of examples of a mix of datasets, randomly accessible by position."""

    def __init__(
        self,
        components: Sequence[Examples],
        weights: Sequence[float],
        *,
        seed: int,
        shuffle: bool = True,
    ):
        """Args:
        components: the examples of each dataset of the mix.
        weights: mix weights (any positive numbers).
        seed: seed of the epoch shuffles.
        shuffle: False = corpus order in every epoch (evaluation).
        """
        self.components, self.seed, self.shuffle = list(components), seed, shuffle
        self.mix = Mix.from_weights(list(weights))

    def locate(self, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dataset, example index, epoch), int64 [n] each, of stream positions int [n]."""
        dataset, local = self.mix.locate(np.asarray(positions, np.int64))
        index, epoch = np.zeros_like(local), np.zeros_like(local)
        for k in np.unique(dataset):
            here = dataset == k
            n = len(self.components[k])
            epoch[here], within = np.divmod(local[here], n)
            index[here] = self._order(within, epoch[here], k, n)
        return dataset, index, epoch

    def _order(self, within: np.ndarray, epoch: np.ndarray, k: int, n: int) -> np.ndarray:
        if not self.shuffle:
            return within
        out = np.empty_like(within)
        for e in np.unique(epoch):  # a batch spans at most a few epochs
            at = epoch == e
            key = keyed_random.derive_key(self.seed, k, e, _SHUFFLE_SALT)
            out[at] = keyed_random.permute(within[at], n, key)
        return out

    def batch(self, positions) -> dict[str, np.ndarray]:
        """The examples at stream positions int [n], as one batch (leading dim n)."""
        dataset, index, epoch = self.locate(positions)
        if len(self.components) == 1:
            return self.components[0].batch(index, epoch)
        out: dict[str, np.ndarray] = {}
        for k in np.unique(dataset):
            here = np.flatnonzero(dataset == k)
            part = self.components[k].batch(index[here], epoch[here])
            for key, value in part.items():
                if key not in out:
                    out[key] = np.zeros((len(dataset), *value.shape[1:]), value.dtype)
                out[key][here] = value
        return out


@dataclasses.dataclass(frozen=True)
class HostBatches:
    """Global batch number -> this host's rows of it, a batch dict (the grain map function).

    Attributes:
      stream: the example stream.
      global_batch_size: B.
      rows: the rows of every global batch this host loads (`ln_jax.data.batches.host_rows`).
    """

    stream: ExampleStream
    global_batch_size: int
    rows: slice

    def positions(self, step: int, count: int = 1) -> np.ndarray:
        """Stream positions int64 [count * b] of this host's rows of global batches
        `step .. step + count - 1`."""
        starts = (step + np.arange(count))[:, None] * self.global_batch_size
        return (starts + np.arange(self.rows.start, self.rows.stop)).reshape(-1)

    def __call__(self, step: int, count: int = 1) -> dict[str, np.ndarray]:
        """This host's rows of `count` consecutive global batches, stacked: [count * b, ...]."""
        return self.stream.batch(self.positions(step, count))


# Worker processes hand the trainer's process one block of bytes per batch, each field in the
# narrowest type that holds its values: grain pays per array handed over (a shared-memory
# block or a pickle each) and per byte (pickle, pipe, unpickle), and both cost more than
# building the batch (ids fit 16 bits, masks and labels 8).
Layout = tuple[tuple[str, str, str, tuple[int, ...]], ...]  # field, dtype, wire dtype, shape


def _wire_dtype(largest: int) -> str:
    """The narrowest unsigned dtype that holds 0..largest."""
    for t in (np.uint8, np.uint16, np.uint32):
        if largest <= np.iinfo(t).max:
            return np.dtype(t).str
    return np.dtype(np.uint64).str


def batch_layout(batch: dict[str, np.ndarray], largest: dict[str, int]) -> Layout:
    """(field, dtype, wire dtype, shape after the batch dim) of each field, in packed order.

    Args:
      batch: a batch (one row is enough) of the fields and dtypes to pack.
      largest: the largest value each field can hold (0/1 fields: 1).
    """
    return tuple(
        (k, batch[k].dtype.str, _wire_dtype(largest[k]), batch[k].shape[1:]) for k in sorted(batch)
    )


def pack(batch: dict[str, np.ndarray], layout: Layout) -> np.ndarray:
    """A batch as one uint8 array: field after field, each in its wire dtype."""
    return np.concatenate(
        [batch[k].astype(wire).reshape(-1).view(np.uint8) for k, _, wire, _ in layout]
    )


def unpack(block: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """The inverse of `pack`: fields in their own dtypes (new arrays)."""
    row_bytes = sum(int(np.prod(shape)) * np.dtype(wire).itemsize for _, _, wire, shape in layout)
    rows, out, start = len(block) // row_bytes, {}, 0
    for name, dtype, wire, shape in layout:
        size = rows * int(np.prod(shape)) * np.dtype(wire).itemsize
        field = block[start : start + size].view(np.dtype(wire)).astype(np.dtype(dtype))
        out[name], start = field.reshape(rows, *shape), start + size
    return out


@dataclasses.dataclass(frozen=True)
class PackedChunks:
    """Chunk c = global batches start + c*count .. start + c*count + count - 1 of `batches`,
    packed (`pack`): what a worker process sends. A chunk of several batches pays grain's
    per-element costs once.
    """

    batches: HostBatches
    layout: Layout
    start: int
    count: int

    @classmethod
    def of(cls, batches: HostBatches, start: int, count: int) -> PackedChunks:
        """The chunks of `batches` from global batch `start` on, `count` batches each."""
        first = batches.stream.components[0]
        ids, length = first.spec.vocab_size - 1, first.max_seq_length - 1
        largest = {"input_ids": ids, "masked_ids": ids, "masked_positions": length}
        one_row = batches.stream.batch(batches.positions(start)[:1])
        layout = batch_layout(one_row, {k: largest.get(k, 1) for k in one_row})
        return cls(batches, layout, start, count)

    def first_step(self, chunk: int) -> int:
        return self.start + chunk * self.count

    def __call__(self, chunk: int) -> np.ndarray:
        return pack(self.batches(self.first_step(chunk), self.count), self.layout)


def record_worker_pid(folder: str, trainer: int, index: int, count: int) -> None:
    """grain's `worker_init_fn` (with `folder` and `trainer` bound): worker `index` of `count`
    leaves its pid in `folder`, so that the trainer's process can tell which worker died, and
    exits when the trainer's process (pid `trainer`) has gone (`exit_with_parent`)."""
    del count
    exit_with_parent(trainer)
    pathlib.Path(folder, f"worker-{index}").write_text(str(os.getpid()))


def exit_with_parent(parent: int, period_s: float = 1.0) -> threading.Thread:
    """Ends this process within `period_s` of the death of its parent, pid `parent` (a daemon
    thread that polls the parent pid; at once if the parent is already gone).

    grain's workers stop only when the parent asks. If the trainer dies without asking
    (SIGKILL, the OOM killer, a preempted job's hard kill), each worker keeps its place forever,
    waiting to hand over a chunk (measured: two orphans of 255 MB resident each, alive 13
    minutes later); a restarted job on the same host would run beside them.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        os._exit(EXIT_PARENT_GONE)

    thread = threading.Thread(target=watch, daemon=True, name="ln_jax-exit-with-parent")
    thread.start()
    return thread


EXIT_PARENT_GONE = 75  # a data worker's exit code once the trainer's process has gone
