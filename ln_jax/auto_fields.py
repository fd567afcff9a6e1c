"""What the config's "auto" fields become on each platform ("cpu", "gpu", "tpu"): the
measured choices, each with the measurement that chose it. `ln_jax.config` resolves them when
a typed config is built (`ModelConfig._resolve_auto`, `TrainConfig`), so config.json records
the resolved values.
"""

from __future__ import annotations

from typing import Any  # the ModelConfig of `auto_attention` (ln_jax.config imports this)


def auto_dtype(on: str) -> str:
    """model.dtype="auto": bfloat16 on an accelerator, float32 on a CPU."""
    return "float32" if on == "cpu" else "bfloat16"


def auto_activation_layout(on: str) -> str:
    """model.activation_layout="auto": "row_major" on a GPU, where XLA otherwise laid the
    residual stream out batch-minor and transposed it around every residual add and LayerNorm
    backward (one H200, BERT-base bf16, same call: 67.8 -> 65.4 ms a step, the profile's
    copies 11.3 -> 0.1 ms; docs/gpu/journal.md, 2026-11-27); XLA's choice elsewhere (TPU:
    unmeasured)."""
    return "row_major" if on == "gpu" else "xla"


def auto_dropout_rng(on: str) -> str:
    """dropout_rng="auto": the fused counter hash "hash" on every platform (`on` is kept for
    the other "auto" fields' form). On an H100 BERT-base 77.0 -> 74.6 ms a step with the
    Pallas attention (docs/gpu/journal.md); on a CPU the translation step against Marian 1.10x ->
    1.21x (docs/translation.md). On a TPU (rbg there until 2026-11-28, the usual advice,
    never measured) libtpu's own compile, read here without a TPU, keeps rbg's uint32 bits
    of every dropout site for the backward: BERT-base at 2 x 128 sequences on a v5e-1 needs
    11.0 GiB with rbg and 9.3 with hash, 256 on a v6e-1 19.0 and 15.3 (docs/tpu.md); a TPU's
    speed with either is unmeasured. Hash bits, like threefry's, are the same on every
    backend and mesh; the studies recorded with threefry pin it (configs/study.py,
    configs/study_mt.py)."""
    del on
    return "hash"


def auto_attention(cfg: Any, on: str) -> str:
    """attention_impl="auto" on a GPU: cuDNN's fused attention where it can run `cfg`
    (`ModelConfig.cudnn_problem`: bf16/fp16, head_dim, no attention dropout); with the
    recipe's attention dropout, bf16/fp16, the Pallas kernel (`ln_jax.nn.flash`: one H100,
    BERT-base, one layer forward + backward 1.08 ms against XLA's 2.00, the step 90.6 -> 77.0
    ms; docs/gpu/journal.md) while this JAX has Pallas's Triton backend; else XLA's. XLA's
    elsewhere."""
    if on != "gpu":
        return "xla"
    if cfg.cudnn_problem() is None:
        return "cudnn"
    half = cfg.dtype in ("bfloat16", "float16")
    if half and cfg.attention_dropout > 0 and _pallas_gpu_problem(cfg) is None:
        return "pallas"
    return "xla"


def _pallas_gpu_problem(cfg: Any) -> str | None:
    """Why the Pallas kernel cannot run `cfg` on a GPU with this JAX (None if it can)."""
    from ln_jax.nn import flash

    return flash.supported_reason(cfg.head_dim) or flash.triton_missing()
