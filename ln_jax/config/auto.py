"""What the config's "auto" fields become on each platform ("cpu", "gpu", "tpu"): the
measured choices, each with the measurement that chose it. `ln_jax.config.run` resolves them when
a typed config is built (`ModelConfig._resolve_auto`, `TrainConfig`), so config.json records
the resolved values.
"""

from __future__ import annotations

from typing import Any  # the ModelConfig of `auto_attention` (ln_jax.config.run imports this)


def auto_dtype(on: str) -> str:
    """model.dtype="auto": bfloat16 on an accelerator, float32 on a CPU."""
    return "float32" if on == "cpu" else "bfloat16"


def auto_activation_layout(on: str) -> str:
    """model.activation_layout="auto": "row_major" on a GPU, where XLA otherwise laid the
    residual stream out batch-minor and transposed it around every residual add and LayerNorm
    backward (one H200, BERT-base bf16, same call: 67.8 -> 65.4 ms a step, the profile's
    copies 11.3 -> 0.1 ms; docs/results/gpu/journal.md, 2026-11-27); XLA's choice elsewhere (TPU:
    unmeasured)."""
    return "row_major" if on == "gpu" else "xla"


def auto_dropout_rng(on: str) -> str:
    """dropout_rng="auto": the fused counter hash "hash" on every platform (`on` is kept for
    the other "auto" fields' form). On an H100 BERT-base 77.0 -> 74.6 ms a step with the
    Pallas attention (docs/results/gpu/journal.md); on a CPU the translation step against Marian
    1.10x -> 1.21x (docs/translation.md). On a TPU (rbg there until 2026-11-28, the usual advice,
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
    ms; docs/results/gpu/journal.md) while this JAX has Pallas's Triton backend; else XLA's. XLA's
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


# --------------------------------------------------------------------------- the layers' layout
#
# model.scan_layers / model.scan_unroll "auto" (issue 67): on a GPU the layers' parameters
# stacked [num_layers, ...] and the scan unrolled into straight-line code, wherever every
# feature of the config works stacked; a list of layers elsewhere. One H200, BERT-base 256 x
# 128, bf16, arms in one process (docs/results/gpu/journal.md, 2026-12-04): 56.2 -> 52.3 ms a step
# blocked, 49.8 -> 49.4 with 5 steps in flight, the host's launch 12.1 -> 7.6 ms. What a
# stacked model cannot have, so "auto" keeps the list for it: a per-layer placement list
# (mixln, "post*3,pre*9": one compiled layer body has one placement) and DLCL (each layer reads
# every earlier layer's output). Per-layer monitor records, Admin's profiling, the HuggingFace
# import/export, fine-tuning from a workdir and beam search work either way
# (tests/test_auto_layout.py). A CPU keeps the list (the stacked float32 step was slower there,
# bench/README.md); a TPU too (unmeasured). A workdir resumes with the layout its run recorded
# (`ln_jax.train.run_identity.keep_recorded_layout`): its checkpoints hold that layout.
LAYOUT_FIELDS = ("scan_layers", "scan_unroll")
AUTO_CHOSEN = "auto_chosen"  # the attribute naming the fields "auto" resolved in a config


def stacking_problem(cfg: Any) -> str | None:
    """Why `cfg`'s layers cannot be stacked (None if they can): the features a stacked model
    lacks."""
    if len(set(cfg.layer_placements)) > 1:
        return "a per-layer placement list"
    if cfg.dlcl:
        return "DLCL"
    return None


def auto_scan_layers(cfg: Any, on: str) -> bool:
    """model.scan_layers="auto": stacked on a GPU unless `stacking_problem(cfg)`; a list on a
    CPU or TPU (the block above)."""
    return on == "gpu" and stacking_problem(cfg) is None


def auto_scan_unroll(scan_layers: bool, num_layers: int) -> int:
    """model.scan_unroll="auto": every layer (straight-line code, the measured arm) when
    stacked; 1 (the only valid value) for a list."""
    return num_layers if scan_layers else 1


def layout_value(name: str, value: Any) -> Any:
    """A layout field's value as the typed config holds it: "auto", a bool (scan_layers) or
    an int (scan_unroll); a command line's text ("true", "12") is parsed.

    Raises:
      ValueError: naming the field and what it takes.
    """
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if name == "scan_layers":
        if isinstance(value, bool | int):
            return bool(value)
        if text in ("true", "false", "1", "0"):
            return text in ("true", "1")
    elif isinstance(value, int) or text.isdigit():
        return int(value)
    kind = "True or False" if name == "scan_layers" else "a number of layers"
    raise ValueError(f"model.{name}={value!r}: give {kind}, or auto.")


def resolve_layout(cfg: Any, on: Any) -> frozenset[str]:
    """Sets `cfg`'s layout fields (a ModelConfig being built) to typed values, "auto" to the
    platform's choice (`on()`, asked only if needed); returns the names "auto" resolved."""
    chosen = set()
    for name in LAYOUT_FIELDS:
        object.__setattr__(cfg, name, layout_value(name, getattr(cfg, name)))
    if cfg.scan_layers == "auto":
        object.__setattr__(cfg, "scan_layers", auto_scan_layers(cfg, on()))
        chosen.add("scan_layers")
    if cfg.scan_unroll == "auto":
        object.__setattr__(cfg, "scan_unroll", auto_scan_unroll(cfg.scan_layers, cfg.num_layers))
        chosen.add("scan_unroll")
    return frozenset(chosen)


def auto_chosen(cfg: Any) -> frozenset[str]:
    """The fields of a typed config that "auto" resolved when it was built (empty for one
    built from resolved values, e.g. a workdir's config.json)."""
    return getattr(cfg, AUTO_CHOSEN, frozenset())
