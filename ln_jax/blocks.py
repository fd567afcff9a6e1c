"""The residual sub-layer — the one place where LayerNorm placement is decided — and the encoder.

`ResidualSublayer` wraps a branch F (self-attention or feed-forward) and interprets the
`PlacementRule` of the configured placement; every placement shares every other line of code.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.config import ModelConfig, PlacementRule
from ln_jax.layers import FeedForward, LayerNorm, SelfAttention, dropout, split_key
from ln_jax.sharding import constrain

Array = jax.Array
Record = dict[str, Array]
ACT = ("act_batch", "act_length", "act_embed")


def make_norm(cfg: ModelConfig) -> LayerNorm:
    return LayerNorm(cfg.hidden_size, cfg)


class ResidualSublayer(nnx.Module):
    """One residual sub-layer `x -> y` around a branch F, normalised as its rule says.

    With rule `post`: y = LN(x + F(x)); with rule `pre`: y = x + F(LN(x)). See `PlacementRule`
    for the general order of operations. The hidden dropout is applied to the branch output just
    before the residual add (as in BERT).
    """

    def __init__(self, branch: nnx.Module, cfg: ModelConfig, rule: PlacementRule):
        self.branch = branch
        self.pre_norm = make_norm(cfg) if rule.pre_norm else None
        self.branch_norm = make_norm(cfg) if rule.branch_norm else None
        self.post_norm = make_norm(cfg) if rule.post_norm else None
        if rule.skip != "identity" or rule.branch_gate:
            raise NotImplementedError(f"skip={rule.skip!r}, branch_gate={rule.branch_gate}")
        self.dropout_rate = cfg.hidden_dropout

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        dropout_key: Array | None = None,
        record: bool = False,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y [batch, length, embed], intermediates).

        The intermediates (only when `record`) are, each [batch, length, embed]: `branch_out`
        (F's output), `<norm>_in` / `<norm>_out` for each of `pre_norm`, `branch_norm`,
        `post_norm` that the rule uses, and `output`.
        """
        rec: Record = {}
        branch_key, drop_key = split_key(dropout_key, 2)
        h = self._norm("pre_norm", x, rec)
        f = self.branch(h, mask=mask, dropout_key=branch_key)
        rec["branch_out"] = f
        f = self._norm("branch_norm", f, rec)
        y = x + dropout(f, self.dropout_rate, drop_key)
        y = self._norm("post_norm", y, rec)
        rec["output"] = y
        return constrain(y, ACT), (rec if record else {})

    def _norm(self, name: str, x: Array, rec: Record) -> Array:
        norm = getattr(self, name)
        if norm is None:
            return x
        y = norm(x)
        rec[f"{name}_in"], rec[f"{name}_out"] = x, y
        return y


class EncoderLayer(nnx.Module):
    """A Transformer encoder layer: self-attention sub-layer, then feed-forward sub-layer."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        rule = cfg.rule
        self.attention = ResidualSublayer(SelfAttention(cfg, rngs=rngs), cfg, rule)
        self.ffn = ResidualSublayer(FeedForward(cfg, rngs=rngs), cfg, rule)

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        dropout_key: Array | None = None,
        record: bool = False,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y, {"attention/..." and "ffn/..." records})."""
        k_att, k_ffn = split_key(dropout_key, 2)
        h, rec_att = self.attention(x, mask=mask, dropout_key=k_att, record=record)
        y, rec_ffn = self.ffn(h, mask=mask, dropout_key=k_ffn, record=record)
        rec = {f"attention/{k}": v for k, v in rec_att.items()}
        rec.update({f"ffn/{k}": v for k, v in rec_ffn.items()})
        return y, rec


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _layer_fn(cfg: ModelConfig, mask: Array | None, record: bool) -> Any:
    """(layer, x, key) -> (y, rec), rematerialised in the backward pass if configured."""

    def apply(layer: EncoderLayer, x: Array, key: Array | None) -> tuple[Array, Record]:
        return layer(x, mask=mask, dropout_key=key, record=record)

    if cfg.remat == "none":
        return apply
    return nnx.remat(apply, policy=_REMAT_POLICIES[cfg.remat])


class Encoder(nnx.Module):
    """A stack of `num_layers` encoder layers, plus a final norm when the placement needs one.

    With `cfg.scan_layers` the layers' parameters are stacked along a leading `layers` axis
    ([num_layers, ...]) and applied with `lax.scan` (one compiled layer body); otherwise they are
    a list. Either way `layer_state(encoder, i)` gives layer i's parameters.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if cfg.scan_layers:
            self.layers = _stacked_layers(cfg, rngs)
        else:
            self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = make_norm(cfg) if cfg.rule.final_norm else None

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        dropout_key: Array | None = None,
        record: bool = False,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y [batch, length, embed], intermediates).

        Intermediates (when `record`): each layer's records stacked to
        [num_layers, batch, length, embed] under `attention/...`, `ffn/...`, and `layer_in`;
        plus `final_norm_in` / `final_norm_out` [batch, length, embed] if there is a final norm.
        """
        fn = _layer_fn(self.cfg, mask, record)
        if self.cfg.scan_layers:
            y, rec = _scan_layers(fn, self.layers, x, dropout_key, self.cfg.num_layers)
        else:
            y, rec = _loop_layers(fn, self.layers, x, dropout_key)
        if not record:
            rec = {}
        if self.final_norm is not None:
            out = self.final_norm(y)
            if record:
                rec["final_norm_in"], rec["final_norm_out"] = y, out
            y = out
        return y, rec


def _loop_layers(fn: Any, layers: Any, x: Array, key: Array | None) -> tuple[Array, Record]:
    records = []
    for layer, layer_key in zip(layers, split_key(key, len(layers)), strict=True):
        layer_in = x
        x, rec = fn(layer, x, layer_key)
        records.append({"layer_in": layer_in, **rec})
    stacked = {k: jnp.stack([r[k] for r in records]) for k in records[0]}
    return x, stacked


def _scan_layers(
    fn: Any, layers: EncoderLayer, x: Array, key: Array | None, num_layers: int
) -> tuple[Array, Record]:
    meta = {nnx.PARTITION_NAME: "layers"}
    keys = None if key is None else jax.random.split(key, num_layers)

    @nnx.scan(
        in_axes=(nnx.Carry, 0, 0 if keys is not None else None),
        out_axes=(nnx.Carry, 0),
        transform_metadata=meta,
    )
    def body(h: Array, layer: EncoderLayer, layer_key: Array | None) -> tuple[Array, Record]:
        y, rec = fn(layer, h, layer_key)
        return y, {"layer_in": h, **rec}

    return body(x, layers, keys)


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> EncoderLayer:
    """`num_layers` EncoderLayers whose parameters are stacked on a leading "layers" axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(layer_rngs: nnx.Rngs) -> EncoderLayer:
        return EncoderLayer(cfg, rngs=layer_rngs)

    return create(rngs)


def layer_state(encoder: Encoder, index: int) -> nnx.State:
    """Layer `index`'s parameters as an nnx.State, whether the layers are scanned or a list."""
    if not encoder.cfg.scan_layers:
        return nnx.state(encoder.layers[index], nnx.Param)
    stacked = nnx.state(encoder.layers, nnx.Param)
    return jax.tree.map(lambda a: a[index], stacked)
