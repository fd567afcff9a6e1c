"""Building blocks: dense layers, dropout, activations, feed-forward, float32 einsums (the
norms: `ln_jax.nn.norms`; attention: `ln_jax.nn.attention`).

Every parameter is float32 and carries logical axis names (see `ln_jax.sharding`); computation
casts parameters to the configured compute dtype, while LayerNorm statistics and the attention
softmax stay in float32. Dropout takes an explicit PRNG key (None = deterministic), so a training
step's randomness is a pure function of its key.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.nn.init import InitScheme, init_scheme
from ln_jax.nn.random import HASH_PRNG
from ln_jax.nn.spec import StackConfig
from ln_jax.runtime import platforms
from ln_jax.sharding import constrain

Array = jax.Array


def dropout(x: Array, rate: float, key: Array | None) -> Array:
    """Inverted dropout of x [any shape]; identity when `key` is None or `rate` is 0.

    Kept entries are multiplied by 1 / (1 - rate) in float32 and rounded once to x's dtype,
    as PyTorch's dropout kernel does. Dividing a bf16 x by `1 - rate` instead divides by
    bf16(0.9) = 0.8984: kept entries came out 1.1131 x, not 1.1111 x (0.18% high), and XLA:GPU
    turned the backward's division into a bf16 multiply by 1.109, so the gradient was not the
    forward's derivative; and that bf16 multiply, the last op before the two gradient GEMMs,
    became a separate pass per GEMM on an H200 (docs/results/gpu/journal.md, session 28). In
    float32 the two forms differ only in the last bit.
    """
    if key is None or rate == 0.0:
        return x
    if _recompute_mask(key):
        return _recomputed_dropout(x, key, rate)
    return _dropped(x, _keep(key, rate, x.shape), rate)


def _recompute_mask(key: Array) -> bool:
    """Whether the backward draws the mask again (`_recomputed_dropout`): on a GPU, with
    counter-hash keys, outside `autodiff_normalization()` (a custom VJP has no forward mode)."""
    if not custom_backwards() or jax.random.key_impl(key) != HASH_PRNG:
        return False
    return platforms.current() == "gpu"


def _keep(key: Array, rate: float, shape: tuple[int, ...]) -> Array:
    return jax.random.bernoulli(key, 1.0 - rate, shape)


def _dropped(x: Array, keep: Array, rate: float) -> Array:
    scaled = (x.astype(jnp.float32) * (1.0 / (1.0 - rate))).astype(x.dtype)
    return jnp.where(keep, scaled, jnp.zeros_like(x))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _recomputed_dropout(x: Array, key: Array, rate: float) -> Array:
    """`dropout` whose backward draws its mask again from the key instead of keeping it.

    With counter-hash bits (`dropout_rng="hash"`) a mask is a few integer operations an element,
    which XLA fuses into whatever reads it. Autodiff of `dropout` keeps the mask for the
    backward, and XLA:GPU then wrote every hidden dropout mask of a step to memory, all 25 of
    BERT-base's in one kernel (pred [256, 128, 768] each, 0.63 GB written, read twice). Here the
    backward's mask is drawn from the key behind an optimisation barrier, so XLA does not merge
    the two draws back into one stored array, and both fuse into their consumers; the barrier
    also holds the incoming gradient, or XLA:GPU re-ran a Post-LN's LayerNorm backward inside
    the dropout's. Compiled for an H200, BERT-base Pre-LN and Post-LN steps move 1.8 GB less
    (docs/results/gpu/journal.md, session 37). Same values. Not on a TPU: compiled for a v5e, the
    step's temporaries grew 3.76 -> 4.04 GiB.
    """
    return _dropped(x, _keep(key, rate, x.shape), rate)


def _recomputed_dropout_fwd(x: Array, key: Array, rate: float) -> tuple[Array, Array]:
    # Plain ops, not the custom_vjp itself: forward-over-reverse (jax.hessian) differentiates
    # this.
    return _dropped(x, _keep(key, rate, x.shape), rate), key


def _recomputed_dropout_bwd(rate: float, key: Array, g: Array) -> tuple[Array, None]:
    key, g = jax.lax.optimization_barrier((key, g))
    return _dropped(g, _keep(key, rate, g.shape), rate), None


_recomputed_dropout.defvjp(_recomputed_dropout_fwd, _recomputed_dropout_bwd)


def split_key(key: Array | None, n: int) -> list[Array | None]:
    """Splits `key` into `n` keys, or gives `n` Nones for deterministic calls."""
    return [None] * n if key is None else list(jax.random.split(key, n))


def activation(name: str, x: Array) -> Array:
    if name == "relu":
        return jax.nn.relu(x)
    if name == "gelu":  # BERT's erf GELU
        return _gelu_erf(x) if custom_backwards() else gelu_erf(x)
    if name == "silu":  # swish, x * sigmoid(x) (HuggingFace Marian's)
        return jax.nn.silu(x)
    return jax.nn.gelu(x, approximate=True)


def gelu_erf(x: Array) -> Array:
    """x * Phi(x) = x (1 + erf(x / sqrt 2)) / 2, evaluated in float32 and returned in x's dtype
    (BERT's and PyTorch's form), any shape.

    `jax.nn.gelu(approximate=False)` evaluates 0.5 x erfc(-x / sqrt 2) instead: XLA expands
    erfc into two polynomials, an exp and two divisions per element, and computed its argument
    in a separate bf16 pass. On an H200 that forward took 3.7 + 1.5 ms of a 53 ms BERT-base
    step (docs/results/gpu/journal.md, 2026-11-27), against about 0.1 ms per layer for a pass over
    its bytes.
    In float32 over [-10, 10] it is within 1.1e-6 of a float64 reference (the erfc form:
    4e-7); below x = -3, where GELU is under 0.005, 1 + erf cancels and the error is relative
    to 1, not to the value, as in PyTorch's kernel.
    """
    xf = x.astype(jnp.float32)
    return (0.5 * xf * (1.0 + jax.lax.erf(xf * 2.0**-0.5))).astype(x.dtype)


@jax.custom_vjp
def _gelu_erf(x: Array) -> Array:
    """`gelu_erf` with a backward that keeps only x: autodiff of the formula saves two more
    [batch, length, mlp] arrays in the forward (measured on an H100: a 3-output fusion)."""
    return gelu_erf(x)


def _gelu_erf_fwd(x: Array) -> tuple[Array, Array]:
    return gelu_erf(x), x


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
      init: the kernel's initialisers (`ln_jax.nn.init.InitScheme`); dtype: the compute dtype.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        names: Sequence[str | None],
        *,
        init: InitScheme,
        dtype: Any,
        rngs: nnx.Rngs,
        use_bias: bool = True,
    ):
        in_shape, out_shape = tuple(in_shape), tuple(out_shape)
        init = init.dense(len(in_shape), len(out_shape))
        self.kernel = nnx.Param(init(rngs.params(), in_shape + out_shape), out_sharding=names)
        self.bias = (
            nnx.Param(jnp.zeros(out_shape), out_sharding=tuple(names[len(in_shape) :]))
            if use_bias
            else None
        )
        self.n_in = len(in_shape)
        self.dtype = dtype

    def __call__(self, x: Array, add_bias: bool = True) -> Array:
        """x [..., *in_shape] -> [..., *out_shape], as one 2-D matmul [rows, in] x [in, out]:
        the weight gradient then contracts one axis, which XLA's CPU backend runs on its fast
        matmul path (with the leading axes kept, 2.1x slower for a [64, 32, 256] x [256, 1024]
        layer's forward and backward on one core; GPU and TPU canonicalise to the same 2-D
        matmul either way). `add_bias=False`: x . W only, for a consumer that adds the bias
        itself (the attention kernel)."""
        kernel = self.kernel[...].astype(self.dtype)
        lead, k_in = x.shape[: x.ndim - self.n_in], kernel.shape[: self.n_in]
        k_out = kernel.shape[self.n_in :]
        flat = x.astype(self.dtype).reshape(math.prod(lead), math.prod(k_in))
        y = jnp.dot(flat, kernel.reshape(math.prod(k_in), math.prod(k_out)))
        if add_bias and self.bias is not None:  # on the 2-D product: a GEMM epilogue takes it
            y = y + self.bias[...].astype(self.dtype).reshape(-1)
        return y.reshape(*lead, *k_out)


def logsumexp(x: Array) -> Array:
    """log(sum(exp(x))) over the last axis of float32 logits `x` [..., V] -> [...].

    On a GPU in one pass over x (the running maximum and the sum of exponentials rescaled to
    it, merged pairwise as the reduction goes): `jax.nn.logsumexp` reads x twice, for the
    maximum and then the sum. Compiled for an H200, BERT-base's MLM loss then reads its
    float32 logits [256, 20, 30592] three times a step, not four (0.6 GB;
    docs/results/gpu/journal.md, session 33). Elsewhere `jax.nn.logsumexp` (on a CPU, values
    unchanged bit for bit).
    """
    return jax.lax.platform_dependent(
        x, cuda=_one_pass_logsumexp, rocm=_one_pass_logsumexp, default=_two_pass_logsumexp
    )


def _two_pass_logsumexp(x: Array) -> Array:
    return jax.nn.logsumexp(x, axis=-1)


@jax.custom_jvp
def _one_pass_logsumexp(x: Array) -> Array:
    def merge(a, b):
        (ma, sa), (mb, sb) = a, b
        m = jnp.maximum(ma, mb)
        # a side at the maximum keeps its sum (also -inf against -inf: the identity)
        rescale = lambda mi, si: jnp.where(mi == m, si, si * jnp.exp(mi - m))  # noqa: E731
        return m, rescale(ma, sa) + rescale(mb, sb)

    init = (jnp.array(-jnp.inf, x.dtype), jnp.zeros((), x.dtype))
    m, total = jax.lax.reduce((x, jnp.ones_like(x)), init, merge, (x.ndim - 1,))
    return m + jnp.log(total)


@_one_pass_logsumexp.defjvp
def _one_pass_logsumexp_jvp(primals, tangents):
    """d lse = sum(softmax(x) dx): linear in dx (reverse mode: g softmax(x))."""
    (x,), (dx,) = primals, tangents
    out = _one_pass_logsumexp(x)
    return out, jnp.sum(jnp.exp(x - out[..., None]) * dx, axis=-1)


_CLOSED_FORM = [True]  # flipped by `autodiff_normalization` while a function is traced


@contextlib.contextmanager
def autodiff_normalization() -> Iterator[None]:
    """Traces LayerNorm/RMSNorm (and `float32_einsum`: the MLM decoder, the attention logits,
    the tied output projection) as plain jnp ops inside the block, for forward mode.

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
    hand-written backward (the norms, `float32_einsum`) then trace as plain ops."""
    return _CLOSED_FORM[-1]


def float32_einsum(spec: str, a: Array, b: Array) -> Array:
    """`jnp.einsum(spec, a, b)` accumulated and returned in float32 (never rounded: logits
    that a softmax reads), whose backward multiplies in a's dtype.

    Autodiff would feed the float32 cotangent into both gradient products, which then run in
    float32 (TF32 on a GPU) even in a bf16 model. Here the cotangent is rounded to a's dtype
    first, as PyTorch's autocast and FlashAttention do; the two products are autodiff's own
    (da = g . b, db = a . g), accumulated in float32 by the backend's GEMMs and rounded once.
    With float32 operands that is autodiff's gradient, so they trace as the plain einsum
    (float32 programs are unchanged, bit for bit), as everything does inside
    `autodiff_normalization()` (forward mode). `python -m ln_jax.compile_check --platform=gpu`
    lists the float32 products left in a step.

    Args:
      spec: "ab,cb->ac"-style, each operand's indices found in the output or the other operand.
      a, b: the operands, in the compute dtype.
    """
    if not custom_backwards() or a.dtype == b.dtype == jnp.float32:
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    return _float32_einsum(_check_spec(spec), a, b)


def _check_spec(spec: str) -> str:
    """`spec` without spaces, if each gradient is an einsum of (cotangent, other operand).

    Raises:
      ValueError: an operand index found neither in the output nor in the other operand.
    """
    spec = spec.replace(" ", "")
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    for mine, other in ((sa, sb), (sb, sa)):
        if set(mine) - set(out) - set(other):
            raise ValueError(f"float32_einsum({spec!r}): {mine!r} sums an index away alone.")
    return spec


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _float32_einsum(spec: str, a: Array, b: Array) -> Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _float32_einsum_fwd(spec: str, a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
    # Plain ops, not the custom_vjp itself: forward-over-reverse (jax.hessian) differentiates
    # this.
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32), (a, b)


def _float32_einsum_bwd(spec: str, res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    a, b = res
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    g = g.astype(a.dtype)
    # Results in the operands' dtype: the GPU's and TPU's GEMMs accumulate in float32 anyway,
    # and XLA:CPU has no bf16 x bf16 = f32 kernel for some of these batched products.
    da = jnp.einsum(f"{out},{sb}->{sa}", g, b)
    db = jnp.einsum(f"{sa},{out}->{sb}", a, g)
    return da.astype(a.dtype), db.astype(b.dtype)


_float32_einsum.defvjp(_float32_einsum_fwd, _float32_einsum_bwd)


class FeedForward(nnx.Module):
    """act(x W1 + b1) W2 + b2; W1 [embed, mlp], W2 [mlp, embed]."""

    def __init__(self, cfg: StackConfig, *, rngs: nnx.Rngs):
        kw = dict(init=init_scheme(cfg), dtype=cfg.compute_dtype, rngs=rngs)
        self.wi = Dense((cfg.hidden_size,), (cfg.mlp_dim,), ("embed", "mlp"), **kw)
        self.wo = Dense((cfg.mlp_dim,), (cfg.hidden_size,), ("mlp", "embed"), **kw)
        self.activation = cfg.activation

    reads = ("layout",)  # inputs a branch takes besides x (`ln_jax.nn.blocks.ResidualSublayer`)

    def __call__(self, x: Array, *, layout: Any = None, dropout_key: Array | None = None) -> Array:
        """x: [batch, length, embed] -> [batch, length, embed]; with a `TokenLayout`
        (`ln_jax.nn.tokens`) only the real tokens' chunks are computed (padded positions get
        zeros or their values, which no real token reads). `dropout_key` is unused."""
        del dropout_key
        if layout is not None:
            return layout.apply(self._tokens, x)
        h = activation(self.activation, self.wi(x))
        h = constrain(h, ("act_batch", "act_length", "act_mlp"))
        return self.wo(h)

    def _tokens(self, x: Array) -> Array:
        """x [tokens, embed] -> [tokens, embed]."""
        return self.wo(activation(self.activation, self.wi(x)))
