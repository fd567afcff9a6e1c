"""What the training-time measurements (`ln_jax.train.monitor`, issue 19) cost over a run.

  taskset -c 0 python bench/speed/bench_monitor.py --size=mini --batch=16 --seq=128 --every=10 \\
      --pairs=40                                                    # about 3 minutes on CPU

Not a test. The trainer's two compiled steps (`ln_jax.train.steps.jit_train_step`, without and with
`measure`) on a one-device mesh, BERT-`--size` from configs/bert_preln.py, a synthetic batch,
called alternately in one process (plain, measured, plain, measured, ...): adjacent calls see
the same machine load, so the per-pair ratio measured/plain is steady where the times are not
(on the shared 2-core machine single step times moved by 3x). The measured call includes what
the trainer does with its output on the host (fetch, `monitor.named`, the early-warning
rules); the plain call fetches nothing (a step that is not logged). A run that measures every
`--every` steps runs the plain program at the other steps, so its average cost is
(median ratio - 1) / every.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import jax

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])  # the repository root, for configs/

from bench.speed.measure import make_batch, run_alternating, synthetic_bert_config, write_result  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="mini", help="tiny | mini | base")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20)
    p.add_argument("--every", type=int, default=10, help="steps per measurement (log_every)")
    p.add_argument("--pairs", type=int, default=40, help="timed (plain, measured) pairs")
    p.add_argument("--warmup", type=int, default=2, help="untimed pairs")
    p.add_argument("--out", help="write the result as JSON here")
    return p.parse_args(argv)


def train_config(args: argparse.Namespace) -> Any:
    shape = (args.size, args.batch, args.seq, args.predictions)
    return synthetic_bert_config(*shape, log_every=args.every)


def build_steps(args: argparse.Namespace) -> dict[str, Any]:
    """{"plain": one plain step, "measured": one measured step + host work}, both compiled."""
    from ln_jax import sharding
    from ln_jax.task import make_task
    from ln_jax.train import monitor, steps
    from ln_jax.train.early_warning import EarlyWarning

    cfg = train_config(args)
    mesh = sharding.single_device_mesh()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    plain = steps.in_mesh(steps.jit_train_step(cfg, task, mesh, pieces), mesh)
    measured = steps.in_mesh(steps.jit_train_step(cfg, task, mesh, pieces, measure=True), mesh)
    shape = {"batch": args.batch, "seq": args.seq, "predictions": args.predictions, "vocab": 8000}
    batch = jax.device_put(make_batch(shape), sharding.batch_sharding(mesh))
    box = {"state": pieces.state}
    watcher = EarlyWarning(cfg.monitor)

    def plain_step() -> None:
        box["state"], _ = plain(box["state"], pieces.rest, batch)
        jax.block_until_ready(box["state"])

    def measured_step() -> None:
        box["state"], metrics = measured(box["state"], pieces.rest, batch)
        metrics = jax.device_get(metrics)
        named = monitor.named(metrics.pop("monitor"))
        watcher.check(0, {**{k: float(v) for k, v in metrics.items()}, **named})
        jax.block_until_ready(box["state"])

    return {"plain": plain_step, "measured": measured_step}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    times = run_alternating(build_steps(args), args.warmup, args.pairs)
    ratios = [m / p for m, p in zip(times["measured"], times["plain"], strict=True)]
    ratio = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4)
    result = {
        "args": vars(args),
        "device": str(jax.devices()[0]),
        "seconds": times,
        "measured_over_plain_median": ratio,
        "measured_over_plain_p25_p75": [quartiles[0], quartiles[2]],
        "run_cost": (ratio - 1) / args.every,
    }
    print(
        f"plain step median {statistics.median(times['plain']):.3f} s; measured/plain per pair: "
        f"median {ratio:.3f} (p25-p75 {quartiles[0]:.3f}-{quartiles[2]:.3f}); a run measuring "
        f"every {args.every} steps: {100 * result['run_cost']:+.2f}% step time"
    )
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
