"""A run's identity: the config a workdir was started with, and what may change on resume.

`WORKDIR/config.json` holds the config of the run in that workdir. Resuming with another config
continues when every difference is a free one (cadences, checkpointing, monitoring: nothing
the run computes), and with `train.py --accept_changes` when the others are safe but change
numbers (mesh, accumulation, a longer run: the schedule change is shown); otherwise it is a
`RunMismatchError` listing the fields that differ. The table is `FREE_FIELDS` /
`CONSENT_FIELDS` below, with the reason for each.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from ln_jax import paths
from ln_jax.validate import Fix, UserError

log = logging.getLogger(__name__)
CONFIG_FILE = "config.json"

# What may change when a run resumes, decided field by field from the typed configs
# (`ln_jax.config.run.TrainConfig` and its sections). Three kinds:
#
# FREE_FIELDS change without asking: they alter no parameter, no batch and no update, only
# how the run is recorded, watched, saved and fed.
#   name                        a label (the default workdir's name).
#   log_every, eval_every,      cadences: when records, evaluations and checkpoints are
#   checkpoint_every            written, not what is trained.
#   nan_policy                  "skip" and "stop" train alike until a non-finite step, where
#                               "stop" ends the run: a run that finishes computed the same.
#   compilation_cache           where compiled programs are kept: the same programs run.
#   translation.skip_padding    whether translation's padded positions are computed: the real
#                               tokens get the same values (tests/test_skip_padding.py).
#   checkpoint.*                how checkpoints are kept, written and restored (`fallback`:
#                               the way back from a corrupt one).
#   monitor.*                   what is measured and warned about (cadence, thresholds).
#   data.cache_dir, download,   how the same batches are fetched: caches are rebuilt
#   worker_count,               identically, the batches are the same for any number of
#   device_prefetch,            workers (tested), prefetching and waiting change no value.
#   prepare_timeout_s
# CONSENT_FIELDS are safe to continue with, but change numbers the run reports or computes,
# so they need `--accept_changes` (the message says so, with the whole command):
#   total_steps, optim.total_steps   the learning-rate schedule of the remaining steps (shown).
#   grad_accum_steps            the same batch split otherwise: equal to float round-off (1e-5).
#   mesh.*                      the same program on other devices: reductions in another order.
#   model.activation_layout     the same program with the residual stream in another memory
#                               layout: the same values up to the order of reductions.
#   model.scan_unroll           the same scanned layers as a loop or as straight-line code:
#                               the same values up to fusion (tests/test_models.py).
#   dropout_rng                 the dropout masks' generator: masks of the same distribution,
#                               other ones from the step resumed at ("auto" on a TPU resolved
#                               to rbg before 2026-11-28, to hash since).
#   data.data_dir               where the prepared data is read: another folder may hold
#                               another preparation.
#   eval_batches, data.eval_batch_size, data.eval_num_batches
#                               the evaluation set: later evals are not comparable with earlier.
# Every other field (model, seed, optimizer, data, task) cannot change within a run.
FREE_SECTIONS = ("checkpoint.", "monitor.")
FREE_FIELDS = frozenset(
    {
        "name",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "nan_policy",
        "compilation_cache",
        "translation.skip_padding",
        "data.cache_dir",
        "data.download",
        "data.worker_count",
        "data.device_prefetch",
        "data.prepare_timeout_s",
    }
)
CONSENT_FIELDS = frozenset(
    {
        "grad_accum_steps",
        "mesh.data",
        "mesh.fsdp",
        "mesh.tensor",
        "model.activation_layout",
        "dropout_rng",
        "model.scan_unroll",
        "data.data_dir",
        "eval_batches",
        "data.eval_batch_size",
        "data.eval_num_batches",
    }
)
# Fields added after runs were recorded, with the value those runs had: a config.json without
# the field matches a config that has this value.
ADDED_FIELDS: dict[str, Any] = {
    "task": "bert_pretraining",
    "steps_per_epoch": 0,
    "model.activation_layout": "xla",  # added 2026-11-26; XLA chose the layout before
    "model.scan_unroll": 1,  # added 2026-11-28; a scanned stack was a loop before
}
# Consent fields that move the learning-rate schedule: the change is shown before it is taken.
SCHEDULE_FIELDS = frozenset({"total_steps", "optim.total_steps"})


class RunMismatchError(UserError):
    """The workdir holds a run of another config."""


class WorkdirError(UserError):
    """The workdir cannot be created or written."""


MISSING = "(unset)"  # how a field one side lacks is shown (a field added since, or removed)


@dataclasses.dataclass(frozen=True)
class Change:
    """One field that differs between the workdir's config and the one given."""

    field: str
    old: Any
    new: Any

    @property
    def kind(self) -> str:
        """ "free" (resumes as it is), "consent" (needs --accept_changes) or "unsafe"."""
        return kind_of(self.field)

    @property
    def safe(self) -> bool:
        return self.kind != "unsafe"

    def __str__(self) -> str:
        shown = lambda v: MISSING if v is _ABSENT else repr(v)
        return f"{self.field}: {shown(self.old)} -> {shown(self.new)}"


_ABSENT = object()


def kind_of(field: str) -> str:
    """What a change of `field` (dotted, e.g. "checkpoint.fallback") needs on resume: "free",
    "consent" or "unsafe" (the table above)."""
    if field in FREE_FIELDS or field.startswith(FREE_SECTIONS):
        return "free"
    if field in CONSENT_FIELDS or field in SCHEDULE_FIELDS:
        return "consent"
    return "unsafe"


def as_dict(cfg: Any) -> dict[str, Any]:
    """A typed config as plain JSON values (tuples become lists), as config.json holds it (a
    TrainConfig's task options under their section's name: `TrainConfig.to_dict`)."""
    values = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    return json.loads(json.dumps(values, default=str))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The fields whose values differ (a field only one side has counts as a change)."""
    a, b = flatten(old), flatten(new)
    a = {**{k: v for k, v in ADDED_FIELDS.items() if k not in a}, **a}
    changes = [Change(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(set(a) | set(b))]
    return [c for c in changes if c.old != c.new]


def prepare_workdir(workdir: str) -> None:
    """Creates `workdir` (a local folder or a URL such as gs://bucket/run) and checks that it
    can be written, before anything is compiled or loaded.

    Raises:
      WorkdirError: naming the directory, the reason and the fix (for gs://: the packages to
        install, or how to authenticate).
    """
    with paths.quiet_cloud_logs():
        _check_workdir(workdir)


def _check_workdir(workdir: str) -> None:
    """`prepare_workdir`'s checks: a protected folder, packages, credentials, then a write."""
    if (protected := paths.protecting(workdir)) is not None:
        raise WorkdirError(
            f"workdir {workdir!r} is inside {protected}, which ${paths.PROTECTED_ENV} keeps "
            "from runs in this process (the test suite protects the checkout's workdirs/, "
            "where the user's own runs live): give the run another --workdir (a test: a "
            "tmp_path)."
        )
    missing = paths.missing_packages(workdir)
    if missing:
        raise WorkdirError(
            f"workdir {workdir!r} needs {', '.join(missing)}: `pip install {' '.join(missing)}`."
        )
    if problem := paths.credentials_problem(workdir):
        raise WorkdirError(
            f"cannot write to workdir {workdir!r}: no Google Cloud credentials ({problem}); "
            f"{paths.GCS_AUTH_HINT}."
        )
    # Cloud clients raise many types (HTTP, auth, DNS errors); locally only OSError is expected.
    expected = Exception if paths.is_url(workdir) else OSError
    folder = paths.as_path(workdir)
    # One probe per process: the processes of a multi-host job check the same workdir at once.
    probe = folder / f".ln_jax_write_probe.{socket.gethostname()}.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except expected as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else None
        reason = f"{type(err).__name__}: {reason}" if reason else paths.cause(err)
        raise WorkdirError(
            f"cannot write to workdir {workdir!r} ({reason}); {paths.access_hint(workdir)}."
        ) from None


def read_config(workdir: str) -> dict[str, Any] | None:
    """The config recorded in `workdir`, or None if the run recorded none. A config.json
    written before 2026-12-05 holds the task's own fields in `task_options`: they are read
    into the task's section (`ln_jax.task.moved_options`), so the run resumes, compares and
    loads as one written since."""
    from ln_jax.task import moved_options

    path = paths.as_path(workdir) / CONFIG_FILE
    if not path.exists():
        return None
    return moved_options(json.loads(path.read_text()))


def record_config(workdir: str, config: Mapping[str, Any]) -> None:
    """Writes `config` as the workdir's config.json (atomically: never half a file)."""
    text = json.dumps(config, indent=1, sort_keys=True) + "\n"
    paths.write_atomic(paths.as_path(workdir) / CONFIG_FILE, text)


def schedule_change(old: Mapping[str, Any], new: Mapping[str, Any], step: int) -> str:
    """How the learning rate of the steps after `step` moves when the schedule changes."""
    from ln_jax.config.optim import OptimConfig
    from ln_jax.train import optim  # the optimizer stack only when a schedule is compared

    lr_old = optim.make_schedule(OptimConfig.from_mapping(old["optim"]))
    lr_new = optim.make_schedule(OptimConfig.from_mapping(new["optim"]))
    end_old, end_new = old["total_steps"], new["total_steps"]
    points = sorted({step + 1, (step + 1 + end_new) // 2, end_new})
    shown = ", ".join(
        f"step {s}: {float(lr_old(s - 1)):.3g} -> {float(lr_new(s - 1)):.3g}"
        for s in points
        if s >= step + 1
    )
    return (
        f"the run stops at step {end_new} instead of {end_old}; steps 1-{step} keep the old "
        f"learning rates, and from step {step + 1} on the schedule changes ({shown})"
    )


def check_resume(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    resume_step: int | None,
    workdir: str,
    accept_changes: bool = False,
) -> list[str]:
    """Checks that `new` may continue the run of `old` in `workdir` from `resume_step`: free
    changes always may, consent ones with `accept_changes`, unsafe ones never.

    Returns:
      Notes to log: one per change taken (empty when nothing changed).

    Raises:
      RunMismatchError: listing the differing fields, what to do, and (`fix`) the change to
        the command line that works: `--accept_changes`, or a new `--workdir`.
    """
    changes = differences(old, new) if old is not None else []
    notes = [str(c) for c in changes]
    step = resume_step or 0
    if any(c.field in SCHEDULE_FIELDS for c in changes):
        notes.append(schedule_change(old, new, step))
    unsafe = [c for c in changes if c.kind == "unsafe"]
    needs_consent = any(c.kind == "consent" for c in changes)
    if not unsafe and (accept_changes or not needs_consent):
        return notes
    where = f"at step {step}" if resume_step else "(no checkpoint yet)"
    listed = "; ".join(notes)
    if unsafe:
        fresh = fresh_workdir(workdir)
        fix = Fix(set={"--workdir": fresh})
        advice = (
            f"{', '.join(c.field for c in unsafe)} cannot change within a run: give a new "
            f"--workdir for the new config, e.g. --workdir={fresh} (or remove the override to "
            "continue the old run)."
        )
    else:
        fix = Fix(set={"--accept_changes": "True"})
        advice = "If these changes are meant, continue with them by adding --accept_changes."
    raise RunMismatchError(
        f"workdir {workdir} holds a run of another config {where}: {listed}. {advice}", fix=fix
    )


def keep_recorded_layout(cfg: Any, old: Mapping[str, Any] | None) -> Any:
    """`cfg` (a TrainConfig) with the layers' layout the workdir's run recorded, where "auto"
    chose it (`ln_jax.config.auto.LAYOUT_FIELDS`): the run's checkpoints hold its parameters
    in that layout (stacked [num_layers, ...] or a list), so "auto" resolves for an existing
    workdir as it did when the run began (a run begun before "auto" stacked the layers on a
    GPU resumes as a list). A layout given explicitly is left as given (a change is a
    mismatch, as before).

    Raises:
      RunMismatchError: the recorded layout does not fit the fields given explicitly.
    """
    from ln_jax.config.auto import LAYOUT_FIELDS, auto_chosen

    recorded = {**ADDED_FIELDS, **flatten(old)} if old is not None else {}
    changes = {
        name: recorded[f"model.{name}"]
        for name in sorted(auto_chosen(cfg.model) & set(LAYOUT_FIELDS))
        if f"model.{name}" in recorded and recorded[f"model.{name}"] != getattr(cfg.model, name)
    }
    if not changes:
        return cfg
    try:
        kept = dataclasses.replace(cfg, model=cfg.model.replace(**changes))
    except ValueError as err:
        raise RunMismatchError(
            f"the workdir's run has model layout {changes} (its checkpoints' layout), which "
            f"the fields given do not fit: {err}"
        ) from None
    shown = ", ".join(f"model.{k}={v!r}" for k, v in changes.items())
    logging.getLogger(__name__).info(
        "auto keeps the layers as the workdir's run has them: %s", shown
    )
    return kept


def fresh_workdir(workdir: str) -> str:
    """`workdir` with the first suffix _2, _3, ... that names no existing folder."""
    base = workdir.rstrip("/")
    for n in range(2, 1000):
        candidate = f"{base}_{n}"
        if not paths.as_path(candidate).exists():
            return candidate
    return f"{base}_new"
