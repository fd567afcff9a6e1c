"""The trainer's train step on any backend: ms/step, sequences/s and MFU two ways.

  # H100 / H200 / A100: BERT-base, batch 256 x 128, bf16, a fixed device batch
  python bench/speed/bench_accel.py --size=base --batch=256 --steps=50 --out=/tmp/accel.json
  python bench/speed/bench_accel.py --size=base --batch=256 --attention=cudnn \\
      --config.model.attention_dropout=0               # cuDNN attention (no attention dropout)
  python bench/speed/bench_accel.py --size=base --batch=256 --feed=both --profile_dir=/tmp/trace
  # TPU (device kind "TPU v5 lite" = v5e, 197 TFLOP/s): the same commands, e.g. --batch=128
  # several configs side by side in one process (compiled in parallel, steps alternating)
  python bench/speed/bench_accel.py --size=base --batch=256 --steps=30 \\
      --arm=default --arm=rbg:dropout_rng=rbg --arm=cudnn_nodrop:model.attention_dropout=0 \\
      --profile_arm=default --profile_dir=/tmp/trace
  # CPU: a measured matmul peak; pin one core (two-thread timings here are bimodal)
  taskset -c 0 python bench/speed/bench_accel.py --size=mini --batch=32 --dtype=f32 --feed=both \\
      --steps=30 --warmup=3 --out=/tmp/accel_cpu.json

What runs: `configs/bert_preln.py:SIZE` (or `--config=FILE[:variant]`) through the config front of
train.py (`--config.SECTION.FIELD=VALUE` overrides work here too), the state from
`ln_jax.train.steps.init_state` and the step from `ln_jax.train.steps.jit_steps` on the mesh of the
config (`--mesh`, default every device on the data axis), lowered and compiled once, so XLA's cost
analysis comes from the very executable that is timed. Every step blocks on its output (state and
metrics); a trainer does not, so host work that a run hides behind the device step shows here in
full.

Feeds (`--feed`):
* fixed: one synthetic batch (`bench.speed.measure.make_batch`) put on the devices once.
* loader: the trainer's pipeline, `ln_jax.data.make_pipeline(cfg.data, split="train")`; the
  timed step includes `next()` (its wait is also reported alone). Reads `cfg.data` (the
  embedded corpus by default, prepared on first use; `--config.data.data_dir=...`).
* both: fixed and loader steps alternate in one process (A B A B ...), so machine noise hits
  both alike; reported: the loader/fixed ratio of median step times and the median of the
  per-round ratios. The loader's read-ahead thread may build a batch during the fixed step
  that follows; on one core that moves a little of the loader's cost to the fixed side.

FLOPs per step (a multiply-add = 2):
* 6ND: 6 * N * tokens + 12 * L * d * T^2 per sequence (attention), N = EVERY parameter of
  the train state, embeddings included (the tied word embedding then stands for an MLM decoder
  at all T positions). The convention of MaxText-style MFU figures.
* done: the work the step really does, the encoder + MLM head at the P masked positions + NSP
  (`bench.speed.measure.model_flops`); smaller than 6ND because ln_jax decodes only P positions.
* xla: XLA's `cost_analysis()` of the compiled step (per device x devices), when given; not
  on a GPU, where it leaves out the cuBLAS and cuDNN calls (1.5 of 17.9 TFLOP at BERT-base).
MFU = FLOPs / median step time / peak. Peak: the dense bf16 (or float32 at default precision:
TF32 on NVIDIA, one bf16 pass on TPU) figure of the device kind from `PEAKS` x devices; for a
CPU or an unknown device an `--matmul`^3 XLA matmul in the compute dtype, timed in the same
alternation (on CPU the host's, whatever the number of fake devices); `--peak_tflops` (per
device) overrides both. The output says which one it divided by.

The vocabulary: `--vocab`, else 30522 (BERT's) with `--feed=fixed`, else the data's (8000 on
the embedded corpus, which supports ~10k pieces). `--attention` (default auto: cuDNN on a GPU,
its fused attention dropout included) sets model.attention_impl.

Arms (`--arm=NAME[:FIELD=VALUE,...]`, repeated): each is the benchmark's config plus its own
overrides (dotted fields as after `--config.`; `xla.OPTION=VALUE` is an XLA compiler option of
that arm's compile alone, e.g. `--arm=cublas:xla.xla_gpu_enable_triton_gemm=false`); all are
built and compiled first (in parallel threads on a CPU, one at a time on a GPU or TPU, whose
compiles time candidate kernels on the device), then their steps alternate on fixed batches,
A B C A B C ..., and the result holds each arm's figures and its speed-up over the first arm.
`--profile_arm` traces one arm alone.

`--pipeline=K` (arms): each arm is also timed as a trainer runs it: K steps dispatched one after
another and one block on the last, the time over K ("pipelined" beside "fixed"). The device
then runs the next step while the host launches it. On one H200 (2026-11-27) the host spent
about 7 ms between two blocked steps of a 53 ms BERT-base step; the main job, which does not
block, ran at its kernels' time. `bench_torch_anchor.py --pipeline=K` times PyTorch alike.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bench.speed import measure  # noqa: E402
from bench.speed.accel_arms import print_arms, run_arms  # noqa: E402
from bench.speed.accel_step import (  # noqa: E402
    DTYPES,
    Feeds,
    arm_result,
    compare,
    compile_step,
    fixed_batch,
    open_loader,
    peak_step,
    profile,
    shape_of,
    total_peak,
    train_config,
)
from ln_jax import sharding  # noqa: E402
from ln_jax.config.load import (  # noqa: E402
    parse_command_line,
)
from ln_jax.config.run import TrainConfig  # noqa: E402

FEEDS = ("fixed", "loader", "both")


# --------------------------------------------------------------------------- set-up


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The benchmark's own flags; `--config=...` and `--config.X=V` are left for the config."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--size",
        default=None,
        choices=("base", "mini", "tiny"),
        help="variant of configs/bert_preln.py (default base; not with --config)",
    )
    p.add_argument("--batch", type=int, default=None, help="global batch (default: config's)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="compute dtype")
    p.add_argument("--attention", default="auto", choices=("xla", "cudnn", "auto"))
    p.add_argument("--vocab", type=int, default=None, help="see the module docstring")
    p.add_argument("--steps", type=int, default=20, help="timed steps per feed")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per feed first")
    p.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor (-1 = the rest)")
    p.add_argument("--feed", default="fixed", choices=FEEDS)
    p.add_argument("--peak_tflops", type=float, default=None, help="peak per device")
    p.add_argument("--matmul", type=int, default=2048, help="N of the measured matmul peak")
    p.add_argument("--profile_dir", default=None, help="jax.profiler trace of a few steps")
    p.add_argument("--profile_steps", type=int, default=3, help="rounds traced")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        help="NAME[:FIELD=VALUE,...]: a config to time beside the others (repeat)",
    )
    p.add_argument("--profile_arm", default=None, help="the arm that --profile_dir traces")
    p.add_argument(
        "--autotune_dump",
        default=None,
        help="GPU: each arm's autotuning results to DIR/ARM.textproto (bench/speed/accel_arms.py)",
    )
    p.add_argument(
        "--pipeline",
        type=int,
        default=0,
        help="arms: also time K steps in flight, one block on the last (0 = not)",
    )
    line = parse_command_line(argv)
    args = p.parse_args(line.rest)
    if args.size and line.spec:
        p.error("--size picks a variant of configs/bert_preln.py; with --config give FILE:variant")
    if args.attention == "cudnn" and jax.default_backend() != "gpu":
        p.error(f"--attention=cudnn needs an NVIDIA GPU; JAX runs on {jax.default_backend()}")
    if args.arm and args.feed != "fixed":
        p.error("--arm times fixed batches; leave --feed at fixed")
    try:
        args.arms = dict(parse_arm(text) for text in args.arm)
    except ValueError as err:
        p.error(str(err))
    if len(args.arms) != len(args.arm):
        p.error("--arm names must differ")
    if args.profile_arm and args.profile_arm not in args.arms:
        p.error(f"--profile_arm={args.profile_arm!r} names no --arm ({', '.join(args.arms)})")
    return args


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """ "NAME:a.b=1,c=x" -> ("NAME", {"a.b": "1", "c": "x"})."""
    name, _, rest = text.partition(":")
    overrides = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--arm={text!r}: give NAME:FIELD=VALUE,FIELD=VALUE")
        overrides[key.strip()] = value.strip()
    if not name:
        raise ValueError(f"--arm={text!r} has no name")
    return name, overrides


# --------------------------------------------------------------------------- steps and peak


# --------------------------------------------------------------------------- results


def print_report(r: dict[str, Any]) -> None:
    s, c, f = r["shape"], r["config"], r["flops_per_step"]
    print(
        f"\nBERT-{c['size']} (L={s['layers']}, d={s['d']}, heads={s['heads']}, F={s['mlp']}, "
        f"V={s['vocab']}, N={r['num_params'] / 1e6:.2f}M params), batch {s['batch']} x seq "
        f"{s['seq']}, {s['predictions']} MLM predictions/example + NSP, {c['dtype']}, attention "
        f"{c['attention_impl']}, dropout {c['hidden_dropout']}/{c['attention_dropout']} "
        f"({c['dropout_rng']})"
    )
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
    d = r["device"]
    print(f"mesh {mesh} on {d['count']} x {d['kind']} ({d['platform']})")
    print(f"peak {r['peak']['flops_per_s'] / 1e12:.4g} TFLOP/s: {r['peak']['source']}")
    xla = f"{f['xla'] / 1e12:.4g}" if f["xla"] else "n/a"
    print(
        f"FLOPs/step (TFLOP): 6ND (6*N*tokens + attention) {f['6nd'] / 1e12:.4g}; done (MLM at "
        f"{s['predictions']} positions) {f['done'] / 1e12:.4g}; XLA cost analysis {xla}"
    )
    print(f"{'feed':<8s}{'ms/step':>10s}{'p25-p75 ms':>16s}{'seq/s':>10s}{'tokens/s':>11s}"
          f"{'MFU 6ND':>9s}{'MFU done':>10s}{'MFU XLA':>9s}")  # fmt: skip
    for name, x in r["feeds"].items():
        mfu_xla = f"{100 * x['mfu_xla']:8.1f}%" if x["mfu_xla"] else f"{'-':>9s}"
        print(
            f"{name:<8s}{x['ms_per_step']:10.1f}{1e3 * x['p25_s']:8.1f}-{1e3 * x['p75_s']:<7.1f}"
            f"{x['sequences_per_s']:10.1f}{x['tokens_per_s']:11.0f}{100 * x['mfu_6nd']:8.1f}%"
            f"{100 * x['mfu_done']:9.1f}%{mfu_xla}"
        )
    if "loader" in r:
        lo = r["loader"]
        if "loader_over_fixed" in lo:
            print(
                f"loader/fixed step time: {lo['loader_over_fixed']:.3f}x (median of per-round "
                f"ratios {lo['loader_over_fixed_rounds']:.3f}x)"
            )
        print(f"loader next() wait: median {1e3 * lo['wait_s']:.2f} ms")


def run(args: argparse.Namespace, cfg: TrainConfig, mesh, feeds: Feeds) -> dict[str, Any]:
    """Times the feeds (and the matmul peak if it must be measured); the results dict."""
    arms = feeds.callables()
    peak_arm = peak_step(args, cfg, mesh)
    times = measure.run_alternating({**arms, **peak_arm}, args.warmup, args.steps)
    peak, source = total_peak(args, cfg, mesh, times)
    result = arm_result(cfg, mesh, feeds, times, (peak, source))
    result.update(steps=args.steps, warmup=args.warmup)
    if feeds.pipeline is not None:
        result["loader"] = compare(times, feeds, args.warmup)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.arms:
        result = run_arms(args, argv)
        result.update(
            command=["python", "bench/speed/bench_accel.py", *argv],
            versions={"jax": jax.__version__, "jaxlib": jax.lib.__version__},
        )
        print_arms(result)
        measure.write_result(args.out, result)
        return result
    cfg = train_config(args, argv)
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    pieces, compiled, seconds = compile_step(cfg, mesh)
    print(f"state built and step compiled in {seconds:.1f} s", flush=True)
    fixed = fixed_batch(shape_of(cfg), mesh) if args.feed != "loader" else None
    pipeline = open_loader(cfg, mesh) if args.feed != "fixed" else None
    try:
        feeds = Feeds(compiled, pieces, fixed, pipeline)
        result = run(args, cfg, mesh, feeds)
        result.update(
            command=["python", "bench/speed/bench_accel.py", *argv],
            compile_s=seconds,
            affinity=sorted(os.sched_getaffinity(0)),
            versions={"jax": jax.__version__, "jaxlib": jax.lib.__version__},
        )
        print_report(result)
        measure.write_result(args.out, result)
        if args.profile_dir:
            profile(feeds.callables(), args.profile_dir, args.profile_steps)
    finally:
        if pipeline is not None:
            pipeline.close()
    return result


if __name__ == "__main__":
    try:
        main()
    except measure.ShapeError as e:
        sys.exit(f"bench_accel.py: error: {e}")
