"""The train state as one list of arrays (`ln_jax.train.flat`): what the train step takes and
returns, read as the state dict, and the same update as the nested NNX form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.task import make_task
from ln_jax.train import flat, steps
from tests.test_trainer import tiny_config

pytest_plugins = ("tests.data_fixtures",)


def _state() -> dict:
    model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 2, rngs=nnx.Rngs(1)))
    params = nnx.state(model, nnx.Param)
    moments = jax.tree.map(lambda x: x + 1.0, params)
    return {"step": jnp.int32(3), "params": params, "opt_state": (moments,), "halted": False}


def test_a_flat_state_reads_as_the_dict_it_packs():
    state = _state()
    packed = flat.Layout.of(state).pack(state)
    leaves = jax.tree.leaves(state)
    assert len(packed.leaves) == len(leaves) == 10
    for a, b in zip(packed.leaves, leaves, strict=True):
        assert a is b
    assert int(packed["step"]) == 3 and packed["halted"] is False
    assert jax.tree.structure(packed["params"]) == jax.tree.structure(state["params"])
    assert isinstance(packed["params"], nnx.State)
    np.testing.assert_array_equal(
        packed["params"]["layers"][1]["kernel"][...], state["params"]["layers"][1]["kernel"][...]
    )
    np.testing.assert_array_equal(packed["opt_state"][0]["layers"][0]["bias"][...], 1.0)
    assert sorted(packed) == ["halted", "opt_state", "params", "step"]
    rebuilt = flat.as_tree(packed)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(state)
    # JAX takes it apart with one node: its leaves, not one Python call per Variable.
    assert jax.tree.structure(packed).num_nodes == len(leaves) + 1
    doubled = jax.tree.map(lambda x: x * 2, packed)
    assert isinstance(doubled, flat.FlatState)
    np.testing.assert_array_equal(doubled["params"]["layers"][0]["bias"][...], 0.0)
    np.testing.assert_array_equal(doubled["opt_state"][0]["layers"][0]["bias"][...], 2.0)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(packed)[0]]
    assert paths[0] == "['halted']" and paths[-1] == "['step']"
    assert paths[6] == "['params']['layers'][0]['kernel'].value"  # as in the nested dict


def test_a_parameter_set_through_a_flat_state_is_what_its_next_step_takes():
    """A trainer's hook may set a parameter (tests/test_monitor.py's loss spike): JAX's
    flattening, as a jitted step's call does it, sees the value set."""
    state = _state()
    packed = flat.Layout.of(state).pack(state)
    kernel = packed["params"]["layers"][1]["kernel"]
    kernel[...] = kernel[...] * 30.0
    x = jax.jit(lambda s: s["params"]["layers"][1]["kernel"][...].sum())(packed)
    np.testing.assert_allclose(x, 30.0 * state["params"]["layers"][1]["kernel"][...].sum(), 1e-5)
    assert jax.tree.leaves(packed)[8] is kernel[...]  # sorted: halted, opt_state x4, params
    assert flat.as_tree(packed)["params"]["layers"][1]["kernel"] is kernel
    packed["params"]["layers"][0]["extra"] = nnx.Param(jnp.zeros(2))
    with pytest.raises(ValueError, match=r"state\['params'\] was changed in structure"):
        jax.tree.leaves(packed)


def test_a_state_of_another_structure_is_refused_with_its_keys():
    state = _state()
    layout = flat.Layout.of(state)
    other = {**state, "params": nnx.state(nnx.Linear(3, 5, rngs=nnx.Rngs(0)), nnx.Param)}
    with pytest.raises(ValueError, match=r"keys that differ: \['params'\]"):
        layout.pack(other)
    with pytest.raises(ValueError, match=r"\['extra'\]"):
        layout.pack({**state, "extra": 1})


def test_the_train_step_returns_a_flat_state_equal_to_the_nested_forms_update(data_dir):
    """Two updates of the train step (state as a FlatState) against the same step function
    jitted over the nested NNX state: equal arrays; a FlatState in is taken as it is."""
    cfg = tiny_config(data_dir, **{"model.hidden_dropout": 0.1})
    mesh = sharding.make_mesh(2, 2, 2)
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    batch = next(iter(task.pipelines(mesh)[0]))
    step = steps.jit_train_step(cfg, task, mesh, pieces)
    shardings = jax.tree.map(lambda x: x.sharding, pieces.state)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rest_sh = jax.tree.map(lambda x: x.sharding, pieces.rest)
    nested = jax.jit(
        steps.make_train_step(cfg, task, pieces.graphdef),
        in_shardings=(shardings, rest_sh, sharding.batch_sharding(mesh), replicated),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )
    a, b = (jax.tree.map(jnp.copy, pieces.state) for _ in range(2))
    with sharding.use_mesh(mesh):
        for _ in range(2):
            a, _ = step(a, pieces.rest, batch)
            b, _ = nested(b, pieces.rest, batch, step.bound)
    assert isinstance(a, flat.FlatState) and isinstance(b, dict)
    assert int(a["step"]) == int(b["step"]) == 2
    before = jax.tree.leaves(pieces.state["params"])
    new_a, new_b = jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])
    for x, y, x0 in zip(new_a, new_b, before, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert x.sharding == x0.sharding
    assert not all(np.array_equal(x, y) for x, y in zip(new_a, before, strict=True))
    moments = zip(jax.tree.leaves(a["opt_state"]), jax.tree.leaves(b["opt_state"]), strict=True)
    for x, y in moments:
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_step_built_with_auto_accumulation_says_what_to_set(data_dir):
    """ "auto" (0) is resolved by a run's set-up; built directly, the step was a
    ZeroDivisionError in the micro-batch split."""
    from ln_jax.validate import ConfigError

    cfg = tiny_config(data_dir, grad_accum_steps=0)
    with pytest.raises(ConfigError, match=r"grad_accum_steps=0 \(auto\).*grad_accum_steps=1"):
        steps.make_train_step(cfg, None, None)


def test_the_library_page_s_own_loop_runs_as_written(data_dir, monkeypatch, capsys):
    """docs/library.md's "The train step in your own loop", run as written (the corpus read
    from the tests' prepared data dir)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "library.md").read_text()
    section = text.split("### The train step in your own loop", 1)[1]
    block = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M).group(1)
    monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
    monkeypatch.chdir(root)
    scope: dict = {}
    exec(compile(block, "docs/library.md", "exec"), scope)
    step, loss = capsys.readouterr().out.split()
    assert int(step) == 3 and 0 < float(loss) < 20
    assert isinstance(scope["state"], flat.FlatState) and isinstance(scope["params"], nnx.State)
    assert jax.tree.structure(scope["whole"]) == jax.tree.structure(scope["pieces"].state)
