"""`model.activation_layout`: pinning the residual stream's memory layout (8 CPU devices).

The pin is a GPU performance experiment (issue 34); what must hold everywhere is that it
changes no value, that it really reaches the compiled step (forward and backward), and that a
wrong value is refused by name.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bench import bench_accel
from configs import bert_preln
from ln_jax import sharding
from ln_jax.config import TrainConfig
from ln_jax.train import steps
from ln_jax.validate import ConfigError

SHAPE = dict(layers=2, d=32, heads=2, mlp=64, vocab=128, batch=8, seq=16, predictions=3)


def _config(layout: str, scan: bool) -> TrainConfig:
    c = bert_preln.get_config("tiny")
    s = SHAPE
    c.model.update(
        num_layers=s["layers"], hidden_size=s["d"], num_heads=s["heads"], mlp_dim=s["mlp"],
        vocab_size=s["vocab"], max_position_embeddings=s["seq"], scan_layers=scan,
        activation_layout=layout, attention_impl="xla", dtype="float32",
    )  # fmt: skip
    c.data.vocab_size = s["vocab"]
    c.data.max_seq_length, c.data.max_predictions_per_seq = s["seq"], s["predictions"]
    c.data.global_batch_size = s["batch"]
    return TrainConfig.from_mapping(c.to_dict())


def _step(layout: str, scan: bool, mesh) -> tuple[dict, dict, str]:
    """(new params, metrics, optimised HLO text) of one real train step with dropout on."""
    cfg = _config(layout, scan)
    pieces = steps.init_state(cfg, mesh)
    train, _ = steps.jit_steps(cfg, mesh, pieces)
    batch = bench_accel.fixed_batch(SHAPE, mesh)
    with sharding.use_mesh(mesh):
        lowered = train.lower(pieces.state, pieces.rest, batch)
        state, metrics = train(pieces.state, pieces.rest, batch)
    return jax.device_get(state["params"]), jax.device_get(metrics), lowered.as_text()


@pytest.mark.parametrize("scan", [False, True])
def test_the_row_major_stream_trains_exactly_as_xla_s_layouts_on_a_2x2x2_mesh(scan):
    mesh = sharding.make_mesh(2, 2, 2)
    p_auto, m_auto, text_auto = _step("xla", scan, mesh)
    p_pin, m_pin, text_pin = _step("row_major", scan, mesh)
    # The pin reaches the program: the embeddings' output and each sub-layer's output in the
    # forward pass, and their cotangents in the backward one (the scan's body holds the
    # layers once); none without it.
    pins = text_pin.count("@LayoutConstraint")
    sublayers = 2 * (1 if scan else SHAPE["layers"])
    assert "@LayoutConstraint" not in text_auto
    assert pins == 2 * (1 + sublayers), pins
    # The same values: loss, gradient norm and every updated parameter.
    assert np.isfinite(m_auto["loss"])
    np.testing.assert_allclose(m_pin["loss"], m_auto["loss"], rtol=1e-6)
    np.testing.assert_allclose(m_pin["grad_norm"], m_auto["grad_norm"], rtol=1e-5)
    flat_auto = jax.tree.leaves(p_auto)
    flat_pin = jax.tree.leaves(p_pin)
    assert len(flat_auto) == len(flat_pin) > 10
    for a, b in zip(flat_auto, flat_pin, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_an_unknown_layout_is_refused_by_name():
    with pytest.raises(ConfigError, match="activation_layout"):
        _config("column_major", False)
    with pytest.raises(ConfigError, match="row_major"), sharding.activation_layout("rowmajor"):
        pass


def test_the_pin_applies_only_to_the_residual_stream_and_only_inside_the_context():
    x = np.ones((2, 3, 4), np.float32)

    def pins(names) -> int:  # a new function each time: jit's cache keys ignore the context
        return (
            jax.jit(lambda v: sharding.constrain(v, names) * 2)
            .lower(x)
            .as_text()
            .count("@LayoutConstraint")
        )

    other = ("act_batch", "act_length", "act_mlp")
    assert pins(sharding.ACT) == 0
    with sharding.activation_layout("row_major"):
        assert pins(sharding.ACT) == 1 and pins(other) == 0
    with sharding.activation_layout("xla"):
        assert pins(sharding.ACT) == 0
