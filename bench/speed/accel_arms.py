"""`bench/speed/bench_accel.py --arm=...`: several configs built, compiled in parallel threads and
timed side by side in one process (blocked, and with `--pipeline=K` steps in flight), each
arm's figures and its speed-up over the first. The module docstring of bench_accel.py says
what is measured and how; this holds the arms' part of it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any

import jax

from bench.speed import measure
from bench.speed.accel_step import (
    Feeds,
    arm_result,
    compile_step,
    fixed_batch,
    peak_step,
    profile,
    shape_of,
    split_xla_options,
    summarize,
    total_peak,
    train_config,
)
from ln_jax import sharding
from ln_jax.config.run import TrainConfig

DUMP_OPTION = "xla_gpu_dump_autotune_results_to"


def _compile_arm(args, argv, name, overrides) -> tuple[TrainConfig, Any, Any, Any, float]:
    fields, options = split_xla_options(overrides)
    cfg = train_config(args, argv, fields)
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    dump = autotune_dump(args, name)
    if dump:
        try:
            return cfg, mesh, *compile_step(cfg, mesh, {**options, DUMP_OPTION: dump})
        except Exception as err:  # an XLA without the option: the arm's figures still count
            if DUMP_OPTION not in str(err):
                raise
            print(f"arm {name}: no autotune dump ({str(err)[:200]})", file=sys.stderr)
    pieces, compiled, seconds = compile_step(cfg, mesh, options)
    return cfg, mesh, pieces, compiled, seconds


def autotune_dump(args: argparse.Namespace, name: str) -> str:
    """Where arm `name`'s compile writes its autotuning results on a GPU (`--autotune_dump`:
    DIR/NAME.textproto), or "" (no flag, or not a GPU). Loaded into a compile without a GPU
    (`bench/probes/gpu_compile_arms.py --arm=NAME:xla.xla_gpu_load_autotune_results_from=PATH`),
    they may let it choose the GPU's kernels: cuBLAS or Triton for each GEMM."""
    if not getattr(args, "autotune_dump", None) or jax.default_backend() != "gpu":
        return ""
    os.makedirs(args.autotune_dump, exist_ok=True)
    return os.path.abspath(os.path.join(args.autotune_dump, f"{name}.textproto"))


def compile_threads(arms: int) -> int:
    """Arms compiled at once: all of them on CPUs; one at a time on a GPU or TPU, whose
    compiles time their candidate kernels on the device (autotuning): compiled together, they
    time them against each other and may keep slower ones (the trainer compiles its programs
    one at a time, `ln_jax.train.precompile`)."""
    return arms if jax.default_backend() == "cpu" else 1


def run_arms(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Every `--arm` compiled (`compile_threads` at once), then timed in alternation; the
    result holds each arm's figures (`arm_result`) and its speed-up over the first arm."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=compile_threads(len(args.arms))) as pool:
        futures = {n: pool.submit(_compile_arm, args, argv, n, o) for n, o in args.arms.items()}
        built, failed = {}, {}
        for name, future in futures.items():
            try:
                built[name] = future.result()
            except Exception as err:  # one arm that cannot build must not lose the others
                failed[name] = f"{type(err).__name__}: {str(err)[:2000]}"
                print(f"arm {name} failed to build: {failed[name][:400]}", file=sys.stderr)
    print(f"{len(built)} arms built and compiled in {time.perf_counter() - start:.1f} s")
    if not built:
        raise SystemExit(f"no arm could be built: {failed}")
    feeds = {}
    for name, (cfg, mesh, pieces, compiled, _) in built.items():
        feeds[name] = Feeds(compiled, pieces, fixed_batch(shape_of(cfg), mesh), None)
    first = next(iter(built.values()))
    steps = {name: f.fixed_step for name, f in feeds.items()}
    times = measure.run_alternating({**steps, **peak_step(args, first[0], first[1])},
                                    args.warmup, args.steps)  # fmt: skip
    peak = total_peak(args, first[0], first[1], times)
    arms = {}
    for name, (cfg, mesh, _, _, seconds) in built.items():
        arms[name] = arm_result(cfg, mesh, feeds[name], {"fixed": times[name]}, peak)
        arms[name].update(overrides=args.arms[name], compile_s=seconds)
    if args.pipeline > 0:
        pipelined = time_pipelined(feeds, args)
        for name, (cfg, *_) in built.items():
            x = summarize(pipelined[name], shape_of(cfg), arms[name]["flops_per_step"], peak[0])
            arms[name]["feeds"]["pipelined"] = {**x, "steps_in_flight": args.pipeline}
            arms[name]["updates"] = int(jax.device_get(feeds[name].state["step"]))
    base = next(iter(arms.values()))["feeds"]["fixed"]["median_s"]
    for r in arms.values():
        r["speedup_over_first"] = base / r["feeds"]["fixed"]["median_s"]
    if args.profile_dir and args.profile_arm in steps:
        profile({args.profile_arm: steps[args.profile_arm]}, args.profile_dir, args.profile_steps)
    out = {"arms": arms, "failed": failed, "steps": args.steps, "warmup": args.warmup}
    return {**out, "profile_arm": args.profile_arm}


def time_pipelined(feeds: dict[str, Feeds], args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per step of each arm with `args.pipeline` steps in flight, arms alternating,
    max(2, steps / K) timed rounds (the steps are compiled and warm from the blocked ones)."""
    k = args.pipeline
    calls = {name: functools.partial(f.pipelined_steps, k) for name, f in feeds.items()}
    print(f"pipelined: {k} steps in flight, one block")
    times = measure.run_alternating(calls, 0, max(2, args.steps // k))
    return {name: [t / k for t in ts] for name, ts in times.items()}


def print_arms(result: dict[str, Any]) -> None:
    first = next(iter(result["arms"].values()))
    s, d = first["shape"], first["device"]
    print(
        f"\nbatch {s['batch']} x seq {s['seq']}, L={s['layers']} d={s['d']} V={s['vocab']}, on "
        f"{d['count']} x {d['kind']}; peak {first['peak']['flops_per_s'] / 1e12:.4g} TFLOP/s "
        f"({first['peak']['source']})"
    )
    print(f"{'arm':<14s}{'ms/step':>9s}{'seq/s':>10s}{'MFU 6ND':>9s}{'MFU done':>10s}"
          f"{'x first':>9s}  config")  # fmt: skip
    for name, r in result["arms"].items():
        x, c = r["feeds"]["fixed"], r["config"]
        what = (
            f"{c['dtype']}, attention {c['attention_impl']}, dropout {c['hidden_dropout']}/"
            f"{c['attention_dropout']} ({c['dropout_rng']})"
        )
        print(
            f"{name:<14s}{x['ms_per_step']:9.1f}{x['sequences_per_s']:10.1f}"
            f"{100 * x['mfu_6nd']:8.1f}%{100 * x['mfu_done']:9.1f}%"
            f"{r['speedup_over_first']:8.2f}x  {what}"
        )
    for name, r in result["arms"].items():
        if "pipelined" in r["feeds"]:
            x = r["feeds"]["pipelined"]
            print(
                f"{name + ' (pipelined)':<14s}{x['ms_per_step']:9.1f}{x['sequences_per_s']:10.1f}"
                f"{100 * x['mfu_6nd']:8.1f}%{100 * x['mfu_done']:9.1f}%  "
                f"{x['steps_in_flight']} steps in flight, one block"
            )
