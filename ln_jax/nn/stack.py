"""Stacks of layers: the encoder and the decoder, scanned or as a list, with DLCL and remat.

`Stack(cfg, layer=EncoderLayer | DecoderLayer, depth=...)` holds `cfg.num_layers` layers, each
built with its placement rule (`cfg.layer_rule(i)`), plus the final norm the placement needs.
`Encoder` and `Decoder` are its two forms. Inputs a layer's branches read (the padding mask,
an encoder output) are passed through to every layer.

Decoding: `init_decoding(decoder, batch, max_length, memory, memory_mask)` gives every
attention branch its cache (the cross-attention keys/values computed once here), after which
`decoder(tokens [batch, t, embed])` runs the next t positions; `end_decoding` goes back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.nn import flash
from ln_jax.nn.attention import Attention
from ln_jax.nn.blocks import DecoderLayer, EncoderLayer, Layer, Record, StackDepth, make_norm
from ln_jax.nn.layers import split_key
from ln_jax.nn.spec import StackConfig

Array = jax.Array

# cuDNN's fused attention forward (jax.nn's `attention_impl="cudnn"`): its output and softmax
# statistics are made inside jax.nn's own VJP, where no checkpoint name reaches them.
CUDNN_ATTENTION_FORWARD = ("dot_product_attention_fwd", "dot_product_attention_fwd_wrapper")


def _save_cudnn_attention(prim: Any, *_: Any, **__: Any) -> bool:
    """A remat policy saving what cuDNN's attention forward computes (without it "dots" ran
    that forward again in the backward: BERT-base compiled for an H200, 24 -> 36 attention
    kernels a step)."""
    return prim.name in CUDNN_ATTENTION_FORWARD


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    # the projections' outputs and the attention's (`flash.RESIDUALS`, cuDNN's forward);
    # not the probabilities
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, _save_cudnn_attention
        ),
        jax.checkpoint_policies.save_only_these_names(flash.RESIDUALS),
    ),
}


def _layer_fn(cfg: StackConfig, inputs: dict, record: bool, decoding: bool) -> Any:
    """(layer, x, key, depth) -> (y, rec), rematerialised in the backward pass if configured
    (not while decoding); depth is the layer's 1-based index."""

    def apply(layer: Layer, x: Array, key: Array | None, depth: Array | int):
        return layer(x, dropout_key=key, record=record, depth=depth, **inputs)

    if cfg.remat == "none" or decoding:
        return apply
    return nnx.remat(apply, policy=_REMAT_POLICIES[cfg.remat])


class Stack(nnx.Module):
    """A stack of `cfg.num_layers` layers of class `layer`, plus a final norm when the
    placement needs one.

    With `cfg.scan_layers` the layers' parameters are stacked along a leading `layers` axis
    ([num_layers, ...]) and applied with `lax.scan` (one compiled layer body); otherwise they are
    a list. Either way `layer_state(stack, i)` gives layer i's parameters. `depth` places the
    stack in its model for Admin's closed form and DeepNorm (default: encoder only).
    """

    def __init__(
        self,
        cfg: StackConfig,
        *,
        rngs: nnx.Rngs,
        layer: type[Layer] = EncoderLayer,
        depth: StackDepth | None = None,
    ):
        self.cfg = cfg
        self.decoding = False
        if cfg.scan_layers:
            self.layers = _stacked_layers(cfg, layer, depth, rngs)
        else:
            rules = [cfg.layer_rule(i) for i in range(cfg.num_layers)]
            self.layers = nnx.List([layer(cfg, r, rngs=rngs, depth=depth) for r in rules])
        self.final_norm = make_norm(cfg, kind=cfg.rule.norm_kind) if cfg.rule.final_norm else None
        self.dlcl = DynamicCombination(cfg) if cfg.dlcl else None

    def __call__(
        self,
        x: Array,
        *,
        dropout_key: Array | None = None,
        record: bool = False,
        **inputs: Any,
    ) -> tuple[Array, Record]:
        """x: [batch, length, embed] -> (y [batch, length, embed], intermediates).

        `inputs` go to every layer (`mask` [batch, length]; a decoder's `memory` [batch, src,
        embed] and `memory_mask` [batch, src]). Intermediates (when `record`): each layer's
        records stacked to [num_layers, batch, length, embed] under "<sub-layer>/...", and
        `layer_in`; plus `final_norm_in` / `final_norm_out` if there is a final norm.
        """
        fn = _layer_fn(self.cfg, inputs, record, self.decoding)
        if self.cfg.scan_layers:
            y, rec = _scan_layers(fn, self.layers, x, dropout_key, self.cfg)
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


class Encoder(Stack):
    """The encoder: `cfg.num_layers` [self-attention, feed-forward] layers."""

    def __init__(self, cfg: StackConfig, *, rngs: nnx.Rngs, depth: StackDepth | None = None):
        super().__init__(cfg, rngs=rngs, layer=EncoderLayer, depth=depth)


class Decoder(Stack):
    """The decoder: `cfg.num_layers` [causal self-attention, cross-attention, feed-forward]
    layers; called with `memory` and `memory_mask` (or, decoding, after `init_decoding`)."""

    def __init__(self, cfg: StackConfig, *, rngs: nnx.Rngs, depth: StackDepth | None = None):
        depth = depth or StackDepth.of("decoder", 0, cfg.num_layers)
        super().__init__(cfg, rngs=rngs, layer=DecoderLayer, depth=depth)


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

    def __init__(self, cfg: StackConfig):
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
    fn: Any, layers: Layer, x: Array, key: Array | None, cfg: StackConfig
) -> tuple[Array, Record]:
    """The stacked layers over x, `cfg.scan_unroll` per iteration (all: straight-line code)."""
    num_layers = cfg.num_layers
    meta = {nnx.PARTITION_NAME: "layers"}
    keys = None if key is None else jax.random.split(key, num_layers)
    depths = jnp.arange(1, num_layers + 1)  # scanned data: each layer's 1-based index

    @nnx.scan(
        in_axes=(nnx.Carry, 0, 0 if keys is not None else None, 0),
        out_axes=(nnx.Carry, 0),
        transform_metadata=meta,
        unroll=min(int(cfg.scan_unroll), num_layers),
    )
    def body(h: Array, layer: Layer, layer_key: Array | None, depth: Array) -> tuple[Array, Record]:
        y, rec = fn(layer, h, layer_key, depth)
        return y, {"layer_in": h, **rec}

    return body(x, layers, keys, depths)


def _stacked_layers(
    cfg: StackConfig, layer: type[Layer], depth: StackDepth | None, rngs: nnx.Rngs
) -> Layer:
    """`num_layers` layers whose parameters are stacked on a leading "layers" axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(layer_rngs: nnx.Rngs) -> Layer:
        return layer(cfg, cfg.rule, rngs=layer_rngs, depth=depth)

    return create(rngs)


def layer_module(stack: Stack, index: int) -> Layer:
    """Layer `index` as a module (for scanned layers: a copy holding that layer's slice)."""
    if not stack.cfg.scan_layers:
        return stack.layers[index]
    graphdef, state = nnx.split(stack.layers)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[index], state))


def layer_state(stack: Stack, index: int) -> nnx.State:
    """Layer `index`'s parameters as an nnx.State, whether the layers are scanned or a list."""
    if not stack.cfg.scan_layers:
        return nnx.state(stack.layers[index], nnx.Param)
    stacked = nnx.state(stack.layers, nnx.Param)
    return jax.tree.map(lambda a: a[index], stacked)


def relayout(arrays: dict[tuple, Any], wanted: list[tuple]) -> dict[tuple, Any]:
    """A model's parameters ({path: array}, as `nnx.to_flat_state` names them) in the layers'
    layout of `wanted` (the paths of the model to fill): where `wanted` has a stack's layers
    as a list, (..., "layers", i, ...), and `arrays` has them stacked, (..., "layers", ...)
    [num_layers, ...], each layer's slice; where the other way round, the layers stacked. A
    path in both layouts passes as it is; a path found in neither is left out (the caller
    names it). Arrays come back on the host (numpy) where they were sliced or stacked."""
    out = {}
    for path in wanted:
        if path in arrays:
            out[path] = arrays[path]
        elif "layers" in path:
            at = path.index("layers") + 1
            if at < len(path) and isinstance(path[at], int):  # a list from a stacked array
                stacked = arrays.get(path[:at] + path[at + 1 :])
                if stacked is not None:
                    out[path] = np.asarray(jax.device_get(stacked))[path[at]]
                continue
            layers = []  # stacked from a list
            while (one := path[:at] + (len(layers),) + path[at:]) in arrays:
                layers.append(np.asarray(jax.device_get(arrays[one])))
            if layers:
                out[path] = np.stack(layers)
    return out


@dataclasses.dataclass(frozen=True)
class StackView:
    """A model's stack as Admin, the monitor and the analyses see it: the one view of its
    sub-layers, from the config alone (the monitor reads parameter-shaped trees, no model).

    Attributes:
      path: where the stack's layers sit in the model's parameter tree (e.g. ("bert",
        "encoder", "layers")); a list of layers or one scanned layer ([num_layers, ...] leaves).
        `path[:-1]` leads to the `Stack` module (`module`), whose attribute name `path[-2]`
        keys its records in `Stacked.stack_records`.
      num_layers: layers in the stack.
      sublayers: the names of a layer's residual sub-layers, in order (`Layer.names`).
      deepnorm_alpha: DeepNorm's skip scale, if a layer's rule has one (the monitor logs it).
      name: the stack's part in measure names ("" for a model of one stack; e.g. "decoder":
        grad_norm/layer_03/decoder/ffn).
    """

    path: tuple[str, ...]
    num_layers: int
    sublayers: tuple[str, ...]
    deepnorm_alpha: float | None = None
    name: str = ""

    @classmethod
    def of(
        cls,
        cfg: StackConfig,
        layer: type[Layer],
        path: tuple[str, ...],
        name: str = "",
        depth: StackDepth | None = None,
    ) -> StackView:
        """The view of a stack of `cfg.num_layers` layers of class `layer` at `path`;
        `deepnorm_alpha` is `depth`'s alpha where a layer's rule has the alpha skip."""
        rules = [cfg.layer_rule(i) for i in range(cfg.num_layers)]
        alpha = depth.alpha if depth and any(r.skip == "alpha" for r in rules) else None
        return cls(path, cfg.num_layers, layer.names, alpha, name)

    @property
    def attribute(self) -> str:
        """The stack's attribute name in its parent module ("encoder", "decoder")."""
        return self.path[-2]

    @property
    def num_sublayers(self) -> int:
        """Residual sub-layers in the stack: layers x the layer's sub-layer names."""
        return self.num_layers * len(self.sublayers)

    def module(self, model: nnx.Module) -> Stack:
        """The `Stack` this view describes in `model`."""
        node = model
        for part in self.path[:-1]:
            node = getattr(node, part)
        return node

    def key(self, measure: str, part: str = "") -> str:
        """The stats key of a measure: "<measure>[/<stack name>][/<part>]" (the monitor's
        `named` puts the layer after the measure)."""
        return "/".join(filter(None, (measure, self.name, part)))


@runtime_checkable
class Stacked(Protocol):
    """A model whose placement set-up (Admin's profiling), monitor and analyses see its
    stacks: BERT's models, the translation model, the analyses' theory model. `cfg` is the
    StackConfig the placement is read from."""

    cfg: Any

    def stack_views(self) -> list[StackView]:
        """Its stacks in the order a signal goes through them (encoder, then decoder)."""

    def stack_records(self, batch: dict, dropout_key: Array | None) -> dict[str, Record]:
        """Each stack's records (`Stack.__call__` with record=True) of one forward pass on
        `batch` (dropout_key None: deterministic), by `StackView.attribute`. A stack's
        records may also hold "embeddings", the stack's input [batch, length, embed]."""


def stacks(model: Stacked) -> list[tuple[StackView, Stack]]:
    """(view, stack module) of each of the model's stacks, in order."""
    return [(view, view.module(model)) for view in model.stack_views()]


def stack_output(rec: Record, view: StackView) -> Array:
    """A stack's output [batch, length, embed] from its records: the final norm's, else the
    last sub-layer's output in the last layer."""
    if "final_norm_out" in rec:
        return rec["final_norm_out"]
    return rec[f"{view.sublayers[-1]}/output"][-1]


def model_sublayers(model: Stacked) -> list[tuple[str, Any]]:
    """Every residual sub-layer of the model in order, as ("[stack/]layer_NN/<name>",
    sub-layer), the stack named as in the monitor's names; scanned layers give copies holding
    their slice (read them, do not train them)."""
    out = []
    for view, stack in stacks(model):
        width = max(2, len(str(view.num_layers - 1)))
        prefix = f"{view.name}/" if view.name else ""
        for i in range(view.num_layers):
            for name, sublayer in layer_module(stack, i).sublayers():
                out.append((f"{prefix}layer_{i:0{width}d}/{name}", sublayer))
    return out


# --------------------------------------------------------------------------- decoding


def _attentions(layer: Layer) -> list[Attention]:
    """The attention branches of a layer, in sub-layer order."""
    return [s.branch for _, s in layer.sublayers() if isinstance(s.branch, Attention)]


def init_decoding(
    stack: Stack, batch: int, max_length: int, memory: Array, memory_mask: Array | None = None
) -> None:
    """Puts a decoder in decoding form: empty self-attention caches for `max_length` target
    positions and the cross-attention keys/values of memory [batch, src, embed] (memory_mask
    [batch, src]), computed here once for every layer."""

    def caches(layer: Layer) -> list:
        return [
            a.decoding_cache(memory, memory_mask, batch=batch, max_length=max_length)
            for a in _attentions(layer)
        ]

    if stack.cfg.scan_layers:  # every layer's caches at once, stacked on a leading axis
        per_layer = nnx.vmap(caches, in_axes=0, out_axes=0)(stack.layers)
        for attention, cache in zip(_attentions(stack.layers), per_layer, strict=True):
            attention.set_cache(cache)
    else:
        for layer in stack.layers:
            for attention, cache in zip(_attentions(layer), caches(layer), strict=True):
                attention.set_cache(cache)
    stack.decoding = True


def end_decoding(stack: Stack) -> None:
    """Back to training form (drops every cache)."""
    layers = [stack.layers] if stack.cfg.scan_layers else list(stack.layers)
    for layer in layers:
        for attention in _attentions(layer):
            attention.set_cache(None)
    stack.decoding = False
