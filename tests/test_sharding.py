"""Sharding: logical axes on every parameter, created sharded on a 2x2x2 mesh, mesh errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ln_jax
from ln_jax import sharding

CFG = ln_jax.ModelConfig(
    size="custom",
    vocab_size=24,
    hidden_size=12,
    num_heads=2,
    mlp_dim=20,
    num_layers=2,
    max_position_embeddings=16,
)


def _params(model):
    return list(nnx.to_flat_state(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axes(scan):
    model = ln_jax.create_model(CFG.replace(scan_layers=scan))
    known = {name for name, _ in sharding.DEFAULT_RULES}
    for path, var in _params(model):
        names = var.get_metadata().get("out_sharding")
        assert names is not None, f"{path} has no logical axes"
        assert len(names) == var[...].ndim, path
        assert set(names) <= known, (path, names)
        if scan and "layers" in path:
            assert names[0] == "layers"


@pytest.mark.parametrize("scan", [False, True])
def test_parameters_are_created_sharded_as_the_rules_say(scan):
    mesh = sharding.make_mesh(2, 2, 2)
    model = ln_jax.create_model(CFG.replace(scan_layers=scan), mesh=mesh)
    rules = dict(sharding.DEFAULT_RULES)
    for path, var in _params(model):
        value = var[...]
        names = var.get_metadata()["out_sharding"]
        spec = value.sharding.spec
        want = sharding.param_spec(names, value.shape, mesh)
        assert value.sharding.is_equivalent_to(NamedSharding(mesh, want), value.ndim), path
        padded = tuple(spec) + (None,) * (value.ndim - len(spec))
        for name, axes in zip(names, padded, strict=True):
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            if rules[name] is not None and not isinstance(rules[name], tuple):
                # the rule's axis is used unless another dimension took it first
                assert rules[name] in axes or rules[name] in str(spec), (path, name, spec)
        # Each device holds only its block, never the whole array.
        held = {s.data.size for s in value.addressable_shards}
        split = np.prod([mesh.shape[a] for a in jax.tree.leaves(tuple(spec))], dtype=int)
        assert held == {value.size // split}, path
    word = model.bert.embeddings.word[...]
    assert word.addressable_shards[0].data.shape == (12, 6)  # vocab/tensor, embed/fsdp


def test_fsdp_splits_every_parameter_zero3_style():
    mesh = sharding.make_mesh(1, 8, 1)
    model = ln_jax.create_model(CFG.replace(hidden_size=16, mlp_dim=24), mesh=mesh)
    params = nnx.state(model, nnx.Param)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    held = sharding.bytes_per_device(params)
    assert len(held) == 8
    # Only the 2-element NSP bias cannot be split 8 ways.
    assert max(held.values()) <= total / 8 + 2 * 4 * 7 / 8 + 1
    same = lambda a, b, nd: NamedSharding(mesh, a).is_equivalent_to(NamedSharding(mesh, b), nd)
    assert same(sharding.param_spec(("mlp",), (24,), mesh), P("fsdp"), 1)
    # Neither dimension divides by 8: replicated rather than an error.
    assert same(sharding.param_spec(("vocab", "embed"), (23, 12), mesh), P(), 2)


def test_sharded_forward_and_gradients_match_single_device():
    mesh = sharding.make_mesh(2, 2, 2)
    single = ln_jax.create_model(CFG, seed=3)
    sharded = ln_jax.create_model(CFG, seed=3, mesh=mesh)
    for (_, a), (_, b) in zip(_params(single), _params(sharded), strict=True):
        np.testing.assert_allclose(a[...], b[...], atol=1e-7)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 24, (8, 10)).astype(np.int32)
    pos = rng.integers(0, 10, (8, 3)).astype(np.int32)

    def loss_and_grad(model, shard_batch):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss(p, ids, pos):
            out = nnx.merge(graphdef, p, rest)(ids, None, None, pos)
            return jnp.mean(out["mlm_logits"] ** 2) + jnp.mean(out["nsp_logits"] ** 2)

        args = (ids, pos)
        if shard_batch:
            args = jax.device_put(args, sharding.batch_sharding(mesh))
        return jax.jit(jax.value_and_grad(loss))(params, *args)

    l1, g1 = loss_and_grad(single, False)
    with sharding.use_mesh(mesh):
        l2, g2 = loss_and_grad(sharded, True)
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_mesh_shape_resolution_and_errors():
    assert sharding.resolve_mesh_shape(-1, 2, 2, 8) == (2, 2, 2)
    assert sharding.resolve_mesh_shape(1, 8, 1, 8) == (1, 8, 1)
    with pytest.raises(ValueError, match="needs 12 devices but 8 are available"):
        sharding.resolve_mesh_shape(3, 2, 2, 8)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        sharding.resolve_mesh_shape(-1, -1, 2, 8)
    with pytest.raises(ValueError, match="does not divide 8"):
        sharding.resolve_mesh_shape(-1, 3, 1, 8)
    assert sharding.make_mesh(-1, 2, 1).shape == {"data": 4, "fsdp": 2, "tensor": 1}
