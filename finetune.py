"""Fine-tunes a pretrained encoder on a GLUE task (or the offline pair task).

  python finetune.py --config=configs/glue.py:offline --config.init_from=workdirs/bert_preln_tiny
  python finetune.py --config=configs/glue.py:mrpc --config.init_from=WORKDIR --config.init_step=500
  python finetune.py --config=configs/glue.py:rte --config.init_from=hf:/path/to/bert

--config=FILE[:task] names the config; every field it declares can be overridden with
--config.FIELD=VALUE (see configs/glue.py), e.g. --config.seeds="(0,1,2)",
--config.learning_rates="(2e-5,3e-5,5e-5)". Every cell x seed is a run of the one trainer
(`ln_jax.train.trainer`) in WORKDIR/<cell>/seed<k>/, on the studies' runner
(`ln_jax.experiments.finetune`). Rerunning the same command keeps finished
runs and resumes a cut-off one from its last checkpoint (every epoch; SIGTERM and Ctrl-C save
the step in flight and exit 0). User errors print one line and exit 2 (--traceback
shows the traceback); library logs go to WORKDIR/finetune.log.
"""

from __future__ import annotations

import os
import sys

from ln_jax import paths
from ln_jax.cli import command as cli


def _finetune_config_front() -> cli.ConfigFront:
    def kind():
        from ln_jax.models.bert.finetune.config import FinetuneConfig

        return FinetuneConfig

    def build(values):
        from ln_jax.models.bert.finetune import build_finetune_config

        return build_finetune_config(values)

    return cli.ConfigFront(kind, build, DEFAULT_CONFIG, example=DEFAULT_CONFIG)


DEFAULT_CONFIG = "configs/glue.py:offline"
COMMAND = cli.Command("python finetune.py", __doc__, _finetune_config_front())
_WORKDIR = COMMAND.string(
    "workdir",
    None,
    "Run directory (default: $LN_JAX_WORKDIRS/<name>_<init>, else workdirs/...).",
    meta="DIR",
)
_TRACEBACK = COMMAND.boolean("traceback", False, "Show the traceback of a user error too.")


def default_workdir(cfg) -> str:
    """workdirs/<name>_<basename of init_from>[_step<k>]."""
    source = (cfg.init_from or "none").rstrip("/")
    tag = os.path.basename(source.removeprefix("hf:")) or "init"
    step = f"_step{cfg.init_step}" if cfg.init_step is not None else ""
    return paths.default_workdir(f"{cfg.name}_{tag}{step}")


def main(inv: cli.Invocation) -> int:
    """The command's body: the grid, its user errors in one line (exit 2), a SIGTERM during
    set-up in one line (exit 143: `SetupSignals`)."""
    from ln_jax import console
    from ln_jax.validate import NonFiniteError

    return console.run_command(
        lambda: inv.call(lambda: _finetune(inv)), _TRACEBACK.value, (NonFiniteError,)
    )


def _finetune(inv: cli.Invocation) -> int:
    from ln_jax import console
    from ln_jax.experiments.finetune import Preempted, finetune
    from ln_jax.models.bert.finetune import format_summary
    from ln_jax.train import run_identity
    from ln_jax.train.preemption import SetupSignals
    from ln_jax.train.workdir_stub import no_stub_workdir

    with SetupSignals("setting up the fine-tuning") as signals:
        cfg = inv.config()
        workdir = _WORKDIR.value or default_workdir(cfg)
        signals.what = f"setting up the fine-tuning in {workdir}"
        with no_stub_workdir(workdir):
            run_identity.prepare_workdir(workdir)
            console.configure_logging(os.path.join(workdir, "finetune.log"))
            print(
                f"ln_jax: fine-tuning {cfg.init_from} on {cfg.task}, workdir {workdir}", flush=True
            )
            try:
                summary = finetune(cfg, workdir)
            except Preempted as stop:
                print(f"{stop}; run the same command to resume", flush=True)
                return 0
    print(format_summary(summary))
    return 0


def run(argv: list[str] | None = None) -> None:
    """The command line (sys.argv by default); exits with the command's status."""
    sys.exit(COMMAND.run(main, argv))


if __name__ == "__main__":
    run()
