"""Pretrains BERT with a chosen LayerNorm placement.

  python train.py --config=configs/bert_preln.py:tiny
  python train.py --config=configs/bert_postln.py:mini --config.total_steps=500 --workdir=/tmp/run

Multi-host (TPU pods, GPU clusters): add --distributed (JAX finds the coordinator on Cloud TPU
and SLURM) or pass --coordinator_address, --num_processes and --process_id.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:variant].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: workdirs/<name>).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize().")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
flags.mark_flag_as_required("config")


def _init_distributed() -> None:
    import jax

    if _COORDINATOR.value is None and not _DISTRIBUTED.value:
        return
    if _COORDINATOR.value and jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
    )


def main(argv: list[str]) -> int:
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _init_distributed()
    from ln_jax.config import TrainConfig
    from ln_jax.trainer import CheckpointError, NonFiniteError, train_and_evaluate

    config = _CONFIG.value
    try:
        cfg = TrainConfig.from_mapping(config.to_dict())
    except ValueError as err:
        print(f"error in the config: {err}", file=sys.stderr)
        return 2
    workdir = _WORKDIR.value or os.path.join("workdirs", cfg.name)
    print(
        f"ln_jax: {cfg.name}: {cfg.model.placement}-LN {cfg.model.size}, "
        f"{cfg.total_steps} steps, workdir {workdir}",
        flush=True,
    )
    try:
        result = train_and_evaluate(cfg, workdir)
    except (NonFiniteError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if result["eval"]:
        print(
            f"final eval at step {result['step']}: "
            + ", ".join(
                f"{k}={v:.4f}"
                for k, v in result["eval"].items()
                if isinstance(v, float) and k != "time"
            )
        )
    return 0


def run() -> None:
    try:
        app.run(main)
    except AttributeError as err:  # ml_collections: an override of a field that does not exist
        message = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        print(f"error: unknown config field in an override: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
