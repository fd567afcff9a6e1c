"""The host's part of a train step: how long the step's call takes to return.

  python bench/speed/bench_launch.py --size=base --pairs=30        # about 2 minutes on this CPU

Not a test. Two forms of the same jitted train step, called alternately in one process on a
one-device mesh, each timed from its call to its return (the launch: flattening the
arguments, dispatching, building the outputs; the device works on after it) and to its
results (the whole step):

- `flat`: the train step as the trainer calls it (`ln_jax.train.steps.jit_train_step`), its
  state a `ln_jax.train.flat.FlatState` (one list of arrays);
- `nnx`: the same step function jitted over the state dict of `nnx.State`s (as the step was
  before 2026-11-28), whose `Variable`s JAX flattens and builds again by a Python call each.

A device whose step is shorter than the launch waits for the host: there the launch is the
step's time (small models on a GPU or TPU). BERT-`--size` from configs/bert_preln.py with a
small synthetic batch, so that the host's part is what differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])  # the repository root, for configs/

from bench.speed.measure import make_batch, synthetic_bert_config, write_result  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="base", help="tiny | mini | small | base | large")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--predictions", type=int, default=4)
    p.add_argument(
        "--scan", action="store_true", help="layers stacked (model.scan_layers=true, unrolled)"
    )
    p.add_argument("--pairs", type=int, default=30, help="timed calls of each form")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each form")
    p.add_argument("--out", help="write the result as JSON here")
    return p.parse_args(argv)


def train_config(args: argparse.Namespace) -> Any:
    stacked = {"model.scan_layers": True, "model.scan_unroll": 64} if args.scan else {}
    # --scan unrolls every layer: the GPU arm "stacked" (docs/results/gpu/journal.md)
    shape = (args.size, args.batch, args.seq, args.predictions)
    return synthetic_bert_config(*shape, grad_accum_steps=1, **stacked)


def build_forms(args: argparse.Namespace) -> tuple[dict[str, Callable], int]:
    """({"flat": call, "nnx": call}, the state's array count): each call runs one step of its
    form on its own copy of the state and returns the step's outputs."""
    from ln_jax import sharding
    from ln_jax.task import make_task
    from ln_jax.train import steps

    cfg = train_config(args)
    mesh = sharding.single_device_mesh()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    library = steps.jit_train_step(cfg, task, mesh, pieces)
    shardings = jax.tree.map(lambda x: x.sharding, pieces.state)
    nnx_form = jax.jit(
        steps.make_train_step(cfg, task, pieces.graphdef),
        in_shardings=(shardings, None, None, None),
        out_shardings=(shardings, None),
        donate_argnums=(0,),
    )
    shape = {"batch": args.batch, "seq": args.seq, "predictions": args.predictions}
    batch = jax.device_put(make_batch({**shape, "vocab": 8000}), sharding.batch_sharding(mesh))
    boxes = {name: jax.tree.map(lambda x: x.copy(), pieces.state) for name in ("flat", "nnx")}

    def form(name: str, fn: Callable) -> Callable:
        def call() -> Any:
            with sharding.use_mesh(mesh):
                boxes[name], metrics = fn(boxes[name], pieces.rest, batch)
            return boxes[name], metrics

        return call

    unbound = lambda state, rest, b: nnx_form(state, rest, b, library.bound)
    calls = {"flat": form("flat", library), "nnx": form("nnx", unbound)}
    return calls, len(jax.tree.leaves(pieces.state))


def time_forms(calls: dict[str, Callable], warmup: int, timed: int) -> dict[str, dict]:
    """{form: {"launch": [s], "step": [s]}}: the forms called in turn, each call timed to its
    return and to its outputs being ready."""
    out = {name: {"launch": [], "step": []} for name in calls}
    for i in range(warmup + timed):
        for name, call in calls.items():
            start = time.perf_counter()
            result = call()
            returned = time.perf_counter()
            jax.block_until_ready(result)
            if i >= warmup:
                out[name]["launch"].append(returned - start)
                out[name]["step"].append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    calls, arrays = build_forms(args)
    times = time_forms(calls, args.warmup, args.pairs)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    ratios = [n / f for n, f in zip(times["nnx"]["launch"], times["flat"]["launch"], strict=True)]
    result = {
        "args": vars(args),
        "device": str(jax.devices()[0]),
        "state_arrays": arrays,
        "median_s": med,
        "launch_nnx_over_flat_median": statistics.median(ratios),
        "seconds": times,
    }
    for name, m in med.items():
        print(f"{name:5s} launch {1e3 * m['launch']:6.2f} ms   step {1e3 * m['step']:8.2f} ms")
    model = f"BERT-{args.size}{' stacked' if args.scan else ''}"
    print(
        f"{model}, {arrays} state arrays: launch nnx/flat per pair, median "
        f"{result['launch_nnx_over_flat_median']:.2f}x"
    )
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
