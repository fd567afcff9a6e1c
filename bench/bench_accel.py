"""The trainer's train step on any backend: ms/step, sequences/s and MFU two ways.

  # H100 / H200 / A100: BERT-base, batch 256 x 128, bf16, a fixed device batch
  python bench/bench_accel.py --size=base --batch=256 --steps=50 --out=/tmp/accel.json
  python bench/bench_accel.py --size=base --batch=256 --attention=cudnn \\
      --config.model.attention_dropout=0               # cuDNN attention (no attention dropout)
  python bench/bench_accel.py --size=base --batch=256 --feed=both --profile_dir=/tmp/trace
  # TPU (device kind "TPU v5 lite" = v5e, 197 TFLOP/s): the same commands, e.g. --batch=128
  # several configs side by side in one process (compiled in parallel, steps alternating)
  python bench/bench_accel.py --size=base --batch=256 --steps=30 \\
      --arm=default --arm=rbg:dropout_rng=rbg --arm=cudnn_nodrop:model.attention_dropout=0 \\
      --profile_arm=default --profile_dir=/tmp/trace
  # CPU: a measured matmul peak; pin one core (two-thread timings here are bimodal)
  taskset -c 0 python bench/bench_accel.py --size=mini --batch=32 --dtype=f32 --feed=both \\
      --steps=30 --warmup=3 --out=/tmp/accel_cpu.json

What runs: `configs/bert_preln.py:SIZE` (or `--config=FILE[:variant]`) through the config front of
train.py (`--config.SECTION.FIELD=VALUE` overrides work here too), the state from
`ln_jax.train.steps.init_state` and the step from `ln_jax.train.steps.jit_steps` on the mesh of the
config (`--mesh`, default every device on the data axis), lowered and compiled once, so XLA's cost
analysis comes from the very executable that is timed. Every step blocks on its output (state and
metrics); a trainer does not, so host work that a run hides behind the device step shows here in
full.

Feeds (`--feed`):
* fixed: one synthetic batch (`bench.measure.make_batch`) put on the devices once.
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
  (`bench.measure.model_flops`); smaller than 6ND because ln_jax decodes only P positions.
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
import collections
import hashlib
import os
import re
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench import measure  # noqa: E402
from ln_jax import sharding  # noqa: E402
from ln_jax.config import TrainConfig  # noqa: E402
from ln_jax.config_front import (  # noqa: E402
    build_config,
    config_from_command_line,
    override,
    parse_command_line,
)
from ln_jax.train import steps  # noqa: E402

DTYPES = {"bf16": "bfloat16", "f32": "float32"}
FEEDS = ("fixed", "loader", "both")
BERT_VOCAB = 30522
# device_kind pattern -> dense TFLOP/s per device: (bfloat16, float32 at default precision).
# NVIDIA: float32 matmuls run as TF32 by default; TPU: as one bf16 pass. First match wins.
PEAKS: tuple[tuple[str, float, float], ...] = (
    (r"H100 PCIe", 756.0, 378.0),
    (r"H100 NVL", 835.0, 418.0),
    (r"H100|H200", 989.0, 495.0),  # SXM: "NVIDIA H100 80GB HBM3"; 1979 is the sparse figure
    (r"A100", 312.0, 156.0),
    (r"\bL4\b", 121.0, 60.0),
    (r"TPU v4$", 275.0, 275.0),
    (r"TPU v5 lite|TPU v5e", 197.0, 197.0),
    (r"TPU v5p|TPU v5$", 459.0, 459.0),
    (r"TPU v6 lite|TPU v6e", 918.0, 918.0),
)


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
        help="GPU: each arm's autotuning results to DIR/ARM.textproto (bench/accel_arms.py)",
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


def train_config(
    args: argparse.Namespace, argv: list[str], arm: dict[str, str] | None = None
) -> TrainConfig:
    """The TrainConfig, read as train.py reads it, with the benchmark's settings as defaults
    and an arm's overrides (`--arm`) last."""
    spec = f"configs/bert_preln.py:{args.size or 'base'}"
    mesh = [int(x) for x in args.mesh.split(",")]
    defaults = {
        "grad_accum_steps": 1,  # the whole batch in one step (base defaults to auto)
        "data.max_seq_length": args.seq,
        "model.dtype": DTYPES[args.dtype],
        "model.attention_impl": args.attention,
        "mesh.data": mesh[0],
        "mesh.fsdp": mesh[1],
        "mesh.tensor": mesh[2],
    }
    if args.batch:
        defaults["data.global_batch_size"] = args.batch
    vocab = args.vocab or (BERT_VOCAB if args.feed == "fixed" else None)
    if vocab:
        defaults["data.vocab_size"] = vocab
    values, _ = config_from_command_line(argv, spec, defaults)
    values = override(values, arm or {})
    model = values["model"]
    model["max_position_embeddings"] = max(model["max_position_embeddings"], args.seq)
    cfg = build_config(values)
    measure.check_shape(shape_of(cfg))  # before anything compiles
    return cfg


def shape_of(cfg: TrainConfig) -> dict[str, int]:
    """The shape dict of `bench.measure` (unpadded vocabulary: the task's work)."""
    m, d = cfg.model, cfg.data
    return dict(
        layers=m.num_layers, d=m.hidden_size, heads=m.num_heads, mlp=m.mlp_dim,
        vocab=m.vocab_size, batch=d.global_batch_size, seq=d.max_seq_length,
        predictions=d.max_predictions_per_seq,
    )  # fmt: skip


def compile_step(
    cfg: TrainConfig, mesh: jax.sharding.Mesh, options: dict[str, Any] | None = None
) -> tuple[Any, Any, float]:
    """(pieces, compiled train step, compile seconds): the trainer's step, compiled once;
    `options`: XLA compiler options of this compile only (an arm's `xla.*` overrides)."""
    start = time.perf_counter()
    pieces = steps.init_state(cfg, mesh)
    train, _ = steps.jit_steps(cfg, mesh, pieces)
    with sharding.use_mesh(mesh):
        lowered = train.lower(pieces.state, pieces.rest, steps.abstract_batch(cfg, mesh))
        compiled = lowered.compile(options) if options else lowered.compile()
    return pieces, compiled, time.perf_counter() - start


XLA_PREFIX = "xla."  # an arm's override naming an XLA compiler option, not a config field


def split_xla_options(overrides: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """An arm's overrides -> (config fields, XLA compiler options): "xla.xla_gpu_enable_triton_gemm
    =false" is the option `xla_gpu_enable_triton_gemm` False for that arm's compile alone (an
    XLA flag in XLA_FLAGS would hold for every arm of the process)."""
    fields = {k: v for k, v in overrides.items() if not k.startswith(XLA_PREFIX)}
    options = {
        k[len(XLA_PREFIX) :]: _option_value(v) for k, v in overrides.items() if k not in fields
    }
    return fields, options


def _option_value(text: str) -> Any:
    """ "true"/"false" -> bool, an integer -> int, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def fixed_batch(s: dict[str, int], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """The synthetic batch as global arrays on the devices (this process loads its rows)."""
    from ln_jax.data import loader

    block, blocks = loader.mesh_rows(mesh, s["batch"])
    rows = loader.host_rows(s["batch"], block, blocks)
    local = {k: v[rows] for k, v in measure.make_batch(s).items()}
    return jax.block_until_ready(loader.to_global(local, mesh, s["batch"]))


def open_loader(cfg: TrainConfig, mesh: jax.sharding.Mesh) -> Any:
    """The trainer's training iterator (global batches); data prepared if needed (timed)."""
    from ln_jax.data import make_pipeline

    start = time.perf_counter()
    pipeline, tokenizer = make_pipeline(cfg.data, split="train", seed=cfg.data.seed, mesh=mesh)
    if tokenizer.vocab_size != cfg.model.vocab_size:
        pipeline.close()
        raise SystemExit(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model {cfg.model.vocab_size}"
            ": pass --vocab (or --config.data.vocab_size) equal to the data's."
        )
    print(f"loader ready in {time.perf_counter() - start:.1f} s", flush=True)
    return pipeline


def digest(batch: dict[str, jax.Array]) -> str:
    """A short hash of this process's rows of a batch's input_ids."""
    shards = batch["input_ids"].addressable_shards
    ordered = sorted(shards, key=lambda x: (x.index[0].start or 0, x.device.id))
    data = b"".join(np.asarray(x.data).tobytes() for x in ordered)
    return hashlib.sha1(data).hexdigest()[:12]


# --------------------------------------------------------------------------- steps and peak


class Feeds:
    """The timed callables: a step on the fixed batch and/or a step on the loader's next."""

    def __init__(self, compiled: Any, pieces: Any, fixed: dict | None, pipeline: Any):
        self.compiled, self.rest, self.state = compiled, pieces.rest, pieces.state
        self.num_params = pieces.num_params
        self.fixed, self.pipeline = fixed, pipeline
        self.waits: list[float] = []  # seconds of each next() of the loader
        self.loader_batches: list[dict] = []  # kept (not hashed) so hashing is not timed
        self.last_loss: dict[str, Any] = {}
        # seconds from a blocked step's call to its return: the host's launch of the step
        # (flattening the state, dispatch), while the device waits in a blocked loop
        self.launches: dict[str, list[float]] = collections.defaultdict(list)

    def _run(self, name: str, batch: dict) -> None:
        start = time.perf_counter()
        self.state, metrics = self.compiled(self.state, self.rest, batch)
        self.launches[name].append(time.perf_counter() - start)
        jax.block_until_ready((self.state, metrics))
        self.last_loss[name] = metrics["loss"]

    def fixed_step(self) -> None:
        self._run("fixed", self.fixed)

    def pipelined_steps(self, k: int) -> None:
        """k steps on the fixed batch, each launched before the last finished; one block."""
        for _ in range(k):
            self.state, metrics = self.compiled(self.state, self.rest, self.fixed)
        jax.block_until_ready((self.state, metrics))
        self.last_loss["pipelined"] = metrics["loss"]

    def loader_step(self) -> None:
        start = time.perf_counter()
        batch = next(self.pipeline)
        self.waits.append(time.perf_counter() - start)
        self.loader_batches.append(batch)
        self._run("loader", batch)

    def callables(self) -> dict[str, measure.Step]:
        out = {}
        if self.fixed is not None:
            out["fixed"] = self.fixed_step
        if self.pipeline is not None:
            out["loader"] = self.loader_step
        return out


def table_peak(kind: str, dtype: str) -> float | None:
    """Dense TFLOP/s of one device of `kind` in `dtype` ("bfloat16"/"float32"), or None."""
    for pattern, bf16, f32 in PEAKS:
        if re.search(pattern, kind):
            return bf16 if dtype == "bfloat16" else f32
    return None


def known_peak(args: argparse.Namespace, cfg: TrainConfig, mesh: jax.sharding.Mesh):
    """(total peak FLOP/s, description), or (None, None) if it must be measured."""
    device = mesh.devices.flat[0]
    devices = 1 if device.platform == "cpu" else mesh.size  # fake CPU devices share the host
    if args.peak_tflops:
        return args.peak_tflops * 1e12 * devices, f"--peak_tflops={args.peak_tflops} x {devices}"
    per_device = (
        None if device.platform == "cpu" else table_peak(device.device_kind, cfg.model.dtype)
    )
    if per_device is None:
        return None, None
    text = (
        f"table: {device.device_kind}, dense {cfg.model.dtype}, {per_device:g} TFLOP/s x {devices}"
    )
    return per_device * 1e12 * devices, text


# --------------------------------------------------------------------------- results


def summarize(times, s, flops: dict[str, float | None], peak: float) -> dict[str, Any]:
    """One feed: median/p25/p75/min seconds, ms/step, sequences/s, tokens/s, MFU each way."""
    out = measure.timing_summary(times, s, flops["done"], peak)
    out["mfu_done"] = out.pop("mfu")
    out["ms_per_step"] = 1e3 * out["median_s"]
    out["mfu_6nd"] = flops["6nd"] / out["median_s"] / peak
    out["mfu_xla"] = flops["xla"] / out["median_s"] / peak if flops["xla"] else None
    out["times_s"] = times
    return out


def compare(times: dict[str, list[float]], feeds: Feeds, warmup: int) -> dict[str, Any]:
    """Loader vs fixed: the ratio of medians, the median per-round ratio, next()'s wait."""
    out: dict[str, Any] = {"wait_s": statistics.median(feeds.waits[warmup:])}
    out["batch_digests"] = [digest(b) for b in feeds.loader_batches]
    if "fixed" in times:
        fixed, loader = times["fixed"], times["loader"]
        out["loader_over_fixed"] = statistics.median(loader) / statistics.median(fixed)
        rounds = [b / a for a, b in zip(fixed, loader, strict=True)]
        out["loader_over_fixed_rounds"] = statistics.median(rounds)
        out["fixed_digest"] = digest(feeds.fixed)
    return out


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


def measured_peak(times: list[float], n: int, mesh: jax.sharding.Mesh, dtype: str):
    """(total peak FLOP/s, description) from the median of the timed n^3 matmuls."""
    device = mesh.devices.flat[0]
    devices = 1 if device.platform == "cpu" else mesh.size
    per_device = 2.0 * n**3 / statistics.median(times)
    text = (
        f"measured: XLA {n}^3 {dtype} matmul on {device.device_kind} ({device.platform}), "
        f"{per_device / 1e9:.1f} GFLOP/s x {devices}, timed in the same alternation"
    )
    return per_device * devices, text


def profile(arms: dict[str, measure.Step], directory: str, rounds: int) -> None:
    """A jax.profiler trace of `rounds` more rounds of the feeds (TensorBoard / Perfetto)."""
    with jax.profiler.trace(directory):
        for _ in range(rounds):
            for step in arms.values():
                step()
    print(f"profile of {rounds} rounds written to {directory}")


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


def peak_step(args: argparse.Namespace, cfg: TrainConfig, mesh) -> dict[str, measure.Step]:
    """{"matmul": step} where the peak must be measured, else {}."""
    if known_peak(args, cfg, mesh)[0] is not None:
        return {}
    return {"matmul": measure.xla_matmul(args.matmul, cfg.model.compute_dtype)}


def total_peak(args: argparse.Namespace, cfg: TrainConfig, mesh, times: dict) -> tuple:
    """(peak FLOP/s, description): the table's, or the timed matmul's (popped from times)."""
    peak, source = known_peak(args, cfg, mesh)
    if peak is None:
        peak, source = measured_peak(times.pop("matmul"), args.matmul, mesh, cfg.model.dtype)
    return peak, source


def arm_result(cfg: TrainConfig, mesh, feeds: Feeds, times: dict, peak: tuple) -> dict:
    """One config's figures: its FLOPs per step each way, and each of its feeds' timings."""
    s = shape_of(cfg)
    device = mesh.devices.flat[0]
    # On a GPU, cost_analysis() leaves out the cuBLAS/cuDNN custom calls: no XLA column.
    xla = measure.compiled_flops(feeds.compiled) if device.platform != "gpu" else None
    flops = {
        "6nd": measure.six_n_flops(feeds.num_params, s),
        "done": measure.model_flops(s),
        "xla": xla * mesh.size if xla else None,
    }
    return {
        "config": {
            "name": cfg.name,
            "size": cfg.model.size,
            "dtype": cfg.model.dtype,
            "attention_impl": cfg.model.attention_impl,
            "dropout_rng": cfg.dropout_rng,
            "hidden_dropout": cfg.model.hidden_dropout,
            "attention_dropout": cfg.model.attention_dropout,
            "remat": cfg.model.remat,
            "activation": cfg.model.activation,
        },  # fmt: skip
        "shape": s,
        "num_params": feeds.num_params,
        "device": {"platform": device.platform, "kind": device.device_kind, "count": mesh.size},
        "mesh": dict(mesh.shape),
        "peak": {"flops_per_s": peak[0], "source": peak[1]},
        "flops_per_step": flops,
        "feeds": {
            name: summarize(times[name], s, flops, peak[0])
            | {"launch_ms": 1e3 * statistics.median(feeds.launches[name][1:] or [float("nan")])}
            for name in feeds.callables()
        },
        "updates": int(jax.device_get(feeds.state["step"])),
        "last_loss": {k: float(v) for k, v in feeds.last_loss.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.arms:
        from bench.accel_arms import print_arms, run_arms  # it imports this module

        result = run_arms(args, argv)
        result.update(
            command=["python", "bench/bench_accel.py", *argv],
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
            command=["python", "bench/bench_accel.py", *argv],
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
