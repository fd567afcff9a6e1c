"""The measuring half of `bench/speed/bench_accel.py`: the benchmark's config, its compiled step,
the feeds (a fixed batch, the trainer's loader), the peaks MFU divides by, and one arm's
figures. `bench_accel.py` (the command) and `bench/speed/accel_arms.py` (several configs side
by side) both build on it; the command's docstring says what is measured and how.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import re
import statistics
import time
from typing import Any

import jax
import numpy as np

from bench.speed import measure
from ln_jax import sharding
from ln_jax.config.load import (
    build_config,
    config_from_command_line,
    override,
)
from ln_jax.config.run import TrainConfig
from ln_jax.task import make_task
from ln_jax.train import steps

DTYPES = {"bf16": "bfloat16", "f32": "float32"}


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
    """The shape dict of `bench.speed.measure` (unpadded vocabulary: the task's work)."""
    m, d = cfg.model, cfg.data
    return dict(
        layers=m.num_layers, d=m.hidden_size, heads=m.num_heads, mlp=m.mlp_dim,
        vocab=m.vocab_size, batch=d.global_batch_size, seq=d.max_seq_length,
        predictions=cfg.options.max_predictions_per_seq,
    )  # fmt: skip


def compile_step(
    cfg: TrainConfig, mesh: jax.sharding.Mesh, options: dict[str, Any] | None = None
) -> tuple[Any, Any, float]:
    """(pieces, compiled train step, compile seconds): the trainer's step, compiled once;
    `options`: XLA compiler options of this compile only (an arm's `xla.*` overrides)."""
    start = time.perf_counter()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    train, _ = steps.jit_steps(cfg, task, mesh, pieces)
    with sharding.use_mesh(mesh):
        lowered = train.lower(pieces.state, pieces.rest, steps.abstract_batch(task, mesh))
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
    from ln_jax.data import batches

    block, blocks = batches.mesh_rows(mesh, s["batch"])
    rows = batches.host_rows(s["batch"], block, blocks)
    local = {k: v[rows] for k, v in measure.make_batch(s).items()}
    return jax.block_until_ready(batches.to_global(local, mesh, s["batch"]))


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
