"""Automatic gradient accumulation: fit a train step into device memory by XLA's own estimate.

`grad_accum_steps=0` ("auto") compiles the step once at one micro-batch, reads XLA's memory
analysis, and picks the smallest power-of-two accumulation whose estimate fits the device, so
that e.g. BERT-base at batch 256 runs on a 24 GiB CPU as it does on an 80 GiB GPU.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from ln_jax import sharding

log = logging.getLogger(__name__)
GiB = 2**30
HEADROOM = 0.8  # use at most this fraction of a device's memory


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


def recheck(compiled: Any, data_cfg: Any, mesh: Any, accum: int) -> int | None:
    """After the step is compiled at the chosen `accum` (> 1): the next accumulation to try
    when its real memory is over this device's budget (`larger_if_over`; logged), else None."""
    memory = device_memory_bytes()
    if memory is None:
        return None
    fixed, temp = step_memory(compiled)
    budget = int(HEADROOM * memory)
    divisor = sharding.batch_divisor(mesh)
    larger = larger_if_over(data_cfg.global_batch_size, divisor, accum, fixed + temp, budget)
    if fixed + temp > budget:
        log.warning(
            "grad_accum_steps=auto: at %d micro-batches the compiled step needs %.1f GiB per "
            "device, over %.1f GiB (%.0f%% of %.1f GiB): %s",
            accum,
            (fixed + temp) / GiB,
            budget / GiB,
            100 * HEADROOM,
            memory / GiB,
            f"trying {larger}" if larger else "the batch allows no more; try model.remat=full",
        )
    return larger


def auto_accumulation(jitted_step: Any, args: tuple, data_cfg: Any, mesh: Any) -> int:
    """Compiles `jitted_step(*args)` (one micro-batch) and returns the accumulation to use."""
    with sharding.use_mesh(mesh):
        compiled = jitted_step.lower(*args).compile()
    return choose(compiled, data_cfg, mesh)


def choose(compiled: Any, data_cfg: Any, mesh: Any) -> int:
    """The accumulation to use, from `compiled` (the train step at one micro-batch): its memory
    analysis against this device's memory (`choose_accumulation`); logged as a warning."""
    fixed, temp = step_memory(compiled)
    memory = device_memory_bytes()
    if memory is None:
        log.warning("device memory unknown: grad_accum_steps=auto uses 1")
        return 1
    budget = int(HEADROOM * memory)
    k = choose_accumulation(
        data_cfg.global_batch_size, sharding.batch_divisor(mesh), fixed, temp, budget
    )
    estimate = fixed + temp / k
    log.warning(
        "grad_accum_steps=auto: the step needs %.1f GiB per device in one micro-batch; using %d "
        "micro-batch(es), estimated %.1f GiB of the device's %.1f GiB",
        (fixed + temp) / GiB,
        k,
        estimate / GiB,
        memory / GiB,
    )
    if estimate > budget:
        log.warning("even %d micro-batches may not fit: try --config.model.remat=full", k)
    return k
