"""`model.activation_layout`: pinning the residual stream's memory layout (8 CPU devices).

The pin is a GPU performance experiment (issue 34); what must hold everywhere is that it
changes no value, that it really reaches the compiled step (forward and backward), and that a
wrong value is refused by name.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bench.speed import accel_step
from configs import bert_preln
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.task import make_task
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
    c.data.max_seq_length, c.bert.max_predictions_per_seq = s["seq"], s["predictions"]
    c.data.global_batch_size = s["batch"]
    return TrainConfig.from_mapping(c.to_dict())


def _lowered(layout: str, scan: bool, mesh) -> tuple[object, tuple]:
    """(lowered train step, its arguments) of the trainer's step on a synthetic batch."""
    cfg = _config(layout, scan)
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    train, _ = steps.jit_steps(cfg, task, mesh, pieces)
    args = (pieces.state, pieces.rest, accel_step.fixed_batch(SHAPE, mesh))
    with sharding.use_mesh(mesh):
        return train.lower(*args), args


def _pins(lowered) -> int:
    return lowered.as_text().count("@LayoutConstraint")


def test_the_row_major_stream_trains_exactly_as_xla_s_layouts_on_a_2x2x2_mesh():
    """One real step with dropout on: the same loss, gradient norm and updated parameters."""
    mesh = sharding.make_mesh(2, 2, 2)
    out = {}
    for layout in ("xla", "row_major"):
        lowered, args = _lowered(layout, False, mesh)
        state, metrics = lowered.compile()(*args)
        out[layout] = (jax.device_get(state["params"]), jax.device_get(metrics), _pins(lowered))
    (p_xla, m_xla, pins_xla), (p_pin, m_pin, pins) = out["xla"], out["row_major"]
    # The pin reaches the program: the embeddings' output and each of the 2 x 2 sub-layers'
    # outputs in the forward pass, and their cotangents in the backward one; none without it.
    assert pins_xla == 0 and pins == 2 * (1 + 2 * SHAPE["layers"]), pins
    assert np.isfinite(m_xla["loss"])
    np.testing.assert_allclose(m_pin["loss"], m_xla["loss"], rtol=1e-6)
    np.testing.assert_allclose(m_pin["grad_norm"], m_xla["grad_norm"], rtol=1e-5)
    flat_xla, flat_pin = jax.tree.leaves(p_xla), jax.tree.leaves(p_pin)
    assert len(flat_xla) == len(flat_pin) > 10
    for a, b in zip(flat_xla, flat_pin, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_under_scan_layers_the_pin_is_in_the_scanned_body():
    """The scan's body holds the layers once: the embeddings' pin and the body's 2, forward
    and backward (lowered only: the values are the unscanned test's)."""
    lowered, _ = _lowered("row_major", True, sharding.make_mesh(2, 2, 2))
    assert _pins(lowered) == 2 * (1 + 2)


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
