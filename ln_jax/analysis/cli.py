"""The command line: `python -m ln_jax.analysis SUBCOMMAND --out=DIR [options]`.

  python -m ln_jax.analysis depth --out=docs/results/analysis
  python -m ln_jax.analysis layers --out=/tmp/a --placements=post,pre --train_steps=50
  python -m ln_jax.analysis lemma2 --out=/tmp/a --setting=theory,bert --num_layers=12
  python -m ln_jax.analysis output-change --out=/tmp/a --placements=post,pre,admin
  python -m ln_jax.analysis dependency --out=/tmp/a --checkpoint=workdirs/bert_postln_tiny
  python -m ln_jax.analysis monitor WORKDIR [WORKDIR ...] --out=DIR   (training-time
      measurements of runs: see ln_jax/analysis/training.py; `monitor --help` for its flags)

The model and data come from `--config=FILE[:variant]` (default configs/bert_preln.py:tiny)
with the analysis defaults on top (Xavier initialisation, sequences of 64, batches of 16) and
then `--config.SECTION.FIELD=VALUE` overrides. `--placements` separates arms by commas; a
per-layer list inside one arm joins its items with "+" ("post*3+pre*3"). `--seeds=10` means
seeds 0..9; a comma list names seeds ("--seeds=0,4,7").
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ln_jax.cli import command as cli
from ln_jax.validate import ConfigError, UserError

# Per subcommand: placements, depths, mini-batches per model, setting(s).
DEFAULTS: dict[str, dict[str, str]] = {
    "depth": {"placements": "post,pre", "num_layers": "6,8,10,12,14", "batches": "4"},
    # E||g|| and ||E g|| need many batches to separate (one compiled scan over them).
    "layers": {"placements": "post,pre", "num_layers": "6", "batches": "64"},
    "lemma2": {"placements": "post,pre", "num_layers": "12", "batches": "2"},
    "output-change": {
        "placements": "post,pre,admin",
        "num_layers": "2,4,6,8,10,12",
        "batches": "2",
    },
    "dependency": {"placements": "post,pre,admin", "num_layers": "18", "batches": "1"},
}
ERRORS = (UserError, ValueError, FileNotFoundError, KeyError)


SUBCOMMANDS = {
    "depth": "Xiong et al. fig. 3(c,d): the last FFN's gradient norm at initialisation, by depth",
    "layers": "Xiong et al. fig. 3(a,b): FFN gradient norms of every layer",
    "lemma2": "Xiong et al. Lemma 2, measured beside its prediction",
    "output-change": "Liu et al. fig. 2: output change under a parameter perturbation, by depth",
    "dependency": "Liu et al. figs. 7-8: each residual branch's share of a sub-layer's output",
    "monitor": "figures of runs' training-time measurements (monitor WORKDIR ... --out=DIR; "
    "`monitor --help` for its flags)",
}


def _config_front() -> cli.ConfigFront:
    from ln_jax.analysis.settings import DEFAULT_CONFIG, analysis_defaults

    return dataclasses.replace(
        cli.train_config_front(DEFAULT_CONFIG, analysis_defaults), example=DEFAULT_CONFIG
    )


COMMAND = cli.Command(
    "python -m ln_jax.analysis",
    __doc__,
    _config_front(),
    positionals=[("SUBCOMMAND", " | ".join(SUBCOMMANDS))],
    subcommands=SUBCOMMANDS,
)
# --config=FILE[:variant] and --config.SECTION.FIELD=VALUE are the config front's, as in every
# ln_jax command.
COMMAND.string(
    "out", None, "folder for <command>.json and <command>.png", required=True, meta="DIR"
)
COMMAND.string("placements", None, "arms, comma-separated (default per command)")
COMMAND.string("num_layers", None, "depths, comma-separated (default per command)")
COMMAND.string("seeds", "10", "a count (seeds 0..N-1) or a comma list")
COMMAND.string("batches", None, "mini-batches per model (default per command)")
COMMAND.string("setting", None, "bert | theory (lemma2: a list, default theory,bert)")
COMMAND.string("data", "corpus", "corpus | random (bert setting)")
COMMAND.string(
    "checkpoint", None, "a trained run's workdir, measured as an extra arm", meta="WORKDIR"
)
COMMAND.integer("train_steps", 50, "layers: Adam warm-up steps")
COMMAND.real("train_lr", 5e-4, "layers: peak learning rate")
COMMAND.real("epsilon", 0.01, "output-change: |delta|/|W|")


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        values = [int(s) for s in _split(text)]
    except ValueError:
        raise ValueError(f"--seeds={text!r}: give a count (10) or a comma list (0,3,7).") from None
    if len(values) == 1 and "," not in text:
        return tuple(range(values[0]))
    return tuple(values)


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--{name}={text!r}: give an integer.") from None


def parse_depths(text: str) -> list[int]:
    try:
        return [int(n) for n in _split(text)]
    except ValueError:
        raise ValueError(f"--num_layers={text!r}: give integers, e.g. 6,8,10,12,14.") from None


def _settings(args: argparse.Namespace, config: Any, setting: str):
    from ln_jax.analysis.settings import Settings

    return Settings(
        config=config,
        seeds=parse_seeds(args.seeds),
        batches=_int("batches", _given(args, "batches")),
        setting=setting,
        data=args.data,
        checkpoint=args.checkpoint,
    )


def _given(args: argparse.Namespace, name: str) -> str:
    """The option's value, or the subcommand's default when it was not given (not when empty)."""
    value = getattr(args, name)
    return DEFAULTS[args.command][name] if value is None else value


def measure(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """Runs the subcommand's measurement and returns its result dict."""
    from ln_jax import analysis

    placements = [p.replace("+", ",") for p in _split(_given(args, "placements"))]
    depths = parse_depths(_given(args, "num_layers"))
    settings_arg = _split(args.setting or ("theory,bert" if args.command == "lemma2" else "bert"))
    if args.command == "lemma2":
        settings = _settings(args, config, "bert")
        return analysis.lemma2(settings, placements, depths, settings_arg)
    if len(settings_arg) != 1:
        raise ValueError(f"--setting takes one of bert, theory for {args.command}.")
    settings = _settings(args, config, settings_arg[0])
    if args.command == "depth":
        return analysis.grad_norm_by_depth(settings, placements, depths)
    if args.command == "output-change":
        return analysis.output_change(settings, placements, depths, args.epsilon)
    if args.command == "layers":
        return analysis.grad_norm_by_layer(
            settings, placements, depths, args.train_steps, args.train_lr
        )
    return analysis.layer_dependency(settings, placements, depths)


def _show_progress() -> None:
    """Progress lines of ln_jax.analysis on stderr (absl owns the root logger's handler)."""
    logger = logging.getLogger("ln_jax.analysis")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def command_config(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """(the typed config, the remaining arguments) of an analysis command line: `--config`
    (default `DEFAULT_CONFIG`), the analysis defaults, then the `--config.*` overrides."""
    from ln_jax.analysis.settings import DEFAULT_CONFIG, analysis_defaults
    from ln_jax.config.load import build_config, config_from_command_line

    values, line = config_from_command_line(argv, DEFAULT_CONFIG, analysis_defaults())
    return build_config(values), line.rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["monitor"]:  # plots of runs' logged measurements: no model, no config
        from ln_jax.analysis import training

        return training.main(argv[1:])
    return COMMAND.run(_measure_and_write, argv)


def _arguments(inv: cli.Invocation) -> argparse.Namespace:
    """The subcommand and the flags' values."""
    if len(inv.words) > 1:
        raise ConfigError(
            f"unexpected argument {inv.words[1]!r} after {inv.words[0]}; config overrides look "
            "like --config.model.hidden_size=64 (see --help for the other options)."
        )
    values = {name: flag.value for name, flag in COMMAND.flags.items()}
    return argparse.Namespace(command=inv.words[0], **values)


def _measure_and_write(inv: cli.Invocation) -> int:
    try:
        args = _arguments(inv)
        config = inv.config()
    except ERRORS as err:
        return inv.report(err)
    _show_progress()
    try:
        result = measure(args, config)
    except ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        return inv.report(message if isinstance(message, BaseException) else ValueError(message))
    from ln_jax.analysis import PLOTS, write_json

    name = args.command
    json_path = os.path.join(args.out, f"{name}.json")
    write_json(json_path, result, digits=6, nan_as_null=True)
    png_path = PLOTS[name](result, os.path.join(args.out, f"{name}.png"))
    print(f"wrote {json_path} and {png_path}")
    return 0
