"""Train-step throughput and MFU: ln_jax next to HuggingFace BertForPreTraining (PyTorch, Flax).

Run pinned to one core (two-thread timings on the 2-core CI machine are bimodal):

  taskset -c 0 python bench/speed/bench_train.py --size=mini --batch=16 --seq=128 --steps=30 \\
      --warmup=3 --out=/tmp/bench_mini.json                        # about 4 minutes
  taskset -c 0 python bench/speed/bench_train.py --size=base --batch=4 --steps=6 --warmup=2 \\
      --skip_xla_flops                                             # about 7 minutes

Not a test. Three implementations of the same BERT pretraining step run in ONE process,
alternating (A B C A B C ...), so that machine noise hits them alike:

* `ln_jax`: the real trainer step (`ln_jax.train.steps.init_state` + `jit_steps`) on a one-device
  mesh, from `configs/bert_preln.py` with the sizes overridden.
* `hf_torch`: `transformers.BertForPreTraining`, PyTorch eager (its default SDPA attention),
  `model.train()`, `loss.backward()`, gradient clipping, `AdamW.step()`, `zero_grad()`.
* `hf_flax`: `transformers.FlaxBertForPreTraining` + optax (clip + AdamW) in one `jax.jit`
  step with `train=True` and a `dropout_rng`, parameters and optimizer state donated.

Two experiments can join them (`--impls=...`): `ln_jax_autodiff_ln`, the same ln_jax step with
LayerNorm's closed-form backward replaced by autodiff (monkeypatched here, see
`layernorm_autodiff`), and
`ln_jax_post`, ln_jax as Post-LN like the HuggingFace models.

All of them: the same sizes and vocabulary, float32, dropout 0.1 (hidden and attention), MLM on
the same `--predictions` positions per example + NSP, global-norm clipping at 1.0, AdamW, the
same synthetic batch. Not the same: HuggingFace's heads decode MLM logits at ALL T positions
(labels -100 elsewhere) while ln_jax decodes only the P masked positions; that is a real
advantage of ln_jax's step and part of what is measured. (ln_jax's config is Pre-LN, the
HuggingFace models Post-LN: the same LayerNorm count bar one final norm.)

Model FLOPs (used for MFU, the same number for every implementation): the work the task
needs, counting a multiply-add as 2 FLOPs and ignoring embedding lookups, softmax, LayerNorm,
biases and the optimizer:

    forward per example = L * T * (8 d^2 + 4 d F)   # q, k, v, out projections + FFN
                        + L * 4 T^2 d               # Q K^T and P V
                        + P * (2 d^2 + 2 d V)       # MLM transform + tied decoder, P positions
                        + 2 d^2 + 4 d               # NSP pooler + classifier
    model FLOPs per step = 3 * B * forward          # backward = 2 x forward

i.e. 6 * N_encoder * tokens plus attention and heads. XLA's `cost_analysis()` FLOPs of the
JAX steps are printed too (they count every op, including HuggingFace's all-position decoder).
MFU = model FLOPs per step / median step time / peak. The peak is a float32 N x N x N matmul
in XLA on the same device, timed in the same alternation as the steps (so under the same
noise); torch's matmul is timed alike, and a second MFU column uses each framework's own peak.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.speed.measure import (  # noqa: E402
    compiled_flops,
    make_batch,
    model_flops,
    run_alternating,
    timing_summary,
    write_result,
    xla_matmul,
)
from ln_jax.config.run import SIZES  # noqa: E402

IMPLS = ("ln_jax", "hf_flax", "hf_torch")
# Experiments: ln_jax with LayerNorm's backward left to autodiff, and ln_jax as Post-LN (like HF).
EXTRA_IMPLS = ("ln_jax_autodiff_ln", "ln_jax_post")
Step = Callable[[], Any]


# --------------------------------------------------------------------------- set-up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="mini", choices=sorted(SIZES))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20, help="masked positions / example")
    p.add_argument("--vocab", type=int, default=None, help="default: 8000 (tiny, mini), 30522")
    p.add_argument("--steps", type=int, default=30, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compiles) each")
    p.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help="comma list of " + ",".join(IMPLS + EXTRA_IMPLS),
    )
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--prng", default=None, help="jax_default_prng_impl for both JAX steps")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    p.add_argument("--matmul", type=int, default=2048, help="N of the peak-FLOP/s matmul")
    p.add_argument(
        "--skip_xla_flops",
        action="store_true",
        help="skip XLA's FLOP count (an extra ahead-of-time compile of each JAX step)",
    )
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def shape(args: argparse.Namespace) -> dict[str, int]:
    """The model and batch sizes every implementation uses."""
    layers, d, heads, mlp = SIZES[args.size]
    vocab = args.vocab or (8000 if args.size in ("tiny", "mini") else 30522)
    return dict(
        layers=layers, d=d, heads=heads, mlp=mlp, vocab=vocab,
        batch=args.batch, seq=args.seq, predictions=args.predictions,
    )  # fmt: skip


def mlm_labels(batch: dict[str, np.ndarray]) -> np.ndarray:
    """HuggingFace labels [B, T]: the masked ids at the masked positions, -100 elsewhere."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows = np.arange(labels.shape[0])[:, None]
    labels[rows, batch["masked_positions"]] = batch["masked_ids"]
    return labels


def hf_config(s: dict[str, int], dropout: float) -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=s["vocab"],
        hidden_size=s["d"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=s["mlp"],
        max_position_embeddings=max(s["seq"], 128),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
    )


# --------------------------------------------------------------------------- the three steps


def ln_jax_config(args: argparse.Namespace, s: dict[str, int], placement: str = "pre") -> Any:
    """The trainer's TrainConfig: configs/bert_preln.py with the benchmark's sizes."""
    from configs import bert_preln
    from ln_jax.config.run import TrainConfig

    c = bert_preln.get_config("mini" if s["vocab"] == 8000 else "base")
    c.model.size = args.size
    c.model.placement = placement
    c.grad_accum_steps = 1  # one step of the whole batch (the base config defaults to auto)
    c.model.max_position_embeddings = max(s["seq"], 128)
    c.model.hidden_dropout = c.model.attention_dropout = args.dropout
    c.data.vocab_size = s["vocab"]
    c.data.global_batch_size = s["batch"]
    c.data.max_seq_length = s["seq"]
    c.bert.max_predictions_per_seq = s["predictions"]
    return TrainConfig.from_mapping(c.to_dict())


@contextlib.contextmanager
def layernorm_autodiff() -> Iterator[None]:
    """ln_jax's LayerNorm left to autodiff (`layers.autodiff_normalization`), an experiment.

    XLA:CPU then duplicates the autodiff'd LayerNorm backward of every later layer into the
    fusions of each earlier one on Pre-LN's residual stream (quadratic in depth).
    """
    from ln_jax.nn import layers

    with layers.autodiff_normalization():
        yield


def build_ln_jax(
    args: argparse.Namespace,
    s: dict[str, int],
    batch: dict,
    placement: str = "pre",
    autodiff_ln: bool = False,
) -> dict[str, Any]:
    """ln_jax's real train step (`ln_jax.train.steps`: init_state + jit_steps) on a one-device mesh.

    The step is traced and compiled here (first call), so that an experimental patch
    (`autodiff_ln`) applies to it and to nothing else.
    """
    from ln_jax import sharding
    from ln_jax.task import make_task
    from ln_jax.train import steps
    from ln_jax.xla.aot import compile_report

    cfg = ln_jax_config(args, s, placement)
    mesh = sharding.single_device_mesh()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    train = steps.in_mesh(steps.jit_steps(cfg, task, mesh, pieces)[0], mesh)
    device_batch = jax.device_put(batch, sharding.batch_sharding(mesh))
    box = {"state": pieces.state}

    def step() -> Any:
        box["state"], metrics = train(box["state"], pieces.rest, device_batch)
        return jax.block_until_ready((box["state"], metrics))

    with layernorm_autodiff() if autodiff_ln else contextlib.nullcontext():
        step()
        # The same step compiled ahead of time from abstract state, for XLA's FLOP count.
        flops = compile_report(cfg, mesh)["flops_per_step"] if not args.skip_xla_flops else None
    return {"step": step, "xla_flops": (lambda: flops) if flops else None}


def _xla_flops(jitted: Any, *args: Any) -> float:
    return compiled_flops(jitted.lower(*args).compile()) or 0.0


def _hf_flax_loss(model: Any, params: Any, batch: dict, rng: Any) -> jax.Array:
    """HuggingFace's pretraining loss: MLM cross-entropy over labelled positions + NSP."""
    import optax

    out = model(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["segment_ids"],
        params=params,
        dropout_rng=rng,
        train=True,
    )
    labels = batch["labels"]
    weights = (labels >= 0).astype(jnp.float32)
    mlm = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits, jnp.maximum(labels, 0)
    )
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits, batch["nsp_label"]
    )
    return (mlm * weights).sum() / weights.sum() + nsp.mean()


def _adamw(lr: float = 3e-4) -> Any:
    import optax

    decay = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decay),
    )


def build_hf_flax(args: argparse.Namespace, s: dict[str, int], batch: dict) -> dict[str, Any]:
    """FlaxBertForPreTraining + optax AdamW in one jitted, donating step."""
    import optax
    from transformers import FlaxBertForPreTraining

    model = FlaxBertForPreTraining(hf_config(s, args.dropout), seed=0, dtype=jnp.float32)
    tx = _adamw()
    hf_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    hf_batch["labels"] = jnp.asarray(mlm_labels(batch), jnp.int32)

    def train_step(params, opt_state, rng, batch):
        rng, dropout_rng = jax.random.split(rng)
        loss, grads = jax.value_and_grad(lambda p: _hf_flax_loss(model, p, batch, dropout_rng))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    train = jax.jit(train_step, donate_argnums=(0, 1, 2))
    box = {"params": model.params, "opt": tx.init(model.params), "rng": jax.random.PRNGKey(0)}

    def step() -> Any:
        out = train(box["params"], box["opt"], box["rng"], hf_batch)
        box["params"], box["opt"], box["rng"], loss = out
        return jax.block_until_ready(out)

    def flops() -> float:
        return _xla_flops(train, box["params"], box["opt"], box["rng"], hf_batch)

    return {"step": step, "xla_flops": flops if not args.skip_xla_flops else None}


def build_hf_torch(args: argparse.Namespace, s: dict[str, int], batch: dict) -> dict[str, Any]:
    """BertForPreTraining in PyTorch eager: forward, backward, clip, AdamW, zero_grad."""
    import torch
    from transformers import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(hf_config(s, args.dropout))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01)  # fmt: skip
    inputs = {
        "input_ids": torch.from_numpy(batch["input_ids"]).long(),
        "attention_mask": torch.from_numpy(batch["attention_mask"]).long(),
        "token_type_ids": torch.from_numpy(batch["segment_ids"]).long(),
        "labels": torch.from_numpy(mlm_labels(batch)),
        "next_sentence_label": torch.from_numpy(batch["nsp_label"]).long(),
    }

    def step() -> Any:
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return {"step": step, "xla_flops": None, "attention": model.config._attn_implementation}


BUILDERS = {
    "ln_jax": build_ln_jax,
    "ln_jax_autodiff_ln": functools.partial(build_ln_jax, autodiff_ln=True),
    "ln_jax_post": functools.partial(build_ln_jax, placement="post"),
    "hf_flax": build_hf_flax,
    "hf_torch": build_hf_torch,
}


# --------------------------------------------------------------------------- measuring


def matmul_steps(n: int) -> dict[str, Step]:
    """Float32 n x n x n matmuls, XLA on the JAX device and torch: timed with the steps."""
    import torch

    t = torch.randn(n, n)
    return {
        "matmul_xla": xla_matmul(n, jnp.float32),
        "matmul_torch": lambda: torch.mm(t, t),
    }


def matmul_peaks(times: dict[str, list[float]], n: int) -> dict[str, float]:
    """FLOP/s from the median time of each matmul (measured under the same noise)."""
    flops = 2.0 * n**3
    return {
        "xla": flops / statistics.median(times.pop("matmul_xla")),
        "torch": flops / statistics.median(times.pop("matmul_torch")),
    }


# --------------------------------------------------------------------------- report


def print_table(result: dict[str, Any]) -> None:
    s, peaks = result["shape"], result["peaks"]
    print(
        f"\nBERT-{result['size']} (L={s['layers']}, d={s['d']}, heads={s['heads']}, "
        f"F={s['mlp']}, V={s['vocab']}), batch {s['batch']} x seq {s['seq']}, "
        f"{s['predictions']} MLM predictions/example + NSP, dropout {result['dropout']}, "
        f"float32, AdamW; {result['steps']} timed steps each, alternating"
    )
    print(
        f"matmul peak ({result['matmul']}^3 f32): XLA {peaks['xla'] / 1e9:.1f} GFLOP/s, "
        f"torch {peaks['torch'] / 1e9:.1f} GFLOP/s; model FLOPs/step "
        f"{result['model_flops'] / 1e9:.2f} GFLOP; torch threads {result['threads']}"
    )
    head = f"{'impl':<18s}{'median s':>10s}{'p25-p75 s':>16s}{'tokens/s':>10s}"
    print(head + f"{'MFU':>8s}{'MFU own':>9s}{'XLA GFLOP':>11s}")
    for name, r in result["impls"].items():
        xla = f"{r['xla_flops'] / 1e9:11.2f}" if r.get("xla_flops") else f"{'-':>11s}"
        print(
            f"{name:<18s}{r['median_s']:10.3f}{r['p25_s']:8.3f}-{r['p75_s']:.3f}"
            f"{r['tokens_per_s']:10.0f}{100 * r['mfu']:7.1f}%{100 * r['mfu_own']:8.1f}%{xla}"
        )
    for key, value in result["ratios"].items():
        print(f"{key}: {value:.2f}x")
    print(
        "note: HuggingFace decodes MLM logits at all T positions, ln_jax only at the P masked "
        "ones (a real saving of ln_jax's step, included in these times)."
    )


def ratios(impls: dict[str, dict]) -> dict[str, float]:
    """Speed-ups of each ln_jax step: the other's median step time / ln_jax's."""
    out = {}
    for mine in (n for n in impls if n.startswith("ln_jax")):
        for other in ("hf_flax", "hf_torch"):
            if other in impls:
                speedup = impls[other]["median_s"] / impls[mine]["median_s"]
                out[f"{mine} speed-up vs {other}"] = speedup
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.prng:
        jax.config.update("jax_default_prng_impl", args.prng)
    import torch

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    s = shape(args)
    batch = make_batch(s)
    names = [n.strip() for n in args.impls.split(",") if n.strip()]
    built = {}
    for name in names:
        start = time.perf_counter()
        built[name] = BUILDERS[name](args, s, batch)
        print(f"built {name} in {time.perf_counter() - start:.1f} s", flush=True)
    steps = {n: b["step"] for n, b in built.items()} | matmul_steps(args.matmul)
    times = run_alternating(steps, args.warmup, args.steps)
    peaks = matmul_peaks(times, args.matmul)
    flops = model_flops(s)
    impls = {}
    for name in names:
        own = peaks["torch" if name == "hf_torch" else "xla"]
        impls[name] = timing_summary(times[name], s, flops, peaks["xla"])
        impls[name]["mfu_own"] = flops / impls[name]["median_s"] / own
        impls[name]["xla_flops"] = built[name]["xla_flops"]() if built[name]["xla_flops"] else None
        impls[name]["times_s"] = times[name]
    result = {
        "size": args.size,
        "shape": s,
        "dropout": args.dropout,
        "prng": args.prng or str(jax.config.jax_default_prng_impl),
        "steps": args.steps,
        "warmup": args.warmup,
        "threads": threads,
        "affinity": sorted(os.sched_getaffinity(0)),
        "matmul": args.matmul,
        "peaks": peaks,
        "model_flops": flops,
        "impls": impls,
        "ratios": ratios(impls),
        "versions": {"jax": jax.__version__, "torch": torch.__version__},
    }
    print_table(result)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
