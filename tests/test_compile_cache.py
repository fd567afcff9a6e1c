"""TrainConfig.compilation_cache (ln_jax/compile_cache.py): where "auto" points, that a run
fills the cache and a second run of the same programs reads it, and that JAX's own setting is
restored after the run."""

from __future__ import annotations

import os

import jax
import pytest

from ln_jax import compile_cache
from ln_jax.train import run_identity, trainer
from tests.test_trainer import tiny_config, train_losses

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


def test_a_second_run_reads_every_program_from_the_cache(data_dir, tmp_path, monkeypatch):
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
        trainer.train_and_evaluate(cfg, str(tmp_path / "second"))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
    assert set(os.listdir(folder)) == written  # nothing compiled anew
    assert train_losses(tmp_path / "second") == train_losses(tmp_path / "first")
