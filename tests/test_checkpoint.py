"""Checkpointer on its own: relative directories (orbax itself refuses them at the first save)."""

import jax.numpy as jnp
import numpy as np

from ln_jax.config.run import CheckpointConfig
from ln_jax.train.checkpoint import Checkpointer


def test_relative_directory_saves_and_restores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.asarray(7)}
    ckpt = Checkpointer("runs/a/checkpoints", CheckpointConfig(keep=2, async_save=True))
    ckpt.save(100, state, {"position": 3}, {"name": "a"})
    ckpt.close()
    assert (tmp_path / "runs/a/checkpoints/100").is_dir()

    again = Checkpointer("runs/a/checkpoints", CheckpointConfig())
    step, restored, data_state = again.restore(state)
    again.close()
    assert step == 100 and data_state == {"position": 3}
    np.testing.assert_array_equal(restored["w"], np.arange(6.0).reshape(2, 3))
    assert int(restored["step"]) == 7
