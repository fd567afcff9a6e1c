"""Trains one run of the task its config names (`--config.task`, `ln_jax.task`) on the one
trainer (`ln_jax.train.trainer`), with the LayerNorm placement the config chooses: BERT
pretraining (configs/bert_preln.py, configs/bert_postln.py), translation (configs/mt.py), or a
task of a user's package ("module:Class"). GLUE fine-tuning (configs/glue.py) runs through
finetune.py, whose every grid cell x seed is a run of this same trainer.

  python train.py --config=configs/bert_preln.py:tiny
  python train.py --config=configs/bert_postln.py:mini --config.total_steps=500 --workdir=/tmp/run
  python train.py --config=configs/mt.py:tiny

--config=FILE[:variant] names the config (resolved from any working directory); every field it
declares can be overridden with --config.SECTION.FIELD=VALUE (see configs/common.py), exactly as
in `python -m ln_jax.experiments`, `python -m ln_jax.analysis` and `python -m
ln_jax.compile_check`.

A workdir holds one run: resuming it with another config is an error listing what differs
(--accept_changes continues with the safe ones). User errors print one line and exit 2
(--traceback, or LN_JAX_TRACEBACK=1, shows the traceback); library logs go to
WORKDIR/train.log. SIGTERM and Ctrl-C save and exit 0 (a second Ctrl-C aborts).

Multi-host (TPU pods, GPU clusters): add --distributed (JAX finds the coordinator on Cloud TPU
and SLURM) or pass --coordinator_address, --num_processes and --process_id.
"""

from __future__ import annotations

import os
import sys

from ln_jax import paths
from ln_jax.cli import command as cli
from ln_jax.validate import Fix

COMMAND = cli.Command("python train.py", __doc__, cli.train_config_front())
_WORKDIR = COMMAND.string(
    "workdir",
    None,
    "Run directory (default: $LN_JAX_WORKDIRS/<name>, else workdirs/<name>).",
    meta="DIR",
)
_ACCEPT = COMMAND.boolean(
    "accept_changes",
    False,
    "Resume a workdir with a config that differs only in fields safe to change within a run "
    "(cadences, mesh, checkpointing, total_steps: the schedule change is shown).",
)
_TRACEBACK = COMMAND.boolean("traceback", False, "Show the traceback of a user error too.")
_DISTRIBUTED = COMMAND.boolean("distributed", False, "Call jax.distributed.initialize().")
_COORDINATOR = COMMAND.string(
    "coordinator_address", None, "host:port of process 0.", meta="HOST:PORT"
)
_NUM_PROCESSES = COMMAND.integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = COMMAND.integer("process_id", None, "This process's index.")


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


def main(inv: cli.Invocation) -> int:
    """The command's body: the run, its user errors in one line (exit 2), a SIGTERM during
    set-up in one line (exit 143: `SetupSignals`)."""
    from ln_jax import console
    from ln_jax.validate import NonFiniteError

    return console.run_command(
        lambda: inv.call(lambda: _train(inv)), _TRACEBACK.value, (NonFiniteError,)
    )


def _distributed() -> bool:
    return bool(_COORDINATOR.value or _DISTRIBUTED.value)


def _train(inv: cli.Invocation) -> int:
    from ln_jax.train import workdir_lock

    if not _distributed():  # a busy workdir: one line before JAX is even imported
        name = inv.config_values()["name"]
        workdir_lock.check_free(_WORKDIR.value or paths.default_workdir(name))
    from ln_jax.train.preemption import SetupSignals
    from ln_jax.train.workdir_stub import no_stub_workdir

    # A multi-process job leaves SIGTERM to JAX's preemption service.
    with SetupSignals("setting up", enabled=not _distributed()) as signals:
        _init_distributed()  # before the config: its "auto" fields ask JAX for the platform
        cfg = inv.config()
        workdir = _WORKDIR.value or paths.default_workdir(cfg.name)
        signals.what = f"setting up the run in {workdir}"
        _preflight(cfg)  # user errors before anything is created
        with no_stub_workdir(workdir):
            result = _train_in(cfg, workdir)
    _report(inv, cfg, workdir, result)
    return 0


def _preflight(cfg) -> None:
    """The mesh's shape and the task's data (`Task.check_data`: BERT's prepared datasets,
    translation's aligned pairs) checked before the workdir is created, so that a user error
    there leaves nothing behind. Nothing is built: the trainer builds the mesh and the task."""
    from ln_jax import sharding, task

    sharding.resolve_mesh_shape(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    task.check_data(cfg)


def _train_in(cfg, workdir: str) -> dict:
    from ln_jax import console
    from ln_jax.train import run_identity
    from ln_jax.train.trainer import train_and_evaluate

    run_identity.prepare_workdir(workdir)  # here, to log into it from the start
    log_file = _log_file_of_this_process(workdir)
    console.configure_logging(log_file)
    print(
        f"ln_jax: {cfg.name}: {cfg.model.placement}-LN {cfg.model.size}, "
        f"{cfg.total_steps} steps, workdir {workdir} (library logs: {log_file})",
        flush=True,
    )
    return train_and_evaluate(cfg, workdir, accept_changes=_ACCEPT.value, workdir_prepared=True)


def _report(inv: cli.Invocation, cfg, workdir: str, result: dict) -> None:
    """What the command prints after the run: nothing trained, a stop, the last eval (naming
    the step it evaluated: `eval_line`)."""
    from ln_jax.train.loop import eval_line

    if result["already_done"]:
        print(nothing_to_train(inv, cfg, workdir, result["step"]))
    elif result["preempted"]:
        print(f"{result['preempted']}: saved step {result['step']}; run the same command to resume")
    line = eval_line(result)
    if line is not None:
        print(line)


def nothing_to_train(inv: cli.Invocation, cfg, workdir: str, step: int) -> str:
    """The line of a run whose workdir already holds its last step, with the whole command
    that trains it longer (twice the steps, `--accept_changes`)."""
    longer = Fix(
        set={
            "--config.total_steps": str(2 * max(cfg.total_steps, step)),
            "--accept_changes": "true",
        }
    )
    return (
        f"nothing to train: {workdir} already holds step {step} of {cfg.total_steps}. To train "
        f"longer, raise --config.total_steps and add --accept_changes: "
        f"{inv.fixed_command(longer)}; for a new run, give a new --workdir."
    )


def _log_file_of_this_process(workdir: str) -> str:
    """WORKDIR/train.log; on a URL, processes other than 0 of a multi-process job log to
    train.process<i>.log: an object is uploaded whole, so shared, they would overwrite each
    other (on a shared local disk they append to one file)."""
    from ln_jax import paths

    log_file = os.path.join(workdir, "train.log")
    if not paths.is_url(workdir) or not (_COORDINATOR.value or _DISTRIBUTED.value):
        return log_file
    import jax

    index = jax.process_index()
    return log_file if index == 0 else os.path.join(workdir, f"train.process{index}.log")


def command_config(argv: list[str]) -> tuple[dict, list[str]]:
    """(the nested config, the other arguments) of a train.py command line."""
    from ln_jax.config.load import config_from_command_line

    values, line = config_from_command_line(argv)
    return values, line.rest


def run(argv: list[str] | None = None) -> None:
    """The command line (sys.argv by default); exits with the run's status."""
    sys.exit(COMMAND.run(main, argv))


if __name__ == "__main__":
    run()
