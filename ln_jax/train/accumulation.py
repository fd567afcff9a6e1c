"""Automatic gradient accumulation: fit a train step into device memory by XLA's own estimate.

`grad_accum_steps=0` ("auto") compiles the step once at one micro-batch, reads XLA's memory
analysis, picks the smallest power-of-two accumulation whose estimate fits the device, and
compiles the step at it, at a larger one while the compiled step does not fit, so that e.g.
BERT-base at batch 256 runs on a 24 GiB CPU as it does on an 80 GiB GPU. `fit` is that
procedure, for the trainer (ahead of time or not) and `python -m ln_jax.compile_check`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import jax

log = logging.getLogger(__name__)
GiB = 2**30
HEADROOM = 0.8  # use at most this fraction of a device's memory
# When no accumulation fits. On a TPU (libtpu's compile, BERT-base 256 x 128 on a v6e-1,
# docs/tpu.md) "dots" took the temporaries 14.0 -> 6.3 GiB for 0.6% more FLOPs, "full" to
# 2.2 GiB for 22% more; XLA:CPU's estimate did not move (docs/usage.md).
REMAT_HINT = (
    "try --config.model.remat=dots (the backward recomputes all but the matmuls' outputs) or "
    "remat=full (each layer), or a smaller data.global_batch_size"
)


def device_memory_bytes(device: Any = None) -> int | None:
    """Memory of one device: the allocator's limit on GPU/TPU, free RAM / local devices on CPU."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # not every backend implements it
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        import psutil

        # What is free now, not the total: other processes (and XLA's compiler) share the RAM.
        return psutil.virtual_memory().available // jax.local_device_count()
    return None


def step_memory(compiled: Any) -> tuple[int, int]:
    """(bytes that do not scale with the batch, temporary bytes) per device of a compiled step."""
    mem = compiled.memory_analysis()
    if mem is None:  # a backend without the analysis: taken to fit (the run finds out)
        return 0, 0
    fixed = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    return int(fixed + mem.generated_code_size_in_bytes), int(mem.temp_size_in_bytes)


def candidates(batch: int, divisor: int) -> list[int]:
    """The accumulations a batch allows: powers of two k, k | batch, batch/k a multiple of
    `divisor` (the mesh's batch divisor), smallest first."""
    return [k for k in (2**i for i in range(16)) if batch % k == 0 and (batch // k) % divisor == 0]


def choose_accumulation(batch: int, divisor: int, fixed: int, temp: int, budget: int) -> int:
    """Smallest power of two k (k | batch, batch/k a multiple of `divisor`) whose estimate
    fixed + temp/k fits `budget`; the largest such k if none fits."""
    allowed = candidates(batch, divisor)
    for k in allowed:
        if fixed + temp / k <= budget:
            return k
    return allowed[-1]


def larger_if_over(batch: int, divisor: int, accum: int, needed: int, budget: int) -> int | None:
    """The next accumulation above `accum` when the step compiled at `accum` needs more than
    `budget` bytes, else None (it fits, or the batch allows no more).

    The estimate from one micro-batch takes the temporaries to shrink k-fold; they do not
    quite: an accumulated step also carries its gradient sum, and a compiler may keep more.
    Measured with libtpu's compile for a v5e-1 (docs/tpu.md): BERT-base's 2 x 128 was
    estimated within 80% of 16 GiB and needed 14.56 GiB (9.25 since micro-batches run one
    after another).
    """
    if needed <= budget:
        return None
    return next((k for k in candidates(batch, divisor) if k > accum), None)


def budget_bytes(memory: int | None = None) -> int | None:
    """The bytes a step may use on one device: `HEADROOM` of `memory` (default: this
    device's, `device_memory_bytes`); None where the memory is unknown."""
    memory = device_memory_bytes() if memory is None else memory
    return None if memory is None else int(HEADROOM * memory)


def size(num_bytes: float) -> str:
    """Bytes as GiB with one decimal, or MiB below one GiB (a test's small budgets)."""
    if num_bytes >= GiB:
        return f"{num_bytes / GiB:.1f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def fit(batch: int, divisor: int, budget: int | None, compile_at: Callable[[int], Any]) -> int:
    """The accumulation an "auto" run uses, found by compiling the step.

    `compile_at(k)` compiles the step at k micro-batches and returns its per-device
    (bytes that do not scale with the batch, temporary bytes) (`step_memory`). k = 1 is the
    probe; its estimate fixed + temp / k picks the smallest k that fits `budget`
    (`choose_accumulation`); the step is then compiled at k, and at the next larger k while
    it needs more than `budget` (`larger_if_over`). The last `compile_at` call is at the
    returned k. `budget` None (the device's memory unknown): 1. The choices are logged.
    """
    fixed, temp = compile_at(1)
    if budget is None:
        log.warning("device memory unknown: grad_accum_steps=auto uses 1")
        return 1
    k = choose_accumulation(batch, divisor, fixed, temp, budget)
    log.log(
        logging.WARNING if k > 1 else logging.INFO,  # the batch split, or as asked
        "grad_accum_steps=auto: the step needs %s per device in one micro-batch; using %d "
        "micro-batch(es), estimated %s of the %s it may use (%.0f%% of the device)",
        size(fixed + temp),
        k,
        size(fixed + temp / k),
        size(budget),
        100 * HEADROOM,
    )
    while k > 1:
        needed = sum(compile_at(k))
        larger = larger_if_over(batch, divisor, k, needed, budget)
        if needed > budget:
            log.warning(
                "grad_accum_steps=auto: at %d micro-batches the compiled step needs %s per "
                "device, over %s: %s",
                k,
                size(needed),
                size(budget),
                f"trying {larger}" if larger else f"the batch allows no more; {REMAT_HINT}",
            )
        if larger is None:
            return k
        k = larger
    if fixed + temp > budget:
        log.warning("the step may not fit in one micro-batch: %s", REMAT_HINT)
    return k
