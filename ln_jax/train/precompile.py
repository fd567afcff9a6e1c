"""A run's train programs compiled at set-up, in a background thread, while its state is
built.

A run trains with two programs (`ln_jax.train.steps`): the train step and, when the monitor is
on, the same update with its measurements. Compiled lazily, they cost their compile times one
after the other: on one H200, BERT-base's first step came 110 s after the command started (the
automatic accumulation's probe compiled among them), the measured step compiled during step 1
(34.9 s) and the train step, a second jitted function of the probe's program, was read back
from the persistent cache during step 2 (4.8 s; docs/results/gpu/journal.md, 2026-11-27).

Here both are lowered from the abstract state (`steps.abstract_state`: shapes and shardings,
nothing allocated) and compiled one after the other in one background thread, the train step
first; XLA compiles outside Python's lock, so the compiles overlap the state's initialisation,
step 0's set-up and the checkpoint's restore (`trainer.setup(..., wait=False)`, then
`trainer.finish_setup`), and the measured step, compiled second, finds the matmuls' autotuning
already done (XLA keeps its results in the process). One thread, not one per program: two
compiles autotuning on one GPU at once would time their candidate kernels against each other's,
and on this 2-core CPU (BERT-base, batch 8, the whole 2-step command against the lazy compiles
before this module, medians of 3 pairs) one thread per program took 0.99x the wall time and
1.15x the CPU time, one thread for both 0.94x and 1.03x (45.4 s against 49.4 s). They start
once the data pipeline is built, so that its errors (a dataset not found or not prepared) come
at once: a compile cannot be stopped, and a process waits for its threads before it exits. The
jitted functions keep their executables, so the run's first calls with the abstract batch's
shapes compile nothing (the state's scalars are typed as the abstract ones: a weakly typed step
counter was a different program).

With `grad_accum_steps=0` ("auto") the train step at one micro-batch is the probe whose memory
analysis picks the accumulation (`accumulation.fit`); when it picks 1, as it does wherever
the batch fits, the probe is the run's train step and the measured step is compiled at one
micro-batch too. Otherwise both are built and compiled at the chosen accumulation, or at the
next larger one while the train step compiled at it is over the device's budget (the probe's
estimate can be short).
The choice is made in the background thread, as soon as the probe is compiled.

  ahead = Ahead(cfg, task, mesh)       # compiling from here on
  ...                                  # the state
  cfg, programs = ahead.finish()       # {"train": step, "measured": step or absent}
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.task import Task
from ln_jax.train import accumulation, steps

TRAIN, MEASURED = "train", "measured"


def programs_of(
    cfg: TrainConfig, task: Task, mesh: jax.sharding.Mesh, pieces: steps.TrainState
) -> dict:
    """{"train": jitted train step, "measured": its measured variant (monitor on)}, built
    from `pieces` (abstract or concrete) as `steps.jit_train_step` builds them."""
    out = {TRAIN: steps.jit_train_step(cfg, task, mesh, pieces)}
    if cfg.monitor_every:
        out[MEASURED] = steps.jit_train_step(cfg, task, mesh, pieces, measure=True)
    return out


def batch_shapes(batch: dict[str, Any]) -> tuple:
    """A batch's array shapes by key: the programs' signature (a new one compiles again)."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


class Ahead:
    """The run's train programs of `cfg` and `task` on `mesh`, compiling in a background
    thread from construction on (`finish` waits for them)."""

    def __init__(self, cfg: TrainConfig, task: Task, mesh: jax.sharding.Mesh):
        self.cfg, self.task, self.mesh = cfg, task, mesh
        self.abstract = steps.abstract_state(task, mesh)
        self.batch = steps.abstract_batch(task, mesh)
        self.seconds: dict[str, float] = {}  # compile seconds of each program
        self.stopped = False
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ln_jax-compile")
        self.future = self.pool.submit(self._compile_all)

    def _compile(self, name: str, jitted: steps.BoundStep) -> Any:
        if self.stopped:
            raise RuntimeError("set-up failed; the compiles were stopped")
        start = time.perf_counter()
        with sharding.use_mesh(self.mesh):
            compiled = jitted.lower(self.abstract.state, self.abstract.rest, self.batch).compile()
        self.seconds[name] = time.perf_counter() - start
        return compiled

    def _compile_all(self) -> tuple[TrainConfig, dict[str, steps.BoundStep]]:
        """(cfg, programs), in the background thread: with "auto" accumulation the train
        step at each accumulation `accumulation.fit` tries, the last one the run's."""
        cfg, built = self.cfg, {}
        if cfg.grad_accum_steps == 0:

            def compile_at(k: int) -> tuple[int, int]:
                if TRAIN in self.seconds:  # the probe, or a step that did not fit
                    self.seconds["probe"] = self.seconds.get("probe", 0.0) + self.seconds.pop(TRAIN)
                at_k = dataclasses.replace(cfg, grad_accum_steps=k)
                built[k] = programs_of(at_k, self.task, self.mesh, self.abstract)
                return accumulation.step_memory(self._compile(TRAIN, built[k][TRAIN]))

            divisor, budget = sharding.batch_divisor(self.mesh), accumulation.budget_bytes()
            k = accumulation.fit(cfg.data.global_batch_size, divisor, budget, compile_at)
            cfg = dataclasses.replace(cfg, grad_accum_steps=k)
        programs = built.get(cfg.grad_accum_steps) or programs_of(
            cfg, self.task, self.mesh, self.abstract
        )
        for name, jitted in programs.items():
            if name not in self.seconds:
                self._compile(name, jitted)
        return cfg, programs

    def finish(self) -> tuple[TrainConfig, dict[str, steps.BoundStep]]:
        """(cfg with its accumulation chosen, {"train", "measured"?: jitted steps whose
        executables for the abstract batch are compiled}), once compiled. The programs are
        built from the abstract state: the caller checks that the initialised model's graphdef
        equals `abstract.graphdef`."""
        try:
            return self.future.result()
        finally:
            self.pool.shutdown(wait=False)

    def abandon(self) -> None:
        """Set-up failed: no further compile starts (the one running ends in its thread: XLA
        cannot stop it)."""
        self.stopped = True
        self.pool.shutdown(wait=False, cancel_futures=True)
