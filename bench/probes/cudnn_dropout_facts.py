"""What cuDNN's fused attention dropout does, read off the kernel on an NVIDIA GPU.

  python bench/probes/cudnn_dropout_facts.py --out=/tmp/cudnn_facts.json
  python bench/probes/cudnn_dropout_facts.py --command_buffers  # XLA's CUDA graphs left as they are

cuDNN draws its dropout masks itself, from a static seed and an offset that XLA's runtime is
meant to advance, so which calls share a mask is a property of JAX/XLA, not of ln_jax. ln_jax's
model refuses cuDNN attention dropout (`ModelConfig.cudnn_problem`) because of what this reads
(jax 0.11.2, H200, 2026-11-26, docs/results/gpu/journal.md): two executions of one jitted program
draw the SAME masks (every training step would drop the same probabilities), and inside XLA's CUDA
graphs the call aborts the process, which is why this script keeps cuDNN out of them
(`--xla_gpu_enable_command_buffer=-CUDNN`) unless `--command_buffers`. Rerun it on a newer JAX
before lifting the refusal. It reports, each as a measured fact:
* the drop rate and the 1/(1 - rate) scale of the kept probabilities; padded keys stay 0;
* whether a call's backward uses its own forward's mask (plain, under `jax.checkpoint`, and
  inside a 2-step `lax.scan`);
* whether two executions of one program differ (fresh masks per step), and whether two calls
  in one program with the same seed / other seeds differ.

The readout: with v[s] = e_s (one-hot over the 64 head dims) the attention output is the
dropped probability matrix P' of keys 0..63; the gradient of v under the cotangent w[t] = e_t
is P' of queries 0..63, as the backward applied it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

KEEP_CUDNN_OUT_OF_GRAPHS = "--xla_gpu_enable_command_buffer=-CUDNN"
if "--command_buffers" not in sys.argv and "jax" not in sys.modules:  # before JAX starts
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {KEEP_CUDNN_OUT_OF_GRAPHS}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

B, T, N, H = 4, 128, 4, 64
LENGTHS = (128, 100, 57, 128)


def cudnn_attention(q, k, v, lengths, rate: float, *, seed: int) -> jax.Array:
    """cuDNN's fused attention with dropout `rate`; q/k/v [B, T, N, H] bf16, lengths [B] int32
    token counts of right-padded keys (every query row computed, as jax.nn's cuDNN path)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # JAX's only dropout entry

    return cudnn.dot_product_attention(
        q, k, v,
        q_seqlen=jnp.full((q.shape[0],), q.shape[1], jnp.int32), kv_seqlen=lengths,
        scale=q.shape[-1] ** -0.5, mask_type=cudnn.MaskType.PADDING, seed=seed,
        dropout_rate=rate,
    )  # fmt: skip


def inputs(seed: int = 11) -> dict[str, jax.Array]:
    """q, k [B, T, N, H] bf16 (random), v and w (the one-hot readouts), lengths [B]."""
    kq, kk = jax.random.split(jax.random.key(seed))
    eye = jnp.broadcast_to(jnp.eye(T, H, dtype=jnp.bfloat16)[None, :, None, :], (B, T, N, H))
    return {
        "q": jax.random.normal(kq, (B, T, N, H), jnp.bfloat16),
        "k": jax.random.normal(kk, (B, T, N, H), jnp.bfloat16),
        "v": eye,
        "w": eye,
        "lengths": jnp.asarray(LENGTHS, jnp.int32),
    }


def attention(x: dict, rate: float, seed: int):
    return lambda v: cudnn_attention(x["q"], x["k"], v, x["lengths"], rate, seed=seed)


def as_bnts(out: jax.Array) -> np.ndarray:
    """Output [.., B, T, N, 64] -> P' [.., B, N, T, 64] (keys 0..63), float32."""
    return np.swapaxes(np.asarray(out, np.float32), -3, -2)


def as_bnts_from_grad(gv: jax.Array) -> np.ndarray:
    """Gradient [.., B, S, N, 64] -> P' [.., B, N, 64, S] (queries 0..63), float32."""
    x = np.swapaxes(np.asarray(gv, np.float32), -3, -2)  # [.., B, N, S, 64]
    return np.swapaxes(x, -1, -2)


def readout(fn, x: dict, stack: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(forward P', backward P') of `fn(v) -> out`, v stacked `stack` times if > 0."""
    v, w = x["v"], x["w"]
    if stack:
        v, w = jnp.stack([v] * stack), jnp.stack([w] * stack)

    @jax.jit
    def run(v):
        out, pullback = jax.vjp(fn, v)
        return out, pullback(w)[0]

    out, gv = run(v)
    return as_bnts(out), as_bnts_from_grad(gv)


def agreement(fwd: np.ndarray, bwd: np.ndarray, real: np.ndarray) -> float:
    """Share of the overlapping real entries (queries and keys 0..63) where the forward's and
    the backward's masks agree: 1.0 when they are the same mask, ~0.82 for independent ones."""
    overlap = real[..., :64, :]
    return float(((fwd[..., :64, :] == 0) == (bwd[..., :64] == 0))[overlap].mean())


def differ(a: np.ndarray, b: np.ndarray, real: np.ndarray) -> float:
    """Share of the real entries where two forward masks differ (0 = the same mask)."""
    return float(((a == 0) != (b == 0))[real].mean())


def facts(rate: float = 0.1) -> dict[str, Any]:
    """Every measured fact of the module docstring, as a dict."""
    x = inputs()
    plain = as_bnts(jax.jit(attention(x, 0.0, 1))(x["v"]))
    real = plain > 0
    fwd, bwd = readout(attention(x, rate, 1), x)
    kept = (fwd > 0) & real
    out: dict[str, Any] = {
        "jax": jax.__version__,
        "device": jax.devices()[0].device_kind,
        "drop_rate": float(((fwd == 0) & real).sum() / real.sum()),
        "kept_scale_median": float(np.median(fwd[kept] / plain[kept])),
        "kept_scale_worst_error": float(np.abs(fwd[kept] / plain[kept] * (1 - rate) - 1).max()),
        "padded_keys_zero": bool(np.all(fwd[2, :, :, LENGTHS[2] :] == 0)),
        "backward_uses_forward_mask": agreement(fwd, bwd, real),
    }
    again, _ = readout(attention(x, rate, 1), x)
    out["second_execution_differs"] = differ(fwd, again, real)
    twice = jax.jit(lambda v: (attention(x, rate, 1)(v), attention(x, rate, 1)(v)))(x["v"])
    out["same_seed_two_calls_differ"] = differ(as_bnts(twice[0]), as_bnts(twice[1]), real)
    other = jax.jit(lambda v: (attention(x, rate, 1)(v), attention(x, rate, 2)(v)))(x["v"])
    out["other_seed_differs"] = differ(as_bnts(other[0]), as_bnts(other[1]), real)
    f_rm, b_rm = readout(jax.checkpoint(attention(x, rate, 1)), x)
    out["remat_backward_uses_forward_mask"] = agreement(f_rm, b_rm, real)

    def scanned(vs):
        return jax.lax.scan(lambda c, v: (c, attention(x, rate, 1)(v)), 0, vs)[1]

    f_sc, b_sc = readout(scanned, x, stack=2)
    out["scan_backward_uses_forward_mask"] = [agreement(f_sc[i], b_sc[i], real) for i in range(2)]
    out["scan_steps_differ"] = differ(f_sc[0], f_sc[1], real)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--command_buffers", action="store_true", help="leave cuDNN in CUDA graphs")
    args = p.parse_args(argv)
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"cuDNN attention needs an NVIDIA GPU; JAX runs on {jax.default_backend()}"
        )
    result = {**facts(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
