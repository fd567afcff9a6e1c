"""Command line of the studies (see `ln_jax.experiments`).

  python -m ln_jax.experiments depth  --out=DIR [--depths=6,12,18] [--arms=...] [--seeds=0,1]
      [--lr=1e-3] [--warmup_fraction=0.1] [--jobs=2] [--config=FILE[:variant]]
      [--config.FIELD=value ...]
  python -m ln_jax.experiments warmup --out=DIR [--lrs=5e-4,1e-3] [--warmups=1,500,4000]
      [--seeds=0,1] [--sgd] [--target=LOSS] [--jobs=2] [--config=...] [--config.FIELD=value ...]

The default config is `configs/study.py:depth` or `:warmup` (CPU scale, embedded corpus).
Rerunning the same command resumes: finished runs are kept, a run cut off midway continues
from its checkpoint. `--only=NAME` trains one run; `--report` only rewrites the report.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import app, flags

from ln_jax.validate import UserError

COMMANDS = ("depth", "warmup")


def _command(argv: list[str]) -> str | None:
    words = [a for a in argv[1:] if not a.startswith("-")]
    return words[0] if words else None


_ARGV = list(sys.argv[1:])  # as given: absl strips the flags out of sys.argv later
_OUT = flags.DEFINE_string("out", None, "Study directory (runs/, results.json, plots).")
_JOBS = flags.DEFINE_integer("jobs", 1, "Runs trained at once, each in its own process.")
_ONLY = flags.DEFINE_string("only", None, "Train only this run (by name).")
_REPORT = flags.DEFINE_bool("report", False, "Only rewrite the report from stored results.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds (the warm-up grid runs seed-major).")
_DEPTHS = flags.DEFINE_list("depths", ["6", "12", "18"], "depth: encoder depths.")
_ARMS = flags.DEFINE_list(
    "arms",
    ["post", "post_warmup", "pre", "admin", "deepnorm"],
    "depth: arms: post_warmup or any placement row (olmo2, lns, dyt, ...); '+qk' adds qk_norm.",
)
_LR = flags.DEFINE_float("lr", 1e-3, "depth: the (large) peak learning rate of every arm.")
_WARMUP_FRACTION = flags.DEFINE_float(
    "warmup_fraction", 0.1, "depth: warm-up of the post_warmup arm, a fraction of the run."
)
_LRS = flags.DEFINE_list("lrs", ["5e-4", "1e-3"], "warmup: peak learning rates.")
_WARMUPS = flags.DEFINE_list(
    "warmups", ["1", "500", "4000"], "warmup: warm-up lengths (of 50k updates; 1 = none)."
)
_SGD = flags.DEFINE_bool("sgd", False, "warmup: add SGD with and without warm-up.")
_TARGET = flags.DEFINE_float("target", None, "warmup: target validation MLM loss.")
flags.mark_flag_as_required("out")


def _ints(values: list[str], name: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError as err:
        raise ValueError(f"--{name}: {err}; give comma-separated integers.") from None


def _floats(values: list[str], name: str) -> list[float]:
    try:
        return [float(v) for v in values]
    except ValueError as err:
        raise ValueError(f"--{name}: {err}; give comma-separated numbers.") from None


def _specs(command: str, base: dict) -> list:
    from ln_jax.experiments import grids

    if command == "depth":
        seeds = _ints(_SEEDS.value, "seeds")
        warmup = max(1, round(_WARMUP_FRACTION.value * base["total_steps"]))
        return grids.depth_grid(
            _ints(_DEPTHS.value, "depths"), _ARMS.value, seeds, _LR.value, warmup
        )
    return grids.warmup_grid(
        base["total_steps"],
        lrs=_floats(_LRS.value, "lrs"),
        lengths=_ints(_WARMUPS.value, "warmups"),
        seeds=_ints(_SEEDS.value, "seeds"),
        sgd=_SGD.value,
    )


def _plateau(out: str, base: dict) -> dict:
    """The corpus's unigram plateau, computed once per study and kept in OUT/plateau.json."""
    from ln_jax.config import TrainConfig
    from ln_jax.experiments.plateau import corpus_plateau
    from ln_jax.results import write_json

    path = os.path.join(out, "plateau.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    value = corpus_plateau(TrainConfig.from_mapping(base).data)
    write_json(path, value)
    return value


def main(argv: list[str], base: dict) -> int:
    from ln_jax.experiments import study

    logging.getLogger("absl").setLevel(logging.WARNING)
    command = _command(argv)
    if command not in COMMANDS:
        print(
            f"error: give a study, one of {', '.join(COMMANDS)} (got {command!r}).", file=sys.stderr
        )
        return 2
    out = _OUT.value
    try:
        specs = _specs(command, base)
        plateau = _plateau(out, base)["unigram_xent"]
        if _ONLY.value:
            return study.run_only(base, specs, out, _ONLY.value, plateau)
        results = study.run(
            command,
            base,
            specs,
            out,
            plateau=plateau,
            jobs=_JOBS.value,
            argv=_ARGV,
            train=not _REPORT.value,
            target=_TARGET.value,
            arms=_ARMS.value if command == "depth" else None,
        )
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(results["table"])
    return 0


def command_config(argv: list[str]) -> tuple[dict, list[str]]:
    """(the nested base config, the other arguments) of a study's command line; the default
    config is `configs/study.py:<study>`."""
    from ln_jax.config import config_from_command_line

    study = _command(["", *argv])
    default = f"configs/study.py:{study if study in COMMANDS else 'depth'}"
    values, line = config_from_command_line(argv, default)
    return values, line.rest


def run() -> None:
    from ln_jax.config import ConfigError

    try:
        base, rest = command_config(_ARGV)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    app.run(lambda argv: main(argv, base), argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    run()
