"""The residual sub-layer — the one place where LayerNorm placement is decided — and layers as
lists of sub-layers.

`ResidualSublayer` wraps a branch F (an attention or the feed-forward) and interprets the
`PlacementRule` of the configured placement; every placement shares every other line of code.
A `Layer` is a list of named residual sub-layers applied in order: the encoder's is
[self-attention, feed-forward], the decoder's [causal self-attention, cross-attention,
feed-forward]. Each branch declares the inputs it reads (`branch.reads`: the padding mask, an
encoder output and its mask), and the layer hands it those; decoding caches live in the
attention branches (`ln_jax.nn.attention`). Stacks of layers: `ln_jax.nn.stack`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.nn.attention import Attention
from ln_jax.nn.init import admin_closed_form, deepnorm_constants
from ln_jax.nn.layers import FeedForward, dropout, split_key
from ln_jax.nn.norms import DyT, LayerNorm, RMSNorm
from ln_jax.nn.placements import PlacementRule
from ln_jax.nn.spec import StackConfig
from ln_jax.sharding import ACT, constrain

Array = jax.Array
Record = dict[str, Array]


Norm = LayerNorm | RMSNorm | DyT


def make_norm(cfg: StackConfig, out_dtype: Any = None, kind: str = "model") -> Norm:
    """The stack's normaliser, output in `out_dtype` (None = compute dtype): `cfg.norm`, or
    DyT where the rule's `norm_kind` says "dyt"."""
    dtype = out_dtype or cfg.compute_dtype
    if kind == "dyt":
        return DyT(cfg.hidden_size, dtype=dtype)
    norm = RMSNorm if cfg.norm == "rmsnorm" else LayerNorm
    return norm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype)


# DeepNet scales these branch projections by beta at initialisation (not query and key).
DEEPNORM_SCALED = ("value", "out", "wi", "wo")


def _scale_init(branch: nnx.Module, beta: float) -> None:
    for name in DEEPNORM_SCALED:
        dense = getattr(branch, name, None)
        if dense is not None:
            dense.kernel[...] = dense.kernel[...] * beta


@dataclasses.dataclass(frozen=True)
class StackDepth:
    """What a sub-layer's initialisation knows of its stack's depth.

    Attributes:
      sublayers: residual sub-layers in the stack (Admin's closed-form N; Liu et al. count each
        stack's own: its layers x the layer's sub-layer names, `Layer.names`: 2 per encoder
        layer, 3 per decoder layer).
      alpha, beta: DeepNet's skip scale and init scale for the stack
        (`ln_jax.nn.init.deepnorm_constants`: encoder-only or the encoder-decoder formulas).
    """

    sublayers: int
    alpha: float
    beta: float

    @classmethod
    def of(cls, stack: str, encoder_layers: int, decoder_layers: int = 0) -> StackDepth:
        """The depth of "encoder" or "decoder" in a model of N encoder and M decoder layers
        (M = 0: encoder only)."""
        alpha, beta = deepnorm_constants(encoder_layers, decoder_layers)[stack]
        if stack == "encoder":
            return cls(encoder_layers * len(EncoderLayer.names), alpha, beta)
        return cls(decoder_layers * len(DecoderLayer.names), alpha, beta)


def _admin_omega(cfg: StackConfig, depth: StackDepth) -> nnx.Param:
    """Admin's omega [embed]: 1 until profiled, or the closed form."""
    value = admin_closed_form(depth.sublayers) if cfg.admin_omega == "closed_form" else 1.0
    return nnx.Param(jnp.full((cfg.hidden_size,), value), out_sharding=("embed",))


class ResidualSublayer(nnx.Module):
    """One residual sub-layer `x -> y` around a branch F, normalised as its rule says.

    With rule `post`: y = LN(x + F(x)); `pre`: y = x + F(LN(x)); `admin`: y = LN(x * omega +
    F(x)) with omega [embed] learned; `deepnorm`: y = LN(alpha x + F(x)) with beta-scaled
    branch weights (`deepnorm_alpha`: the alpha skip only; `deepnorm_beta`: Post-LN with only
    the beta-scaled init); `sandwich`: y = x + LN(F(LN(x))); `rezero`: y = x + gate * F(x)
    with a learned scalar gate starting at 0; `olmo2`: y = x + LN(F(x)); `lns`: y = x +
    F(LN(x) / sqrt(depth)); `dyt`: Pre-LN with DyT for LN. See `PlacementRule` for the general
    order of operations. The hidden dropout is applied to the branch output just before the
    residual add (as in BERT). `depth` gives Admin's closed form and DeepNorm's constants their
    stack (default: an encoder of `cfg.num_layers` layers).
    """

    def __init__(
        self,
        branch: nnx.Module,
        cfg: StackConfig,
        rule: PlacementRule,
        depth: StackDepth | None = None,
    ):
        depth = depth or StackDepth.of("encoder", cfg.num_layers)
        self.branch = branch
        kind = rule.norm_kind
        self.pre_norm = make_norm(cfg, kind=kind) if rule.pre_norm else None
        self.branch_norm = make_norm(cfg, kind=kind) if rule.branch_norm else None
        # Post-LN's norm output is the residual stream.
        self.post_norm = make_norm(cfg, cfg.residual_dtype, kind) if rule.post_norm else None
        self.omega = _admin_omega(cfg, depth) if rule.skip == "omega" else None
        self.gate = nnx.Param(jnp.zeros((1,)), out_sharding=(None,)) if rule.branch_gate else None
        self.alpha = depth.alpha if rule.skip == "alpha" else 1.0
        if rule.init_scale == "deepnorm_beta":
            _scale_init(branch, depth.beta)
        self.pre_norm_scale = rule.pre_norm_scale
        self.dropout_rate = cfg.hidden_dropout
        self.residual_dtype = cfg.residual_dtype

    def __call__(
        self,
        x: Array,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
        depth: Array | int = 1,
        **inputs: Any,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y [batch, length, embed], intermediates).

        `inputs` are what the layer offers its branches (`mask` [batch, length], `memory`
        [batch, src, embed], `memory_mask` [batch, src]); the branch gets those it `reads`.
        `depth` is the 1-based index of the layer (a traced int under scan_layers); only a rule
        with a `pre_norm_scale` reads it.

        y is in the residual dtype (`StackConfig.residual_dtype`): with a float32 residual the
        branch computes in the compute dtype and its output is added to the float32 sum.

        The intermediates (only when `record`) are, each [batch, length, embed]: `branch_out`
        (F's output), `<norm>_in` / `<norm>_out` for each of `pre_norm`, `branch_norm`,
        `post_norm` that the rule uses (`pre_norm_out` is what the branch reads: LN(x) /
        sqrt(depth) under "inv_sqrt_depth"), and `output`.
        """
        rec: Record = {}
        branch_key, drop_key = split_key(dropout_key, 2)
        h = self._norm("pre_norm", x, rec, self._pre_scale(depth))
        wanted = {k: v for k, v in inputs.items() if k in self.branch.reads}
        f = self.branch(h, dropout_key=branch_key, **wanted)
        rec["branch_out"] = f
        f = self._norm("branch_norm", f, rec)
        if self.gate is not None:
            f = f * self.gate[...].astype(f.dtype)
        y = self._skip(x).astype(self.residual_dtype) + dropout(f, self.dropout_rate, drop_key)
        y = self._norm("post_norm", y, rec).astype(self.residual_dtype)
        rec["output"] = y
        return constrain(y, ACT), (rec if record else {})

    def skip_scale(self) -> Array | float:
        """What the skip path multiplies x by: omega [embed] (learned per channel, Admin), the
        constant alpha (DeepNorm), or 1.0."""
        return self.omega[...] if self.omega is not None else self.alpha

    def norms(self) -> dict[str, Norm]:
        """The norms this sub-layer's rule uses, by position: "pre_norm", "branch_norm",
        "post_norm" (only those present)."""
        names = ("pre_norm", "branch_norm", "post_norm")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def _skip(self, x: Array) -> Array:
        scale = self.skip_scale()
        if isinstance(scale, float):
            return x if scale == 1.0 else x * scale
        return x * scale.astype(x.dtype)

    def _pre_scale(self, depth: Array | int) -> Array | None:
        """What the pre-norm output is multiplied by: 1/sqrt(depth), or None (1)."""
        if self.pre_norm_scale == "none":
            return None
        return jax.lax.rsqrt(jnp.asarray(depth, jnp.float32))

    def _norm(self, name: str, x: Array, rec: Record, scale: Array | None = None) -> Array:
        norm = getattr(self, name)
        if norm is None:
            return x
        y = norm(x)
        if scale is not None:
            y = y * scale.astype(y.dtype)
        rec[f"{name}_in"], rec[f"{name}_out"] = x, y
        return y


class Layer(nnx.Module):
    """A layer: residual sub-layers applied in order, named by `names` (their attributes).

    Subclasses build their sub-layers; `sublayers()` lists them as (name, ResidualSublayer).
    """

    names: tuple[str, ...] = ()

    def sublayers(self) -> list[tuple[str, ResidualSublayer]]:
        return [(name, getattr(self, name)) for name in self.names]

    def __call__(
        self,
        x: Array,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
        depth: Array | int = 1,
        **inputs: Any,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y, {"<sub-layer name>/<record>": ...}); `inputs` go
        to the sub-layers (see `ResidualSublayer`), `depth` is the layer's 1-based index."""
        rec: Record = {}
        keys = split_key(dropout_key, len(self.names))
        for (name, sublayer), key in zip(self.sublayers(), keys, strict=True):
            x, sub_rec = sublayer(x, dropout_key=key, record=record, depth=depth, **inputs)
            rec.update({f"{name}/{k}": v for k, v in sub_rec.items()})
        return x, rec


class EncoderLayer(Layer):
    """[self-attention, feed-forward], named "attention" and "ffn"."""

    names = ("attention", "ffn")

    def __init__(
        self,
        cfg: StackConfig,
        rule: PlacementRule,
        *,
        rngs: nnx.Rngs,
        depth: StackDepth | None = None,
    ):
        self.attention = ResidualSublayer(Attention(cfg, rngs=rngs), cfg, rule, depth)
        self.ffn = ResidualSublayer(FeedForward(cfg, rngs=rngs), cfg, rule, depth)


class DecoderLayer(Layer):
    """[causal self-attention, cross-attention, feed-forward], named "self_attention",
    "cross_attention", "ffn"; the cross-attention reads `memory` and `memory_mask`."""

    names = ("self_attention", "cross_attention", "ffn")

    def __init__(
        self,
        cfg: StackConfig,
        rule: PlacementRule,
        *,
        rngs: nnx.Rngs,
        depth: StackDepth | None = None,
    ):
        depth = depth or StackDepth.of("decoder", 0, cfg.num_layers)
        causal = Attention(cfg, kind="causal", rngs=rngs)
        self.self_attention = ResidualSublayer(causal, cfg, rule, depth)
        cross = Attention(cfg, kind="cross", rngs=rngs)
        self.cross_attention = ResidualSublayer(cross, cfg, rule, depth)
        self.ffn = ResidualSublayer(FeedForward(cfg, rngs=rngs), cfg, rule, depth)
