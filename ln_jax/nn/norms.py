"""The norms: LayerNorm, RMSNorm and DyT, and the row statistics and closed-form backwards
they are built on (`row_moments`, `normalize`, `rms_normalize`, `layer_norm`).

Statistics are float32 whatever the compute dtype; each module's output is in its configured
dtype (the residual dtype where its output is the residual stream). Inside
`ln_jax.nn.layers.autodiff_normalization()` the norms trace as plain jnp ops (every autodiff
mode works); outside it their backward is written in closed form.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.nn.layers import custom_backwards

Array = jax.Array


def row_moments(x: Array) -> tuple[Array, Array]:
    """(mean, variance) [..., 1] over the last axis of float32 `x` [..., d].

    On a GPU in one pass over x (Welford's update, as PyTorch's LayerNorm kernels compute it):
    XLA fuses it into the kernel that writes x (the residual add with its dropout). The
    two-pass form (the mean, then the mean of squared deviations) read x again in a kernel of
    its own for the variance: compiled for an H200, BERT-base's step had 53 more kernels and
    moved 0.8 GB more (docs/results/gpu/journal.md, session 33). Elsewhere the two passes, as
    before: on a CPU its values are unchanged bit for bit; on a TPU Welford's reduction does not
    fuse with x's producer (compiled for a v5e: a pass of its own either way), and the one pass
    that does, mean(x^2) - mean(x)^2, loses the variance's digits where the mean is large
    against the spread (2e-3 of it in float32 at 100 standard deviations).
    """
    return jax.lax.platform_dependent(
        x, cuda=_one_pass_moments, rocm=_one_pass_moments, default=_two_pass_moments
    )


def _two_pass_moments(x: Array) -> tuple[Array, Array]:
    mean = x.mean(-1, keepdims=True)
    return mean, jnp.square(x - mean).mean(-1, keepdims=True)


@jax.custom_jvp
def _one_pass_moments(x: Array) -> tuple[Array, Array]:
    """Welford: each element a (count 1, mean x, M2 0) triple, merged pairwise by Chan et
    al.'s rule in whatever order the reduction takes; M2 / d is the biased variance (no
    cancellation, unlike mean(x^2) - mean(x)^2, which loses the variance's digits where the
    mean is large against it)."""

    def merge(a, b):
        (na, ma, qa), (nb, mb, qb) = a, b
        n = na + nb
        w = nb / jnp.maximum(n, 1.0)  # the identity (0, 0, 0) merges to the other side
        delta = mb - ma
        return n, ma + delta * w, qa + qb + delta * delta * na * w

    zero = jnp.zeros((), x.dtype)
    triples = (jnp.ones_like(x), x, jnp.zeros_like(x))
    _, mean, m2 = jax.lax.reduce(triples, (zero, zero, zero), merge, (x.ndim - 1,))
    return mean[..., None], m2[..., None] / x.shape[-1]


@_one_pass_moments.defjvp
def _one_pass_moments_jvp(primals, tangents):
    """d mean = mean(dx); d var = 2 mean((x - mean) dx): linear in dx, so reverse mode and
    forward mode (`autodiff_normalization`, jax.hessian) both work."""
    (x,), (dx,) = primals, tangents
    mean, var = _one_pass_moments(x)
    d_mean = dx.mean(-1, keepdims=True)
    d_var = 2.0 * ((x - mean) * dx).mean(-1, keepdims=True)
    return (mean, var), (d_mean, d_var)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _standardize(x: Array, eps: float, center: bool) -> Array:
    """xhat = (x - [mean if center]) * rstd over the last axis of float32 `x` [..., d], with
    rstd = 1 / sqrt(mean(centred^2) + eps); the backward is written in closed form."""
    return _standardize_fwd(x, eps, center)[0]


def _standardize_fwd(x: Array, eps: float, center: bool) -> tuple[Array, tuple[Array, Array]]:
    if center:
        mean, var = row_moments(x)
        centred = x - mean
    else:
        centred, var = x, jnp.square(x).mean(-1, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    xhat = centred * rstd
    return xhat, (xhat, rstd)


def _standardize_bwd(eps: float, center: bool, res: tuple[Array, Array], g: Array):
    """dx = rstd * (g - [mean(g) if center] - xhat * mean(g * xhat))."""
    del eps
    xhat, rstd = res
    g_centred = g - g.mean(-1, keepdims=True) if center else g
    return (rstd * (g_centred - xhat * (g * xhat).mean(-1, keepdims=True)),)


_standardize.defvjp(_standardize_fwd, _standardize_bwd)


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


def layer_norm(x: Array, scale: Array, bias: Array, eps: float) -> Array:
    """normalize(x) * scale + bias for float32 `x` [..., d], scale and bias [d]; its backward
    (all three gradients) written in closed form from x and its row statistics.

    The statistics pass an optimisation barrier in the backward, so XLA uses the saved mean
    and rstd instead of re-deriving the mean: x̂ is then elementwise there, and the column
    sums of the scale and bias gradients can read g and x directly. Without it XLA:GPU
    recomputed the mean inside the producer of g · x̂ and wrote that product in float32
    ([B, S, d], 27 times a BERT-base step, 6.1 GB) for a separate column reduction
    (docs/results/gpu/journal.md, 2026-11-27).
    """
    if not custom_backwards():
        return _plain_standardize(x, eps, True) * scale + bias
    return _layer_norm(x, scale, bias, eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x: Array, scale: Array, bias: Array, eps: float) -> Array:
    return _layer_norm_fwd(x, scale, bias, eps)[0]


def _layer_norm_fwd(x: Array, scale: Array, bias: Array, eps: float) -> tuple[Array, tuple]:
    mean, var = row_moments(x)
    rstd = jax.lax.rsqrt(var + eps)
    return (x - mean) * rstd * scale + bias, (x, mean, rstd, scale)


def _layer_norm_bwd(eps: float, res: tuple, g: Array) -> tuple[Array, Array, Array]:
    """dx = rstd (gs - mean(gs) - x̂ mean(gs x̂)) with gs = g scale; dscale = sum(g x̂),
    dbias = sum(g) over every axis but the last."""
    del eps
    x, mean, rstd, scale = res
    mean, rstd = jax.lax.optimization_barrier((mean, rstd))
    xhat = (x - mean) * rstd
    gs = g * scale
    dx = rstd * (gs - gs.mean(-1, keepdims=True) - xhat * (gs * xhat).mean(-1, keepdims=True))
    rows = tuple(range(g.ndim - 1))
    return dx, jnp.sum(g * xhat, axis=rows), jnp.sum(g, axis=rows)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis, statistics in float32, output in `out_dtype` (default:
    the compute dtype; the residual dtype where the output is the residual stream)."""

    def __init__(self, dim: int, *, eps: float, dtype: Any, name: str = "embed"):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.bias = nnx.Param(jnp.zeros((dim,)), out_sharding=(name,))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype."""
        return layer_norm(x.astype(jnp.float32), self.scale[...], self.bias[...], self.eps).astype(
            self.dtype
        )

    def decompose(self, x: Array) -> tuple[Any, Array]:
        """The norm at input x [..., dim] as a linear map plus an offset, the statistics of x
        held fixed: (f, b) with LN(x) = f(x) + b, f additive over parts of x (float32); what
        the residual decomposition of `ln_jax.analysis.residual` applies to each part."""
        x = x.astype(jnp.float32)
        inv = jax.lax.rsqrt(x.var(-1, keepdims=True) + self.eps)
        f = lambda c: (c - c.mean(-1, keepdims=True)) * inv * self.scale[...]
        return f, jnp.broadcast_to(self.bias[...], x.shape)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis (scale only, no bias), statistics in float32; output dtype
    as LayerNorm's."""

    def __init__(self, dim: int, *, eps: float, dtype: Any, name: str = "embed"):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype."""
        y = rms_normalize(x.astype(jnp.float32), self.eps)
        return (y * self.scale[...]).astype(self.dtype)

    def decompose(self, x: Array) -> tuple[Any, Array]:
        """As `LayerNorm.decompose`: RMSNorm(x) = f(x), no offset."""
        x = x.astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + self.eps)
        return (lambda c: c * inv * self.scale[...]), jnp.zeros_like(x)


class DyT(nnx.Module):
    """Dynamic Tanh (Zhu et al. 2025), a norm without statistics: gamma * tanh(alpha x) + beta,
    alpha a learned scalar (init `alpha0`), gamma/beta per channel (init 1/0); output dtype as
    LayerNorm's."""

    def __init__(self, dim: int, *, dtype: Any, name: str = "embed", alpha0: float = 0.5):
        self.alpha = nnx.Param(jnp.full((1,), alpha0), out_sharding=(None,))
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=(name,))
        self.bias = nnx.Param(jnp.zeros((dim,)), out_sharding=(name,))
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        """x [..., dim] -> [..., dim] in the output dtype (tanh in float32)."""
        y = jnp.tanh(self.alpha[...] * x.astype(jnp.float32))
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)

    def decompose(self, x: Array) -> tuple[Any, Array]:
        """As `LayerNorm.decompose`, with tanh's secant at x: each element scaled by
        tanh(alpha x) / x (alpha where x = 0), so the parts add up to DyT(x) exactly."""
        x = x.astype(jnp.float32)
        a = self.alpha[...]
        safe = jnp.where(jnp.abs(x) > 1e-12, x, 1.0)
        secant = jnp.where(jnp.abs(x) > 1e-12, jnp.tanh(a * x) / safe, a)
        f = lambda c: c * secant * self.scale[...]
        return f, jnp.broadcast_to(self.bias[...], x.shape)
