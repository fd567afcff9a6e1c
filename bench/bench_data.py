"""Throughput of the pretraining-data pipeline at seq 128, next to what a train step consumes.

Run:  python bench/bench_data.py [--data_dir DIR] [--seconds 3] [--step_seconds 0.3 0.5 1.0]
      (pin one core for steadier numbers: taskset -c 0 python bench/bench_data.py)

It prepares the embedded corpus and the tokenizer if needed (timed), then reads batches from
the host pipeline (numpy) and from the device pipeline (global jax.Arrays on a one-device mesh)
and prints examples/s and batches/s. A train step of S seconds at batch B consumes B/S
examples/s: the loader is not the bottleneck while its rate is well above that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402

from ln_jax import sharding  # noqa: E402
from ln_jax.data import DataConfig, loader, sources, tokenizer  # noqa: E402


@dataclasses.dataclass
class Row:
    name: str
    batch: int
    examples_per_s: float
    batches_per_s: float


def _rate(it, batch: int, seconds: float, block=None) -> tuple[float, float]:
    """Batches/s of an iterator over at least `seconds` (after two warm-up batches)."""
    for _ in range(2):
        b = next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 3:
        b = next(it)
        if block:
            block(b)
        n += 1
    per_s = n / (time.perf_counter() - start)
    return per_s * batch, per_s


def _timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"{label:<44s} {time.perf_counter() - start:7.2f} s", flush=True)
    return out


def prepare(cfg: DataConfig) -> None:
    """Times the one-off steps: corpus generation, tokenizer training, token ids, pairs."""
    opened = _timed(
        "prepare corpus (cached after the first run)",
        lambda: sources.open_sources(cfg),
    )
    tok = _timed("tokenizer (trained once, then cached)", lambda: tokenizer.get_tokenizer(cfg))
    print(f"  {tok.path}")
    docs = sum(s.num_documents(cfg.train_split) for s, _ in opened)
    comps, _ = _timed(
        "pipeline construction (token ids + pairs)", lambda: loader.load_examples(cfg, "train", 0)
    )
    print(f"  {docs} train documents -> {sum(len(c) for c, _ in comps)} examples at seq 128")


def measure(cfg: DataConfig, seconds: float, threads: int) -> list[Row]:
    rows = []
    mesh = sharding.single_device_mesh()
    variants = [
        ("host, NSP", {}, 16),
        ("host, NSP", {}, 128),
        ("host, NSP + whole-word", {"whole_word_masking": True}, 128),
        ("host, no NSP (packed)", {"nsp": False}, 128),
    ]
    for name, overrides, batch in variants:
        c = dataclasses.replace(cfg, global_batch_size=batch, **overrides)
        it, _ = loader.make_host_pipeline(c, seed=0, threads=threads)
        rows.append(Row(name, batch, *_rate(it, batch, seconds)))
    for batch in (16, 128):
        c = dataclasses.replace(cfg, global_batch_size=batch)
        it, _ = loader.make_pipeline(c, seed=0, mesh=mesh, threads=threads)
        block = lambda b: jax.block_until_ready(b)  # noqa: E731
        rows.append(Row("device (global jax.Array)", batch, *_rate(it, batch, seconds, block)))
    return rows


def _bert_step(vocab_size: int, size: str):
    """A jitted BERT pretraining step (AdamW, MLM + NSP loss) of ln_jax's model."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from ln_jax.bert import create_model
    from ln_jax.config import model_config

    model = create_model(model_config(size, vocab_size=vocab_size), seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.adamw(1e-4)

    def loss_fn(params, rest, batch):
        out = nnx.merge(graphdef, params, rest)(
            batch["input_ids"],
            batch["segment_ids"],
            batch["attention_mask"],
            batch["masked_positions"],
        )
        logp = jax.nn.log_softmax(out["mlm_logits"])
        nll = -jnp.take_along_axis(logp, batch["masked_ids"][..., None], axis=-1)[..., 0]
        w = batch["masked_weights"]
        mlm = (nll * w).sum() / jnp.maximum(w.sum(), 1.0)
        nsp = optax.softmax_cross_entropy_with_integer_labels(out["nsp_logits"], batch["nsp_label"])
        return mlm + nsp.mean()

    @jax.jit
    def step(params, opt_state, rest, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, params, opt.init(params), rest


def measure_train_step(cfg: DataConfig, batch: int, steps: int, size: str) -> dict[str, float]:
    """s/step of a BERT train step alone (fixed batch) and fed by the pipeline, same run."""
    c = dataclasses.replace(cfg, global_batch_size=batch)
    it, tok = loader.make_pipeline(c, seed=0, mesh=sharding.single_device_mesh())
    step, params, opt_state, rest = _bert_step(tok.vocab_size, size)
    fixed = next(it)
    for _ in range(2):  # compile and warm up
        params, opt_state, loss = step(params, opt_state, rest, fixed)
    jax.block_until_ready(loss)
    feeds = {"step alone": lambda: fixed, "step fed by loader": lambda: next(it)}
    timings = dict.fromkeys(feeds, 0.0)
    for _ in range(2):  # alternate the two loops: the second core is sometimes contended
        for name, feed in feeds.items():
            start = time.perf_counter()
            for _ in range(steps // 2):
                params, opt_state, loss = step(params, opt_state, rest, feed())
            jax.block_until_ready(loss)
            timings[name] += (time.perf_counter() - start) / (2 * (steps // 2))
    return timings


def report(rows: list[Row], steps: list[tuple[str, float]], train_batch: int) -> None:
    print(f"\n{'pipeline':<28s} {'batch':>5s} {'examples/s':>11s} {'batches/s':>10s}")
    for r in rows:
        print(f"{r.name:<28s} {r.batch:5d} {r.examples_per_s:11.0f} {r.batches_per_s:10.1f}")
    slowest = min(r.examples_per_s for r in rows if r.batch == train_batch)
    print(f"\nA train step at batch {train_batch} consumes (headroom = slowest loader row / need):")
    print(f"{'train step':<44s} {'s/step':>7s} {'examples/s':>11s} {'headroom':>9s}")
    for name, sec in steps:
        need = train_batch / sec
        print(f"{name:<44s} {sec:7.3f} {need:11.1f} {slowest / need:8.0f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default=None, help="TFDS data dir (default: TFDS's)")
    p.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    p.add_argument("--threads", type=int, default=1, help="grain read threads")
    p.add_argument("--step_seconds", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--train_batch", type=int, default=16, help="batch of the train step")
    p.add_argument("--model_size", default="mini", help="ln_jax model size of the train step")
    p.add_argument("--train_steps", type=int, default=10, help="0 = skip the train step")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    cfg = DataConfig(data_dir=args.data_dir, max_seq_length=128, max_predictions_per_seq=20)
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, {jax.device_count()} device(s)")
    prepare(cfg)
    rows = measure(cfg, args.seconds, args.threads)
    timings = {}
    if args.train_steps:
        try:
            timings = measure_train_step(cfg, args.train_batch, args.train_steps, args.model_size)
        except Exception as e:  # the model is another part of the project: report, go on
            print(f"train step not measured ({type(e).__name__}: {e})")
    steps = [(f"assumed {s:g} s/step", s) for s in args.step_seconds]
    steps += [(f"BERT-{args.model_size}, {name} (measured)", t) for name, t in timings.items()]
    report(rows, steps, args.train_batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [dataclasses.asdict(r) for r in rows], "train": timings}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
