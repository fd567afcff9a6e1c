"""Orbax checkpoints of a run: train state, data-iterator state and the config, per step.

Layout: `WORKDIR/checkpoints/<step>/{state, data_iter, config}`. Saves are asynchronous; a
restore goes straight into the sharded layout of an abstract target, so a run may resume on a
different mesh.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from ln_jax.config import CheckpointConfig

log = logging.getLogger(__name__)
ITEMS = ("state", "data_iter", "config")


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be restored (corrupt or incompatible)."""


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a pytree of arrays: a restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Checkpointer:
    """Saves and restores {state, data_iter, config} with an orbax CheckpointManager."""

    def __init__(self, directory: str | epath.Path, cfg: CheckpointConfig):
        if jax.default_backend() == "cpu":
            # Orbax splits the writing of replicated arrays between replicas with an eager slice
            # per array shape; on CPU those compilations cost ~20 s for a small model's first
            # save (measured: 27 s vs 0.8 s). GPU backends already turn it off.
            ocp.type_handlers.register_type_handler(
                jax.Array,
                ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                override=True,
            )
        if "://" not in str(directory):  # orbax refuses relative paths (at the first save)
            directory = os.path.abspath(directory)
        self.directory = epath.Path(directory)
        self.cfg = cfg
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep, enable_async_checkpointing=cfg.async_save, create=True
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, config: dict) -> None:
        """Starts saving `step` (async); returns once the arrays are safe to donate."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iter=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        self.manager.save(step, args=args, force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def restore(self, target: Any) -> tuple[int, Any, dict] | None:
        """Restores the latest checkpoint into `target`'s shapes and shardings.

        Returns:
          (step, state, data_iter_state), or None when the directory holds no checkpoint.

        Raises:
          CheckpointError: naming the checkpoint's path, if it cannot be restored (and, with
            `fallback`, neither can any earlier one).
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        errors, broken = [], []
        for step in steps if self.cfg.fallback else steps[:1]:
            try:
                restored = step, *self._restore_step(step, target)
            except Exception as err:  # orbax raises many types for a bad file
                path = self.directory / str(step)
                errors.append(f"{path}: {type(err).__name__}: {err}")
                broken.append(step)
                log.warning("checkpoint %s could not be restored: %s", path, err)
                continue
            self._set_aside(broken)
            return restored
        hint = (
            ""
            if self.cfg.fallback
            else " Set --config.checkpoint.fallback=True to fall back to the previous checkpoint,"
            " or delete the broken step directory."
        )
        raise CheckpointError("cannot restore checkpoint " + "; ".join(errors)[:2000] + "." + hint)

    def _set_aside(self, steps: list[int]) -> None:
        """Renames unrestorable step directories to `corrupt_<step>` (kept for inspection),
        so that training can go on past them."""
        for step in steps:
            (self.directory / str(step)).rename(self.directory / f"corrupt_{step}")
            log.warning("moved unrestorable checkpoint %s aside to corrupt_%d", step, step)
        if steps:
            self.manager.reload()

    def _restore_step(self, step: int, target: Any) -> tuple[Any, dict]:
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_like(target)),
            data_iter=ocp.args.JsonRestore(),
        )
        restored = self.manager.restore(step, args=args)
        return restored["state"], restored["data_iter"]

    def restore_config(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))[
            "config"
        ]
