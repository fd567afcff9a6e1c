"""This process's batches as a checkpointable iterator, built in-process or by grain workers.

`HostBatchIterator` turns a `stream.HostBatches` (global batch s -> this process's rows) into
an iterator whose state is the number of the next global batch. With data workers, grain
worker processes build chunks of consecutive batches; a worker that dies is named, with the
batches and the first example it had not delivered (`DataWorkerError`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import pathlib
import queue
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grain

from ln_jax.data import stream as stream_lib
from ln_jax.data.stream import HostBatches

STATE_VERSION = 2  # 1: grain's own position, before the batched pipeline (issue 17)
CHUNK_ROWS = 1024  # rows a worker process hands over at once
Batch = dict[str, Any]


class DataWorkerError(RuntimeError):
    """A data worker process failed or died; the message names it and the batch's examples."""


# Arrays below this size cross from a worker by pickle instead of a shared-memory block each.
# grain's default, a shared-memory block per chunk, gave 0.79x the pipe's examples/s with two
# workers (`python bench/speed/bench_data.py --transport 2 --rounds=6`, docs/benchmarks.md).
_NO_SHARED_MEMORY = grain.experimental.DatasetOptions(min_shm_size=1 << 40)


def read_options(threads: int) -> grain.ReadOptions:
    # In-process reading: one thread prefetching a few batches overlaps loading with the step.
    return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 if threads else 0)


def _chunk_size(rows: int) -> int:
    """Batches per chunk a worker sends: about 1,024 rows (grain's costs per element, ~1 ms
    on each side, become small next to the ~12 ms those rows take to build)."""
    return max(1, CHUNK_ROWS // rows)


class _WorkerWatch(threading.Thread):
    """Notes which data worker died and how, while it is a zombie: grain reaps it within a
    second, then stops the others, after which nothing tells them apart.

    Attributes:
      died: {worker index: (pid, "exit code N" or "signal N")}.
    """

    def __init__(self, folder: str, period_s: float = 0.1):
        super().__init__(daemon=True, name="ln_jax-data-worker-watch")
        self.folder, self.period_s, self.died = folder, period_s, {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            for path in pathlib.Path(self.folder).glob("worker-*"):
                index = int(path.name.split("-")[1])
                if index not in self.died and (how := _zombie_status(int(path.read_text()))):
                    self.died[index] = (int(path.read_text()), how)

    def inferred(self, index: int, error: Exception) -> dict[int, tuple[int, str]]:
        """{index: (pid, how)} when the watch missed the zombie (grain reaped it first, e.g. on a
        loaded machine): the worker whose chunk was awaited, with the exit code grain reports."""
        path = pathlib.Path(self.folder) / f"worker-{index}"
        found = re.search(r"exit code (-?\d+)", str(error))
        if not (found and path.exists()):
            return {}
        code = int(found.group(1))  # multiprocessing gives -N for a death by signal N
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return {index: (int(path.read_text()), how)}


def _zombie_status(pid: int) -> str | None:
    """How a dead, not yet reaped process ended ("exit code N", "signal N"); None otherwise."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])  # exit_code: the wait status
    if status & 0x7F:
        return f"signal {status & 0x7F}"
    return f"exit code {status >> 8}" if status >> 8 else None  # 0: stopped by grain


def _absl_flags_parsed() -> None:
    # grain's worker processes read absl flags; outside an absl app (tests, notebooks, the
    # benchmark) nothing parsed them, and every worker would fail on its first flag.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def grain_workers(root: Any) -> list[Any]:
    """grain's per-process prefetch iterators under the iterator `root` (grain internals:
    `ProcessPrefetchDatasetIterator`, reached through `DatasetIterator` attributes, sequences and
    the queues of iterators that grain makes ahead); [] where a grain version has none."""
    try:
        from grain._src.python.dataset.transformations.process_prefetch import (
            ProcessPrefetchDatasetIterator as kind,
        )
    except ImportError:
        return []
    found, seen, stack = [], set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kind):
            found.append(obj)
        elif isinstance(obj, list | tuple | collections.deque):
            stack.extend(obj)
        elif isinstance(obj, queue.Queue):
            stack.extend(list(obj.queue))
        elif isinstance(obj, futures.Future) and obj.done() and not obj.cancelled():
            if obj.exception() is None:  # e.g. a worker's iterator made ahead, not yet in use
                stack.append(obj.result())
        elif isinstance(obj, grain.DatasetIterator):
            stack.extend(vars(obj).values())
    return found


@contextlib.contextmanager
def draining(root: Any) -> Iterator[None]:
    """While in the block, reads and drops what grain's worker processes under `root` still
    send once grain has asked them to stop; for wrapping grain's `close`.

    Why: a worker process exits only once its queue's feeder thread has written the chunk it
    holds into the pipe. grain's close empties the queue once, then joins the worker for 25 s
    before it kills it; a chunk that the feeder started after that one read has no reader, and
    about one close in five waited the full 25 s (2 workers, chunks of ~1.7 MB).
    """
    names = ("_prefetch_should_stop", "_buffer")
    workers = [w for w in grain_workers(root) if all(hasattr(w, a) for a in names)]
    done = threading.Event()

    def drain() -> None:
        while not done.wait(0.005):
            for w in workers:
                if w._prefetch_should_stop.is_set():  # set by grain's close, not before
                    _discard_queued(w._buffer)

    reader = threading.Thread(target=drain, daemon=True, name="ln_jax-data-worker-drain")
    reader.start()
    try:
        yield
    finally:
        done.set()
        reader.join(timeout=5.0)  # daemon: never holds up the process


def _discard_queued(buffer: Any) -> None:
    """Reads and drops what a worker's queue holds now (waits only for a chunk that is arriving)."""
    while True:
        try:
            buffer.get_nowait()
        except queue.Empty:
            return


class HostBatchIterator(Iterator[Batch]):
    """Numpy batches of this process's rows, with checkpointable state.

    Each batch: input_ids, segment_ids, attention_mask int32 [b, T]; masked_positions,
    masked_ids int32 [b, P]; masked_weights float32 [b, P]; nsp_label int32 [b], where b is this
    process's share of the global batch. With `workers` > 0, grain worker processes build the
    batches in chunks of consecutive batches (worker i of W builds chunks i, i + W, ...); the
    batches are the same for every number of workers.
    """

    def __init__(
        self, batches: HostBatches, identity: dict[str, Any], threads: int = 1, workers: int = 0
    ):
        self.batches, self._identity = batches, identity
        self.threads, self.workers = threads, workers
        self._it, self._ready, self._pids, self._watch = None, collections.deque(), None, None
        self._start(0)

    def _start(self, step: int) -> None:
        self.close()
        self._next = step
        if self.workers:
            _absl_flags_parsed()
            # A worker sends chunks of batches, each one block through grain's queue (not
            # shared memory): see `stream.pack`.
            rows = self.batches.rows.stop - self.batches.rows.start
            self._chunks = stream_lib.PackedChunks.of(self.batches, step, _chunk_size(rows))
            chunks = grain.MapDataset.range(0, sys.maxsize).map(self._chunks)
            ds = chunks.to_iter_dataset(read_options(0))
            ds = grain.experimental.WithOptionsIterDataset(ds, _NO_SHARED_MEMORY)
            options = grain.MultiprocessingOptions(self.workers, per_worker_buffer_size=2)
            self._pids = tempfile.mkdtemp(prefix="ln_jax_data_workers_")
            self._watch = _WorkerWatch(self._pids)
            self._watch.start()
            record = functools.partial(stream_lib.record_worker_pid, self._pids, os.getpid())
            it = ds.mp_prefetch(options, worker_init_fn=record)
        else:
            steps = grain.MapDataset.range(step, sys.maxsize)
            it = steps.map(self.batches).to_iter_dataset(read_options(self.threads))
        self._it = iter(it)

    def __next__(self) -> Batch:
        if self.workers and not self._ready:
            self._receive()
        batch = self._ready.popleft() if self.workers else next(self._it)
        self._next += 1
        return batch

    def _receive(self) -> None:
        """The next chunk from the workers, split into batches."""
        try:
            block = next(self._it)
        except Exception as e:
            raise DataWorkerError(self._failure(e)) from e
        fields = stream_lib.unpack(block, self._chunks.layout)
        rows = self.batches.rows.stop - self.batches.rows.start
        for i in range(self._chunks.count):  # the chunk's rows are its batches, in order
            self._ready.append({k: v[i * rows : (i + 1) * rows] for k, v in fields.items()})

    def _failure(self, error: Exception) -> str:
        """Names the dead worker(s) and the first batch each had not delivered."""
        workers, count = self.workers, self._chunks.count
        waiting = (self._next - self._chunks.start) // count  # the chunk being waited for
        dead = dict(self._watch.died) if self._watch else {}
        if self._watch and not dead:
            dead = self._watch.inferred(waiting % workers, error)
        parts = []
        for w, pid in sorted(dead.items()) or [(waiting % workers, None)]:
            chunk = waiting + (w - waiting) % workers  # w's first chunk not delivered
            step = self._chunks.first_step(chunk)
            positions = self.batches.positions(step)
            dataset, index, epoch = (int(a[0]) for a in self.batches.stream.locate(positions[:1]))
            state = f"(pid {pid[0]}) died with {pid[1]}" if pid else "failed"
            parts.append(
                f"data worker {w} of {workers} {state} before delivering global batches {step}.."
                f"{step + count - 1} (stream positions from {positions[0]}; the first example "
                f"is example {index} of dataset {dataset}, epoch {epoch})"
            )
        return f"{'; '.join(parts)}: {type(error).__name__}: {error}"

    def close(self) -> None:
        """Stops the worker processes (if any); a later `set_state` starts new ones."""
        if self._it is not None and hasattr(self._it, "close"):
            with draining(self._it) if self.workers else contextlib.nullcontext():
                self._it.close()
        self._it = None
        self._ready.clear()
        if self._watch:
            self._watch.stop.set()
            self._watch = None
        if self._pids:
            shutil.rmtree(self._pids, ignore_errors=True)
            self._pids = None

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable state: the next global batch and the identity of the pipeline."""
        return {"version": STATE_VERSION, "pipeline": self._identity, "next_batch": self._next}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a `get_state()` of the same pipeline (any process or worker count).

        Raises:
          ValueError: if the state belongs to a pipeline with other data, seed or batch size.
        """
        if state.get("version") == 1:
            raise ValueError(
                "iterator state version 1 comes from ln_jax's per-example data pipeline, whose "
                "pairs and masks the batched pipeline does not reproduce: start a new run (or "
                "finish this one with the ln_jax it was started with)."
            )
        if state.get("version") != STATE_VERSION or state.get("pipeline") != self._identity:
            raise ValueError(
                "iterator state is from a different data pipeline:\n"
                f"  saved:   {json.dumps(state.get('pipeline'), sort_keys=True)}\n"
                f"  current: {json.dumps(self._identity, sort_keys=True)}"
            )
        if state["next_batch"] != self._next:
            self._start(int(state["next_batch"]))
