"""The translation model's train step and beam search on any backend: tokens/s, MFU, sentences/s.

  # H100 / H200: the `iwslt` shape (6-6, 512/1024/4, vocab 10k), the recipe's 4,096-token batch
  # and a larger one, then beam 5 on 256 sources
  python bench/bench_mt_accel.py --batches=128x32,512x64 --out=/tmp/mt_accel.json
  # CPU (what CI runs, tiny shapes)
  python bench/bench_mt_accel.py --config=configs/mt.py:tiny --batches=8x16 --steps=2 \\
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
MFU divides by the device kind's dense peak (`bench.accel_step.PEAKS`), or none on a CPU.

Decode: the same model with random weights (`Translation.build`), beam 5 (`--beam`), the cached
search of `ln_jax.models.translation.search` on `--sentences` sources of lengths drawn from
src_len/2..src_len, every hypothesis run to `--max_length` tokens (max_len_a 0, b = max_length:
random weights do not stop early, so the work is fixed: a trained model stops sooner and is
faster). Rate: sentences/s and generated tokens/s (sentences x max_length).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench.accel_step import table_peak  # noqa: E402
from bench.bench_translate_hf import train_batch  # noqa: E402
from bench.measure import run_alternating, write_result  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/mt.py:iwslt", help="FILE[:variant]")
    p.add_argument("--dtype", default="auto", help="model.dtype (auto: bf16 on GPU/TPU)")
    p.add_argument(
        "--attention", default="auto", help="model.attention_impl (auto: the platform's choice)"
    )
    p.add_argument("--batches", default="128x32,512x64", help="ROWSxLENGTH,...")
    p.add_argument("--steps", type=int, default=20, help="timed steps per batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--src_len", type=int, default=32)
    p.add_argument("--max_length", type=int, default=40, help="tokens generated, EOS included")
    p.add_argument("--rounds", type=int, default=3, help="timed decodes")
    p.add_argument("--skip_decode", action="store_true")
    p.add_argument("--out", help="write the result (JSON) here")
    return p.parse_args(argv)


def build_config(spec: str, dtype: str, attention: str = "auto"):
    """The TrainConfig of `spec` on one device, the whole batch in one step, every position
    computed (`task_options.skip_padding` off: the FLOPs are counted on padded positions)."""
    from ln_jax.config_front import build_config as build
    from ln_jax.config_front import config_from_command_line

    defaults = {"model.dtype": dtype, "model.attention_impl": attention, "grad_accum_steps": 1,
                "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1,
                "task_options.skip_padding": "off"}  # fmt: skip
    values, _ = config_from_command_line([], spec, defaults)
    return build(values)


def step_flops(cfg, rows: int, length: int) -> float:
    """Training FLOPs of one step over padded positions (the module docstring's formula)."""
    from ln_jax.models.translation.options import TranslationOptions

    m = cfg.model
    d, f, v = m.hidden_size, m.mlp_dim, m.vocab_size
    le = m.num_layers
    ld = TranslationOptions.from_mapping(cfg.task_options, m).decoder_layers
    s = t = length
    n_enc = le * (4 * d * d + 2 * d * f)
    n_dec = ld * (6 * d * d + 2 * d * f)
    forward = 2 * (n_enc * s + (n_dec + d * v) * t + 2 * ld * d * d * s)
    forward += 4 * d * (le * s * s + ld * (t * t + t * s))
    return 3.0 * forward * rows


def train_arms(cfg, batches: list[tuple[int, int]]):
    """{ROWSxLENGTH: a blocking call of the trainer's step on that batch}, each compiled."""
    from ln_jax import sharding
    from ln_jax.train import steps

    mesh = sharding.single_device_mesh()
    pieces = steps.init_state(cfg, mesh)
    train = steps.in_mesh(steps.jit_steps(cfg, mesh, pieces)[0], mesh)
    box = {"state": pieces.state}
    arms, data, compile_s = {}, {}, {}
    for rows, length in batches:
        name = f"{rows}x{length}"
        data[name] = train_batch(rows, length, vocab=cfg.model.vocab_size)
        device_batch = jax.device_put(data[name], sharding.batch_sharding(mesh))

        def step(b=device_batch):
            box["state"], metrics = train(box["state"], pieces.rest, b)
            return jax.block_until_ready(metrics)

        start = time.perf_counter()
        step()  # compile this shape
        compile_s[name] = time.perf_counter() - start
        print(f"train {name}: first step {compile_s[name]:.1f} s (with compilation)", flush=True)
        arms[name] = step
    return arms, data, compile_s


def train_result(cfg, args, batches) -> dict:
    arms, data, compile_s = train_arms(cfg, batches)
    times = run_alternating(arms, args.warmup, args.steps)
    kind = jax.devices()[0].device_kind
    peak = table_peak(kind, cfg.model.dtype) if jax.default_backend() != "cpu" else None
    out = {}
    for (rows, length), (name, t) in zip(batches, times.items(), strict=True):
        median = statistics.median(t)
        flops = step_flops(cfg, rows, length)
        tokens = float(data[name]["tgt_mask"].sum())
        out[name] = {
            "median_ms": 1e3 * median,
            "target_tokens_per_step": tokens,
            "target_tokens_per_s": tokens / median,
            "padded_positions_per_s": 2 * rows * length / median,
            "tflop_per_step": flops / 1e12,
            "tflops": flops / median / 1e12,
            "mfu": flops / median / (peak * 1e12) if peak else None,
            "first_step_s": compile_s[name],
            "seconds": t,
        }
    return {"peak_tflops": peak, "arms": out}


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


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = build_config(args.config, args.dtype, args.attention)
    batches = [tuple(int(x) for x in b.split("x")) for b in args.batches.split(",")]
    result = {"device": jax.devices()[0].device_kind, "config": args.config,
              "dtype": str(cfg.model.dtype), "attention_impl": cfg.model.attention_impl,
              "args": vars(args)}  # fmt: skip
    result["train"] = train_result(cfg, args, batches)
    for name, r in result["train"]["arms"].items():
        mfu = f", MFU {100 * r['mfu']:.1f}%" if r["mfu"] else ""
        rate = f"{r['target_tokens_per_s']:,.0f} target tokens/s, {r['tflops']:.1f} TFLOP/s"
        print(f"train {name}: {r['median_ms']:.2f} ms/step, {rate}{mfu}")
    if not args.skip_decode:
        result["decode"] = d = decode_result(cfg, args)
        print(f"beam {d['beam']}: {d['sentences_per_s']:,.1f} sentences/s "
              f"({d['sentences']} sources, {d['max_length']} tokens each)")  # fmt: skip
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
