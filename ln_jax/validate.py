"""Leaf validators shared by every typed config (model, optimizer, data, run), and the error
types every command line reports in one line (user errors; a training's non-finite stop).

This module imports nothing from ln_jax, so that `config.py`, `optim.py` and `data/config.py`
can all use it without importing each other.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ln_jax import field_names

MAX_LISTED = 20  # more valid names than this are not listed in a message


@dataclasses.dataclass(frozen=True)
class Fix:
    """The change to a command line that fixes a user error; `ln_jax.cli` applies it to the
    user's own arguments and shows the whole command that works.

    Attributes:
      set: argument name -> value, e.g. {"--config.model.placement": "pre"}: replaces the
        argument where the user gave it, else adds it.
      rename: misspelt argument name -> the right one (the value is kept).
    """

    set: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rename: Mapping[str, str] = dataclasses.field(default_factory=dict)


class UserError(Exception):
    """An error in what the user asked for (config, mesh, dataset, workdir, checkpoint): its
    message names the problem and the fix, so command lines print it alone and exit 2.

    `fix` (optional): the `Fix` of the command line; a command then prints the whole command
    that works after the message.
    """

    def __init__(self, *args: Any, fix: Fix | None = None):
        super().__init__(*args)
        self.fix = fix


class NonFiniteError(RuntimeError):
    """Training produced a NaN/Inf loss or gradient (nan_policy="stop"); `fix`: the change to
    the command line that goes on past it (`--config.nan_policy=skip`). Raised by
    `ln_jax.train.trainer` (as `trainer.NonFiniteError`); defined here so that a command can
    name it without importing the trainer."""

    def __init__(self, *args: Any, fix: Fix | None = None):
        super().__init__(*args)
        self.fix = fix


class ConfigError(UserError, ValueError):
    """A user error in a config or a command line: the message names the field and the fix."""


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt `name`, or None if nothing is close."""
    matches = close_names(name, valid, 1)
    return matches[0] if matches else None


def close_names(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` valid names close to a misspelt `name` (difflib's ratio >= 0.6), closest first."""
    return difflib.get_close_matches(str(name), [str(v) for v in valid], n=n)


def did_you_mean(names: list[str]) -> str:
    """ "did you mean 'a', 'b' or 'c'?" (empty for no names)."""
    if not names:
        return ""
    quoted = [repr(n) for n in names]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {listed}?"


def check_choice(
    field: str,
    value: Any,
    valid: Iterable[Any],
    *,
    config_field: str | None = None,
    shown: Iterable[str] | None = None,
    error: type[UserError] = ConfigError,
) -> None:
    """Raises `unknown_choice(...)` (a ConfigError, hence a ValueError, by default) if `value`
    is not one of `valid`; the arguments are `unknown_choice`'s."""
    valid = tuple(valid)
    if value not in valid:
        raise unknown_choice(
            field, value, valid, config_field=config_field, shown=shown, error=error
        )


def unknown_choice(
    field: str,
    value: Any,
    valid: Iterable[Any],
    *,
    config_field: str | None = None,
    shown: Iterable[str] | None = None,
    error: type[UserError] = ConfigError,
) -> UserError:
    """The error of a value that is none of `valid`: it lists the valid names (`shown`
    instead, e.g. with patterns such as "textdir:FOLDER"; only up to MAX_LISTED) and suggests
    the closest ones (difflib): "unknown model.norm 'rmsnrom'; valid names: layernorm,
    rmsnorm; did you mean 'rmsnorm'?".

    Args:
      field: the field as the message names it ("model.norm", "data.dataset").
      value: the value given.
      valid: the values accepted.
      config_field: the dotted config field the value came from: the error's `Fix` then sets
        `--config.<config_field>` to the closest name.
      shown: the names the message lists (default: `valid`, sorted).
      error: the exception class returned.
    """
    names = [str(v) for v in valid]
    near = close_names(str(value), names)
    listed = sorted(names) if shown is None else list(shown)
    parts = [f"unknown {field} {value!r}"]
    if len(listed) <= MAX_LISTED:
        parts.append(f"valid names: {', '.join(listed)}")
    if near:
        parts.append(did_you_mean(near))
    message = "; ".join(parts) + ("" if near else ".")
    fix = Fix(set={f"--config.{config_field}": near[0]}) if config_field and near else None
    return error(message, fix=fix)


def reject_unknown_keys(kind: str, given: Mapping[str, Any], valid: Iterable[str]) -> None:
    """Raises ValueError naming, for an unknown key, the valid field it likely means: one
    another trainer calls so (`ln_jax.field_names.ALIASES`: "lr" -> "peak_lr"), else the
    closest spelling."""
    valid = list(valid)
    for key in given:
        if key not in valid:
            aliased = [a.rsplit(".", 1)[-1] for a in field_names.ALIASES.get(str(key).lower(), ())]
            near = [a for a in aliased if a in valid] or close_names(key, valid, 1)
            hint = " D" + did_you_mean(near)[1:] if near else ""
            raise ValueError(f"unknown {kind} field {key!r}.{hint} Valid: {', '.join(valid)}.")
