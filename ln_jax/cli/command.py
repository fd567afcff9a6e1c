"""The one command-line convention of every ln_jax command: train.py, finetune.py, `python -m
ln_jax.compile_check | analysis | experiments | translate`, and any new `Command`.

A command is a `Command`: its docstring (usage and examples), its own flags (`--name=VALUE` or
`--name VALUE`; booleans also bare `--name`, `--noname`, `--name=false`; lists
comma-separated), its positional words, and the config front (`ln_jax.config.load`:
`--config=FILE[:variant]` and `--config.SECTION.FIELD=VALUE`). Every command

* prints its help and exits 0 on `-h` or `--help` (absl's `--helpfull`, `--helpshort` too),
  with or without `--config`: usage, the docstring with its examples, the flags, and the
  config's fields grouped by section, one line each: the defaults, or with `--config` the
  values that config resolves to;
* reports a user error (`ln_jax.validate.UserError`) in one line and exits 2; an error that
  knows its fix (a `fix`: `UserError.fix`, or another error's, e.g. a NaN stop's, which
  keeps its own exit status) ends with the whole command that works, built from the user's
  own arguments (`fixed_command`).

A new command (the lead's `ln_jax.translate`):

    COMMAND = cli.Command("python -m ln_jax.translate", __doc__)
    WORKDIR = COMMAND.string("workdir", None, "A translation run's workdir.", required=True)
    BEAM = COMMAND.integer("beam", 4, "Beam width.")

    def main(argv=None) -> int:
        return COMMAND.run(lambda inv: _translate(WORKDIR.value, BEAM.value), argv)
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import shlex
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ln_jax import console
from ln_jax.cli.help import _row, config_fields
from ln_jax.config import load as config_front
from ln_jax.validate import ConfigError, Fix, UserError, close_names, did_you_mean

HELP_FLAGS = ("-h", "--help", "--helpfull", "--helpshort")
EXIT_USER_ERROR = console.EXIT_USER_ERROR
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


# --------------------------------------------------------------------------- flags


@dataclasses.dataclass
class Flag:
    """One flag of a command; `value` holds what the command line gave (else `default`).

    Attributes:
      name: the flag's name, without dashes.
      kind: "string", "integer", "float", "bool", "list" (comma-separated) or "enum".
      default: the value when the flag is not given.
      help: one line.
      choices: the values an "enum" flag accepts.
      required: the command needs it (not for --help).
      meta: the value's name in the help ("DIR"; default by kind).
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    required: bool = False
    meta: str = ""
    value: Any = None
    present: bool = False

    def reset(self) -> None:
        self.value, self.present = self.default, False

    def set(self, text: str | None) -> None:
        """Sets `value` from the command line's text (None: a bare boolean flag)."""
        self.value, self.present = self._parse(text), True

    def _parse(self, text: str | None) -> Any:
        if self.kind == "bool":
            if text is None:
                return True
            flag = _BOOLS.get(text.strip().lower())
            if flag is None:
                raise ConfigError(f"--{self.name}={text!r}: give true or false.")
            return flag
        if self.kind == "list":
            return [item.strip() for item in text.split(",") if item.strip()]
        if self.kind == "enum" and text not in self.choices:
            near = close_names(text, self.choices)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ConfigError(
                f"--{self.name}={text!r}: give one of {', '.join(self.choices)}.{hint}",
                fix=Fix(set={f"--{self.name}": near[0]}) if near else None,
            )
        number = {"integer": int, "float": float}.get(self.kind)
        if number is None:
            return text
        try:
            return number(text)
        except ValueError:
            raise ConfigError(
                f"--{self.name}={text!r}: give a{'n' * (number is int)} {self.kind}."
            ) from None

    def usage(self) -> str:
        if self.kind == "bool":
            return f"--[no]{self.name}"
        kinds = {"list": "A,B,...", "enum": "|".join(self.choices), "integer": "N", "float": "X"}
        meta = self.meta or kinds.get(self.kind, "VALUE")
        return f"--{self.name}={meta}"

    def describe(self) -> str:
        default = self.default
        if isinstance(default, list):
            default = ",".join(map(str, default))
        tail = " (required)" if self.required else ""
        if default not in (None, "", []) and not self.required:
            tail = f" (default: {default})"
        return _row(self.usage(), self.help + tail, wrap=True)


# --------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True)
class ConfigFront:
    """How a command reads its config, for its help and its `Invocation.config_values`.

    Attributes:
      kind: the typed config class whose defaults the help shows without `--config`
        (a callable returning it, so that importing it waits for the help).
      build: nested values -> the typed config (what `--config` resolves to).
      default_spec: the config used when no `--config` is given: a `FILE[:variant]`, a
        callable of the positional words giving one, or None (then `--config` is required).
      defaults: a callable giving the command's own defaults, applied between the file and
        the user's overrides (the analysis defaults).
      example: a config to name in the fix of a missing `--config`.
    """

    kind: Callable[[], type]
    build: Callable[[Mapping[str, Any]], Any]
    default_spec: str | Callable[[list[str]], str | None] | None = None
    defaults: Callable[[], Mapping[str, Any]] | None = None
    example: str = "configs/bert_preln.py:tiny"


def train_config_front(
    default_spec: str | Callable[[list[str]], str | None] | None = None,
    defaults: Callable[[], Mapping[str, Any]] | None = None,
) -> ConfigFront:
    """The config front of the commands reading a `TrainConfig` (train.py, compile_check, ...).
    The class is imported when first asked for (it imports JAX): a command line is read, and
    a busy workdir refused, without it."""

    def kind() -> type:
        from ln_jax.config.run import TrainConfig

        return TrainConfig

    return ConfigFront(kind, config_front.build_config, default_spec, defaults)


class Command:
    """A command line: its flags, positional words, config front and help (module docstring).

    Args:
      prog: how the user starts it, e.g. "python train.py", "python -m ln_jax.analysis".
      doc: the module docstring: usage and examples, printed by --help.
      config: the command's `ConfigFront`, or None for a command without a config.
      positionals: (name, one line) of the positional words, for the help, e.g.
        ("STUDY", "depth | warmup | downstream").
      subcommands: name -> one line, listed by the help (and checked when given).
    """

    def __init__(
        self,
        prog: str,
        doc: str | None,
        config: ConfigFront | None = None,
        positionals: Sequence[tuple[str, str]] = (),
        subcommands: Mapping[str, str] | None = None,
    ):
        self.prog, self.doc, self.config = prog, inspect.cleandoc(doc or ""), config
        self.positionals, self.subcommands = tuple(positionals), dict(subcommands or {})
        self.flags: dict[str, Flag] = {}

    # ------------------------------------------------------------------ defining flags

    def _define(self, name: str, kind: str, default: Any, help: str, **extra: Any) -> Flag:
        if name in self.flags:
            raise ValueError(f"{self.prog}: flag --{name} defined twice")
        flag = Flag(name, kind, default, help, **extra)
        flag.reset()
        self.flags[name] = flag
        return flag

    def string(
        self, name: str, default: str | None, help: str, required: bool = False, meta: str = ""
    ) -> Flag:
        """A text flag; `meta` names its value in the help (e.g. "DIR")."""
        return self._define(name, "string", default, help, required=required, meta=meta)

    def integer(self, name: str, default: int | None, help: str) -> Flag:
        return self._define(name, "integer", default, help)

    def real(self, name: str, default: float | None, help: str) -> Flag:
        return self._define(name, "float", default, help)

    def boolean(self, name: str, default: bool, help: str) -> Flag:
        return self._define(name, "bool", default, help)

    def strings(self, name: str, default: list[str] | None, help: str) -> Flag:
        """A comma-separated list (its value: a list of strings)."""
        return self._define(name, "list", default, help)

    def enum(self, name: str, default: str, choices: Iterable[str], help: str) -> Flag:
        return self._define(name, "enum", default, help, choices=tuple(choices))

    # ------------------------------------------------------------------ running

    def run(self, body: Callable[[Invocation], int], argv: Sequence[str] | None = None) -> int:
        """Parses `argv` (default sys.argv[1:]) and returns `body(invocation)`'s exit status;
        --help prints the help (0), a user error in the command line its line (2)."""
        argv = list(sys.argv[1:] if argv is None else argv)
        inv = Invocation(self, argv)
        if wants_help(argv):
            with contextlib.suppress(BrokenPipeError):  # `--help | head`
                print(self.help(argv), flush=True)
            return 0
        try:
            inv.parse()
        except UserError as err:
            return inv.report(err)
        _mark_absl_flags_parsed()
        return body(inv)

    def main(self, body: Callable[[Invocation], int]) -> None:
        """`sys.exit(self.run(body))`: a command's `if __name__ == "__main__"` line."""
        sys.exit(self.run(body))

    # ------------------------------------------------------------------ help

    def help(self, argv: Sequence[str] = ()) -> str:
        """The help text: usage, docstring, subcommands, flags, config fields."""
        parts = [f"usage: {self.usage()}", "", self.doc]
        if self.subcommands:
            parts += ["", "subcommands:"]
            parts += [_row(name, text) for name, text in self.subcommands.items()]
        if self.flags:
            parts += ["", "flags:", *(flag.describe() for flag in self.flags.values())]
        parts.append(_row("-h, --help", "this help (with --config: that config's values)"))
        if self.config is not None:
            parts += ["", *self._config_help(argv)]
        return "\n".join(parts).rstrip() + "\n"

    def usage(self) -> str:
        words = [self.prog, *(name for name, _ in self.positionals)]
        if self.config is not None:
            config = "--config=FILE[:variant]"
            words.append(config if self.config.default_spec is None else f"[{config}]")
            words.append("[--config.SECTION.FIELD=VALUE ...]")
        required = [f.usage() for f in self.flags.values() if f.required]
        return " ".join([*words, *required, "[flags]" if self.flags else ""]).strip()

    def _config_help(self, argv: Sequence[str]) -> list[str]:
        line = config_front.parse_command_line(argv)
        if line.spec is None and not line.overrides and self._default_spec(argv) is None:
            typed, head = None, "the defaults; with --config=FILE[:variant], the values it gives"
        else:
            try:
                typed = self.config.build(Invocation(self, list(argv)).config_values())
                given = " with the overrides given" if line.overrides else ""
                spec = line.spec or f"{self._default_spec(argv)} (the default)"
                head = f"the values of {spec}{given}"
            except (UserError, ValueError, TypeError) as err:
                typed, head = None, f"the defaults: {err}"
        lines = [f"config fields (--config.SECTION.FIELD=VALUE; {head}):"]
        return lines + config_fields(typed if typed is not None else self.config.kind())

    def _default_spec(self, argv: Sequence[str], words: list[str] | None = None) -> str | None:
        """The config used without `--config` (for these positional words, which are guessed
        from `argv` when not given)."""
        spec = self.config.default_spec
        if not callable(spec):
            return spec
        if words is None:
            words = [a for a in config_front.parse_command_line(argv).rest if a[:1] != "-"]
        return spec(words)


def wants_help(argv: Sequence[str]) -> bool:
    """True when the command line asks for help (before any `--`)."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    return any(arg in HELP_FLAGS for arg in args)


def _mark_absl_flags_parsed() -> None:
    """Libraries that log through absl (orbax, TFDS) then log without absl's "Logging before
    flag parsing" line; ln_jax's commands read no absl flag."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS([sys.argv[0]])


# --------------------------------------------------------------------------- one invocation


class Invocation:
    """One command line of a `Command`: the arguments as given, then parsed.

    Attributes:
      command: the Command.
      argv: the arguments as the user gave them (for `fixed_command`).
      line: the config front's split (`config_front.CommandLine`).
      words: the positional words.
    """

    def __init__(self, command: Command, argv: list[str]):
        self.command, self.argv = command, argv
        self.line = config_front.parse_command_line([])
        self.words: list[str] = []

    def parse(self) -> None:
        """Splits the config arguments off, sets every flag, checks the required ones.

        Raises:
          ConfigError: an unknown flag (naming the closest), a value of the wrong type, a
            missing value or required flag, an unknown subcommand.
        """
        for flag in self.command.flags.values():
            flag.reset()
        self.line = config_front.parse_command_line(self.argv)
        args = list(self.line.rest)
        while args:
            arg = args.pop(0)
            if arg == "--":
                self.words += args
                break
            if arg.startswith("-") and not _is_number(arg):
                self._set_flag(arg, args)
            else:
                self.words.append(arg)
        self._check_words()
        for flag in self.command.flags.values():
            if flag.required and not flag.present:
                raise ConfigError(f"{self.command.prog} needs --{flag.name}: {flag.help}")

    def _set_flag(self, arg: str, following: list[str]) -> None:
        name, has_value, text = arg.lstrip("-").partition("=")
        flag = self.command.flags.get(name)
        if flag is None and name.startswith("no") and not has_value:
            negated = self.command.flags.get(name[2:])
            if negated is not None and negated.kind == "bool":
                negated.set("false")
                return
        if flag is None:
            raise self._unknown_flag(name, arg)
        if has_value or flag.kind == "bool":
            flag.set(text if has_value else None)
            return
        if not following or (following[0].startswith("--")):
            raise ConfigError(f"--{name} needs a value: --{name}=VALUE.")
        flag.set(following.pop(0))

    def _unknown_flag(self, name: str, arg: str) -> ConfigError:
        """The error of an unknown flag: the closest flag, else the config field it means."""
        near = [f"--{n}" for n in close_names(name, self.command.flags, 1)]
        near = near or [f"--config.{f}" for f in self._config_fields_meant(name)]
        hint = " D" + did_you_mean(near)[1:].replace("'", "") if near else ""
        known = ", ".join(f"--{n}" for n in self.command.flags) or "none"
        return ConfigError(
            f"unknown flag {arg.partition('=')[0]!r}.{hint} The flags of {self.command.prog} "
            f"are: {known}; config fields are set as --config.SECTION.FIELD=VALUE (--help "
            "lists both).",
            fix=Fix(rename={arg.partition("=")[0]: near[0]}) if len(near) == 1 else None,
        )

    def _config_fields_meant(self, name: str) -> list[str]:
        """The config fields a flag's `name` likely means (`--lr`: `optim.peak_lr`)."""
        try:  # none where the command reads no config, or its config is unreadable
            return config_front.fields_meant(self.config_values(), name)
        except (ConfigError, ValueError):
            return []

    def _check_words(self) -> None:
        subcommands = self.command.subcommands
        if not subcommands:
            return
        given = self.words[0] if self.words else None
        if given in subcommands:
            return
        near = close_names(given or "", subcommands, 1)
        what = f"unknown subcommand {given!r}" if given else "no subcommand"
        hint = f"; {did_you_mean(near)}" if near else "."
        raise ConfigError(
            f"{what}{hint} Give one of {', '.join(subcommands)}: {self.command.prog} "
            f"{'|'.join(subcommands)} ... (--help says more).",
            fix=Fix(set={given: near[0]}) if near and given else None,
        )

    # ------------------------------------------------------------------ the config

    def config_values(self) -> dict[str, Any]:
        """The nested config of this command line (file, command defaults, overrides).

        Raises:
          ConfigError: no `--config` where the command has no default (with the fix), or an
            error of `config_front` (an unknown field, with the fix).
        """
        front = self.command.config
        if front is None:
            raise ValueError(f"{self.command.prog} reads no config")
        default = self.command._default_spec(self.argv, self.words or None)
        defaults = front.defaults() if front.defaults else {}
        try:
            values, _ = config_front.config_from_command_line(
                self.argv, default, defaults, shipped=self._shipped_configs
            )
        except ConfigError as err:
            if err.fix is None and config_front.parse_command_line(self.argv).spec is None:
                err.fix = Fix(set={"--config": front.example})
            raise
        return values

    def config(self) -> Any:
        """The typed config of this command line (`ConfigFront.build`).

        Raises:
          ConfigError: as `ConfigFront.build`; a config file of another command (most of its
            top-level fields unknown here, e.g. configs/glue.py given to train.py) says so.
        """
        values = self.config_values()
        try:
            return self.command.config.build(values)
        except ConfigError as err:
            raise self._other_command_s_config(values) or err from None

    def _shipped_configs(self) -> list[str]:
        """The shipped config files this command takes (a missing file's error suggests only
        these: configs/glue.py is finetune.py's, which train.py refuses)."""
        kind = self.command.config.kind()
        mine = []
        for path in config_front.shipped_configs():
            try:
                values = config_front.load_config(path)
            except Exception:  # noqa: BLE001 (one that cannot load here is not suggested)
                continue
            if _foreign_fields(kind, values) is None:
                mine.append(path)
        return mine

    def _other_command_s_config(self, values: Mapping[str, Any]) -> ConfigError | None:
        """The error for `values` that are another command's config, else None."""
        kind = self.command.config.kind()
        unknown = _foreign_fields(kind, values)
        if unknown is None:
            return None
        front = self.command.config
        spec = config_front.parse_command_line(self.argv).spec or self.command._default_spec(
            self.argv
        )
        return ConfigError(
            f"--config={spec} is not a config of {self.command.prog}: {len(unknown)} of its "
            f"{len(values)} top-level fields are not {kind.__name__}'s ({', '.join(unknown[:4])}"
            f"{', ...' if len(unknown) > 4 else ''}): another command's config (train.py and "
            "compile_check take configs/bert_*.py and mt.py, finetune.py configs/glue.py); "
            f"{self.command.prog} takes e.g. --config={front.example}.",
            fix=Fix(set={"--config": front.example}),
        )

    # ------------------------------------------------------------------ errors

    def fixed_command(self, fix: Fix | None) -> str | None:
        """The whole command that applies `fix` to the user's arguments (None: no fix, or one
        naming an argument the user did not give)."""
        return fixed_command(self.command.prog, self.argv, fix)

    def explain(self, err: BaseException) -> BaseException:
        """`err` with the whole fixed command appended to its message, if it knows its fix (a
        `fix` attribute: a UserError's, or another error's such as `NonFiniteError`'s)."""
        fix = getattr(err, "fix", None)
        command = self.fixed_command(fix) if isinstance(fix, Fix) else None
        if command and err.args and isinstance(err.args[0], str) and command not in err.args[0]:
            err.args = (f"{err.args[0].rstrip()} Run: {command}", *err.args[1:])
        return err

    def call(self, body: Callable[[], int]) -> int:
        """`body()`; an error it raises that knows its fix (every UserError; another error
        with a `fix`, e.g. a NaN stop) is explained (`explain`) and raised again, for a command
        whose errors are printed by `ln_jax.console` (which keeps each one's exit status)."""
        try:
            return body()
        except UserError as err:
            raise self.explain(err) from None
        except Exception as err:
            if not isinstance(getattr(err, "fix", None), Fix):
                raise
            self.explain(err)
            raise

    def report(self, err: BaseException) -> int:
        """Prints an error in one line (with the fixed command if it knows its fix) and
        returns 2."""
        self.explain(err)
        if console.wants_traceback("--traceback" in self.argv):
            traceback.print_exception(err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


def _foreign_fields(kind: Any, values: Mapping[str, Any]) -> list[str] | None:
    """The top-level fields of `values` that config class `kind` lacks, if `values` look like
    another command's config (most of them foreign), else None (a misspelt field or two: the
    field's own error is the better one)."""
    known = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else set()
    unknown = sorted(k for k in values if k not in known)
    if not known or len(unknown) < 3 or len(unknown) < len(values) / 4:
        return None
    return unknown


def fixed_command(prog: str, argv: Sequence[str], fix: Fix | None) -> str | None:
    """`prog` and `argv` with `fix` applied, quoted for a shell; None if there is no fix or it
    renames an argument that `argv` does not hold. A set `--config` goes first, other set
    arguments the user did not give go last. An argument the fix sets or renames to appears
    once, with the fix's value: the user's other occurrences of it (`--noNAME` of a boolean
    too) are dropped, so the command never repeats a flag with two values."""
    if fix is None:
        return None
    out, pending, renamed, emitted = [], dict(fix.set), set(), set()
    fixed = {*fix.set, *fix.rename.values()}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, has_value, value = arg.partition("=")
        if not arg.startswith("-"):  # a positional word (a subcommand a fix may correct)
            out.append((None, pending.pop(arg, arg)))
            continue
        if (
            not has_value
            and args
            and not args[0].startswith("-")
            and (name in fix.rename or name in fixed)
        ):  # `--name VALUE`
            value, has_value = args.pop(0), True
        if name not in fix.rename and name not in fix.set:
            out.append((_negated(name, fixed) or name, arg))
            continue
        if name in fix.rename:
            renamed.add(name)
            name = fix.rename[name]
        if name in emitted:  # given twice: once is enough
            continue
        emitted.add(name)
        value = pending.pop(name, value)
        out.append(("fix", f"{name}={value}" if has_value or name in fix.set else name))
    if set(fix.rename) - renamed:
        return None
    kept = [text for owner, text in out if owner == "fix" or owner not in fixed]
    first = [f"{n}={v}" for n, v in pending.items() if n == "--config"]
    last = [f"{n}={v}" for n, v in pending.items() if n != "--config"]
    return shlex.join([*prog.split(), *first, *kept, *last])


def _negated(name: str, fixed: set[str]) -> str | None:
    """`--NAME` if `name` is `--noNAME` and the fix sets `--NAME`, else None."""
    if name.startswith("--no") and f"--{name[4:]}" in fixed:
        return f"--{name[4:]}"
    return None


def _is_number(arg: str) -> bool:
    return re.fullmatch(r"-\d[\d.e+-]*", arg) is not None
