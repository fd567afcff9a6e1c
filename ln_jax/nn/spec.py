"""What a layer stack reads of a config: the fields `ln_jax.nn` modules are built from.

`StackConfig` is structural: `ln_jax.config.run.ModelConfig` satisfies it (BERT's own fields,
segment types or the NSP head, are not in it), and so does any frozen dataclass a model family
defines with these fields. The decoder of an encoder-decoder is the same fields with its own
depth (`ModelConfig.replace(num_layers=...)`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ln_jax.nn.placements import PlacementRule


class StackConfig(Protocol):
    """The layer-stack fields (see `ln_jax.config.run.ModelConfig` for their meaning)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    mlp_dim: int
    placement: Any
    norm: str
    layer_norm_eps: float
    qk_norm: bool
    dlcl: bool
    admin_omega: str
    activation: str
    init: str
    init_std: float
    hidden_dropout: float
    attention_dropout: float
    attention_impl: str
    remat: str
    scan_layers: bool
    scan_unroll: int

    @property
    def head_dim(self) -> int: ...

    @property
    def layer_placements(self) -> tuple[str, ...]: ...

    def layer_rule(self, index: int) -> PlacementRule: ...

    @property
    def rule(self) -> PlacementRule: ...

    @property
    def compute_dtype(self) -> Any: ...

    @property
    def residual_dtype(self) -> Any: ...

    def replace(self, **changes: Any) -> StackConfig: ...
