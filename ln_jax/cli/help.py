"""The config fields as `--help` lists them: grouped by section, each with its value and the
first sentence of its docstring (`config_fields`), in rows of `_row`. Used by
`ln_jax.cli.command`."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Mapping
from typing import Any

_WIDTH = 100
_NAME_COLUMN = 44


def config_fields(config: Any) -> list[str]:
    """Help lines of a typed config's fields (an instance: its values; a class: its
    defaults): the top-level fields first, then one group per section, one line each:
    `  section.field=value   first sentence of the field's docstring`."""
    cls = config if isinstance(config, type) else type(config)
    docs = field_docs(cls)
    scalars, sections = [], []
    for field in dataclasses.fields(cls):
        value = _field_value(config, field)
        section = _section_class(field, value)
        if field.name == "options":  # a task's own fields: its section, under its name
            if section is not None:
                sections.append((config.options_section, section, value))
            continue
        if section is None:
            scalars.append(_row(f"  {field.name}={_show(value)}", docs.get(field.name, "")))
        else:
            sections.append((field.name, section, value))
    lines = [_row("run:", "the run's own fields (--config.FIELD=VALUE)"), *scalars]
    for name, section, value in sections:
        inner = section if value is None else value
        lines.append(_row(f"{name}:", _first_sentence(inspect.getdoc(section) or "")))
        section_docs = field_docs(section)
        for field in dataclasses.fields(section):
            shown = _show(_field_value(inner, field))
            lines.append(_row(f"  {name}.{field.name}={shown}", section_docs.get(field.name, "")))
    return lines


def _field_value(config: Any, field: dataclasses.Field) -> Any:
    if not isinstance(config, type):
        return getattr(config, field.name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        made = field.default_factory()
        return None if dataclasses.is_dataclass(made) else made
    return None


def _section_class(field: dataclasses.Field, value: Any) -> type | None:
    """The dataclass of a section field (model, optim, ...), None for a plain field."""
    if dataclasses.is_dataclass(value):
        return type(value)
    factory = field.default_factory
    if factory is not dataclasses.MISSING and isinstance(factory, type):
        return factory if dataclasses.is_dataclass(factory) else None
    return None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return repr(dict(value))
    return repr(value)


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the first sentence of its entry under "Attributes:" in `cls`'s docstring
    (an entry may name several fields: "eval_every / checkpoint_every / log_every: ...")."""
    lines = (inspect.getdoc(cls) or "").splitlines()
    if "Attributes:" not in lines:
        return {}
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in lines[lines.index("Attributes:") + 1 :]:
        if not line.strip():
            break
        entry = re.match(r"^(\s+)([\w][\w ,/]*):\s*(.*)$", line)
        if entry and (indent is None or len(entry.group(1)) == indent):
            indent = len(entry.group(1))
            names = [n.strip() for n in re.split(r"[/,]", entry.group(2)) if n.strip()]
            for name in names:
                docs[name] = entry.group(3)
        elif names:
            for name in names:
                docs[name] += " " + line.strip()
    return {name: _first_sentence(text) for name, text in docs.items()}


def _first_sentence(text: str) -> str:
    """The first sentence of `text` (up to a full stop that ends it; "e.g." does not)."""
    text = " ".join(text.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)(?<! al)\.(\s|$)", text)
    return text[: end.start() + 1] if end else text


def _row(left: str, right: str, wrap: bool = False) -> str:
    """One help line: `  left   right`, the right column at _NAME_COLUMN (further right after
    a long left part), cut to _WIDTH characters (`wrap`: wrapped onto more lines instead)."""
    left = f"  {left}"
    if not right:
        return left
    left = left.ljust(_NAME_COLUMN) if len(left) < _NAME_COLUMN else left + "  "
    right = right.replace("``", "`")
    if wrap:
        indent = " " * _NAME_COLUMN
        return textwrap.fill(
            right,
            _WIDTH,
            initial_indent=left,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    room = max(_WIDTH - len(left), 30)
    return left + textwrap.shorten(right, room, placeholder=" ...")
