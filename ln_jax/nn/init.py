"""Initialisers: BERT's truncated normal (fixed or width-scaled), the Xavier scheme of Xiong et
al. (section 3.3), and fairseq's Xavier (the papers' translation code: q, k and v drawn as one
packed [3d, d] matrix, so their variance is 2 / (d + 3d) = 1 / (2d), half of Xavier's 1 / d).

Each returns a `jax.nn.initializers.Initializer` for a kernel whose leading `n_in` axes are
contracted with the input and whose trailing `n_out` axes are produced.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.nn import initializers

from ln_jax.nn.spec import StackConfig

# The width at which BERT's init_std = 0.02 was chosen (BERT-base); "bert_scaled" keeps the std
# relative to 1/sqrt(d) that BERT-base has: 0.02 * sqrt(768 / d).
BERT_WIDTH = 768


def bert_std(cfg: StackConfig) -> float | None:
    """The truncated normal's std of "bert" / "bert_scaled" (None for other initialisers)."""
    if cfg.init == "bert":
        return cfg.init_std
    if cfg.init == "bert_scaled":
        return cfg.init_std * math.sqrt(BERT_WIDTH / cfg.hidden_size)
    return None


@dataclasses.dataclass(frozen=True)
class InitScheme:
    """What a layer's initialisers read of the config: BERT's truncated normal of std `std`,
    or (std None) Xavier kernels and N(0, 1/width) embeddings."""

    std: float | None
    width: int
    # fairseq's packed q/k/v projection: the q, k and v kernels take Xavier's bound with a
    # fan-out 3 times their own (`qkv`); 1 everywhere else
    fan_out_factor: int = 1
    packed_qkv: bool = False

    def qkv(self) -> InitScheme:
        """The scheme of the attention's q, k and v kernels (fairseq's packed projection)."""
        return dataclasses.replace(self, fan_out_factor=3) if self.packed_qkv else self

    def dense(self, n_in: int = 1, n_out: int = 1) -> initializers.Initializer:
        """Kernel initialiser of a dense layer with `n_in` input and `n_out` output axes."""
        if self.std is not None:
            # As BERT's TF code: a normal truncated at two standard deviations.
            return initializers.truncated_normal(self.std)
        in_axis = tuple(range(n_in))
        out_axis = tuple(range(n_in, n_in + n_out))
        if self.fan_out_factor != 1:
            return _xavier_packed(in_axis, out_axis, self.fan_out_factor)
        # Xavier: Var = 2 / (fan_in + fan_out), i.e. 1/d for the d x d matrices of the theory.
        return initializers.xavier_uniform(in_axis=in_axis, out_axis=out_axis)

    def embed(self) -> initializers.Initializer:
        """Embedding-table initialiser: the truncated normal, or N(0, 1/width) for Xavier."""
        if self.std is not None:
            return initializers.truncated_normal(self.std)
        return initializers.normal(self.width**-0.5)


def init_scheme(cfg: StackConfig) -> InitScheme:
    """The initialisers of `cfg` (`init`, `init_std`, `hidden_size`)."""
    return InitScheme(bert_std(cfg), cfg.hidden_size, packed_qkv=cfg.init == "fairseq")


def _xavier_packed(in_axis: tuple, out_axis: tuple, factor: int) -> initializers.Initializer:
    """Xavier-uniform of a kernel that is one of `factor` slices of a packed matrix: bound
    sqrt(6 / (fan_in + factor * fan_out)), Var = 2 / (fan_in + factor * fan_out)."""

    def init(key, shape, dtype=jnp.float32):
        fan_in = math.prod(shape[a] for a in in_axis)
        fan_out = math.prod(shape[a] for a in out_axis)
        bound = math.sqrt(6.0 / (fan_in + factor * fan_out))
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def admin_closed_form(num_sublayers: int) -> float:
    """Admin's omega without profiling: sqrt((N+1)/ln(N+1) - 1), N residual sub-layers."""
    n1 = num_sublayers + 1
    return math.sqrt(n1 / math.log(n1) - 1.0)


def deepnorm_constants(encoder_layers: int, decoder_layers: int = 0) -> dict[str, tuple]:
    """DeepNet's (alpha, beta) for each stack (Wang et al. 2022, Table 1): N encoder and M
    decoder layers.

    Encoder only: (2N)^(1/4), (8N)^(-1/4); decoder only: (2M)^(1/4), (8M)^(-1/4). Encoder-
    decoder: encoder 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16); decoder (3M)^(1/4),
    (12M)^(-1/4).
    """
    n, m = encoder_layers, decoder_layers
    if n and m:
        return {
            "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
            "decoder": ((3.0 * m) ** 0.25, (12.0 * m) ** -0.25),
        }
    out = {}
    if n:
        out["encoder"] = (deepnorm_alpha(n), deepnorm_beta(n))
    if m:
        out["decoder"] = (deepnorm_alpha(m), deepnorm_beta(m))
    return out


def deepnorm_alpha(num_layers: int) -> float:
    """DeepNet's skip scale for an encoder of N layers: (2N)^(1/4)."""
    return (2.0 * num_layers) ** 0.25


def deepnorm_beta(num_layers: int) -> float:
    """DeepNet's init scale of the value, output and FFN weights: (8N)^(-1/4)."""
    return (8.0 * num_layers) ** -0.25
