"""The one table of LayerNorm placements: each placement is a `PlacementRule`, data that
`ln_jax.nn.blocks.ResidualSublayer` interprets; no other code re-derives where a norm goes.

`parse_placement` turns a config's placement (one name, a per-layer list, "mixln") into one
name per layer.
"""

from __future__ import annotations

import dataclasses

from ln_jax.validate import ConfigError, Fix, check_choice

__all__ = ["NOT_ROWS", "PLACEMENTS", "PlacementRule", "parse_placement"]


@dataclasses.dataclass(frozen=True)
class PlacementRule:
    """Where a residual sub-layer normalises, as data.

    A sub-layer computes, in this order (skipping what the rule switches off):
      h = Norm(x) if pre_norm else x;  h = h / sqrt(l) if pre_norm_scale == "inv_sqrt_depth"
      f = F(h);  f = Norm(f) if branch_norm;  f = alpha * f if branch_gate
      s = skip_scale * x  (1, a learned per-channel omega, or a constant alpha)
      y = s + f;  y = Norm(y) if post_norm
    and the encoder applies a final Norm after the last layer if `final_norm`.

    Attributes:
      pre_norm: normalise the branch input (Pre-LN).
      post_norm: normalise after the residual add (Post-LN).
      branch_norm: normalise the branch output before the add (sandwich / Peri-LN).
      final_norm: the encoder ends with a Norm (needed when the residual stream is unnormalised).
      skip: "identity", "omega" (Admin: learned per-channel vector) or "alpha" (DeepNorm constant).
      branch_gate: scale the branch by a learned scalar initialised at 0 (ReZero).
      pre_norm_scale: "none", or "inv_sqrt_depth": the pre-norm output of layer l (1-based)
        is multiplied by 1/sqrt(l) (LayerNorm Scaling).
      norm_kind: "model" (every Norm is the model's `norm`) or "dyt": every Norm of the rule
        and the final one is DyT, gamma * tanh(alpha x) + beta (no statistics).
      init_scale: "none", or "deepnorm_beta": the branch's value, attention-output and FFN
        kernels are multiplied by beta = (8N)^(-1/4) at initialisation (DeepNet; N layers).
    """

    pre_norm: bool = False
    post_norm: bool = False
    branch_norm: bool = False
    final_norm: bool = False
    skip: str = "identity"
    branch_gate: bool = False
    pre_norm_scale: str = "none"
    norm_kind: str = "model"
    init_scale: str = "none"

    def __post_init__(self) -> None:
        check_choice("pre_norm_scale", self.pre_norm_scale, PRE_NORM_SCALES)
        check_choice("norm_kind", self.norm_kind, NORM_KINDS)
        check_choice("init_scale", self.init_scale, INIT_SCALES)
        if self.pre_norm_scale != "none" and not self.pre_norm:
            raise ValueError("PlacementRule: pre_norm_scale scales the pre-norm; set pre_norm.")


PRE_NORM_SCALES = ("none", "inv_sqrt_depth")
NORM_KINDS = ("model", "dyt")
INIT_SCALES = ("none", "deepnorm_beta")

# The one table of placements. "post" is exactly Xiong et al.'s Post-LN, LN(x + F(x)); a norm on
# the branch output is "sandwich", never "post".
PLACEMENTS: dict[str, PlacementRule] = {
    "post": PlacementRule(post_norm=True),
    "pre": PlacementRule(pre_norm=True, final_norm=True),
    # Liu et al. 2020 (Admin): LN(x * omega + F(x)), omega profiled or closed form.
    "admin": PlacementRule(post_norm=True, skip="omega"),
    # Wang et al. 2022 (DeepNet): LN(alpha x + F(x)), alpha = (2N)^(1/4); beta-scaled init.
    "deepnorm": PlacementRule(post_norm=True, skip="alpha", init_scale="deepnorm_beta"),
    # DeepNorm's two changes apart: the alpha skip alone (plain init), and Post-LN with only
    # the beta init scaling (which of them keeps DeepNorm out of the collapse).
    "deepnorm_alpha": PlacementRule(post_norm=True, skip="alpha"),
    "deepnorm_beta": PlacementRule(post_norm=True, init_scale="deepnorm_beta"),
    # Peri-LN: x + LN(F(LN(x))), then a final LN.
    "sandwich": PlacementRule(pre_norm=True, branch_norm=True, final_norm=True),
    # Bachlechner et al. 2020 (ReZero): x + alpha F(x), alpha learned from 0, no norm at all.
    "rezero": PlacementRule(branch_gate=True),
    # OLMo 2's reordered norm: x + LN(F(x)), no input norm, then a final LN.
    "olmo2": PlacementRule(branch_norm=True, final_norm=True),
    # LayerNorm Scaling (Curse of Depth 2025): x + F(LN(x) / sqrt(l)) in layer l (1-based).
    "lns": PlacementRule(pre_norm=True, final_norm=True, pre_norm_scale="inv_sqrt_depth"),
    # Zhu et al. 2025 (DyT): Pre-LN with every norm gamma * tanh(alpha x) + beta, alpha from 0.5.
    "dyt": PlacementRule(pre_norm=True, final_norm=True, norm_kind="dyt"),
}

# nGPT (Loshchilov et al. 2025) is not a row: its residual step Norm(h + a * (Norm(F(h)) - h)) would
# fit the table, but the rest of it does not: every weight matrix is renormalised to the unit
# sphere after each optimizer update (a projection in the train step), and the sub-layers change
# inside (s_qk on normalised q and k with softmax scale sqrt(d_k), s_u and s_v in the FFN, s_z on
# the logits, normalised embeddings). A row with only the residual step would be misnamed.
NOT_ROWS = {
    "ngpt": "nGPT is not available: besides its residual step Norm(h + a*(Norm(F(h)) - h)) it "
    "renormalises every weight matrix after each optimizer update and rescales q/k, the FFN and "
    "the logits inside the sub-layers, which the placement table cannot express (docs/library.md). "
    "Closest rows: 'olmo2' (normalised branch output) or 'pre'."
}


def parse_placement(placement: str | tuple[str, ...], num_layers: int) -> tuple[str, ...]:
    """The placement name of each layer, from one name or a per-layer list.

    Args:
      placement: a name from `PLACEMENTS`, a tuple of names (one per layer), or a string of
        comma-separated items `name` or `name*count`, e.g. "post*3,pre*9" (Mix-LN). "mixln" is
        Mix-LN's rule: Post-LN for the first quarter of the layers (rounded down), Pre-LN after.
      num_layers: layers of the encoder; a list must name exactly that many.

    Returns:
      A tuple of `num_layers` names from `PLACEMENTS`.
    """
    if placement == "mixln":
        return _mixln(num_layers)
    items = placement if isinstance(placement, tuple) else tuple(placement.split(","))
    names: list[str] = []
    for item in items:
        name, _, count = item.strip().partition("*")
        if name in NOT_ROWS:
            raise ValueError(f"model.placement={name!r}: {NOT_ROWS[name]}")
        whole = "model.placement" if len(items) == 1 and not count else None  # fixable
        check_choice("model.placement", name, (*PLACEMENTS, "mixln"), config_field=whole)
        if name == "mixln":  # a rule for the whole stack, not one layer's placement
            raise ValueError(
                f"model.placement={placement!r}: 'mixln' names the whole stack's rule and "
                "cannot be an item of a per-layer list; give it alone, or list the layers "
                "(e.g. 'post*3,pre*9')."
            )
        if count and not (count.strip().isdigit() and int(count) > 0):
            raise ValueError(
                f"placement item {item.strip()!r}: the count after '*' must be a positive "
                f"integer (e.g. 'post*3,pre*9')."
            )
        names.extend([name] * (int(count) if count else 1))
    if len(names) == 1:
        return tuple(names) * num_layers
    if len(names) != num_layers:
        raise ValueError(
            f"model.placement={placement!r} names {len(names)} layers but model.num_layers="
            f"{num_layers}; give one name, or one per layer (e.g. 'post*3,pre*9')."
        )
    return tuple(names)


def _mixln(num_layers: int) -> tuple[str, ...]:
    """Mix-LN: Post-LN for the first num_layers // 4 layers, Pre-LN after.

    Raises:
      ConfigError: under 4 layers, where no layer would be Post-LN: the model would be Pre-LN
        under another name (a comparison of "mixln" with "pre" would compare one model twice).
    """
    quarter = num_layers // 4
    if quarter == 0:
        raise ConfigError(
            f"model.placement='mixln' on {num_layers} layer(s) is plain Pre-LN (Mix-LN makes "
            f"the first num_layers // 4 = 0 layers Post-LN); give 4 or more layers, list the "
            "layers (e.g. 'post,pre'), or say --config.model.placement=pre.",
            fix=Fix(set={"--config.model.placement": "pre"}),
        )
    return ("post",) * quarter + ("pre",) * (num_layers - quarter)
