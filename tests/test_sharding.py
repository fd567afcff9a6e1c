"""Sharding: logical axes on every parameter, created sharded on a 2x2x2 mesh, mesh errors."""

from __future__ import annotations

import math

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


@pytest.mark.parametrize(
    "scan, extra", [(False, {}), (True, {}), (True, {"placement": "dyt", "qk_norm": True})]
)
def test_every_parameter_has_logical_axes(scan, extra):
    model = ln_jax.create_model(CFG.replace(scan_layers=scan, **extra))
    known = {name for name, _ in sharding.DEFAULT_RULES} | {None}  # None: replicated
    for path, var in _params(model):
        names = var.get_metadata().get("out_sharding")
        assert names is not None, f"{path} has no logical axes"
        assert len(names) == var[...].ndim, path
        assert set(names) <= known, (path, names)
        if scan and "layers" in path:
            assert names[0] == "layers"


# The PartitionSpec of every parameter of CFG on the 2x2x2 (data, fsdp, tensor) mesh, worked out
# by hand from DEFAULT_RULES (vocab, embed_proj, mlp, heads -> tensor; embed -> fsdp) and the
# ZeRO-3 rule (a parameter that does not use fsdp yet is split over it along its largest
# dimension that still divides). Encoder-layer paths drop the layer index.
TENSOR_FSDP = ("tensor", "fsdp")
SPECS_2X2X2 = {
    "bert/embeddings/norm/bias": ("fsdp",),
    "bert/embeddings/norm/scale": ("fsdp",),
    "bert/embeddings/position": (None, "fsdp"),
    "bert/embeddings/segment": (None, "fsdp"),
    "bert/embeddings/word": ("tensor", "fsdp"),
    "bert/encoder/final_norm/bias": ("fsdp",),
    "bert/encoder/final_norm/scale": ("fsdp",),
    # [heads=2, kv=6]: heads take tensor; 2 does not divide by tensor x fsdp, so kv takes fsdp
    "layers/attention/branch/key/bias": ("tensor", "fsdp"),
    "layers/attention/branch/key/kernel": ("fsdp", "tensor", None),
    "layers/attention/branch/out/bias": ("fsdp",),
    "layers/attention/branch/out/kernel": ("tensor", None, "fsdp"),
    "layers/attention/branch/query/bias": ("tensor", "fsdp"),
    "layers/attention/branch/query/kernel": ("fsdp", "tensor", None),
    "layers/attention/branch/value/bias": ("tensor", "fsdp"),
    "layers/attention/branch/value/kernel": ("fsdp", "tensor", None),
    "layers/attention/pre_norm/bias": ("fsdp",),
    "layers/attention/pre_norm/scale": ("fsdp",),
    "layers/ffn/branch/wi/bias": (TENSOR_FSDP,),  # [mlp=20]: tensor, then fsdp (20 % 4 == 0)
    "layers/ffn/branch/wi/kernel": ("fsdp", "tensor"),
    "layers/ffn/branch/wo/bias": ("fsdp",),
    "layers/ffn/branch/wo/kernel": ("tensor", "fsdp"),
    "layers/ffn/pre_norm/bias": ("fsdp",),
    "layers/ffn/pre_norm/scale": ("fsdp",),
    "mlm/bias": (TENSOR_FSDP,),
    "mlm/norm/bias": (TENSOR_FSDP,),
    "mlm/norm/scale": (TENSOR_FSDP,),
    "mlm/transform/bias": (TENSOR_FSDP,),
    "mlm/transform/kernel": ("fsdp", "tensor"),
    "nsp/classifier/bias": ("fsdp",),  # classes -> None; 2 % fsdp == 0
    "nsp/classifier/kernel": (TENSOR_FSDP, None),  # fsdp joins the larger dimension (12 > 2)
    "nsp/pooler/bias": (TENSOR_FSDP,),
    "nsp/pooler/kernel": ("fsdp", "tensor"),
}


def _mesh_axes(spec: P, ndim: int) -> tuple:
    """A spec as one entry per dimension: None, an axis name, or a tuple of several names."""
    padded = tuple(spec) + (None,) * (ndim - len(spec))
    one = lambda a: a[0] if isinstance(a, tuple) and len(a) == 1 else (a or None)
    return tuple(one(a) for a in padded)


def _table_key(path: tuple) -> tuple[str, bool]:
    """(key into SPECS_2X2X2, whether the parameter belongs to an encoder layer)."""
    parts = [str(p) for p in path]
    if "layers" not in parts:
        return "/".join(parts), False
    rest = parts[parts.index("layers") + 1 :]
    return "/".join(["layers"] + [p for p in rest if not p.isdigit()]), True


@pytest.mark.parametrize("scan", [False, True])
def test_parameters_are_created_sharded_as_the_rules_say(scan):
    mesh = sharding.make_mesh(2, 2, 2)
    model = ln_jax.create_model(CFG.replace(scan_layers=scan), mesh=mesh)
    seen = set()
    for path, var in _params(model):
        value = var[...]
        key, in_layer = _table_key(path)
        want = SPECS_2X2X2[key]
        if scan and in_layer:  # the stacked [layers=2] dimension is never the largest: unsplit
            want = (None, *want)
        assert _mesh_axes(value.sharding.spec, value.ndim) == want, (path, value.sharding.spec)
        assert value.sharding.mesh == mesh, path
        seen.add(key)
        # Each device holds only its block, never the whole array.
        split = lambda ax: math.prod(mesh.shape[a] for a in ((ax,) if isinstance(ax, str) else ax))
        block = tuple(n // split(ax or ()) for n, ax in zip(value.shape, want, strict=True))
        assert {s.data.shape for s in value.addressable_shards} == {block}, path
    assert seen == set(SPECS_2X2X2)  # every parameter met its row of the table
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
    # By hand: tensor (size 1) still takes its rule's dimension; fsdp=8 then joins the largest
    # dimension that divides by 8, or none (the 2-element NSP bias stays replicated).
    want = {
        "bert/embeddings/word": ("tensor", "fsdp"),  # [24, 16]
        "bert/embeddings/position": (None, "fsdp"),  # [16, 16]
        "bert/embeddings/norm/scale": ("fsdp",),  # [16]
        "bert/encoder/layers/0/attention/branch/key/bias": ("tensor", "fsdp"),  # [2, 8]
        "bert/encoder/layers/1/attention/branch/query/kernel": ("fsdp", "tensor", None),
        "bert/encoder/layers/0/attention/branch/out/kernel": ("tensor", None, "fsdp"),
        "bert/encoder/layers/0/ffn/branch/wi/bias": (TENSOR_FSDP,),  # [24]
        "bert/encoder/layers/0/ffn/branch/wi/kernel": ("fsdp", "tensor"),
        "bert/encoder/layers/1/ffn/branch/wo/kernel": ("tensor", "fsdp"),
        "mlm/bias": (TENSOR_FSDP,),  # [24]
        "nsp/classifier/kernel": (TENSOR_FSDP, None),  # [16, 2]
        "nsp/classifier/bias": (None,),  # [2]
    }
    specs = {
        "/".join(map(str, path)): _mesh_axes(var[...].sharding.spec, var[...].ndim)
        for path, var in _params(model)
    }
    assert {name: specs[name] for name in want} == want
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


class _BackendCompiles:
    """Counts XLA compilations (JAX's backend-compile events) inside a `with` block."""

    def __enter__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        return self

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._on_event)


@pytest.mark.parametrize("on_mesh", [False, True], ids=["unsharded", "2x2x2"])
def test_create_model_compiles_once_per_config(on_mesh):
    """Another seed reuses the compiled initialisers and gives other values; the same seed
    gives the same values."""
    cfg = CFG.replace(num_layers=1, vocab_size=32)  # a config no other test builds
    mesh = sharding.make_mesh(2, 2, 2) if on_mesh else None
    values = lambda m: [np.asarray(v[...]) for _, v in _params(m)]
    with _BackendCompiles() as first:
        seed0 = values(ln_jax.create_model(cfg, seed=0, mesh=mesh))
    with _BackendCompiles() as again:
        model1 = ln_jax.create_model(cfg, seed=1, mesh=mesh)
        model0 = ln_jax.create_model(cfg, seed=0, mesh=mesh)
    assert first.count >= 1  # the counter sees the first compilation
    assert again.count == 0
    seed1 = values(model1)
    drawn = [i for i, a in enumerate(seed0) if np.ptp(a) > 0]  # not a constant init (0 or 1)
    assert len(drawn) >= 10 and all(not np.array_equal(seed0[i], seed1[i]) for i in drawn)
    for a, b in zip(seed0, values(model0), strict=True):
        np.testing.assert_array_equal(a, b)
    if on_mesh:
        word = model1.bert.embeddings.word[...]
        assert _mesh_axes(word.sharding.spec, 2) == ("tensor", "fsdp")


def test_initialisers_equal_the_default_compilation_bit_for_bit():
    """create_model compiles its initialisers with cheaper XLA options on CPU; the values must
    be exactly those of a plain `jax.jit` with the defaults."""
    cfg = CFG.replace(num_layers=1, vocab_size=32)

    def build():
        return ln_jax.BertForPreTraining(cfg, rngs=nnx.Rngs(params=3))

    # XLA's defaults, whatever the test process's XLA_FLAGS say (tests/xla_env.py).
    defaults = {
        "xla_backend_optimization_level": 3,
        "xla_llvm_disable_expensive_passes": False,
        "xla_cpu_use_fusion_emitters": True,
    }
    with nnx.use_eager_sharding(False):
        want = jax.jit(
            lambda: nnx.to_pure_dict(nnx.state(build(), nnx.Param)), compiler_options=defaults
        )()
    got = nnx.to_pure_dict(nnx.state(ln_jax.create_model(cfg, seed=3), nnx.Param))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_mesh_axis_that_does_not_divide_a_dimension_is_named_once(caplog, monkeypatch):
    """tensor=8 on a width of 12, 2 heads and an MLP of 20: each stays whole on the tensor
    devices (the run works, not as split as asked), and the warning names each, with the
    sizes that would split it, once per process; on a 2x2x2 mesh every dimension splits and
    nothing is said."""
    monkeypatch.setattr(sharding, "_NOTICED", set())
    build = lambda: ln_jax.BertForPreTraining(CFG, rngs=nnx.Rngs(params=0))  # noqa: E731
    with caplog.at_level("WARNING", logger="ln_jax.sharding"):
        _, abstract = sharding.abstract_sharded(build, sharding.make_mesh(2, 2, 2))
        assert not caplog.records
        mesh = sharding.make_mesh(1, 1, 8)
        _, abstract = sharding.abstract_sharded(build, mesh)
        sharding.abstract_sharded(build, mesh)
    with nnx.use_eager_sharding(False):
        found = sharding.unsplit_dims(nnx.eval_shape(build), mesh)
    tensor = ("tensor",)
    assert found == {
        ("embed_proj", 12, tensor): 7,
        ("heads", 2, tensor): 14,
        ("mlp", 20, tensor): 6,
    }
    (record,) = caplog.records
    assert record.getMessage() == (
        "mesh.tensor=8 does not divide 'embed_proj' (12) of 7 parameters: that dimension stays "
        "whole (replicated) on those devices; tensor 2 or 4 would split it; "
        "mesh.tensor=8 does not divide 'heads' (2) of 14 parameters: that dimension stays "
        "whole (replicated) on those devices; tensor 2 would split it; mesh.tensor=8 does not "
        "divide 'mlp' (20) of 6 parameters: that dimension stays whole (replicated) on those "
        "devices; tensor 2 or 4 would split it."
    )
    query = abstract["bert"]["encoder"]["layers"][0]["attention"]["branch"]["query"]["kernel"]
    assert "tensor" not in jax.tree.leaves(tuple(query.get_value().sharding.spec))
