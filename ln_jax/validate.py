"""Leaf validators shared by every typed config (model, optimizer, data, run), and the error
types every command line reports in one line (user errors; a training's non-finite stop).

It also finds the declared config field that an unknown `--config.` name most likely means
(`suggest`, `ALIASES`; the last section below).

This module imports nothing from ln_jax, so that `config/`, `train/optim.py` and
`data/config.py` can all use it without importing each other.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MAX_LISTED = 20  # more valid names than this are not listed in a message


@dataclasses.dataclass(frozen=True)
class Fix:
    """The change to a command line that fixes a user error; `ln_jax.cli.command` applies it to the
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
    another trainer calls so (`ln_jax.ALIASES`: "lr" -> "peak_lr"), else the
    closest spelling."""
    valid = list(valid)
    for key in given:
        if key not in valid:
            aliased = [a.rsplit(".", 1)[-1] for a in ALIASES.get(str(key).lower(), ())]
            near = [a for a in aliased if a in valid] or close_names(key, valid, 1)
            hint = " D" + did_you_mean(near)[1:] if near else ""
            raise ValueError(f"unknown {kind} field {key!r}.{hint} Valid: {', '.join(valid)}.")


# The section of a task's own fields until 2026-12-05: one untyped dict (`ln_jax.task`).
LEGACY_SECTION = "task_options"


def moved_message(dotted: str, section: str | None) -> str:
    """The one line of a field given as `task_options.FIELD` (or the section itself): the task's
    own fields moved into its section on 2026-12-05."""
    field = dotted.partition(".")[2]
    if section is None:
        return f"config field {dotted} is gone: the task has no fields of its own; remove it."
    if not field:
        return (
            f"config section {dotted} moved: the task's own fields are its section {section} "
            f"(--config.{section}.FIELD; c.{section}.FIELD in a config file)."
        )
    return f"config field {dotted} moved: use --config.{section}.{field}"


# Fields of the shared sections until 2026-12-06 that are a family's own since:
# {shared section: {field: the family's section}} (BERT's `ln_jax.models.bert.options.
# BertOptions`, translation's `TranslationOptions`). A task whose options class has such a field
# takes it from an old config.json (`ln_jax.task.moved_options`); the others drop it.
FAMILY_FIELDS: dict[str, dict[str, str]] = {
    "model": {"type_vocab_size": "bert", "nsp_head": "bert"},
    "data": {
        **dict.fromkeys(
            ("max_predictions_per_seq", "masked_lm_prob", "short_seq_prob", "whole_word_masking"),
            "bert",
        ),
        "nsp": "bert",
        "max_tokens": "translation",
    },
}
# Who a family's section belongs to, as its errors say it: (owner, configs that have it).
_FAMILY = {
    "bert": ("BERT's", "BERT pretraining's configs"),
    "translation": ("translation's", "configs/mt.py and the translation studies' configs"),
}


def family_field(shared: str, field: str) -> str | None:
    """The family section that `shared.field` moved to on 2026-12-06, or None."""
    return FAMILY_FIELDS.get(shared, {}).get(field)


def family_field_message(shared: str, field: str, has_section: bool) -> str:
    """The one line of `shared.field` for a field of `FAMILY_FIELDS`; `has_section`: the
    config has the field's family section (a config of that family)."""
    section = family_field(shared, field)
    new = f"{section}.{field}"
    if has_section:
        return f"config field {shared}.{field} moved: use --config.{new} (c.{new} in a config file)"
    owner, configs = _FAMILY[section]
    return (
        f"config field {shared}.{field} is gone: it is {owner} own ({new}, in {configs}) and "
        "this task has no use for it; remove it."
    )


def check_family_fields(shared: str, values: Mapping[str, Any], section: str | None) -> None:
    """Raises ConfigError (`family_field_message`) if the shared section `shared` (its
    mapping `values`) of a config whose task has the section `section` sets a field of
    `FAMILY_FIELDS`."""
    moved = [name for name in FAMILY_FIELDS.get(shared, {}) if name in values]
    if moved:
        has = family_field(shared, moved[0]) == section
        raise ConfigError(family_field_message(shared, moved[0], has))


# Fine-tuning's optimizer fields: at the top of its config (configs/glue.py) until 2026-12-05,
# now its section optim (an `OptimConfig`, as train.py's).
MOVED_FIELDS = {
    name: f"optim.{name}" for name in ("optimizer", "weight_decay", "b1", "b2", "eps", "clip_norm")
}


def moved_field_message(name: str) -> str:
    """The one line of a field given by its name before it moved (`MOVED_FIELDS`)."""
    return f"config field {name} moved: use --config.{MOVED_FIELDS[name]}"


# --------------------------------------------------------------------------- field names
# The declared config field that an unknown `--config.` name most likely means.
#
# A user coming from another trainer types that trainer's names (`--config.lr`,
# `--config.batch_size`, `--config.warmup_steps` at the top level where ln_jax has
# `optim.warmup_steps`). Spelling distance alone then points at the wrong field, and the command
# line's fix would set it (`warmup_steps` is close to `total_steps`; `data.batch_size` to
# `data.eval_batch_size`). `suggest` looks, in this order, for:
#
#   1. the same name declared in another section (`model.max_seq_length` -> `data.max_seq_length`);
#   2. the name as other trainers spell a declared field (`ALIASES`: HuggingFace's
#      TrainingArguments and BertConfig, fairseq, MaxText, nanoGPT);
#   3. a name spelt nearly the same in the same section (difflib, ratio >= 0.6);
#   4. a name spelt nearly the same anywhere (ratio >= 0.8).
#
# Only fields the config being overridden declares are suggested.

_SEQ = ("data.max_seq_length", "translation.max_source_length", "translation.max_target_length")

# Another trainer's name -> the declared fields it names (those a config lacks are skipped).
ALIASES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("lr", "learning_rate", "max_lr", "base_lr", "peak_learning_rate"),
        ("optim.peak_lr", "learning_rates"),
    ),
    **dict.fromkeys(("min_lr", "final_lr", "end_learning_rate"), ("optim.end_lr",)),
    **dict.fromkeys(
        ("warmup", "warmup_updates", "num_warmup_steps", "warmup_iters"),
        ("optim.warmup_steps",),
    ),
    **dict.fromkeys(
        (
            "batch_size",
            "train_batch_size",
            "per_device_train_batch_size",
            "global_batch",
            "max_sentences",
            "batch",
        ),
        ("data.global_batch_size", "batch_sizes"),
    ),
    **dict.fromkeys(("num_train_epochs", "num_epochs", "max_epoch", "n_epochs"), ("epochs",)),
    **dict.fromkeys(("warmup_ratio", "warmup_proportion"), ("warmup_fraction",)),
    **dict.fromkeys(("per_device_eval_batch_size", "valid_batch_size"), ("data.eval_batch_size",)),
    **dict.fromkeys(
        (
            "seq_len",
            "seq_length",
            "max_len",
            "max_length",
            "sequence_length",
            "block_size",
            "max_target_positions",
            "max_source_positions",
        ),
        _SEQ,
    ),
    **dict.fromkeys(
        (
            "steps",
            "max_steps",
            "num_train_steps",
            "train_steps",
            "max_update",
            "num_steps",
            "max_iters",
            "iterations",
        ),
        ("total_steps",),
    ),
    "dropout": ("model.hidden_dropout", "model.attention_dropout"),
    **dict.fromkeys(
        ("hidden_dropout_prob", "resid_dropout", "resid_pdrop"), ("model.hidden_dropout",)
    ),
    **dict.fromkeys(
        ("attention_probs_dropout_prob", "attn_dropout", "attn_pdrop", "attention_dropout_prob"),
        ("model.attention_dropout",),
    ),
    **dict.fromkeys(
        (
            "layers",
            "n_layers",
            "n_layer",
            "num_hidden_layers",
            "encoder_layers",
            "depth",
            "base_num_decoder_layers",
        ),
        ("model.num_layers",),
    ),
    **dict.fromkeys(
        ("heads", "n_heads", "n_head", "num_attention_heads", "base_num_query_heads"),
        ("model.num_heads",),
    ),
    **dict.fromkeys(
        (
            "d_model",
            "hidden_dim",
            "emb_dim",
            "embed_dim",
            "n_embd",
            "encoder_embed_dim",
            "base_emb_dim",
            "width",
        ),
        ("model.hidden_size",),
    ),
    **dict.fromkeys(
        (
            "d_ff",
            "ffn_dim",
            "intermediate_size",
            "encoder_ffn_embed_dim",
            "base_mlp_dim",
            "ffn_size",
        ),
        ("model.mlp_dim",),
    ),
    **dict.fromkeys(("hidden_act", "activation_fn", "act"), ("model.activation",)),
    **dict.fromkeys(
        ("layer_norm_epsilon", "ln_eps", "norm_eps", "normalization_layer_epsilon"),
        ("model.layer_norm_eps",),
    ),
    **dict.fromkeys(
        (
            "ln",
            "layer_norm_position",
            "norm_position",
            "pre_ln",
            "post_ln",
            "prenorm",
            "normalize_before",
            "encoder_normalize_before",
        ),
        ("model.placement",),
    ),
    **dict.fromkeys(("norm_type", "normalization"), ("model.norm",)),
    **dict.fromkeys(
        ("precision", "mixed_precision", "bf16", "fp16", "compute_dtype"), ("model.dtype",)
    ),
    **dict.fromkeys(("beta1", "adam_beta1"), ("optim.b1",)),
    **dict.fromkeys(("beta2", "adam_beta2"), ("optim.b2",)),
    **dict.fromkeys(("adam_epsilon", "adam_eps"), ("optim.eps",)),
    **dict.fromkeys(
        (
            "max_grad_norm",
            "grad_clip",
            "clip_grad_norm",
            "gradient_clipping",
            "gradient_clipping_threshold",
        ),
        ("optim.clip_norm",),
    ),
    **dict.fromkeys(("wd", "adam_weight_decay"), ("optim.weight_decay",)),
    **dict.fromkeys(
        ("lr_scheduler", "lr_scheduler_type", "lr_schedule", "scheduler"), ("optim.schedule",)
    ),
    **dict.fromkeys(("optimizer_type", "opt_type", "optim"), ("optim.optimizer",)),
    **dict.fromkeys(
        ("gradient_accumulation_steps", "accum_steps", "update_freq", "accumulate_grad_batches"),
        ("grad_accum_steps",),
    ),
    **dict.fromkeys(("eval_steps", "eval_interval", "validate_interval_updates"), ("eval_every",)),
    **dict.fromkeys(
        ("save_steps", "save_interval_updates", "checkpoint_period"), ("checkpoint_every",)
    ),
    **dict.fromkeys(("logging_steps", "log_interval", "log_period"), ("log_every",)),
    **dict.fromkeys(("mlm_probability", "mask_prob", "mask_ratio"), ("bert.masked_lm_prob",)),
    **dict.fromkeys(("vocab", "n_vocab"), ("data.vocab_size",)),
    **dict.fromkeys(("label_smoothing_factor", "smoothing"), ("translation.label_smoothing",)),
    **dict.fromkeys(("beam", "beam_size", "num_beams"), ("translation.eval_beam",)),
    **dict.fromkeys(("lenpen", "length_penalty"), ("translation.eval_lenpen",)),
}


def leaves(tree: Mapping[str, Any], parents: tuple[str, ...] = ()) -> Iterator[str]:
    """The dotted names of `tree`'s fields (its non-mapping values), in its order."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from leaves(value, (*parents, key))
        else:
            yield ".".join((*parents, key))


def suggest(tree: Mapping[str, Any], parents: list[str], key: str, field: bool = True) -> list[str]:
    """The declared names (dotted, at most 3) that `key`, unknown under the section `parents`
    of `tree`, most likely means; empty if none is likely. `field`: `key` was given as a field
    (the last part of `--config.A.B.key`); otherwise as a section, and only the sections
    spelt nearly the same beside it are looked at. One name: a command line's fix may rename
    to it; several: they are shown and none is chosen."""
    node: Any = tree
    for name in parents:
        node = node[name]
    here = ".".join(parents)
    nearby = [_join(here, n) for n in difflib.get_close_matches(key, [str(k) for k in node], n=1)]
    if not field:
        return nearby
    declared = list(leaves(tree))
    bare = [d.rsplit(".", 1)[-1] for d in declared]
    for found in (
        [d for d, name in zip(declared, bare, strict=True) if name == key],
        _aliased(key, declared),
        nearby,
        [d for d, name in zip(declared, bare, strict=True) if name in _closest(key, bare)],
    ):
        if found:
            return found[:3]
    return []


def _aliased(key: str, declared: list[str]) -> list[str]:
    """The declared fields `ALIASES` gives for `key`."""
    return [t for t in ALIASES.get(key.lower(), ()) if t in declared]


def _join(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def _closest(key: str, names: list[str]) -> list[str]:
    """The name spelt most nearly as `key` (ratio >= 0.8), as a list of none or one."""
    return difflib.get_close_matches(key, list(dict.fromkeys(names)), n=1, cutoff=0.8)
