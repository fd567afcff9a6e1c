"""The residual sub-layer — the one place where LayerNorm placement is decided — and the encoder.

`ResidualSublayer` wraps a branch F (self-attention or feed-forward) and interprets the
`PlacementRule` of the configured placement; every placement shares every other line of code.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.config import ModelConfig
from ln_jax.nn.init import admin_closed_form, deepnorm_alpha, deepnorm_beta
from ln_jax.nn.layers import DyT, FeedForward, LayerNorm, RMSNorm, SelfAttention, dropout, split_key
from ln_jax.nn.placements import PlacementRule
from ln_jax.sharding import constrain

Array = jax.Array
Record = dict[str, Array]
ACT = ("act_batch", "act_length", "act_embed")


Norm = LayerNorm | RMSNorm | DyT


def make_norm(cfg: ModelConfig, out_dtype: Any = None, kind: str = "model") -> Norm:
    """The encoder's normaliser, output in `out_dtype` (None = compute dtype): `cfg.norm`, or
    DyT where the rule's `norm_kind` says "dyt"."""
    if kind == "dyt":
        return DyT(cfg.hidden_size, cfg, out_dtype=out_dtype)
    return (RMSNorm if cfg.norm == "rmsnorm" else LayerNorm)(
        cfg.hidden_size, cfg, out_dtype=out_dtype
    )


# DeepNet scales these branch projections by beta at initialisation (not query and key).
DEEPNORM_SCALED = ("value", "out", "wi", "wo")


def _scale_init(branch: nnx.Module, beta: float) -> None:
    for name in DEEPNORM_SCALED:
        dense = getattr(branch, name, None)
        if dense is not None:
            dense.kernel[...] = dense.kernel[...] * beta


def _admin_omega(cfg: ModelConfig) -> nnx.Param:
    """Admin's omega [embed]: 1 until profiled, or the closed form."""
    value = admin_closed_form(cfg.num_sublayers) if cfg.admin_omega == "closed_form" else 1.0
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
    residual add (as in BERT).
    """

    def __init__(self, branch: nnx.Module, cfg: ModelConfig, rule: PlacementRule):
        self.branch = branch
        kind = rule.norm_kind
        self.pre_norm = make_norm(cfg, kind=kind) if rule.pre_norm else None
        self.branch_norm = make_norm(cfg, kind=kind) if rule.branch_norm else None
        # Post-LN's norm output is the residual stream.
        self.post_norm = make_norm(cfg, cfg.residual_dtype, kind) if rule.post_norm else None
        self.omega = _admin_omega(cfg) if rule.skip == "omega" else None
        self.gate = nnx.Param(jnp.zeros((1,)), out_sharding=(None,)) if rule.branch_gate else None
        self.alpha = deepnorm_alpha(cfg.num_layers) if rule.skip == "alpha" else 1.0
        if rule.init_scale == "deepnorm_beta":
            _scale_init(branch, deepnorm_beta(cfg.num_layers))
        self.pre_norm_scale = rule.pre_norm_scale
        self.dropout_rate = cfg.hidden_dropout
        self.residual_dtype = cfg.residual_dtype

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        dropout_key: Array | None = None,
        record: bool = False,
        depth: Array | int = 1,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y [batch, length, embed], intermediates).

        `depth` is the 1-based index of the layer (a traced int under scan_layers); only a rule
        with a `pre_norm_scale` reads it.

        y is in the residual dtype (`ModelConfig.residual_dtype`): with a float32 residual the
        branch computes in the compute dtype and its output is added to the float32 sum.

        The intermediates (only when `record`) are, each [batch, length, embed]: `branch_out`
        (F's output), `<norm>_in` / `<norm>_out` for each of `pre_norm`, `branch_norm`,
        `post_norm` that the rule uses (`pre_norm_out` is what the branch reads: LN(x) /
        sqrt(depth) under "inv_sqrt_depth"), and `output`.
        """
        rec: Record = {}
        branch_key, drop_key = split_key(dropout_key, 2)
        h = self._norm("pre_norm", x, rec, self._pre_scale(depth))
        f = self.branch(h, mask=mask, dropout_key=branch_key)
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


class EncoderLayer(nnx.Module):
    """A Transformer encoder layer: self-attention sub-layer, then feed-forward sub-layer."""

    def __init__(self, cfg: ModelConfig, rule: PlacementRule, *, rngs: nnx.Rngs):
        self.attention = ResidualSublayer(SelfAttention(cfg, rngs=rngs), cfg, rule)
        self.ffn = ResidualSublayer(FeedForward(cfg, rngs=rngs), cfg, rule)

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        dropout_key: Array | None = None,
        record: bool = False,
        depth: Array | int = 1,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y, {"attention/..." and "ffn/..." records}); `depth`
        is the layer's 1-based index (see `ResidualSublayer`)."""
        k_att, k_ffn = split_key(dropout_key, 2)
        kw = dict(mask=mask, record=record, depth=depth)
        h, rec_att = self.attention(x, dropout_key=k_att, **kw)
        y, rec_ffn = self.ffn(h, dropout_key=k_ffn, **kw)
        rec = {f"attention/{k}": v for k, v in rec_att.items()}
        rec.update({f"ffn/{k}": v for k, v in rec_ffn.items()})
        return y, rec


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _layer_fn(cfg: ModelConfig, mask: Array | None, record: bool) -> Any:
    """(layer, x, key, depth) -> (y, rec), rematerialised in the backward pass if configured;
    depth is the layer's 1-based index."""

    def apply(
        layer: EncoderLayer, x: Array, key: Array | None, depth: Array | int
    ) -> tuple[Array, Record]:
        return layer(x, mask=mask, dropout_key=key, record=record, depth=depth)

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
            layers = [
                EncoderLayer(cfg, cfg.layer_rule(i), rngs=rngs) for i in range(cfg.num_layers)
            ]
            self.layers = nnx.List(layers)
        self.final_norm = make_norm(cfg, kind=cfg.rule.norm_kind) if cfg.rule.final_norm else None
        self.dlcl = DynamicCombination(cfg) if cfg.dlcl else None

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
        elif self.dlcl is not None:
            y, rec = _dlcl_layers(fn, self.layers, self.dlcl, x, dropout_key)
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
    for i, (layer, layer_key) in enumerate(zip(layers, split_key(key, len(layers)), strict=True)):
        layer_in = x
        x, rec = fn(layer, x, layer_key, i + 1)
        records.append({"layer_in": layer_in, **rec})
    return x, _stack_records(records)


def _stack_records(records: list[Record]) -> Record:
    """Per-layer records -> [num_layers, ...] arrays; NaN for layers without that record.

    Layers differ in their records only under a per-layer placement (e.g. "post*3,pre*9").
    """
    keys = dict.fromkeys(k for r in records for k in r)
    out = {}
    for k in keys:
        like = next(r[k] for r in records if k in r)
        out[k] = jnp.stack([r.get(k, jnp.full_like(like, jnp.nan)) for r in records])
    return out


class DynamicCombination(nnx.Module):
    """DLCL (Wang et al. 2019) for Pre-LN: layer l's input is sum_k<=l W[l, k] LN_k(y_k).

    y_0 is the embedding output and y_k the output of layer k-1; each y_k gets its own norm.
    W [num_layers, num_layers] is lower triangular (entries above the diagonal are masked out),
    initialised to averages, W[l, k] = 1/(l+1). The last layer's output goes to the final norm.
    """

    def __init__(self, cfg: ModelConfig):
        n = cfg.num_layers
        rows = jnp.tril(jnp.ones((n, n)))
        self.weights = nnx.Param(
            rows / rows.sum(1, keepdims=True), out_sharding=("dlcl_to", "dlcl_from")
        )
        self.norms = nnx.List([make_norm(cfg) for _ in range(n)])

    def __call__(self, history: list[Array], index: int) -> Array:
        """history: the normalised y_0..y_index, each [batch, length, embed] -> layer input."""
        w = self.weights[...][index, : index + 1].astype(history[0].dtype)
        return sum(w[k] * h for k, h in enumerate(history))


def _dlcl_layers(
    fn: Any, layers: Any, combine: DynamicCombination, x: Array, key: Array | None
) -> tuple[Array, Record]:
    records, history = [], []
    for i, (layer, layer_key) in enumerate(zip(layers, split_key(key, len(layers)), strict=True)):
        history.append(combine.norms[i](x))
        layer_in = combine(history, i)
        x, rec = fn(layer, layer_in, layer_key, i + 1)
        records.append({"layer_in": layer_in, **rec})
    return x, _stack_records(records)


def _scan_layers(
    fn: Any, layers: EncoderLayer, x: Array, key: Array | None, num_layers: int
) -> tuple[Array, Record]:
    meta = {nnx.PARTITION_NAME: "layers"}
    keys = None if key is None else jax.random.split(key, num_layers)
    depths = jnp.arange(1, num_layers + 1)  # scanned data: each layer's 1-based index

    @nnx.scan(
        in_axes=(nnx.Carry, 0, 0 if keys is not None else None, 0),
        out_axes=(nnx.Carry, 0),
        transform_metadata=meta,
    )
    def body(
        h: Array, layer: EncoderLayer, layer_key: Array | None, depth: Array
    ) -> tuple[Array, Record]:
        y, rec = fn(layer, h, layer_key, depth)
        return y, {"layer_in": h, **rec}

    return body(x, layers, keys, depths)


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> EncoderLayer:
    """`num_layers` EncoderLayers whose parameters are stacked on a leading "layers" axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(layer_rngs: nnx.Rngs) -> EncoderLayer:
        return EncoderLayer(cfg, cfg.rule, rngs=layer_rngs)

    return create(rngs)


def layer_module(encoder: Encoder, index: int) -> EncoderLayer:
    """Layer `index` as a module (for scanned layers: a copy holding that layer's slice)."""
    if not encoder.cfg.scan_layers:
        return encoder.layers[index]
    graphdef, state = nnx.split(encoder.layers)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[index], state))


def layer_state(encoder: Encoder, index: int) -> nnx.State:
    """Layer `index`'s parameters as an nnx.State, whether the layers are scanned or a list."""
    if not encoder.cfg.scan_layers:
        return nnx.state(encoder.layers[index], nnx.Param)
    stacked = nnx.state(encoder.layers, nnx.Param)
    return jax.tree.map(lambda a: a[index], stacked)
