"""Position-wise work on the real tokens only (`ln_jax.nn.tokens`, translation's
`translation.skip_padding`): the same values and gradients as computing every position,
chunks past the real tokens really skipped, the option resolved and checked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.config.run import ModelConfig
from ln_jax.models.translation.model import Translator
from ln_jax.models.translation.options import TranslationOptions
from ln_jax.nn.tokens import TokenLayout


def _mask(rows: int, length: int, seed: int = 0, low: int = 2) -> np.ndarray:
    lengths = np.random.default_rng(seed).integers(low, length, rows)
    return (np.arange(length)[None] < lengths[:, None]).astype(np.int32)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_apply_equals_fn_on_real_tokens_with_gradients(groups):
    mask = _mask(8, 24)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(8, 24, 6)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    layout = TokenLayout.of(jnp.asarray(mask), groups, chunk=8)
    real = mask[..., None] > 0

    def loss(w, x, packed):
        fn = lambda t: jnp.tanh(t @ w)
        y = layout.apply(fn, x) if packed else fn(x)
        return jnp.sum(jnp.where(real, y, 0.0) ** 2), y

    (a, ya), ga = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(w, x, True)
    (b, yb), gb = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(w, x, False)
    np.testing.assert_allclose(np.where(real, ya, 0), np.where(real, yb, 0), atol=1e-6)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(ga[0], gb[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ga[1], gb[1], rtol=1e-5, atol=1e-5)


def test_chunks_past_the_real_tokens_are_skipped():
    """fn(x) = x + 1 everywhere it runs: the padded positions of computed chunks get it, those
    of skipped chunks keep zeros; the count is the largest group's."""
    mask = np.zeros((4, 8), np.int32)
    mask[0, :8] = mask[1, :8] = mask[2, :5] = 1  # 21 real of 32 positions, one group
    layout = TokenLayout.of(jnp.asarray(mask), 1, chunk=4)
    assert int(layout.count) == 21
    y = np.asarray(layout.apply(lambda t: t + 1.0, jnp.zeros((4, 8, 1))))[..., 0]
    assert (y[mask > 0] == 1.0).all()
    # 8 chunks of 4 packed positions: 0-3 run unconditionally, 4 (positions 16-19) and 5
    # (20-23, holding the 21st real token) run, 6 and 7 are skipped: 24 positions hold 1.
    assert int((y == 1.0).sum()) == 24
    by_group = TokenLayout.of(jnp.asarray(mask), 2, chunk=4)
    assert int(by_group.count) == 16  # rows 0-1: 16 real tokens; rows 2-3: 5


def _model(skip: str, dropout: float = 0.1, **kw) -> Translator:
    cfg = ModelConfig(
        size="custom", vocab_size=21, hidden_size=16, num_heads=2, mlp_dim=32, num_layers=2,
        hidden_dropout=dropout, attention_dropout=dropout, init="xavier", activation="relu",
        max_position_embeddings=80, embedding_layernorm=False, **kw,
    )  # fmt: skip
    opts = TranslationOptions.from_mapping({"skip_padding": skip}, cfg)
    return Translator(cfg, opts, rngs=nnx.Rngs(params=0))


def _batch(rows=6, length=12):
    rng = np.random.default_rng(3)
    src_mask, tgt_mask = _mask(rows, length, 4), _mask(rows, length, 5)
    src = np.where(src_mask > 0, rng.integers(4, 21, (rows, length)), 0)
    tgt_out = np.where(tgt_mask > 0, rng.integers(4, 21, (rows, length)), 0)
    tgt_in = np.where(tgt_mask > 0, np.concatenate([np.full((rows, 1), 2), tgt_out[:, :-1]], 1), 0)
    arrays = dict(src=src, src_mask=src_mask, tgt_in=tgt_in, tgt_out=tgt_out, tgt_mask=tgt_mask)
    return {
        k: jnp.asarray(v, jnp.float32 if k == "tgt_mask" else jnp.int32) for k, v in arrays.items()
    }


@pytest.mark.parametrize("stack", [{}, {"scan_layers": True, "remat": "full"}])
def test_translator_loss_and_gradients_equal_with_and_without_skipping(stack, dropout=0.1):
    """Dropout sits outside the skipped projections, so even its masks are the same; layers
    as a list, and scanned under remat (the loop's custom VJP inside both transforms)."""
    b = _batch()
    key = jax.random.key(7)
    results = {}
    with sharding.use_mesh(sharding.single_device_mesh()):
        for skip in ("on", "off"):
            model = _model(skip, dropout, **stack)
            assert model.skip_padding == (skip == "on")

            def loss(model):
                h = model(b["src"], b["src_mask"], b["tgt_in"], dropout_key=key, hidden=True)
                return model.loss_sums(h["hidden"], b["tgt_out"], b["tgt_mask"], 0.1)[0]

            value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
            results[skip] = (value, jax.tree.leaves(nnx.state(grads, nnx.Param)))
    np.testing.assert_allclose(results["on"][0], results["off"][0], rtol=1e-5)
    for a, c in zip(results["on"][1], results["off"][1], strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)
    assert float(results["on"][0]) > 0


def test_skip_padding_resolves_and_rejects_unknown_values():
    cfg = ModelConfig(
        size="custom", vocab_size=21, hidden_size=16, num_heads=2, mlp_dim=32,
        max_position_embeddings=80,
    )  # fmt: skip
    assert TranslationOptions.from_mapping({}, cfg).skip_padding == "on"  # the CPU's choice
    assert TranslationOptions.from_mapping({"skip_padding": "off"}, cfg).skip_padding == "off"
    with pytest.raises(ValueError, match="skip_padding.*'sometimes'.*auto"):
        TranslationOptions.from_mapping({"skip_padding": "sometimes"}, cfg)


def test_the_resolved_value_is_in_the_config():
    from configs import mt
    from ln_jax.config.load import build_config

    values = mt.get_config("tiny").to_dict()
    assert build_config(values).options.skip_padding == "on"
    values["translation"]["skip_padding"] = "off"
    assert build_config(values).options.skip_padding == "off"
