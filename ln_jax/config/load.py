"""The config front of every command line: `--config=FILE[:variant]` and
`--config.SECTION.FIELD=VALUE` overrides, read the same way by train.py, finetune.py,
`python -m ln_jax.experiments`, `python -m ln_jax.analysis` and `python -m
ln_jax.compile_check`, so a field that works in one works in all.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import importlib.util
import os
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ml_collections.config_dict import FieldReference

from ln_jax.validate import (
    LEGACY_SECTION,
    MOVED_FIELDS,
    ConfigError,
    Fix,
    closest,
    did_you_mean,
    family_field,
    family_field_message,
    moved_field_message,
    moved_message,
    suggest,
)

__all__ = [
    "CommandLine",
    "build_config",
    "config_from_command_line",
    "defaults_for",
    "derive_again",
    "fields_meant",
    "load_config",
    "override",
    "parse_command_line",
    "parse_value",
    "resolve_config_path",
    "shipped_configs",
]


# --------------------------------------------------------------------------- the config front
#
# Every command line (train.py, ln_jax.experiments, ln_jax.analysis, ln_jax.compile_check) and
# the tests read configs through these functions, so a field that works in one works in all:
#   --config=FILE[:variant]            a .py file whose get_config(variant) returns the config
#   --config.SECTION.FIELD=VALUE       an override of a field the config declares

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_PREFIX = "--config."
EXAMPLE_CONFIG = "configs/bert_preln.py:tiny"


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A command line split into the config's arguments and the command's own.

    Attributes:
      spec: the `--config=FILE[:variant]` given, or the command's default.
      overrides: dotted field -> raw text, from `--config.SECTION.FIELD=VALUE` in order.
      rest: every other argument, for the command's own flag parser.
    """

    spec: str | None
    overrides: dict[str, str]
    rest: list[str]


def parse_command_line(argv: Sequence[str], default_spec: str | None = None) -> CommandLine:
    """Takes `--config=...` / `--config ...` and `--config.A.B=V` / `--config.A.B V` out of argv."""
    spec, overrides, rest = default_spec, {}, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--config" or arg.startswith("--config="):
            spec = _flag_value(arg, args, "--config")
        elif arg.startswith(CONFIG_PREFIX):
            key = arg[len(CONFIG_PREFIX) :].partition("=")[0]
            overrides[key] = _flag_value(arg, args, CONFIG_PREFIX + key)
        else:
            rest.append(arg)
    return CommandLine(spec, overrides, rest)


def _flag_value(arg: str, following: list[str], name: str) -> str:
    if "=" in arg:
        return arg.split("=", 1)[1]
    if not following or following[0].startswith("--"):
        raise ConfigError(f"{name} needs a value: {name}=VALUE.")
    return following.pop(0)


def resolve_config_path(
    path: str, shipped: Callable[[], Sequence[str]] | None = None
) -> pathlib.Path:
    """A config file's path: as given (absolute, or relative to the working directory), else
    relative to the ln_jax checkout, so `configs/bert_preln.py` works from any directory.

    Raises:
      ConfigError: no such file, suggesting the closest of `shipped()` (the shipped configs
        the command takes; default: every shipped config).
    """
    given = pathlib.Path(path).expanduser()
    for candidate in (given, REPO_ROOT / given):
        if candidate.is_file():
            return candidate.resolve()
    raise _no_config_file(path, shipped() if shipped is not None else shipped_configs())


def shipped_configs() -> list[str]:
    """The config files of the checkout (`configs/*.py`, relative to it), sorted."""
    found = (REPO_ROOT / "configs").glob("[!_]*.py")
    return sorted(str(p.relative_to(REPO_ROOT)) for p in found if p.stem != "common")


def _no_config_file(path: str, shipped: Sequence[str]) -> ConfigError:
    """The error of a config path that is no file: the closest of `shipped`, if any."""
    places = dict.fromkeys([os.getcwd(), str(REPO_ROOT)])  # once each, in order
    near = closest(path, shipped)
    hint = f" Did you mean {near!r}?" if near else ""
    example = EXAMPLE_CONFIG if EXAMPLE_CONFIG.split(":")[0] in shipped else next(iter(shipped), "")
    return ConfigError(
        f"--config={path!r}: no such file (looked in {' and '.join(places)}).{hint} Give a "
        f"config file such as {example or EXAMPLE_CONFIG} (the shipped ones this command "
        f"takes: {', '.join(shipped) or 'none'}).",
        fix=Fix(set={"--config": near}) if near else None,
    )


def load_config(spec: str, shipped: Callable[[], Sequence[str]] | None = None) -> dict[str, Any]:
    """`FILE[:variant]` -> the nested dict of FILE's `get_config(variant)`.

    Raises:
      ConfigError: a missing file (suggesting the closest of `shipped()`, see
        `resolve_config_path`), a file without `get_config`, or an unknown variant.
    """
    return _plain(_get_config(spec, shipped))


def _get_config(spec: str, shipped: Callable[[], Sequence[str]] | None = None) -> Any:
    """What FILE's `get_config(variant)` returns (a ConfigDict keeps its references)."""
    path_text, _, variant = spec.partition(":")
    try:
        path = resolve_config_path(path_text, shipped)
    except ConfigError as err:
        if err.fix is not None and variant:  # the variant asked for, if the file has it
            near = f"{err.fix.set['--config']}:{variant}"
            with contextlib.suppress(ConfigError):
                _get_config(near)
                err.fix = Fix(set={"--config": near})
        raise
    root = str(path.parent.parent)  # configs/*.py import their siblings as `configs.common`
    if root not in sys.path:
        sys.path.insert(0, root)
    module_spec = importlib.util.spec_from_file_location(f"_ln_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config={spec!r}: {path} defines no get_config(variant).")
    try:
        return module.get_config(variant or None)
    except ValueError as err:
        raise ConfigError(f"--config={spec!r}: {err}") from None
    except AttributeError as err:  # a config file setting c.task_options.FIELD
        if LEGACY_SECTION not in str(err):
            raise
        raise ConfigError(
            f"--config={spec!r}: {path.name} sets c.{LEGACY_SECTION}, which moved: the task's own "
            "fields are its own section (c.translation.FIELD for translation; ln_jax/task.py)."
        ) from None


def _plain(config: Any) -> dict[str, Any]:
    """A deep, plain-dict copy of a ConfigDict or mapping."""
    values = config.to_dict() if hasattr(config, "to_dict") else config
    return {
        k: _plain(v) if isinstance(v, Mapping) or hasattr(v, "to_dict") else copy.deepcopy(v)
        for k, v in values.items()
    }


def override(config: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` (nested mapping or ConfigDict) with dotted `overrides` set.

    Only fields the config declares can be set (configs/common.py declares every field of the
    typed configs). A value given as text (from a command line) is parsed to the type of the
    field's current value: "1e-3" for a float, "true"/"False" for a bool, "None" for an
    optional field; text for a field whose default is None is read as a Python literal when it
    is one ("12", "(1, 2)") and kept as text otherwise.

    Raises:
      ConfigError: naming an unknown field and the closest declared one, a section set as a
        value, or a value that does not parse as the field's type.
    """
    out = _plain(config)
    for dotted, value in overrides.items():
        node, path = out, dotted.split(".")
        if path[0] == LEGACY_SECTION and LEGACY_SECTION not in out:
            raise _moved(out, dotted)
        if dotted in MOVED_FIELDS and dotted not in out and "optim" in out:
            rename = {CONFIG_PREFIX + dotted: CONFIG_PREFIX + MOVED_FIELDS[dotted]}
            raise ConfigError(moved_field_message(dotted), fix=Fix(rename=rename))
        if len(path) == 2 and family_field(*path):
            _check_family_field(out, dotted)
        for depth, key in enumerate(path):
            if not isinstance(node, dict) or key not in node:
                raise _unknown_field(out, path[:depth], key, node, dotted)
            if depth < len(path) - 1:
                node = node[key]
        leaf = path[-1]
        if isinstance(node[leaf], dict):
            first = next(iter(node[leaf]), "FIELD")
            raise ConfigError(
                f"config.{dotted} is a section, not a field; set its fields, e.g. "
                f"--config.{dotted}.{first}=VALUE."
            )
        node[leaf] = parse_value(dotted, value, node[leaf])
    return out


def _check_family_field(tree: Mapping[str, Any], dotted: str) -> None:
    """`model.nsp_head`, `data.nsp`, `data.max_tokens` ... of a config that no longer declares
    them: a family's own section since 2026-12-06 (`ln_jax.validate.FAMILY_FIELDS`); the fix
    renames the flag."""
    shared, field = dotted.split(".")
    if field in tree.get(shared, {}):
        return
    family = family_field(shared, field)
    section = tree.get(family)
    has = isinstance(section, dict) and field in section
    fix = Fix(rename={CONFIG_PREFIX + dotted: f"{CONFIG_PREFIX}{family}.{field}"}) if has else None
    raise ConfigError(family_field_message(shared, field, has), fix=fix)


def _moved(tree: Mapping[str, Any], dotted: str) -> ConfigError:
    """The error of `task_options.FIELD`: the task's own fields moved into the task's section
    (`ln_jax.task`) on 2026-12-05; the fix renames the flag."""
    from ln_jax.task import options_section  # JAX's import, on this error's path only

    try:
        section = options_section(str(tree.get("task", "bert_pretraining")))
    except ValueError:
        section = None
    field = dotted.partition(".")[2]
    fix = None
    if section is not None and field:
        if field not in tree.get(section, {}):  # not one of the section's fields: no move
            return ConfigError(
                f"config field {dotted} is gone: the task's own fields are its section "
                f"{section} (--config.{section}.FIELD), which has no {field!r}; remove it."
            )
        fix = Fix(rename={CONFIG_PREFIX + dotted: f"{CONFIG_PREFIX}{section}.{field}"})
    return ConfigError(moved_message(dotted, section), fix=fix)


def fields_meant(tree: Mapping[str, Any], dotted: str) -> list[str]:
    """The declared fields that `dotted` ("model.placement", "lr") names or likely means
    (`ln_jax.validate.suggest`): itself where declared; empty for a section or nothing."""
    node: Any = tree
    path = dotted.split(".")
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping):
            return []
        if key not in node:
            rest = path[depth + 1 :]
            near = suggest(tree, path[:depth], key, field=not rest)
            return [".".join([n, *rest]) for n in near]
        node = node[key]
    return [] if isinstance(node, Mapping) else [dotted]


def _unknown_field(tree: dict, parents: list[str], key: str, node: Any, dotted: str) -> ConfigError:
    """The error of an unknown field: the declared names it likely means
    (`ln_jax.validate.suggest`) and, where that is one, the command line's fix
    (`--config.<dotted>` renamed)."""
    where = ".".join(parents)
    if not isinstance(node, dict):
        return ConfigError(f"config.{where} is a field, not a section: it has no field {key!r}.")
    rest = dotted.split(".")[len(parents) + 1 :]
    near = suggest(tree, parents, key, field=not rest)
    hint = " D" + did_you_mean(near)[1:] if near else ""
    fix = None
    if len(near) == 1:
        fix = Fix(rename={CONFIG_PREFIX + dotted: CONFIG_PREFIX + ".".join([near[0], *rest])})
    name = ".".join([*parents, key])
    return ConfigError(
        f"unknown config field {name!r}.{hint} The fields of "
        f"{where or 'the config'} are: {', '.join(node)} (--help lists them, with their values).",
        fix=fix,
    )


def parse_value(field: str, value: Any, current: Any) -> Any:
    """`value` (text from a command line, or a Python value) as the type of `current`."""
    if not isinstance(value, str) or isinstance(current, str):
        return value
    if value.strip() == "None":
        return None
    if isinstance(current, bool):
        flag = {"true": True, "1": True, "false": False, "0": False}.get(value.strip().lower())
        if flag is None:
            raise ConfigError(f"config.{field}={value!r}: give True or False.")
        return flag
    kind = type(current) if isinstance(current, int | float) else None
    if kind is not None:
        try:
            return kind(value) if kind is float else int(value, 10)
        except ValueError:
            raise ConfigError(f"config.{field}={value!r}: give a {kind.__name__}.") from None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value  # text such as a placement name or a path


def build_config(values: Mapping[str, Any]) -> Any:
    """The typed, validated `TrainConfig` of a nested config mapping.

    Raises:
      ConfigError: any invalid field or combination, with the typed configs' message.
    """
    from ln_jax.config.run import TrainConfig  # JAX's import: not for reading a command line

    try:
        return TrainConfig.from_mapping(_plain(values))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err), fix=getattr(err, "fix", None)) from None


def config_from_command_line(
    argv: Sequence[str],
    default_spec: str | None = None,
    defaults: Mapping[str, Any] = (),
    shipped: Callable[[], Sequence[str]] | None = None,
) -> tuple[dict[str, Any], CommandLine]:
    """The nested config of a command line: FILE[:variant], then `defaults`, then overrides;
    then the config's derived fields (`derive_again`: a preset's warm-up as a fraction of
    `total_steps`) from the values given. `shipped`: the configs a missing file's error may
    suggest (`resolve_config_path`).

    Returns:
      (the nested config mapping, the parsed command line).

    Raises:
      ConfigError: no `--config` and no default, or any error of `load_config`/`override`.
    """
    line = parse_command_line(argv, default_spec)
    if line.spec is None:
        raise ConfigError(
            f"give a config: --config=FILE[:variant], e.g. {EXAMPLE_CONFIG}.",
            fix=Fix(set={"--config": EXAMPLE_CONFIG}),
        )
    raw = _get_config(line.spec, shipped)
    defaults = defaults_for(_plain(raw), defaults)
    values = override(override(_plain(raw), defaults), line.overrides)
    return derive_again(raw, values, [*defaults, *line.overrides]), line


def defaults_for(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `defaults` (dotted fields, a command's own defaults) whose section the
    config `values` has: a command's defaults for one family's section (the analyses' "bert")
    do not apply to a config of another."""
    return {k: v for k, v in dict(defaults).items() if k.split(".")[0] in values}


def derive_again(raw: Any, values: dict[str, Any], given: Sequence[str]) -> dict[str, Any]:
    """`values` with the derived fields of `raw` (a config file's ConfigDict: fields that are
    ml_collections references computed from others, `configs.common.from_total_steps`)
    computed again from the fields `given` (dotted names, as set in `values`), except those
    given themselves. `--config.total_steps=5` on a preset whose warm-up is 10% of its run
    then warms up over 10% of 5 steps, not of the preset's 300."""
    derived = [f for f in _derived_fields(raw) if f not in given]
    if not derived or not given:
        return values
    fresh = copy.deepcopy(raw)
    for dotted in given:
        *parents, leaf = dotted.split(".")
        node = fresh
        for key in parents:
            node = node[key]
        with contextlib.suppress(TypeError, KeyError, AttributeError):  # not a typed input
            node[leaf] = _value_at(values, dotted)
    computed = _plain(fresh)
    for dotted in derived:
        *parents, leaf = dotted.split(".")
        node = values
        for key in parents:
            node = node[key]
        node[leaf] = _value_at(computed, dotted)
    return values


def _derived_fields(config: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields of a ConfigDict that are computed from other fields."""
    fields = getattr(config, "_fields", None)
    if fields is None:
        return []
    found = []
    for key, field in fields.items():
        if isinstance(field, FieldReference) and field._ops:
            found.append(prefix + key)
        elif hasattr(field, "_fields"):
            found += _derived_fields(field, f"{prefix}{key}.")
    return found


def _value_at(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        node = node[key]
    return node
