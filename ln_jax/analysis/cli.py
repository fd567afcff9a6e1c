"""The command line: `python -m ln_jax.analysis SUBCOMMAND --out=DIR [options]`.

  python -m ln_jax.analysis depth --out=docs/analysis
  python -m ln_jax.analysis layers --out=/tmp/a --placements=post,pre --train_steps=50
  python -m ln_jax.analysis lemma2 --out=/tmp/a --setting=theory,bert --num_layers=12
  python -m ln_jax.analysis output-change --out=/tmp/a --placements=post,pre,admin
  python -m ln_jax.analysis dependency --out=/tmp/a --checkpoint=workdirs/bert_postln_tiny

The model and data come from `--config=FILE[:variant]` (default configs/bert_preln.py:tiny)
with the analysis defaults on top (Xavier initialisation, sequences of 64, batches of 16) and
then `--config.SECTION.FIELD=VALUE` overrides. `--placements` separates arms by commas; a
per-layer list inside one arm joins its items with "+" ("post*3+pre*3"). `--seeds=10` means
seeds 0..9; a comma list names seeds ("--seeds=0,4,7").
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_CONFIG = "configs/bert_preln.py:tiny"
# Per subcommand: placements, depths, mini-batches per model, setting(s).
DEFAULTS: dict[str, dict[str, str]] = {
    "depth": {"placements": "post,pre", "num_layers": "6,8,10,12,14", "batches": "4"},
    "layers": {"placements": "post,pre", "num_layers": "6", "batches": "4"},
    "lemma2": {"placements": "post,pre", "num_layers": "12", "batches": "2"},
    "output-change": {
        "placements": "post,pre,admin",
        "num_layers": "2,4,6,8,10,12",
        "batches": "2",
    },
    "dependency": {"placements": "post,pre,admin", "num_layers": "18", "batches": "1"},
}
ERRORS = (ValueError, FileNotFoundError, KeyError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ln_jax.analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=sorted(DEFAULTS), help="the measurement")
    p.add_argument("--out", required=True, help="folder for <command>.json and <command>.png")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="config file[:variant]")
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


def load_config_file(spec: str) -> dict[str, Any]:
    """`path.py[:variant]` -> the nested dict of its `get_config(variant)`."""
    path, _, variant = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config={spec!r}: no file {path!r} (e.g. {DEFAULT_CONFIG}).")
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if root not in sys.path:
        sys.path.insert(0, root)  # configs/*.py import their siblings as `configs.common`
    module_spec = importlib.util.spec_from_file_location("_analysis_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(variant or None)
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def parse_overrides(extra: Sequence[str]) -> dict[str, Any]:
    """["--config.model.hidden_size=64", ...] -> {"model.hidden_size": 64, ...}."""
    out = {}
    for arg in extra:
        key, eq, raw = arg.partition("=")
        if not key.startswith("--config.") or not eq:
            raise ValueError(
                f"unrecognised argument {arg!r}; config overrides look like "
                "--config.model.hidden_size=64 (see --help for the other options)."
            )
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a plain string such as a placement name
        out[key[len("--config.") :]] = value
    return out


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


def _settings(args: argparse.Namespace, overrides: dict[str, Any], setting: str):
    from ln_jax.analysis.settings import Settings, analysis_config

    return Settings(
        config=analysis_config(load_config_file(args.config), overrides),
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


def measure(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """Runs the subcommand's measurement and returns its result dict."""
    from ln_jax import analysis

    placements = [p.replace("+", ",") for p in _split(_given(args, "placements"))]
    depths = parse_depths(_given(args, "num_layers"))
    settings_arg = _split(args.setting or ("theory,bert" if args.command == "lemma2" else "bert"))
    if args.command == "lemma2":
        settings = _settings(args, overrides, "bert")
        return analysis.lemma2(settings, placements, depths, settings_arg)
    if len(settings_arg) != 1:
        raise ValueError(f"--setting takes one of bert, theory for {args.command}.")
    settings = _settings(args, overrides, settings_arg[0])
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


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    _show_progress()
    try:
        overrides = parse_overrides(extra)
        result = measure(args, overrides)
    except ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    from ln_jax.analysis import PLOTS, write_json

    name = args.command
    json_path = write_json(result, os.path.join(args.out, f"{name}.json"))
    png_path = PLOTS[name](result, os.path.join(args.out, f"{name}.png"))
    print(f"wrote {json_path} and {png_path}")
    return 0
