"""The translation model's train step and beam search on any backend: tokens/s, MFU, sentences/s.

  # H100 / H200: the `iwslt` shape (6-6, 512/1024/4, vocab 10k), the recipe's 4,096-token batch
  # and a larger one, then beam 5 on 256 sources
  python bench/speed/bench_mt_accel.py --batches=128x32,512x64 --out=/tmp/mt_accel.json
  # + the layers' two layouts, 5 steps in flight, HuggingFace Marian + torch.compile and
  # generate (issue 67 item 4: what the accelerator suite runs)
  python bench/speed/bench_mt_accel.py --batches=128x32 --layouts=auto,list --pipeline=5 \\
      --marian=compile --out=/tmp/mt_accel.json
  # CPU (what CI runs, tiny shapes)
  python bench/speed/bench_mt_accel.py --config=configs/mt.py:tiny --batches=8x16 --steps=2 \\
      --warmup=1 --sentences=4 --max_length=8 --rounds=1

Not a test. Train: the trainer's own step (`ln_jax.train.steps`: init_state + jit_steps, the
config's dtype ("auto": bfloat16 on a GPU/TPU), dropout, label-smoothed loss, optimizer) on one
device, one synthetic batch per `ROWSxLENGTH` (source and target lengths drawn from 8..LENGTH,
real padding: `bench_translate_hf.train_batch`), each batch compiled first, then timed
alternately. Rates: target tokens/s (the papers' "tokens per batch" counts target tokens) and
padded positions/s. FLOPs per step, counted, not read from XLA's cost analysis (which skips
cuBLAS calls on a GPU), a multiply-add = 2, training = 3 x forward, over padded positions
(the work the step does):

  forward = 2 * (N_enc * S + (N_dec + d * V) * T + 2 * L_dec * d^2 * S)
            + 4 * d * (L_enc * S^2 + L_dec * (T^2 + T * S)) per sentence,

N_enc = L_enc (4 d^2 + 2 d f), N_dec = L_dec (6 d^2 + 2 d f) (self-attention, the cross-
attention's query and output, the FFN); the cross-attention's keys and values (2 L_dec d^2 per
source token) are the third term; embeddings are lookups, the tied output projection is d V.
MFU divides by the device kind's dense peak (`bench.speed.accel_step.PEAKS`), or none on a CPU.

Layouts (`--layouts`): "auto" (the config's own: on a GPU the layers stacked and unrolled
since issue 67, a list elsewhere; its arm is named ROWSxLENGTH), "list" and "stacked" (named
"ROWSxLENGTH list" / "... stacked"), each its own compiled step, all alternating. With
`--pipeline=K` each train arm is also timed as a training loop runs it: K steps launched back
to back, one wait on the last, the time over K ("pipelined").

The PyTorch anchor (`--marian=compile[,eager]`, `bench/speed/mt_marian.py`): HuggingFace's
`MarianMTModel` of the same shape, batch and dropout, bf16 autocast on CUDA, `torch.compile`,
label-smoothed loss and AdamW, its steps alternating with ln_jax's (blocked and, with
`--pipeline`, in flight) on the first batch of `--batches` (the recipe's); and `generate` with
beam `--beam` against ln_jax's beam search on one random Marian model imported into ln_jax
(the same weights and sources: `--sentences` x up to `--src_len` tokens, at most
`--max_length` generated), alternating. Targets (printed, and judged by
`bench/gpu/suite_report.py` on a GPU): the train step >= 1.25x Marian + torch.compile, the search
>= 1.5x generate. JAX's memory is not preallocated then (`XLA_PYTHON_CLIENT_PREALLOCATE`),
so both frameworks fit on one GPU.

Decode: the same model with random weights (`Translation.build`), beam 5 (`--beam`), the cached
search of `ln_jax.models.translation.search` on `--sentences` sources of lengths drawn from
src_len/2..src_len, every hypothesis run to `--max_length` tokens (max_len_a 0, b = max_length:
random weights do not stop early, so the work is fixed: a trained model stops sooner and is
faster). Rate: sentences/s and generated tokens/s (sentences x max_length).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench.speed.accel_step import table_peak  # noqa: E402
from bench.speed.bench_torch_anchor import pipelined_times  # noqa: E402
from bench.speed.bench_translate_hf import train_batch  # noqa: E402
from bench.speed.measure import run_alternating, write_result  # noqa: E402

LAYOUTS = {"auto": {}, "list": {"model.scan_layers": False},
           "stacked": {"model.scan_layers": True}}  # fmt: skip
TRAIN_TARGET = 1.25  # x HuggingFace Marian + torch.compile, target tokens/s (issue 67)
BEAM_TARGET = 1.5  # x Marian's generate, sentences/s


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/mt.py:iwslt", help="FILE[:variant]")
    p.add_argument("--dtype", default="auto", help="model.dtype (auto: bf16 on GPU/TPU)")
    p.add_argument(
        "--attention", default="auto", help="model.attention_impl (auto: the platform's choice)"
    )
    p.add_argument("--batches", default="128x32,512x64", help="ROWSxLENGTH,...")
    p.add_argument("--layouts", default="auto", help="auto,list,stacked: the layers' layouts")
    p.add_argument("--pipeline", type=int, default=0, help="also K steps in flight (0: not)")
    p.add_argument("--marian", default="", help="eager,compile: HuggingFace Marian's modes")
    p.add_argument("--steps", type=int, default=20, help="timed steps per batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--src_len", type=int, default=32)
    p.add_argument("--max_length", type=int, default=40, help="tokens generated, EOS included")
    p.add_argument("--rounds", type=int, default=3, help="timed decodes")
    p.add_argument("--skip_decode", action="store_true", help="no search at all")
    p.add_argument(
        "--decodes",
        default="",
        help="random,marian: the searches (default: random, and marian with --marian)",
    )
    p.add_argument("--out", help="write the result (JSON) here")
    args = p.parse_args(argv)
    args.layouts = [x for x in args.layouts.split(",") if x]
    args.marian = [x for x in args.marian.split(",") if x]
    args.decodes = [x for x in args.decodes.split(",") if x] or (
        ["random", "marian"] if args.marian else ["random"]
    )
    if args.skip_decode:
        args.decodes = []
    if "marian" in args.decodes and not args.marian:
        p.error("--decodes=marian needs --marian (the PyTorch anchor's modes)")
    if set(args.layouts) - set(LAYOUTS) or set(args.marian) - {"eager", "compile"}:
        p.error(f"--layouts takes {', '.join(LAYOUTS)}; --marian takes eager, compile")
    return args


def build_config(spec: str, dtype: str, attention: str = "auto", layout: str = "auto"):
    """The TrainConfig of `spec` on one device, the whole batch in one step, every position
    computed (`translation.skip_padding` off: the FLOPs are counted on padded positions), the
    layers in `layout` (`LAYOUTS`)."""
    from ln_jax.config.load import build_config as build
    from ln_jax.config.load import config_from_command_line

    defaults = {"model.dtype": dtype, "model.attention_impl": attention, "grad_accum_steps": 1,
                "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1,
                "translation.skip_padding": "off", **LAYOUTS[layout]}  # fmt: skip
    values, _ = config_from_command_line([], spec, defaults)
    return build(values)


def step_flops(cfg, rows: int, length: int) -> float:
    """Training FLOPs of one step over padded positions (the module docstring's formula)."""
    m = cfg.model
    d, f, v = m.hidden_size, m.mlp_dim, m.vocab_size
    le = m.num_layers
    ld = cfg.options.resolved(m).decoder_layers
    s = t = length
    n_enc = le * (4 * d * d + 2 * d * f)
    n_dec = ld * (6 * d * d + 2 * d * f)
    forward = 2 * (n_enc * s + (n_dec + d * v) * t + 2 * ld * d * d * s)
    forward += 4 * d * (le * s * s + ld * (t * t + t * s))
    return 3.0 * forward * rows


def arm_name(rows: int, length: int, layout: str = "auto") -> str:
    return f"{rows}x{length}" + ("" if layout == "auto" else f" {layout}")


def train_arms(cfg, batches: list[tuple[int, int]], layout: str = "auto"):
    """{arm name: one call of the trainer's step on that batch (`step(wait=True)` waits for
    it)}, each compiled; with the batches and each first call's seconds."""
    from ln_jax import sharding
    from ln_jax.task import make_task
    from ln_jax.train import steps

    mesh = sharding.single_device_mesh()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    train = steps.in_mesh(steps.jit_steps(cfg, task, mesh, pieces)[0], mesh)
    box = {"state": pieces.state}
    arms, data, compile_s = {}, {}, {}
    for rows, length in batches:
        name = arm_name(rows, length, layout)
        data[name] = train_batch(rows, length, vocab=cfg.model.vocab_size)
        device_batch = jax.device_put(data[name], sharding.batch_sharding(mesh))

        def step(wait: bool = True, b=device_batch):
            box["state"], metrics = train(box["state"], pieces.rest, b)
            return jax.block_until_ready(metrics) if wait else None

        start = time.perf_counter()
        step()  # compile this shape
        compile_s[name] = time.perf_counter() - start
        print(f"train {name}: first step {compile_s[name]:.1f} s (with compilation)", flush=True)
        arms[name] = step
    return arms, data, compile_s


def _timing(seconds: list[float], tokens: float, flops: float, peak: float | None) -> dict:
    median = statistics.median(seconds)
    return {"median_ms": 1e3 * median, "target_tokens_per_s": tokens / median,
            "tflops": flops / median / 1e12,
            "mfu": flops / median / (peak * 1e12) if peak else None}  # fmt: skip


def train_result(cfgs: dict, args, batches) -> dict:
    """Every layout's arms and Marian's (on the first batch), alternating in one process."""
    arms, data, compile_s, layout_of = {}, {}, {}, {}
    # the layouts' steps compile in parallel threads (as bench_accel.py's arms): on an H200 one
    # took 40 s, most of a call's time
    with concurrent.futures.ThreadPoolExecutor(len(cfgs)) as pool:
        built = {x: pool.submit(train_arms, c, batches, x) for x, c in cfgs.items()}
    for layout, future in built.items():
        a, d, c = future.result()
        arms.update(a)
        data.update(d)
        compile_s.update(c)
        layout_of.update(dict.fromkeys(a, layout))
    first = arm_name(*batches[0])
    cfg = next(iter(cfgs.values()))
    for mode in args.marian:
        from bench.speed import mt_marian

        start = time.perf_counter()
        arms[f"marian_{mode}"] = mt_marian.train_step(cfg, data[first], mode)
        compile_s[f"marian_{mode}"] = time.perf_counter() - start
        data[f"marian_{mode}"], layout_of[f"marian_{mode}"] = data[first], None
        print(f"marian {mode}: first step {compile_s[f'marian_{mode}']:.1f} s", flush=True)
    times = run_alternating(arms, args.warmup, args.steps)
    piped = pipelined_times(arms, args) if args.pipeline > 0 else {}
    kind = jax.devices()[0].device_kind
    peak = table_peak(kind, cfg.model.dtype) if jax.default_backend() != "cpu" else None
    out = {}
    for name, t in times.items():
        rows, length = data[name]["src"].shape
        flops = step_flops(cfg, rows, length)
        tokens = float(data[name]["tgt_mask"].sum())
        out[name] = {**_timing(t, tokens, flops, peak), "target_tokens_per_step": tokens,
                     "padded_positions_per_s": 2 * rows * length / statistics.median(t),
                     "tflop_per_step": flops / 1e12, "first_step_s": compile_s[name],
                     "layout": _layout_name(cfgs, layout_of[name]), "seconds": t}  # fmt: skip
        if name in piped:
            out[name]["pipelined"] = {**_timing(piped[name], tokens, flops, peak),
                                      "steps_in_flight": args.pipeline}  # fmt: skip
    return {"peak_tflops": peak, "arms": out}


def _layout_name(cfgs: dict, layout: str | None) -> str | None:
    """ "stacked" or "list": what `layout` ("auto" included) resolved to; None for Marian."""
    return None if layout is None else ("stacked" if cfgs[layout].model.scan_layers else "list")


def decode_result(cfg, args) -> dict:
    from flax import nnx

    from ln_jax import sharding
    from ln_jax.models.translation.search import Search, translate
    from ln_jax.models.translation.task import Translation

    rng = np.random.default_rng(0)
    lengths = rng.integers(args.src_len // 2, args.src_len + 1, args.sentences)
    mask = (np.arange(args.src_len)[None] < lengths[:, None]).astype(np.int32)
    src = np.where(mask == 1, rng.integers(4, cfg.model.vocab_size, mask.shape), 0)
    src[np.arange(args.sentences), lengths - 1] = 3  # EOS
    search = Search(args.beam, args.max_length, max_len_a=0.0, max_len_b=args.max_length)
    with sharding.use_mesh(sharding.single_device_mesh()):
        model = Translation(cfg).build(nnx.Rngs(params=0))
        src, mask = jax.numpy.asarray(src, "int32"), jax.numpy.asarray(mask, "int32")
        arms = {"beam": lambda: jax.block_until_ready(translate(model, src, mask, search))}
        start = time.perf_counter()
        arms["beam"]()  # compile
        first = time.perf_counter() - start
        print(f"beam: first call (compilation included) {first:.1f} s", flush=True)
        times = run_alternating(arms, 1, args.rounds)["beam"]
    median = statistics.median(times)
    return {"beam": args.beam, "sentences": args.sentences, "max_length": args.max_length,
            "sentences_per_s": args.sentences / median,
            "generated_tokens_per_s": args.sentences * args.max_length / median,
            "median_s": median, "first_call_s": first, "seconds": times}  # fmt: skip


def marian_decode_result(cfg, args) -> dict:
    """ln_jax's beam search against Marian's `generate` on the same weights and sources."""
    import tempfile

    from bench.speed import mt_marian

    with tempfile.TemporaryDirectory() as folder:
        calls, pad = mt_marian.decode_pair(cfg, args, folder)
        start = time.perf_counter()
        outputs = {name: call() for name, call in calls.items()}  # ln_jax's compiles
        print(f"marian decode: first calls {time.perf_counter() - start:.1f} s", flush=True)
        times = run_alternating(calls, 1, args.rounds)
    rate = {n: args.sentences / statistics.median(t) for n, t in times.items()}
    return {"beam": args.beam, "sentences": args.sentences, "max_length": args.max_length,
            "sentences_per_s": rate, "seconds": times,
            "ratio": rate["ln_jax"] / rate["hf_generate"],
            **mt_marian.same_tokens(outputs["ln_jax"], outputs["hf_generate"], pad)}  # fmt: skip


def targets(result: dict, first: str) -> dict:
    """The translation targets against Marian (issue 67): {name: {"value", "target"}}, the
    train step's on the first batch, blocked and in flight."""
    out = {}
    arms = result["train"]["arms"]
    anchor = "marian_compile" if "marian_compile" in arms else "marian_eager"
    theirs = arms.get(anchor)
    if first in arms and theirs:
        pairs = {"": (arms[first], theirs)}
        if "pipelined" in arms[first] and "pipelined" in theirs:
            pairs["pipelined_"] = (arms[first]["pipelined"], theirs["pipelined"])
        for prefix, (a, b) in pairs.items():
            value = a["target_tokens_per_s"] / b["target_tokens_per_s"]
            entry = {"value": value, "target": TRAIN_TARGET, "anchor": anchor}
            out[f"{prefix}mt_train_x_marian"] = entry
    if "marian_decode" in result:
        value = result["marian_decode"]["ratio"]
        entry = {"value": value, "target": BEAM_TARGET, "anchor": "hf_generate"}
        out["mt_beam_x_generate"] = entry
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.marian:  # torch's allocator and JAX's on one GPU: JAX takes memory as it needs it
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    cfgs = {x: build_config(args.config, args.dtype, args.attention, x) for x in args.layouts}
    cfg = next(iter(cfgs.values()))
    batches = [tuple(int(x) for x in b.split("x")) for b in args.batches.split(",")]
    result = {"device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
              "config": args.config, "dtype": str(cfg.model.dtype),
              "attention_impl": cfg.model.attention_impl, "args": vars(args)}  # fmt: skip
    if args.marian:
        import torch
        import transformers

        result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    first = arm_name(*batches[0])

    def save() -> None:  # after each part: a run cut by its time limit keeps what it measured
        result["targets"] = targets(result, first)
        write_result(args.out, result)

    result["train"] = train_result(cfgs, args, batches)
    save()
    for name, r in result["train"]["arms"].items():
        mfu = f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else ""
        rate = f"{r['target_tokens_per_s']:,.0f} target tokens/s, {r['tflops']:.1f} TFLOP/s"
        piped = r.get("pipelined")
        flight = f"; {piped['median_ms']:.2f} ms with {args.pipeline} in flight" if piped else ""
        print(f"train {name}: {r['median_ms']:.2f} ms/step, {rate}{mfu}{flight}")
    if "marian" in args.decodes:
        result["marian_decode"] = m = marian_decode_result(cfg, args)
        save()
        print(f"beam {m['beam']} against Marian's generate: " + ", ".join(
            f"{n} {r:,.1f} sentences/s" for n, r in m["sentences_per_s"].items()
        ) + f"; same tokens: {m['same_fraction']:.0%} of the sentences")  # fmt: skip
    if "random" in args.decodes:
        result["decode"] = d = decode_result(cfg, args)
        print(f"beam {d['beam']}: {d['sentences_per_s']:,.1f} sentences/s "
              f"({d['sentences']} sources, {d['max_length']} tokens each)")  # fmt: skip
    save()
    for name, t in result["targets"].items():
        print(f"{name}: {t['value']:.3f} x {t['anchor']} (target {t['target']})")
    return result


if __name__ == "__main__":
    main()
