"""The command line: `python -m ln_jax.analysis SUBCOMMAND --out=DIR [options]`.

  python -m ln_jax.analysis depth --out=docs/analysis
  python -m ln_jax.analysis layers --out=/tmp/a --placements=post,pre --train_steps=50
  python -m ln_jax.analysis lemma2 --out=/tmp/a --setting=theory,bert --num_layers=12
  python -m ln_jax.analysis output-change --out=/tmp/a --placements=post,pre,admin
  python -m ln_jax.analysis dependency --out=/tmp/a --checkpoint=workdirs/bert_postln_tiny
  python -m ln_jax.analysis monitor WORKDIR [WORKDIR ...] --out=DIR   (training-time
      measurements of runs: see ln_jax/analysis/training.py)

The model and data come from `--config=FILE[:variant]` (default configs/bert_preln.py:tiny)
with the analysis defaults on top (Xavier initialisation, sequences of 64, batches of 16) and
then `--config.SECTION.FIELD=VALUE` overrides. `--placements` separates arms by commas; a
per-layer list inside one arm joins its items with "+" ("post*3+pre*3"). `--seeds=10` means
seeds 0..9; a comma list names seeds ("--seeds=0,4,7").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ln_jax.validate import UserError

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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ln_jax.analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(DEFAULTS), help="the measurement")
    # --config=FILE[:variant] and --config.SECTION.FIELD=VALUE are taken out of the command
    # line before this parser (ln_jax.config_front.parse_command_line), as in every ln_jax command.
    p.add_argument("--out", required=True, help="folder for <command>.json and <command>.png")
    p.add_argument("--placements", help="arms, comma-separated (default per command)")
    p.add_argument("--num_layers", help="depths, comma-separated (default per command)")
    p.add_argument("--seeds", default="10", help="a count (seeds 0..N-1) or a comma list")
    p.add_argument("--batches", help="mini-batches per model (default per command)")
    p.add_argument("--setting", help="bert | theory (lemma2: a list, default theory,bert)")
    p.add_argument("--data", default="corpus", help="corpus | random (bert setting)")
    p.add_argument("--checkpoint", help="a trained run's workdir, measured as an extra arm")
    p.add_argument("--train_steps", type=int, default=50, help="layers: Adam warm-up steps")
    p.add_argument("--train_lr", type=float, default=5e-4, help="layers: peak learning rate")
    p.add_argument("--epsilon", type=float, default=0.01, help="output-change: |delta|/|W|")
    return p


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
    from ln_jax.config_front import build_config, config_from_command_line

    values, line = config_from_command_line(argv, DEFAULT_CONFIG, analysis_defaults())
    return build_config(values), line.rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["monitor"]:  # plots of runs' logged measurements: no model, no config
        from ln_jax.analysis import training

        return training.main(argv[1:])
    try:
        config, rest = command_config(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args, extra = _parser().parse_known_args(rest)
    if extra:
        print(
            f"error: unrecognised argument {extra[0]!r}; config overrides look like "
            "--config.model.hidden_size=64 (see --help for the other options).",
            file=sys.stderr,
        )
        return 2
    _show_progress()
    try:
        result = measure(args, config)
    except ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    from ln_jax.analysis import PLOTS, write_json

    name = args.command
    json_path = os.path.join(args.out, f"{name}.json")
    write_json(json_path, result, digits=6, nan_as_null=True)
    png_path = PLOTS[name](result, os.path.join(args.out, f"{name}.png"))
    print(f"wrote {json_path} and {png_path}")
    return 0
