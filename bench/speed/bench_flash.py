"""One attention layer's forward + backward, the implementations side by side (one process,
calls alternating): ln_jax's fused Pallas kernel under several Triton settings
(`ln_jax.nn.flash.Tuning`), XLA's attention with a threefry dropout mask (what
attention_impl=xla runs), and cuDNN's fused attention without dropout (a floor: the recipe's
dropout cannot run on it, docs/results/gpu/journal.md).

  python bench/speed/bench_flash.py --out=/tmp/flash.json          # GPU: BERT-base shapes
  python bench/speed/bench_flash.py --env_out=/tmp/tuning.env && . /tmp/tuning.env  # the fastest
  python bench/speed/bench_flash.py --batch=2 --heads=2 --steps=2    # CPU: the interpreter

Each variant is jitted as value_and_grad of sum(out * w) over q, k, v (bf16 on a GPU), with
right-padded key lengths; reported: median ms per call and the ratio to the first variant.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.speed import measure  # noqa: E402
from ln_jax.nn import attention, flash  # noqa: E402

TUNINGS = {
    "pallas_w4": flash.Tuning(warps_fwd=4, warps_bwd=4),
    "pallas_w8": flash.Tuning(warps_fwd=4, warps_bwd=8),
    "pallas_w8_s3": flash.Tuning(warps_fwd=8, warps_bwd=8, stages=3),
    "pallas_split": flash.Tuning(fused_backward=False),
}


def variants(rate: float, on_gpu: bool) -> dict:
    """name -> attention(q, k, v, valid, lengths, key)."""
    out = {name: functools.partial(_pallas, tuning=t, rate=rate) for name, t in TUNINGS.items()}
    out["xla_threefry"] = functools.partial(_xla, rate=rate)
    if on_gpu:
        out["cudnn_nodrop"] = _cudnn
    return out


def _pallas(q, k, v, valid, lengths, key, *, tuning, rate):
    return flash.flash_attention(q, k, v, valid, dropout_rate=rate, dropout_key=key, tuning=tuning)


def _xla(q, k, v, valid, lengths, key, *, rate):
    del valid
    return attention.masked_attention(q, k, v, attention.key_mask(lengths, q.shape[1]), rate, key)


def _cudnn(q, k, v, valid, lengths, key):
    del valid, key
    return jax.nn.dot_product_attention(
        q, k, v, key_value_seq_lengths=lengths, implementation="cudnn"
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--env_out", default=None, help="write the fastest settings as a shell export")
    args = p.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    b, t, n, h = args.batch, args.length, args.heads, args.head_dim
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v, w = (jax.random.normal(x, (b, t, n, h), dtype) for x in keys[:4])
    lengths = jax.random.randint(keys[4], (b,), t // 2, t + 1).at[0].set(t)
    valid = jnp.arange(t)[None, :] < lengths[:, None]
    steps = {}
    for name, fn in variants(args.rate, on_gpu).items():

        def loss(q, k, v, key, fn=fn):
            out = fn(q, k, v, valid, lengths, key)
            return jnp.sum(out.astype(jnp.float32) * w)

        grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        try:
            jax.block_until_ready(grad(q, k, v, jax.random.key(1)))
        except Exception as err:  # a variant that cannot run here is reported, not fatal
            print(f"{name}: failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
            continue
        steps[name] = functools.partial(
            lambda g: jax.block_until_ready(g(q, k, v, jax.random.key(1))), grad
        )
    times = measure.run_alternating(steps, args.warmup, args.steps)
    first = statistics.median(next(iter(times.values())))
    result = {
        "shape": dict(batch=b, length=t, heads=n, head_dim=h, rate=args.rate),
        "device": str(jax.devices()[0].device_kind),
        "ms": {name: 1e3 * statistics.median(x) for name, x in times.items()},
    }
    result["ratio_to_first"] = {n: 1e-3 * ms / first for n, ms in result["ms"].items()}
    for name, ms in result["ms"].items():
        print(f"{name:16s} {ms:8.3f} ms  x{result['ratio_to_first'][name]:.2f}")
    tuned = {n: ms for n, ms in result["ms"].items() if n in TUNINGS}
    if tuned:
        best = TUNINGS[min(tuned, key=tuned.get)]
        result["best_tuning"] = ",".join(str(int(x)) for x in best)
        print(f"fastest Pallas settings: {flash.TUNING_ENV}={result['best_tuning']}")
        if args.env_out:
            with open(args.env_out, "w") as f:
                f.write(f"export {flash.TUNING_ENV}={result['best_tuning']}\n")
    measure.write_result(args.out, result)
    return result


if __name__ == "__main__":
    json.dumps(main())
