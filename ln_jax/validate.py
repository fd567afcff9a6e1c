"""Leaf validators shared by every typed config (model, optimizer, data, run).

This module imports nothing from ln_jax, so that `config.py`, `optim.py` and `data/config.py`
can all use it without importing each other.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class UserError(Exception):
    """An error in what the user asked for (config, mesh, dataset, workdir, checkpoint): its
    message names the problem and the fix, so command lines print it alone and exit 2."""


class ConfigError(UserError, ValueError):
    """A user error in a config or a command line: the message names the field and the fix."""


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt `name`, or None if nothing is close."""
    matches = difflib.get_close_matches(name, list(valid), n=1)
    return matches[0] if matches else None


def check_choice(field: str, value: Any, valid: Iterable[Any]) -> None:
    """Raises ValueError listing the valid names if `value` is not one of them."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"unknown {field} {value!r}; valid names: {', '.join(sorted(valid))}.")


def reject_unknown_keys(kind: str, given: Mapping[str, Any], valid: Iterable[str]) -> None:
    """Raises ValueError naming the closest valid field for each misspelt key."""
    valid = list(valid)
    for key in given:
        if key not in valid:
            near = closest(key, valid)
            hint = f" Did you mean {near!r}?" if near else ""
            raise ValueError(f"unknown {kind} field {key!r}.{hint} Valid: {', '.join(valid)}.")
