"""Pretrains BERT with a chosen LayerNorm placement.

  python train.py --config=configs/bert_preln.py:tiny
  python train.py --config=configs/bert_postln.py:mini --config.total_steps=500 --workdir=/tmp/run

--config=FILE[:variant] names the config (resolved from any working directory); every field it
declares can be overridden with --config.SECTION.FIELD=VALUE (see configs/common.py), exactly as
in `python -m ln_jax.experiments`, `python -m ln_jax.analysis` and `python -m
ln_jax.compile_check`.

Multi-host (TPU pods, GPU clusters): add --distributed (JAX finds the coordinator on Cloud TPU
and SLURM) or pass --coordinator_address, --num_processes and --process_id.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: workdirs/<name>).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize().")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")


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


def main(argv: list[str], values: dict) -> int:
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    _init_distributed()
    from ln_jax.config import ConfigError, build_config
    from ln_jax.trainer import CheckpointError, NonFiniteError, train_and_evaluate

    try:
        cfg = build_config(values)
    except ConfigError as err:
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


def command_config(argv: list[str]) -> tuple[dict, list[str]]:
    """(the nested config, the other arguments) of a train.py command line."""
    from ln_jax.config import config_from_command_line

    values, line = config_from_command_line(argv)
    return values, line.rest


def run() -> None:
    from ln_jax.config import ConfigError

    try:
        values, rest = command_config(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    app.run(lambda argv: main(argv, values), argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    run()
