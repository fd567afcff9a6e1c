"""A run's identity: the config a workdir was started with, and what may change on resume.

`WORKDIR/config.json` holds the config of the run in that workdir. Resuming with another config
is a `RunMismatchError` listing the fields that differ, unless every difference is one a run
can safely continue with (cadences, mesh, checkpointing, a longer run) and the user accepted
them (`train.py --accept_changes`); a changed schedule is shown before it is accepted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from ln_jax import paths
from ln_jax.validate import UserError

CONFIG_FILE = "config.json"

# Fields a run may continue with when they change: they alter no parameter, no batch and no
# update of the steps already run.
SAFE_FIELDS = frozenset(
    {
        "name",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "eval_batches",
        "grad_accum_steps",  # the same batch, split otherwise (equal to 1e-5, tested)
        "nan_policy",
        "checkpoint.keep",
        "checkpoint.async_save",
        "checkpoint.fallback",
        "mesh.data",
        "mesh.fsdp",
        "mesh.tensor",
        "data.data_dir",
        "data.cache_dir",  # where caches of a URL data dir go; they are rebuilt identically
        "data.download",
        "data.eval_batch_size",
        "data.eval_num_batches",
        "data.worker_count",  # the same batches for any number of workers (tested)
        "data.device_prefetch",
        "data.prepare_timeout_s",
        "monitor.every",  # what is measured and warned about, not what is trained
        "monitor.window",
        "monitor.loss_spike",
        "monitor.grad_jump",
        "monitor.collapse",
        "monitor.keep_checkpoint",
    }
)
# Fields added after runs were recorded, with the value those runs had: a config.json without
# the field matches a config that has this value.
ADDED_FIELDS: dict[str, Any] = {"task": "bert_pretraining", "steps_per_epoch": 0}
# Safe too, but they move the learning-rate schedule: the change is shown before it is taken.
SCHEDULE_FIELDS = frozenset({"total_steps", "optim.total_steps"})


class RunMismatchError(UserError):
    """The workdir holds a run of another config."""


class WorkdirError(UserError):
    """The workdir cannot be created or written."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One field that differs between the workdir's config and the one given."""

    field: str
    old: Any
    new: Any

    @property
    def safe(self) -> bool:
        return self.field in SAFE_FIELDS or self.field in SCHEDULE_FIELDS

    def __str__(self) -> str:
        return f"{self.field}: {self.old!r} -> {self.new!r}"


def as_dict(cfg: Any) -> dict[str, Any]:
    """A typed config as plain JSON values (tuples become lists), as config.json holds it."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


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
    missing = object()
    changes = [Change(k, a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))]
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
    """`prepare_workdir`'s checks: packages, credentials, then a write."""
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
    """The config recorded in `workdir`, or None if the run recorded none."""
    path = paths.as_path(workdir) / CONFIG_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def record_config(workdir: str, config: Mapping[str, Any]) -> None:
    """Writes `config` as the workdir's config.json (atomically: never half a file)."""
    text = json.dumps(config, indent=1, sort_keys=True) + "\n"
    paths.write_atomic(paths.as_path(workdir) / CONFIG_FILE, text)


def schedule_change(old: Mapping[str, Any], new: Mapping[str, Any], step: int) -> str:
    """How the learning rate of the steps after `step` moves when the schedule changes."""
    from ln_jax.train import optim  # the optimizer stack only when a schedule is compared

    lr_old = optim.make_schedule(optim.OptimConfig.from_mapping(old["optim"]))
    lr_new = optim.make_schedule(optim.OptimConfig.from_mapping(new["optim"]))
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
    """Checks that `new` may continue the run of `old` in `workdir` from `resume_step`.

    Returns:
      Notes to log: one per accepted change (empty when nothing changed).

    Raises:
      RunMismatchError: listing the differing fields and what to do.
    """
    changes = differences(old, new) if old is not None else []
    if not changes:
        return []
    notes = [str(c) for c in changes]
    step = resume_step or 0
    if any(c.field in SCHEDULE_FIELDS for c in changes):
        notes.append(schedule_change(old, new, step))
    unsafe = [c for c in changes if not c.safe]
    if accept_changes and not unsafe:
        return notes
    where = f"at step {step}" if resume_step else "(no checkpoint yet)"
    listed = "; ".join(notes)
    if unsafe:
        fix = (
            f"{', '.join(c.field for c in unsafe)} cannot change within a run: give a new "
            "--workdir for the new config (or remove the override to continue the old run)."
        )
    else:
        fix = "If these changes are meant, continue with them by adding --accept_changes."
    raise RunMismatchError(
        f"workdir {workdir} holds a run of another config {where}: {listed}. {fix}"
    )
