"""What the train-step benchmarks share: the synthetic batch, FLOP counts, alternating timing.

Imported by `bench_train.py` (CPU, against HuggingFace) and `bench_accel.py` (any backend). It
sets no environment variable and picks no JAX platform: each script decides that itself.

A shape is a dict with the keys layers, d, heads, mlp, vocab, batch, seq and predictions
(MLM positions per example).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Step = Callable[[], Any]


class ShapeError(ValueError):
    """A benchmark shape no synthetic batch can have."""


def check_shape(s: dict[str, int]) -> None:
    """Raises ShapeError if `make_batch(s)` cannot place its masked predictions."""
    t, p = s["seq"], s["predictions"]
    if p > t - 2:
        raise ShapeError(
            f"a batch of length {t} has {max(t - 2, 0)} maskable positions (not [CLS] and the "
            f"last), fewer than the {p} masked predictions asked for: raise the length (--seq) "
            "or lower bert.max_predictions_per_seq (an --arm field)."
        )


def make_batch(s: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """A synthetic pretraining batch with ln_jax's documented keys (numpy)."""
    check_shape(s)
    rng = np.random.default_rng(seed)
    b, t, p, v = s["batch"], s["seq"], s["predictions"], s["vocab"]
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, t - 1), p, replace=False) for _ in range(b)]), axis=1
    )
    return {
        "input_ids": rng.integers(5, v, (b, t), dtype=np.int32),
        "segment_ids": (np.arange(t)[None, :] >= t // 2).repeat(b, 0).astype(np.int32),
        "attention_mask": np.ones((b, t), np.int32),
        "masked_positions": positions.astype(np.int32),
        "masked_ids": rng.integers(5, v, (b, p), dtype=np.int32),
        "masked_weights": np.ones((b, p), np.float32),
        "nsp_label": rng.integers(0, 2, (b,), dtype=np.int32),
    }


def model_flops(s: dict[str, int]) -> float:
    """FLOPs of the work one training step really does (a multiply-add = 2 FLOPs).

        forward per example = L * T * (8 d^2 + 4 d F)   # q, k, v, out projections + FFN
                            + L * 4 T^2 d               # Q K^T and P V
                            + P * (2 d^2 + 2 d V)       # MLM transform + tied decoder, P positions
                            + 2 d^2 + 4 d               # NSP pooler + classifier
        per step            = 3 * B * forward           # backward = 2 x forward

    Embedding lookups, softmax, LayerNorm, biases and the optimizer are not counted.
    """
    L, d, f, t = s["layers"], s["d"], s["mlp"], s["seq"]
    p, v = s["predictions"], s["vocab"]
    forward = L * t * (8 * d * d + 4 * d * f) + L * 4 * t * t * d
    forward += p * (2 * d * d + 2 * d * v) + 2 * d * d + 4 * d
    return 3.0 * s["batch"] * forward


def six_n_flops(num_params: int, s: dict[str, int]) -> float:
    """The usual MFU numerator: 6 * N * tokens + attention, 12 * L * d * T^2 per sequence.

    N is whatever the caller passes (bench_accel: every parameter, embeddings included, so the
    tied word embedding stands for a decoder at all T positions).
    """
    tokens = s["batch"] * s["seq"]
    attention = 12.0 * s["layers"] * s["d"] * s["seq"] ** 2 * s["batch"]
    return 6.0 * num_params * tokens + attention


def compiled_flops(compiled: Any) -> float | None:
    """XLA's `cost_analysis()` FLOPs of a compiled program (per device); None if not given."""
    costs = compiled.cost_analysis()
    if isinstance(costs, (list, tuple)):  # older JAX: one dict per program
        costs = costs[0] if costs else {}
    flops = float((costs or {}).get("flops", 0.0))
    return flops or None


def xla_matmul(n: int, dtype: Any) -> Step:
    """An n x n x n matmul in XLA on the default device (2 n^3 FLOPs a call), blocking."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    return lambda: mm(a, a).block_until_ready()


def run_alternating(steps: dict[str, Step], warmup: int, timed: int) -> dict[str, list[float]]:
    """Calls the steps in turn (A B C A B C ...); the seconds of each timed call."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + timed):
        last = {}
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            last[name] = time.perf_counter() - start
            if i >= warmup:
                times[name].append(last[name])
        line = ", ".join(f"{n} {t:.3f}s" for n, t in last.items())
        print(f"  round {i + 1}/{warmup + timed}: {line}", flush=True)
    return times


def timing_summary(times: list[float], s: dict[str, int], flops: float, peak: float) -> dict:
    """Median step time (and p25, p75, min), sequences/s, tokens/s and MFU = flops/time/peak."""
    median = statistics.median(times)
    quart = statistics.quantiles(times, n=4) if len(times) > 1 else [median] * 3
    return {
        "median_s": median,
        "p25_s": quart[0],
        "p75_s": quart[2],
        "min_s": min(times),
        "sequences_per_s": s["batch"] / median,
        "tokens_per_s": s["batch"] * s["seq"] / median,
        "mfu": flops / median / peak,
    }


def synthetic_bert_config(size: str, batch: int, seq: int, predictions: int, **fields) -> Any:
    """The `TrainConfig` of configs/bert_preln.py at BERT-`size` for a synthetic batch
    (`make_batch`: vocabulary 8000) of `batch` x `seq` with `predictions` masked positions;
    `fields`: more settings by dotted name ("model.scan_layers": True, "log_every": 10)."""
    from configs import bert_preln
    from ln_jax.config import load as config_front
    from ln_jax.config.run import TrainConfig

    shape = {
        "model.size": size,
        "model.max_position_embeddings": max(seq, 128),
        "data.vocab_size": 8000,
        "data.global_batch_size": batch,
        "data.max_seq_length": seq,
        "bert.max_predictions_per_seq": predictions,
    }
    values = config_front.override(bert_preln.get_config("mini"), {**shape, **fields})
    return TrainConfig.from_mapping(values)


def write_result(path: str | None, result: dict[str, Any]) -> None:
    """Writes a benchmark's result as JSON to `path` (the scripts' --out; None = nowhere)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
