"""Xiong et al. (2020) Lemma 2: the expected squared norm of hidden states at initialisation.

Lemma 2 says E||x^{post,5}_l||^2 = 3/2 d for Post-LN, where x^{post,5}_l = x^{post,3}_l + FFN(...)
is layer l's FFN residual sum before its LayerNorm (ln_jax: the FFN sub-layer's
`post_norm_in`), and that the Pre-LN residual stream grows linearly:
(1 + l/2) d <= E||x^{pre}_l||^2 <= (1 + 3l/2) d.

Index convention: here l counts the layers applied, so x^{pre}_0 is the encoder input
(E||x||^2 = d: Gaussian N(0, I) inputs, or LayerNorm-ed embeddings) and x^{pre}_l, l >= 1, is
the output of layer l (ln_jax: `layer_in` of layer l+1, or `final_norm_in` for l = L). The
paper's proof (Appendix C) shows d/2 <= E||x_{l+1}||^2 - E||x_l||^2 <= 3d/2 per layer from an
input of norm^2 d, which gives the stated interval exactly in this convention. Post-LN layers
are numbered l = 1..L.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ln_jax.analysis.models import (
    AnyModel,
    Batch,
    all_arms,
    checkpoint_info,
    encode,
    instances,
    jit_model_fn,
    real_tokens,
    take_batches,
)
from ln_jax.analysis.settings import (
    SETTINGS,
    Arm,
    Settings,
    check_placements,
    describe,
    one_depth,
)
from ln_jax.analysis.stats import seed_mean_std
from ln_jax.validate import check_choice


def _token_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """values [..., batch, length], mask [batch, length] -> mean over real tokens [...]."""
    m = mask.astype(values.dtype)
    return (values * m).sum((-2, -1)) / m.sum()


def squared_norms(model: AnyModel, batch: Batch) -> dict[str, jax.Array]:
    """Mean over real tokens of ||x||^2 on one batch.

    Returns:
      {"stream": [L + 1] (l = 0..L, the residual stream after l layers, before any final
       norm), "post5": [L] (l = 1..L, the FFN sub-layer's sum before its post-norm; NaN for
       layers without a post-norm)}.
    """
    hidden, rec = encode(model, batch, record=True)
    mask = real_tokens(batch)
    sq = lambda a: jnp.square(a.astype(jnp.float32)).sum(-1)
    last = rec.get("final_norm_in", hidden)  # the stream before the final norm
    stream = jnp.concatenate([sq(rec["layer_in"]), sq(last)[None]])
    num_layers = rec["layer_in"].shape[0]
    post5 = rec.get("ffn/post_norm_in")
    post5 = sq(post5) if post5 is not None else jnp.full((num_layers,) + mask.shape, jnp.nan)
    return {"stream": _token_mean(stream, mask), "post5": _token_mean(post5, mask)}


def prediction(d: int, num_layers: int) -> dict[str, Any]:
    """Lemma 2's values: 1.5 d for x^{post,5}_l; [(1 + l/2) d, (1 + 3l/2) d] for l = 0..L."""
    layers = np.arange(num_layers + 1)
    return {
        "post5": 1.5 * d,
        "stream_lower": (1 + layers / 2) * d,
        "stream_upper": (1 + 3 * layers / 2) * d,
    }


def _lemma2_arm(settings: Settings, arm: Arm, fn) -> dict[str, Any]:
    batches = take_batches(settings, arm, settings.batches)
    values = [
        [jax.device_get(fn(model, b)) for b in batches]
        for _, model in instances(settings, arm, batches[0])
    ]
    out = {
        key: seed_mean_std([[v[key] for v in per_model] for per_model in values])
        for key in ("stream", "post5")
    }
    out["hidden_size"] = arm.model.hidden_size
    out["placement"] = arm.model.placement
    return out


def lemma2(
    settings: Settings,
    placements: Sequence[str] = ("post", "pre"),
    num_layers: int | Sequence[int] = 12,
    setting_names: Sequence[str] = ("theory", "bert"),
) -> dict[str, Any]:
    """Xiong et al. Lemma 2, measured beside its prediction in each setting.

    Every model is measured on `settings.batches` mini-batches (the theory setting's Gaussian
    inputs, or BERT batches); mean and std over seeds. A checkpoint is measured in the bert
    setting only.

    Returns:
      {"results": {setting: {arm: {"stream": {"mean": [L+1], "std": ...}, "post5":
       {"mean": [L], ...}, "hidden_size": d}, "prediction": {...}}}, "config": {setting: ...}}.
    """
    depth = one_depth(num_layers)
    names = check_placements(placements)
    fn = jit_model_fn(squared_norms)
    out: dict[str, Any] = {"measurement": "E||x||^2 per layer (Xiong et al. Lemma 2)"}
    out["index"] = "stream: l = layers applied, 0 = encoder input; post5: layer l = 1..L"
    out["results"], out["config"] = {}, {}
    for name in setting_names:
        check_choice("setting", name, SETTINGS)
    for name in setting_names:
        ckpt = settings.checkpoint if name == "bert" else None
        s = settings.replace(setting=name, checkpoint=ckpt)
        result = {arm.label: _lemma2_arm(s, arm, fn) for arm in all_arms(s, names, depth)}
        result["prediction"] = prediction(s.config.model.hidden_size, depth)
        out["results"][name] = result
        out["config"][name] = describe(s, num_layers=depth, checkpoint_arm=checkpoint_info(s))
    return out
