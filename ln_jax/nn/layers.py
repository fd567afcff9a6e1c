"""Building blocks: dense layers, LayerNorm, embeddings, self-attention, feed-forward.

Every parameter is float32 and carries logical axis names (see `ln_jax.sharding`); computation
casts parameters to the configured compute dtype, while LayerNorm statistics and the attention
softmax stay in float32. Dropout takes an explicit PRNG key (None = deterministic), so a training
step's randomness is a pure function of its key.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.config import ModelConfig
from ln_jax.nn import flash
from ln_jax.nn.init import dense_init
from ln_jax.sharding import constrain

Array = jax.Array


def dropout(x: Array, rate: float, key: Array | None) -> Array:
    """Inverted dropout; identity when `key` is None or `rate` is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def split_key(key: Array | None, n: int) -> list[Array | None]:
    """Splits `key` into `n` keys, or gives `n` Nones for deterministic calls."""
    return [None] * n if key is None else list(jax.random.split(key, n))


def activation(name: str, x: Array) -> Array:
    if name == "relu":
        return jax.nn.relu(x)
    if name == "gelu":  # BERT's erf GELU
        return _gelu_erf(x) if custom_backwards() else jax.nn.gelu(x, approximate=False)
    return jax.nn.gelu(x, approximate=True)


@jax.custom_vjp
def _gelu_erf(x: Array) -> Array:
    """x * Phi(x) with a backward that keeps only x: autodiff of the formula saves two more
    [batch, length, mlp] arrays in the forward (measured on an H100: a 3-output fusion)."""
    return jax.nn.gelu(x, approximate=False)


def _gelu_erf_fwd(x: Array) -> tuple[Array, Array]:
    return jax.nn.gelu(x, approximate=False), x


def _gelu_erf_bwd(x: Array, g: Array) -> tuple[Array]:
    """d gelu / dx = Phi(x) + x phi(x), in float32."""
    xf = x.astype(jnp.float32)
    cdf = 0.5 * (1.0 + jax.lax.erf(xf * (2.0**-0.5)))
    pdf = jnp.exp(-0.5 * xf * xf) * (2.0 * jnp.pi) ** -0.5
    return ((g.astype(jnp.float32) * (cdf + xf * pdf)).astype(x.dtype),)


_gelu_erf.defvjp(_gelu_erf_fwd, _gelu_erf_bwd)


class Dense(nnx.Module):
    """y = x . W + b, contracting the trailing len(in_shape) axes of x.

    Args:
      in_shape / out_shape: the contracted and produced kernel dimensions.
      names: logical axis names of the kernel (len(in_shape) + len(out_shape) of them); the
        bias takes the names of the output dimensions.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        names: Sequence[str | None],
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        use_bias: bool = True,
    ):
        in_shape, out_shape = tuple(in_shape), tuple(out_shape)
        init = dense_init(cfg, len(in_shape), len(out_shape))
        self.kernel = nnx.Param(init(rngs.params(), in_shape + out_shape), out_sharding=names)
        self.bias = (
            nnx.Param(jnp.zeros(out_shape), out_sharding=tuple(names[len(in_shape) :]))
            if use_bias
            else None
        )
        self.n_in = len(in_shape)
        self.dtype = cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        kernel = self.kernel[...].astype(self.dtype)
        axes = (tuple(range(x.ndim - self.n_in, x.ndim)), tuple(range(self.n_in)))
        y = jax.lax.dot_general(x.astype(self.dtype), kernel, (axes, ((), ())))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _standardize(x: Array, eps: float, center: bool) -> Array:
    """xhat = (x - [mean if center]) * rstd over the last axis of float32 `x` [..., d], with
    rstd = 1 / sqrt(mean(centred^2) + eps); the backward is written in closed form."""
    return _standardize_fwd(x, eps, center)[0]


def _standardize_fwd(x: Array, eps: float, center: bool) -> tuple[Array, tuple[Array, Array]]:
    centred = x - x.mean(-1, keepdims=True) if center else x
    rstd = jax.lax.rsqrt(jnp.square(centred).mean(-1, keepdims=True) + eps)
    xhat = centred * rstd
    return xhat, (xhat, rstd)


def _standardize_bwd(eps: float, center: bool, res: tuple[Array, Array], g: Array):
    """dx = rstd * (g - [mean(g) if center] - xhat * mean(g * xhat))."""
    del eps
    xhat, rstd = res
    g_centred = g - g.mean(-1, keepdims=True) if center else g
    return (rstd * (g_centred - xhat * (g * xhat).mean(-1, keepdims=True)),)


_standardize.defvjp(_standardize_fwd, _standardize_bwd)

_CLOSED_FORM = [True]  # flipped by `autodiff_normalization` while a function is traced


@contextlib.contextmanager
def autodiff_normalization() -> Iterator[None]:
    """Traces LayerNorm/RMSNorm (and the MLM decoder) as plain jnp ops inside the block, for
    forward mode.

    Outside it the normalisation is a `jax.custom_vjp` (closed-form backward, faster on CPU):
    reverse mode and forward-over-reverse (`jax.hessian`, Hessian-vector products) work, pure
    forward mode (`jax.jvp`, `jax.jacfwd`) raises. Inside it autodiff sees the plain formula, so
    every mode works (same values). It acts when a function is traced, so trace (or first call
    a jitted function) inside it:

        with layers.autodiff_normalization():
            y, ty = jax.jvp(lambda x: model(x, ...), (x,), (t,))
    """
    _CLOSED_FORM.append(False)
    try:
        yield
    finally:
        _CLOSED_FORM.pop()


def custom_backwards() -> bool:
    """False while a function is traced inside `autodiff_normalization()`: the layers with a
    hand-written backward (the norms, the MLM decoder) then trace as plain ops."""
    return _CLOSED_FORM[-1]


def _plain_standardize(x: Array, eps: float, center: bool) -> Array:
    return _standardize_fwd(x, eps, center)[0]


def _normalizer():
    return _standardize if custom_backwards() else _plain_standardize


def normalize(x: Array, eps: float) -> Array:
    """LayerNorm's (x - mean) / sqrt(var + eps) over the last axis of float32 `x` [..., d].

    Its backward is written in closed form, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    from the saved xhat and rstd. Autodiff of the forward gives the same values, but on Pre-LN's
    residual stream XLA:CPU can re-derive the statistics of every later LayerNorm inside the
    fusions of each earlier layer's backward (work quadratic in depth); see bench/README.md.
    No pure forward mode (jax.jvp) unless traced inside `autodiff_normalization()`.
    """
    return _normalizer()(x, eps, True)


def rms_normalize(x: Array, eps: float) -> Array:
    """RMSNorm's x / sqrt(mean(x^2) + eps) over the last axis of float32 `x` [..., d], with the
    closed-form backward dx = rstd * (g - xhat * mean(g * xhat))."""
    return _normalizer()(x, eps, False)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis, statistics in float32, output in `out_dtype` (default:
    the compute dtype; the residual dtype where the output is the residual stream)."""

    def __init__(self, dim: int, cfg: ModelConfig, *, name: str = "embed", out_dtype=None):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.bias = nnx.Param(jnp.zeros((dim,)), out_sharding=(name,))
        self.eps = cfg.layer_norm_eps
        self.dtype = out_dtype or cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype."""
        y = normalize(x.astype(jnp.float32), self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis (scale only, no bias), statistics in float32; output dtype
    as LayerNorm's."""

    def __init__(self, dim: int, cfg: ModelConfig, *, name: str = "embed", out_dtype=None):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.eps = cfg.layer_norm_eps
        self.dtype = out_dtype or cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype."""
        y = rms_normalize(x.astype(jnp.float32), self.eps)
        return (y * self.scale[...]).astype(self.dtype)


class DyT(nnx.Module):
    """Dynamic Tanh (Zhu et al. 2025), a norm without statistics: gamma * tanh(alpha x) + beta,
    alpha a learned scalar (init `alpha0`), gamma/beta per channel (init 1/0); output dtype as
    LayerNorm's."""

    def __init__(
        self, dim: int, cfg: ModelConfig, *, name: str = "embed", out_dtype=None, alpha0=0.5
    ):
        self.alpha = nnx.Param(jnp.full((1,), alpha0), out_sharding=(None,))
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.bias = nnx.Param(jnp.zeros((dim,)), out_sharding=(name,))
        self.dtype = out_dtype or cfg.compute_dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype (tanh in float32)."""
        y = jnp.tanh(self.alpha[...] * x.astype(jnp.float32))
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)


def attention_mask(mask: Array | None) -> Array | None:
    """[batch, length] 1/0 padding mask -> [batch, 1, 1, length] boolean key mask."""
    return None if mask is None else (mask > 0)[:, None, None, :]


def sequence_lengths(mask: Array | None) -> Array | None:
    """[batch, length] right-padded 1/0 mask (tokens first, then padding) -> [batch] int32
    token counts: the form both attention implementations take (cuDNN has no [B,1,1,S] mask)."""
    return None if mask is None else (mask > 0).sum(-1).astype(jnp.int32)


def key_mask(lengths: Array | None, length: int) -> Array | None:
    """[batch] token counts -> [batch, 1, 1, length] boolean mask of the keys < count."""
    if lengths is None:
        return None
    return (jnp.arange(length)[None, :] < lengths[:, None])[:, None, None, :]


def head_norm(cfg: ModelConfig) -> LayerNorm | RMSNorm | None:
    """QK-norm's normaliser over head_dim (`cfg.norm`, parameters [kv]), or None if off."""
    if not cfg.qk_norm:
        return None
    return (RMSNorm if cfg.norm == "rmsnorm" else LayerNorm)(cfg.head_dim, cfg, name="kv")


class SelfAttention(nnx.Module):
    """Multi-head self-attention with separate q/k/v projections.

    Kernels: q/k/v [embed, heads, kv]; output [heads, kv, embed]. With `cfg.qk_norm`, queries
    and keys are normalised over head_dim (`query_norm`, `key_norm`) before the dot product.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        qkv_names = ("embed", "heads", "kv")
        self.query = Dense((d,), (n, h), qkv_names, cfg, rngs=rngs)
        self.key = Dense((d,), (n, h), qkv_names, cfg, rngs=rngs)
        self.value = Dense((d,), (n, h), qkv_names, cfg, rngs=rngs)
        self.out = Dense((n, h), (d,), ("heads", "kv", "embed"), cfg, rngs=rngs)
        self.query_norm, self.key_norm = head_norm(cfg), head_norm(cfg)
        self.dropout_rate = cfg.attention_dropout
        self.impl = cfg.attention_impl

    def __call__(
        self, x: Array, *, mask: Array | None = None, dropout_key: Array | None = None
    ) -> Array:
        """x [batch, length, embed], mask [batch, length] (1 = token, right-padded: tokens
        first) -> [batch, length, embed]. Padded keys are masked through sequence lengths, the
        same way for the "xla" and "cudnn" implementations ("pallas" takes the mask itself).
        Attention dropout (keyed by `dropout_key`) runs on the XLA and Pallas paths (other
        masks: `ln_jax.nn.flash`); the config keeps it off cuDNN's (see
        `ModelConfig.cudnn_problem`)."""
        names = ("act_batch", "act_length", "act_heads", "act_kv")
        q = constrain(self.query(x), names)
        k = constrain(self.key(x), names)
        if self.query_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        v = constrain(self.value(x), names)
        if self.impl == "pallas":
            valid = None if mask is None else mask > 0
            ctx = flash.flash_attention(
                q, k, v, valid, dropout_rate=self.dropout_rate, dropout_key=dropout_key
            )
            return self.out(constrain(ctx, names))
        lengths = sequence_lengths(mask)
        if dropout_key is not None and self.dropout_rate > 0.0:
            bool_mask = key_mask(lengths, x.shape[1])
            ctx = _attention_with_dropout(q, k, v, bool_mask, self.dropout_rate, dropout_key)
        else:
            ctx = jax.nn.dot_product_attention(
                q, k, v, key_value_seq_lengths=lengths, implementation=self.impl
            )
        return self.out(constrain(ctx, names))


def _attention_with_dropout(
    q: Array, k: Array, v: Array, mask: Array | None, rate: float, key: Array
) -> Array:
    """Softmax attention with dropout on the probabilities (as BERT); q/k/v [B, T, N, H]."""
    scale = q.shape[-1] ** -0.5
    # Accumulated and kept in float32 (bf16 q/k): the softmax sees unrounded logits.
    logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = dropout(jax.nn.softmax(logits, axis=-1), rate, key).astype(v.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, v)


class FeedForward(nnx.Module):
    """act(x W1 + b1) W2 + b2; W1 [embed, mlp], W2 [mlp, embed]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.wi = Dense((cfg.hidden_size,), (cfg.mlp_dim,), ("embed", "mlp"), cfg, rngs=rngs)
        self.wo = Dense((cfg.mlp_dim,), (cfg.hidden_size,), ("mlp", "embed"), cfg, rngs=rngs)
        self.activation = cfg.activation

    def __call__(
        self, x: Array, *, mask: Array | None = None, dropout_key: Array | None = None
    ) -> Array:
        """x: [batch, length, embed] -> [batch, length, embed]. mask/dropout_key are unused."""
        del mask, dropout_key
        h = activation(self.activation, self.wi(x))
        h = constrain(h, ("act_batch", "act_length", "act_mlp"))
        return self.wo(h)
