"""Linen interop: the ln_jax NNX `BertEncoder` inside a `flax.linen.Module` via `nnx.bridge`.

Usage::

    import flax.linen as nn
    import jax
    from flax import nnx

    import ln_jax

    class Classifier(nn.Module):
        cfg: ln_jax.ModelConfig
        num_classes: int

        @nn.compact
        def __call__(self, input_ids, segment_ids=None, attention_mask=None, train=False):
            # ln_jax parameters carry logical sharding names, and flax shards them eagerly
            # when created, which needs a mesh. The bridge builds the NNX module at init *and*
            # at every apply, so build it with eager sharding off; the names still reach Linen
            # (nn.get_partition_spec) for the usual logical-partitioning flow.
            with nnx.use_eager_sharding(False):
                encoder = nnx.bridge.to_linen(ln_jax.BertEncoder, self.cfg, name="encoder")
                key = self.make_rng("dropout") if train else None
                hidden, _ = encoder(input_ids, segment_ids, attention_mask, dropout_key=key)
            return nn.Dense(self.num_classes)(hidden[:, 0])  # the [CLS] vector

    model = Classifier(cfg, num_classes=3)
    variables = model.init(jax.random.key(0), input_ids)
    logits = model.apply(variables, input_ids, segment_ids, attention_mask)
    logits = model.apply(variables, input_ids, train=True, rngs={"dropout": key})

`BertEncoder.__call__` returns `(hidden, intermediates)`; the encoder's parameters live under
`variables["params"]["encoder"]` with the NNX module's paths (`embeddings/word`,
`encoder/layers/0/attention/branch/query/kernel`, ...), boxed in `nnx.bridge.NNXMeta`.
"""

from __future__ import annotations

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ln_jax
from ln_jax import sharding

CFG = ln_jax.ModelConfig(
    size="custom",
    vocab_size=97,
    hidden_size=36,
    num_layers=2,
    num_heads=3,
    mlp_dim=52,
    max_position_embeddings=40,
    placement="post",
)
NUM_CLASSES = 5


class Classifier(nn.Module):
    """A Linen classifier on the [CLS] vector of the NNX encoder; also returns the hidden states."""

    cfg: ln_jax.ModelConfig
    num_classes: int

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, attention_mask=None, train=False):
        with nnx.use_eager_sharding(False):
            encoder = nnx.bridge.to_linen(ln_jax.BertEncoder, self.cfg, name="encoder")
            key = self.make_rng("dropout") if train else None
            hidden, _ = encoder(input_ids, segment_ids, attention_mask, dropout_key=key)
        return nn.Dense(self.num_classes, name="head")(hidden[:, 0]), hidden


def make_inputs(batch: int = 4, length: int = 7) -> tuple[jax.Array, jax.Array, jax.Array]:
    ids = jax.random.randint(jax.random.key(1), (batch, length), 0, CFG.vocab_size)
    segments = (jnp.arange(length) >= length // 2).astype(jnp.int32)[None].repeat(batch, 0)
    mask = jnp.ones((batch, length), jnp.int32).at[1, length - 2 :].set(0)
    return ids, segments, mask


INPUTS = make_inputs()


@pytest.fixture(scope="module")
def model_and_variables():
    model = Classifier(CFG, NUM_CLASSES)
    return model, jax.jit(model.init)(jax.random.key(0), *INPUTS)


@pytest.fixture(scope="module")
def apply_fn(model_and_variables):
    model, _ = model_and_variables
    return jax.jit(model.apply, static_argnames="train")


def test_init_and_apply_shapes(model_and_variables, apply_fn):
    _, variables = model_and_variables
    params = nn.unbox(variables["params"])
    assert set(params) == {"encoder", "head"}
    assert params["encoder"]["embeddings"]["word"].shape == (97, 36)
    wi = params["encoder"]["encoder"]["layers"][1]["ffn"]["branch"]["wi"]["kernel"]
    assert wi.shape == (36, 52)
    assert params["head"]["kernel"].shape == (36, NUM_CLASSES)
    logits, hidden = apply_fn(variables, *INPUTS)
    assert logits.shape == (4, NUM_CLASSES) and hidden.shape == (4, 7, 36)
    assert np.isfinite(np.asarray(logits)).all()


def test_logical_axis_names_reach_linen(model_and_variables):
    _, variables = model_and_variables
    specs = nn.get_partition_spec(variables)["params"]["encoder"]
    assert specs["embeddings"]["word"] == jax.sharding.PartitionSpec("vocab", "embed")
    query = specs["encoder"]["layers"][0]["attention"]["branch"]["query"]["kernel"]
    assert query == jax.sharding.PartitionSpec("embed", "heads", "kv")


def test_train_mode_passes_a_dropout_key_to_the_encoder(model_and_variables):
    """With `train=True` the Linen "dropout" stream reaches BertEncoder as its dropout key.

    Checked on the traced program only: compiling dropout's random bits costs seconds on CPU.
    """
    model, variables = model_and_variables

    def random_draws(train: bool) -> int:
        def run(v):
            return model.apply(v, *INPUTS, train=train, rngs={"dropout": jax.random.key(0)})

        return str(jax.make_jaxpr(run)(variables)).count("random_bits")

    assert random_draws(True) > random_draws(False)
    with pytest.raises(flax.errors.InvalidRngError):  # no silent training without dropout rng
        jax.eval_shape(lambda v: model.apply(v, *INPUTS, train=True), variables)


def abstract_encoder() -> ln_jax.BertEncoder:
    """An NNX BertEncoder of shapes only (no initialisation computed)."""

    def build() -> ln_jax.BertEncoder:
        return ln_jax.BertEncoder(CFG, rngs=nnx.Rngs(params=5))

    return nnx.merge(*sharding.abstract_sharded(build, None))


def test_linen_encoder_equals_nnx_encoder_with_the_same_parameters(model_and_variables, apply_fn):
    _, variables = model_and_variables
    linen_params = nn.unbox(variables["params"]["encoder"])
    leaves, tree = jax.tree.flatten(linen_params)
    rng = np.random.default_rng(9)
    new = [x + 0.3 * rng.standard_normal(x.shape, np.float32) for x in leaves]
    params = jax.tree.unflatten(tree, new)  # fresh values, to be copied to both sides

    encoder = abstract_encoder()
    state = nnx.state(encoder, nnx.Param)
    assert jax.tree.structure(nnx.to_pure_dict(state)) == tree  # the same parameter paths
    nnx.replace_by_pure_dict(state, params)
    nnx.update(encoder, state)
    want, _ = nnx.jit(lambda m, *x: m(*x))(encoder, *INPUTS)
    _, hidden = apply_fn({"params": {**variables["params"], "encoder": params}}, *INPUTS)
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_gradient_step_through_linen_trains_the_encoder(model_and_variables):
    """Adam steps through the Linen module move every encoder parameter."""
    model, variables = model_and_variables
    labels = jnp.array([0, 3, 4, 1])
    optimizer = optax.adam(1e-2)

    def loss_fn(params):
        logits, _ = model.apply({"params": params}, *INPUTS)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = variables["params"]
    new, new_opt_state, loss0 = step(params, optimizer.init(params))
    old_enc, new_enc = nn.unbox(params["encoder"]), nn.unbox(new["encoder"])
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), old_enc, new_enc)
    assert all(jax.tree.leaves(changed["encoder"])), "every encoder-layer parameter moves"
    assert bool(changed["embeddings"]["word"]) and bool(changed["embeddings"]["norm"]["scale"])
    _, _, loss1 = step(new, new_opt_state)
    assert float(loss1) < float(loss0)


def test_sharded_variables_with_linen_logical_partitioning(model_and_variables, apply_fn):
    """The usual Linen flow: logical specs -> mesh shardings -> device_put -> jit(apply)."""
    model, variables = model_and_variables
    mesh = sharding.make_mesh(2, 2, 1, devices=jax.devices()[:4])
    specs = nn.get_partition_spec(variables)
    placed = jax.device_put(
        variables, nn.logical_to_mesh_sharding(specs, mesh, sharding.DEFAULT_RULES)
    )
    wi = placed["params"]["encoder"]["encoder"]["layers"][0]["ffn"]["branch"]["wi"]["kernel"]
    assert nn.unbox(wi).sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    with sharding.use_mesh(mesh):  # batch 4 splits over data x fsdp
        logits, _ = jax.jit(model.apply)(placed, *INPUTS)
    want, _ = apply_fn(variables, *INPUTS)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), atol=1e-5, rtol=1e-5)
