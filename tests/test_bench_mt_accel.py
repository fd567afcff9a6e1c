"""bench/bench_mt_accel.py's counted FLOPs: the formula of its docstring, checked against XLA's
own count of the same forward pass on the CPU (where XLA's cost analysis sees every dot)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from bench import bench_mt_accel
from ln_jax import sharding
from ln_jax.models.translation.task import Translation


def test_counted_flops_match_xla_on_the_forward_pass():
    cfg = bench_mt_accel.build_config("configs/mt.py:tiny", "float32")
    rows, length = 2, 16
    with sharding.use_mesh(sharding.single_device_mesh()):
        model = Translation(cfg).build(nnx.Rngs(params=0))
        graphdef, state = nnx.split(model)
        ids = jnp.full((rows, length), 5, jnp.int32)
        mask = jnp.ones((rows, length), jnp.int32)

        def forward(state, src, mask, tgt):
            m = nnx.merge(graphdef, state)
            return m(src, mask, tgt)["logits"]

        cost = jax.jit(forward).lower(state, ids, mask, ids).compile().cost_analysis()
    xla = cost["flops"] if isinstance(cost, dict) else cost[0]["flops"]
    counted = bench_mt_accel.step_flops(cfg, rows, length) / 3.0
    # XLA also counts the softmaxes, norms and biases (a few % at this width), no more
    assert counted == pytest.approx(xla, rel=0.05)
    assert counted < xla
