"""TrainConfig.compilation_cache (ln_jax/runtime/compile_cache.py): where "auto" points, that a run
fills the cache and a second run of the same programs reads it (and so does a run with another
seed, learning rate and length: `steps.run_values` are inputs), and that JAX's own
setting is restored after the run."""

from __future__ import annotations

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from ln_jax import sharding
from ln_jax.runtime import compile_cache
from ln_jax.task import make_task
from ln_jax.train import run_identity, steps, trainer
from tests.test_trainer import read_metrics, tiny_config, train_losses

pytest_plugins = ("tests.data_fixtures",)


def test_auto_is_off_on_a_cpu_and_the_cache_folder_on_an_accelerator(monkeypatch, tmp_path):
    monkeypatch.setenv("LN_JAX_CACHE_DIR", str(tmp_path))
    assert compile_cache.resolve("auto", "cpu") == "off"
    for platform in ("gpu", "tpu"):
        assert compile_cache.resolve("auto", platform) == str(tmp_path / "jax_compilation")
    assert compile_cache.resolve("gs://b/cache", "cpu") == "gs://b/cache"
    with pytest.raises(ValueError, match='use "auto", "off" or a folder'):
        compile_cache.resolve("", "gpu")
    assert run_identity.kind_of("compilation_cache") == "free"


def test_the_environment_variable_wins_and_jax_is_left_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    before = jax.config.jax_compilation_cache_dir
    with compile_cache.use(str(tmp_path / "config")) as folder:
        assert folder == str(tmp_path / "env")
        assert jax.config.jax_compilation_cache_dir == before


def test_a_second_run_reads_every_program_from_the_cache(
    data_dir, tmp_path, monkeypatch, fresh_programs
):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # the test suite's own (tests/conftest.py)
    folder = tmp_path / "cache"
    cfg = tiny_config(data_dir, total_steps=2, compilation_cache=str(folder))
    before = jax.config.jax_compilation_cache_dir
    min_secs = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # CPU compiles fast
    try:
        trainer.train_and_evaluate(cfg, str(tmp_path / "first"))
        assert jax.config.jax_compilation_cache_dir == before  # restored after the run
        written = set(os.listdir(folder))
        assert len(written) >= 2  # at least the train and evaluation steps
        steps.forget_programs()  # as a new process: nothing kept in this one
        trainer.train_and_evaluate(cfg, str(tmp_path / "second"))
        assert set(os.listdir(folder)) == written  # nothing compiled anew
        # Another seed, learning rate and length: the same programs (run_values).
        other = {"seed": 3, "optim.peak_lr": 3e-3}
        steps.forget_programs()
        trainer.train_and_evaluate(
            tiny_config(data_dir, total_steps=3, compilation_cache=str(folder), **other),
            str(tmp_path / "third"),
        )
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
    assert set(os.listdir(folder)) == written
    first = train_losses(tmp_path / "first")
    assert train_losses(tmp_path / "second") == first
    third = read_metrics(tmp_path / "third")
    assert [r["learning_rate"] for r in third if r["split"] == "train"] == pytest.approx(
        [3e-3, 2e-3, 1e-3]  # linear_decay: 3e-3 * (1 - t / 3)
    )
    assert train_losses(tmp_path / "third")[1] != first[1]  # another seed: other parameters


def test_the_run_values_as_inputs_compute_what_they_compute_as_constants(data_dir):
    """The train step with `run_values` bound as inputs equals the same step with them
    compiled in as constants, bit for bit (a warm-up, another seed). Under the suite's
    fast-compile flags XLA:CPU's older emitters round some products with the constant-folded
    learning rate differently in the last bit (parameters apart by up to 9e-11, 2026-11-28:
    tests/xla_env.py), so there the check allows 1e-9; each update moves a parameter by about
    the learning rate (3e-4 here), and a wrong step's learning rate is off by a third."""
    schedule = {"optim.schedule": "warmup_linear_decay", "optim.warmup_steps": 3}
    cfg = tiny_config(data_dir, seed=4, **schedule, **{"optim.peak_lr": 1e-3})
    mesh = sharding.make_mesh(2, 2, 2)
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    batch = next(iter(task.pipelines(mesh)[0]))
    bound = steps.jit_train_step(cfg, task, mesh, pieces)
    fn, values = steps.make_train_step(cfg, task, pieces.graphdef), steps.run_values(cfg)
    shardings = jax.tree.map(lambda x: x.sharding, pieces.state)
    constants = jax.jit(
        lambda state, rest, batch: fn(state, rest, batch, values),  # numbers: constants
        in_shardings=(shardings, jax.tree.map(lambda x: x.sharding, pieces.rest), None),
        out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
    )
    results = []
    for step in (bound, constants):
        state = jax.tree.map(jnp.copy, pieces.state)  # the step donates it
        with sharding.use_mesh(mesh):
            for _ in range(2):
                state, metrics = step(state, pieces.rest, batch)
        results.append(jax.device_get((state["params"], metrics)))
    older_emitters = "--xla_cpu_use_fusion_emitters=false" in os.environ.get("XLA_FLAGS", "")
    tol = {"rtol": 1e-6, "atol": 1e-9} if older_emitters else {"rtol": 0.0, "atol": 0.0}
    jax.tree.map(partial(np.testing.assert_allclose, **tol), *results)
    assert results[0][1]["learning_rate"] == pytest.approx(1e-3 / 3)  # update 1 of 3 of warm-up


def test_a_process_keeps_each_program_for_its_next_run_with_the_same_program(data_dir):
    """`steps.program_key`: the seed, the schedule's numbers, the length and the cadences are
    not in a run's programs, so such runs in one process get the same jitted step (traced and
    compiled once); any field the step computes with gives another."""
    base = tiny_config(data_dir)
    same = {"seed": 3, "total_steps": 7, "log_every": 2, "eval_every": 3, "monitor.every": 5,
            "optim.peak_lr": 3e-3, "optim.end_lr": 1e-5, "checkpoint.keep": 1}  # fmt: skip
    assert steps.program_key(tiny_config(data_dir, **same)) == steps.program_key(base)
    for other in ({"model.placement": "post"}, {"nan_policy": "skip"}, {"grad_accum_steps": 2},
                  {"dropout_rng": "threefry"}, {"data.max_seq_length": 64},
                  {"optim.weight_decay": 0.1}, {"model.hidden_dropout": 0.0}):  # fmt: skip
        assert steps.program_key(tiny_config(data_dir, **other)) != steps.program_key(base), other

    mesh = sharding.make_mesh(2, 2, 2)
    abstract = steps.abstract_state(make_task(base), mesh)
    first = steps.jit_train_step(base, make_task(base), mesh, abstract)
    again = tiny_config(data_dir, **same)
    kept = steps.jit_train_step(again, make_task(again), mesh, abstract)
    assert kept.fn is first.fn and kept.bound["seed"] != first.bound["seed"]  # its own values
    measured = steps.jit_train_step(base, make_task(base), mesh, abstract, measure=True)
    assert measured.fn is not first.fn
    steps.forget_programs()
    assert steps.jit_train_step(base, make_task(base), mesh, abstract).fn is not first.fn
