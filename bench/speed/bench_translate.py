"""Decoding speed: the cached beam search against the same search recomputing the prefix.

  taskset -c 0 python bench/speed/bench_translate.py --beam=5 --sentences=32 --src_len=24 \\
      --max_length=32 --repeats=3

One process, one model (`configs/mt.py:small` shapes by default, random weights, Post-LN), the
same source batch; both searches are compiled first, then timed alternately (`repeats` each).
Prints sentences/s of each and the ratio; `--json` writes them. The decoded tokens are checked
equal (the caches change the work, not the result).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from ln_jax import sharding  # noqa: E402
from ln_jax.config.run import ModelConfig  # noqa: E402
from ln_jax.models.translation.model import Translator  # noqa: E402
from ln_jax.models.translation.options import TranslationOptions  # noqa: E402
from ln_jax.models.translation.search import Search, translate  # noqa: E402


def _model(args) -> Translator:
    cfg = ModelConfig(
        size="custom",
        vocab_size=args.vocab,
        hidden_size=args.width,
        num_heads=args.heads,
        mlp_dim=4 * args.width,
        num_layers=args.layers,
        placement="post",
        init="xavier",
        activation="relu",
        embedding_layernorm=False,
        max_position_embeddings=max(args.src_len, args.max_length) + 2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    options = TranslationOptions.from_mapping(
        {"max_source_length": args.src_len, "max_target_length": args.max_length - 1}, cfg
    )
    return Translator(cfg, options, rngs=nnx.Rngs(params=0))


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=32)
    p.add_argument("--src_len", type=int, default=24)
    p.add_argument("--max_length", type=int, default=32)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    with sharding.use_mesh(sharding.single_device_mesh()):
        model = _model(args)
        rng = np.random.default_rng(0)
        src = jnp.asarray(rng.integers(4, args.vocab, (args.sentences, args.src_len)), jnp.int32)
        mask = jnp.ones_like(src)
        searches = {
            "cached": Search(args.beam, args.max_length, max_len_a=0.0, max_len_b=args.max_length),
            "recompute": Search(
                args.beam, args.max_length, max_len_a=0.0, max_len_b=args.max_length, cache=False
            ),
        }
        runs = {
            n: (lambda s=s: translate(model, src, mask, s)["tokens"]) for n, s in searches.items()
        }
        first = {n: np.asarray(fn()) for n, fn in runs.items()}  # compile
        times = {n: [] for n in runs}
        for _ in range(args.repeats):  # alternate, so drifts in the machine hit both
            for n, fn in runs.items():
                times[n] += _time(fn, 1)
    same = bool(np.array_equal(first["cached"], first["recompute"]))
    rate = {n: args.sentences / statistics.median(t) for n, t in times.items()}
    result = {
        "args": vars(args),
        "sentences_per_s": rate,
        "cached_over_recompute": rate["cached"] / rate["recompute"],
        "same_tokens": same,
        "seconds": times,
        "device": jax.devices()[0].device_kind,
    }
    for n, r in rate.items():
        print(f"{n:10s} {r:8.2f} sentences/s (median of {args.repeats})")
    print(f"cached / recompute = {result['cached_over_recompute']:.2f}x; same tokens: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
