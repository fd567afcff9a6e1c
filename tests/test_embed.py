"""The one embedding module (ln_jax/nn/embed.py): the parameter paths checkpoints and converters
rely on, their logical axes, and its values against the formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.config.load import build_config, load_config, override
from ln_jax.nn.embed import Embed, sinusoidal
from ln_jax.task import make_task


def _params(config: str, **extra) -> dict[str, tuple]:
    """{path: (shape, logical axes)} of the embedding parameters of the config's model."""
    task = make_task(build_config(override(load_config(config), extra)))
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: task.build(nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {
        "/".join(map(str, p)): (
            tuple(v.shape),
            tuple(getattr(v, "out_sharding", None) or v.sharding_names),
        )
        for p, v in flat
        if "emb" in str(p[:2])
    }


def test_the_families_embeddings_keep_their_parameter_paths_and_axes():
    bert = _params("configs/bert_preln.py:tiny")
    assert {k: axes for k, (_, axes) in bert.items()} == {
        "bert/embeddings/word": ("vocab", "embed"),
        "bert/embeddings/position": ("position", "embed"),
        "bert/embeddings/segment": ("segment", "embed"),
        "bert/embeddings/norm/scale": ("embed",),
        "bert/embeddings/norm/bias": ("embed",),
    }
    mt = _params("configs/mt.py:tiny")  # sinusoidal positions: no table
    assert {k: axes for k, (_, axes) in mt.items()} == {"embed/word": ("vocab", "embed")}
    learned = _params("configs/mt.py:tiny", **{"translation.positions": "learned"})
    assert learned["embed/position"][1] == ("position", "embed")


def test_embed_is_scaled_tokens_plus_positions_plus_types():
    cfg = build_config(load_config("configs/bert_preln.py:tiny")).model
    cfg = cfg.replace(hidden_dropout=0.0, embedding_layernorm=False)
    ids = jnp.array([[5, 7, 9], [1, 2, 3]])
    types = jnp.array([[0, 1, 1], [1, 0, 0]])
    with nnx.use_eager_sharding(False):
        learned = Embed(cfg, rngs=nnx.Rngs(0), types=2)
        sines = Embed(cfg, rngs=nnx.Rngs(0), positions="sinusoidal", scale=2.0, pad_id=0)
    want = learned.word[...][ids] + learned.position[...][:3] + learned.segment[...][types]
    np.testing.assert_allclose(learned(ids, types), want, rtol=1e-6)
    assert sines.position is None and sines.segment is None
    assert not np.any(np.asarray(sines.word[...][0]))  # the pad row starts at zero
    d = cfg.hidden_size
    want = 2.0 * sines.word[...][ids] + sinusoidal(3, d, 4)[None]
    np.testing.assert_allclose(sines(ids, offset=jnp.int32(4)), want, rtol=1e-6, atol=1e-6)
    assert jax.tree.leaves(nnx.state(sines, nnx.Param))  # word only
