"""Global batches over a mesh, whatever the family: which rows of each global batch a process
loads, the global jax.Arrays made from them, and the iterator that puts them on the devices
ahead of the step.

Every family's pipeline (BERT's `ln_jax.data.bert.pipeline`, translation's
`ln_jax.data.translation.batches`, GLUE's `ln_jax.data.bert.glue`) builds its numpy batches of
a process's rows and hands them to these: process `p` loads only its block of rows (read from
the batch sharding, `mesh_rows`), `to_global` assembles the global arrays with
`jax.make_array_from_process_local_data`, and `GlobalBatchIterator` keeps `prefetch` batches on
the devices with a state that describes the next batch returned, so a checkpoint resumes exactly.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ln_jax import sharding as sharding_lib
from ln_jax.data.config import DataConfig
from ln_jax.data.host_iterator import HostBatchIterator
from ln_jax.validate import ConfigError

DEVICE_PREFETCH_ACCELERATOR = 2  # batches on the devices ahead of the step on GPU/TPU
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


def device_prefetch(cfg: DataConfig, mesh: jax.sharding.Mesh) -> int:
    """Batches put on the devices ahead: cfg.device_prefetch, or by default 0 on CPU devices
    (their memory is the host's) and DEVICE_PREFETCH_ACCELERATOR on GPU/TPU."""
    if cfg.device_prefetch is not None:
        return cfg.device_prefetch
    on_cpu = all(d.platform == "cpu" for d in mesh.devices.flat)
    return 0 if on_cpu else DEVICE_PREFETCH_ACCELERATOR


def prepare_once(build):
    """Runs `build` on process 0 first, so that one process writes the shared caches."""
    if jax.process_count() == 1:
        return build()
    from jax.experimental import multihost_utils

    result = build() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices("ln_jax.data: prepared")
    return result if result is not None else build()
