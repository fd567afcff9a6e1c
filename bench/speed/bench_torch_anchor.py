"""The PyTorch anchor: HuggingFace `BertForPreTraining`'s train step, the step a user would pick
instead of ln_jax, timed on the same device and batch as `bench_accel.py`.

  # one H100/H200: BERT-base, batch 256 x 128, bf16 autocast, dropout 0.1 everywhere
  python bench/speed/bench_torch_anchor.py --size=base --batch=256 --steps=20 --out=/tmp/torch.json
  # CPU (CI): tiny shapes, eager only
  python bench/speed/bench_torch_anchor.py --size=tiny --batch=8 --steps=2 \\
      --modes=eager_all,eager_masked

Modes (`--modes`, alternating in one process, each with its own model and optimizer):
* eager_all / compile_all: `BertForPreTraining(**inputs, labels=...)` as HuggingFace ships it:
  the MLM decoder at all T positions (its loss ignores the unmasked ones);
* eager_masked / compile_masked: the encoder, then the MLM head at the P masked positions only
  (the work ln_jax's step does) and the NSP head;
* compile_*: the same under `torch.compile` (default mode), compiled before timing.
Every step: forward, backward, global-norm clipping at 1.0, AdamW (fused on CUDA), zero_grad;
bf16 autocast on CUDA, float32 on CPU; dropout 0.1 on hidden states and attention
probabilities (SDPA). Timed with a device synchronise after each step; medians. With
`--pipeline=K`, also K steps launched back to back and one synchronise, the time over K
("pipelined", as `bench_accel.py --pipeline=K` times ln_jax).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

from bench.speed import measure  # noqa: E402

SIZES = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "base": (12, 768, 12, 3072)}
MODES = ("eager_all", "eager_masked", "compile_all", "compile_masked")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="base", choices=sorted(SIZES))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--pipeline",
        type=int,
        default=0,
        help="also time K steps launched back to back, one wait on the last (0 = not)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        p.error(f"unknown --modes {unknown}; choose from {', '.join(MODES)}")
    return args


def shape(args: argparse.Namespace) -> dict[str, int]:
    layers, d, heads, mlp = SIZES[args.size]
    return dict(
        layers=layers, d=d, heads=heads, mlp=mlp, vocab=args.vocab,
        batch=args.batch, seq=args.seq, predictions=args.predictions,
    )  # fmt: skip


def build_model(s: dict[str, int], dropout: float, device: Any) -> Any:
    import torch
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=s["vocab"], hidden_size=s["d"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], intermediate_size=s["mlp"],
        max_position_embeddings=max(512, s["seq"]), hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout, hidden_act="gelu", layer_norm_eps=1e-12,
    )  # fmt: skip
    model = BertForPreTraining(config).to(device)
    model.train()
    return model


def tensors(batch: dict, device: Any) -> dict[str, Any]:
    """The synthetic batch (bench.speed.measure.make_batch) as torch tensors, HF's labels added."""
    import numpy as np
    import torch

    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    labels[np.arange(labels.shape[0])[:, None], batch["masked_positions"]] = batch["masked_ids"]
    out = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in batch.items()}
    out["labels"] = torch.from_numpy(labels).to(device)
    return {k: (v.long() if v.dtype != torch.float32 else v) for k, v in out.items()}


def loss_fn(model: Any, t: dict[str, Any], masked: bool) -> Any:
    """The pretraining loss: HF's own (all positions) or the MLM head at the masked ones."""
    import torch.nn.functional as F

    if not masked:
        return model(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"],
            token_type_ids=t["segment_ids"], labels=t["labels"],
            next_sentence_label=t["nsp_label"],
        ).loss  # fmt: skip
    hidden, pooled = model.bert(
        input_ids=t["input_ids"], attention_mask=t["attention_mask"],
        token_type_ids=t["segment_ids"], return_dict=False,
    )[:2]  # fmt: skip
    pos = t["masked_positions"][..., None].expand(-1, -1, hidden.shape[-1])
    scores = model.cls.predictions(hidden.gather(1, pos))  # [B, P, V]
    mlm = F.cross_entropy(scores.flatten(0, 1).float(), t["masked_ids"].flatten())
    nsp = F.cross_entropy(model.cls.seq_relationship(pooled).float(), t["nsp_label"])
    return mlm + nsp


def make_step(mode: str, s: dict[str, int], t: dict, args, device: Any) -> Any:
    """A callable running one full train step of `mode` and waiting for the device."""
    import torch

    model = build_model(s, args.dropout, device)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=cuda
    )
    masked = mode.endswith("masked")
    forward = (lambda m, x: loss_fn(m, x, masked)) if mode.startswith("eager") else None
    if forward is None:
        compiled = torch.compile(lambda m, x: loss_fn(m, x, masked))
        forward = compiled

    def step(wait: bool = True) -> float | None:
        """One step; with `wait`, waits for the device and returns the loss (else launches
        only: the next step queues behind it, as in a training loop)."""
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = forward(model, t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not wait:
            return None
        if cuda:
            torch.cuda.synchronize()
        return float(loss.detach())

    step.attention = model.config._attn_implementation  # what HF chose (sdpa)
    return step


def pipelined_times(steps: dict[str, Any], args) -> dict[str, list[float]]:
    """Seconds per step of each mode with `args.pipeline` steps launched before one wait
    (modes alternating; max(2, steps / K) timed rounds after the blocked ones)."""
    k = args.pipeline

    def burst(step):
        for _ in range(k - 1):
            step(wait=False)
        step()

    calls = {m: functools.partial(burst, step) for m, step in steps.items()}
    times = measure.run_alternating(calls, 0, max(2, args.steps // k))
    return {m: [t / k for t in ts] for m, ts in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s = shape(args)
    t = tensors(measure.make_batch(s), device)
    steps, compile_s, losses = {}, {}, {}
    for mode in args.modes:
        start = time.perf_counter()
        steps[mode] = make_step(mode, s, t, args, device)
        losses[mode] = steps[mode]()  # the first call compiles a compile_* mode
        compile_s[mode] = time.perf_counter() - start
        print(f"{mode}: built and first step in {compile_s[mode]:.1f} s", flush=True)
    times = measure.run_alternating(steps, args.warmup, args.steps)
    pipelined = pipelined_times(steps, args) if args.pipeline > 0 else {}
    flops = measure.model_flops(s)  # the masked-position work, the same numerator for all
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {
        "device": name,
        "shape": s,
        "modes": {
            m: {
                **measure.timing_summary(times[m], s, flops, 1.0),
                "ms_per_step": 1e3 * statistics.median(times[m]),
                "times_s": times[m],
                "first_step_s": compile_s[m],
                "first_loss": losses[m],
                "attention": steps[m].attention,
            }
            for m in args.modes
        },
        "dtype": "bfloat16 autocast" if device.type == "cuda" else "float32",
        "dropout": args.dropout,
        "versions": {"torch": torch.__version__, "transformers": _version("transformers")},
        "command": ["python", "bench/speed/bench_torch_anchor.py", *(argv or sys.argv[1:])],
    }
    for m, ts in pipelined.items():
        x = measure.timing_summary(ts, s, flops, 1.0)
        x.pop("mfu")
        result["modes"][m]["pipelined"] = {
            **x,
            "ms_per_step": 1e3 * statistics.median(ts),
            "steps_in_flight": args.pipeline,
        }
    for m in result["modes"].values():
        m.pop("mfu")  # no peak here: bench_accel's table divides by the device's
    print(f"\nHuggingFace BertForPreTraining on {name}, batch {s['batch']} x {s['seq']}")
    for mode, r in result["modes"].items():
        print(f"  {mode:<15s}{r['ms_per_step']:9.1f} ms {r['sequences_per_s']:10.1f} seq/s")
        if "pipelined" in r:
            x = r["pipelined"]
            print(f"  {'  pipelined':<15s}{x['ms_per_step']:9.1f} ms {x['sequences_per_s']:10.1f}"
                  f" seq/s ({args.pipeline} steps in flight, one wait)")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
