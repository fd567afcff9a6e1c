"""The task boundary: what the one trainer needs to know of a model family and its objective.

`ln_jax.train.steps`, `ln_jax.train.trainer`, `ln_jax.compile_check`, accumulation and the
benchmarks work through a `Task` and import no model family. `TrainConfig.task` names it: a name of
`TASKS` (BERT pretraining is "bert_pretraining") or any importable "module:attribute", a Task class
(or factory) that `make_task` calls with the TrainConfig. So a family defined outside ln_jax (a test
file, a user's package) trains on the same trainer, steps, accumulation, checkpoints and
monitor with no change to ln_jax:

    class MyTask(Task):                # see ln_jax/models/bert/pretraining.py
        name = "my_task"
        def build(self, rngs): ...
        ...
    python train.py --config=my_config.py --config.task=my_package.tasks:MyTask

A run makes its task once (`ln_jax.train.setup.setup`) and passes it to every builder of
`ln_jax.train.steps`. A batch is a dict of global arrays whose leading axis is the example axis
(split over the data and fsdp devices, and into micro-batches under accumulation).

A family's own config fields (translation's decoder depth and beam, the GLUE task's pretrained
source) are its own typed section: the Task class names a frozen dataclass (`options_class`)
and the section it is written under (`options_section`), so `--config.translation.eval_beam=5`
sets translation's field, `TrainConfig.options` holds the dataclass instance and config.json
records it under the section's name. The shared `TrainConfig` holds what every task has (stack
shape, placement, optimiser, mesh, data loading); a new family's fields are files added. (Until
2026-12-05 they were an untyped `task_options` dict: `moved_options` reads such a config.json.)

A task subclasses `Task`: the base class gives every optional method its default, so the
trainer asks each task the same questions and never probes for a method. The optional ones:
`check_config`, `check_data` (static, run before the task is made), `initialize` (a warm
start), `run_result`, `tokens_per_step`, `eval_description`, and for the analyses
`random_batch` and `host_batches`.

Fine-tuning (`ln_jax.models.bert.finetune.task.GlueClassification`, "glue_classification")
overrides `initialize` and `run_result`; translation
(`ln_jax.models.translation.task.Translation`) `check_config`, `check_data`, `initialize`,
`tokens_per_step`, `eval_description` and `host_batches`; BERT pretraining `check_data`,
`random_batch` and `host_batches`; the toy of tests/toy_task.py none (its config,
tests/toy_config.py, starts from the typed defaults, not from BERT's recipe). The model a task
builds may also be `ln_jax.nn.stack.Stacked` (its stacks seen by Admin's profiling, the monitor
and the analyses).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ln_jax.validate import (
    FAMILY_FIELDS,  # a family's own, in `model` / `data` until 2026-12-06
    LEGACY_SECTION,  # the task's fields until 2026-12-05
)

Array = jax.Array
Batch = dict[str, Array]

# name -> "module:attribute" of the tasks ln_jax ships (imported on first use)
TASKS: dict[str, str] = {
    "bert_pretraining": "ln_jax.models.bert.pretraining:BertPretraining",
    "glue_classification": "ln_jax.models.bert.finetune.task:GlueClassification",
    "translation": "ln_jax.models.translation.task:Translation",
}


class Task:
    """A model family and its training objective, for one TrainConfig: the base class of
    every task. A subclass defines the required methods (those raising NotImplementedError
    here) and overrides the optional ones it needs; the others keep their defaults.

    Attributes:
      name: the task's name (in logs, errors and the compiled-initialiser cache key).
      cfg: the TrainConfig it was made for.
      options_section: the config section of the family's own fields ("translation": set as
        `--config.translation.FIELD`, recorded so in config.json); None (the default): the
        task has no fields of its own.
      options_class: the frozen dataclass of those fields (its defaults are the section's);
        `TrainConfig.options` holds an instance. None with `options_section` None.
    """

    name: str
    cfg: Any
    options_section: str | None = None
    options_class: type | None = None

    def __init__(self, cfg: Any):
        self.cfg = cfg

    # ----------------------------------------------------------------------- required

    def build(self, rngs: Any) -> Any:
        """The model of `cfg` as an nnx.Module, parameters from `rngs` (called under
        `jax.eval_shape` for abstract shapes and inside the mesh for sharded creation).
        Equal configs must build equal structures."""
        raise NotImplementedError

    def abstract_batch(self, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes, dtypes and shardings (`sharding.batch_sharding(mesh)`) of one global
        training batch."""
        raise NotImplementedError

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        """The whole batch's loss denominators (token weights, sequence counts): under
        gradient accumulation every micro-batch divides by these, so the micro-batch losses
        add up to the whole batch's loss exactly."""
        raise NotImplementedError

    def loss(
        self,
        model: Any,
        batch: Batch,
        key: Array | None,
        normalizers: Mapping[str, Array],
        record: bool = False,
    ) -> tuple[Array, dict[str, Array], Any]:
        """(loss, metrics, outputs) of one (micro-)batch: metrics are scalars (a "loss"
        among them) normalised by `normalizers`; `outputs` is what `forward_measures` reads
        (with `record`: the intermediates it needs). `key` is the step's dropout key (None =
        deterministic)."""
        raise NotImplementedError

    def eval_batch(self, model: Any, batch: Batch) -> dict[str, Array]:
        """What one evaluation batch contributes (jitted; fetched to the host): e.g. summed
        losses and their counts, or the batch's predictions."""
        raise NotImplementedError

    def eval_metrics(self, outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """The evaluation's metrics (a "loss" among them) from every batch's `eval_batch`
        output, in order: sums reduce to exact averages, predictions to any score."""
        raise NotImplementedError

    def pipelines(self, mesh: Any) -> tuple[Iterator[Batch], Iterable[Batch]]:
        """(training iterator with get_state/set_state/close, evaluation batches)."""
        raise NotImplementedError

    def forward_measures(self, model: Any, outputs: Any, batch: Batch) -> dict[str, Array]:
        """Per-layer activation measures of a training forward pass (`ln_jax.train.monitor`); {}
        if the family measures none. Called on measured steps only."""
        raise NotImplementedError

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict[str, Array]:
        """Per-layer gradient / update measures of a step (trees like the parameters); {} if
        none."""
        raise NotImplementedError

    # ----------------------------------------------------------------------- optional

    @staticmethod
    def check_config(cfg: Any) -> Any:
        """Raises ValueError for settings the task cannot run (its options section), when the
        TrainConfig is built: a command line's error before anything is set up. Returns the
        options as the run records them (e.g. an "auto" field resolved for the platform), or
        None: as given. Default: nothing to check."""
        return None

    @staticmethod
    def check_data(cfg: Any) -> None:
        """Raises a UserError for data the run cannot read (a dataset not prepared, files
        that are no aligned pairs), before the workdir is created (`train.py`). Default:
        nothing to check (the pipelines say it at set-up)."""

    def initialize(self, model: Any) -> bool:
        """Step 0's parameters from elsewhere (a pretrained checkpoint), set in place in the
        fresh model's shardings; called on a fresh run only (a restore overwrites them), before
        step 1. True: it set them, so the placements' data-dependent set-up is skipped.
        Default: False (no warm start; see `warm_starts`)."""
        return False

    def run_result(self, evals: Sequence[dict]) -> dict[str, Any] | None:
        """The run's result from all its eval records, written once (split "result") after
        the last step, e.g. the best and the last evaluation's scores. None (the default): the
        run writes no "result" record."""
        return None

    def tokens_per_step(self) -> int:
        """Tokens a step trains on, for the progress line's rate. Default:
        data.global_batch_size x data.max_seq_length; translation: its token budget."""
        return int(self.cfg.data.global_batch_size * self.cfg.data.max_seq_length)

    def eval_description(self) -> str | None:
        """What an evaluation does that takes a while (decoding for BLEU), for the lines the
        trainer shows before it and with its time after; None (the default): nothing to say."""
        return None

    def random_batch(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One training batch of random tokens on the host (numpy, `abstract_batch`'s
        shapes), for the analyses' measurements on random data (`ln_jax.analysis`). Default:
        the task has none (an error naming the task)."""
        raise NotImplementedError(f"task {self.name!r} has no random batches (random_batch).")

    def host_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The training corpus's batches on the host (one process, no loader threads), for
        the analyses' measurements on real data. Default: none (an error naming the task)."""
        raise NotImplementedError(f"task {self.name!r} has no host batches (host_batches).")


def warm_starts(task: Task) -> bool:
    """Whether `task` has a warm start of its own (overrides `Task.initialize`): then a
    resumed run, whose restore sets the parameters, asks neither it nor the placements'
    set-up."""
    return getattr(type(task), "initialize", None) is not Task.initialize


def make_task(cfg: Any) -> Task:
    """The Task of `cfg.task` made for `cfg` (a TrainConfig).

    Raises:
      ValueError: naming the known tasks, what could not be imported, or what a non-Task
        lacks.
    """
    task = factory(cfg.task)(cfg)
    missing = [name for name in _REQUIRED if _lacks(task, name)]
    if missing:
        raise ValueError(f"task {cfg.task!r} is not a Task: it lacks {', '.join(missing)}.")
    if not isinstance(task, Task):
        raise ValueError(
            f"task {cfg.task!r} is not a Task: subclass ln_jax.task.Task (it gives the optional "
            "methods their defaults)."
        )
    return task


def check_data(cfg: Any) -> None:
    """The data of `cfg` checked by its task class (`Task.check_data`) before any task is
    made or anything created; a factory that is no Task subclass checks nothing here."""
    made_by = factory(cfg.task)
    if isinstance(made_by, type) and issubclass(made_by, Task):
        made_by.check_data(cfg)


def _lacks(task: Any, name: str) -> bool:
    """Whether `task` lacks `name`, or keeps `Task`'s placeholder of a required method."""
    if not hasattr(task, name):
        return True
    return name in vars(Task) and getattr(type(task), name, None) is vars(Task)[name]


def factory(name: str) -> Callable[[Any], Task]:
    """The class (or factory) that `name` (a `TASKS` name or "module:attribute") names."""
    target = TASKS.get(name, name)
    module_name, sep, attribute = target.partition(":")
    if not sep:
        raise ValueError(
            f"unknown task {name!r}: give one of {', '.join(TASKS)} or 'module:attribute' of "
            "a Task class (ln_jax/task.py)."
        )
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"task {name!r}: cannot import {target!r} ({err}).") from None


def options_section(task: str) -> str | None:
    """The config section of the task named `task` (`Task.options_section`), or None: it
    has no fields of its own (BERT pretraining), or is a factory that is no Task subclass.

    Raises:
      ValueError: an unknown or unimportable task (`factory`).
    """
    return getattr(factory(task), "options_section", None)


def free_fields(task: str) -> frozenset[str]:
    """The dotted fields of the task's own section that a resumed run may change without
    asking (`ln_jax.train.run_identity`): the names in its options class's `FREE_ON_RESUME`,
    which change no value the run computes, e.g. {"translation.skip_padding"}.

    Raises:
      ValueError: an unknown or unimportable task (`factory`).
    """
    section = options_section(task)
    kind = getattr(factory(task), "options_class", None)
    return frozenset(f"{section}.{name}" for name in getattr(kind, "FREE_ON_RESUME", ()))


def make_options(task: str, given: Any) -> Any:
    """The typed options of the task named `task` from `given` (a mapping of its section, an
    instance of its `options_class`, or None = the defaults); None for a task with none.

    Raises:
      ValueError: fields its options class lacks (naming the closest), fields given to a task
        that has none, or an invalid value (the dataclass's own checks).
    """
    from ln_jax.validate import reject_unknown_keys

    made_by = factory(task)
    kind, section = getattr(made_by, "options_class", None), options_section(task)
    if kind is None:
        if given:
            raise ValueError(f"task {task!r} has no config section of its own; given {given}.")
        return None
    if isinstance(given, kind):
        return given
    if dataclasses.is_dataclass(given):  # another task's options: their fields checked here
        given = dataclasses.asdict(given)
    values = dict(given or {})
    reject_unknown_keys(section, values, [f.name for f in dataclasses.fields(kind)])
    return kind(**values)


def checked_options(cfg: Any) -> Any:
    """The typed options of `cfg` (a TrainConfig being built) as the run records them: checked
    by the task's `check_config`, with what it resolved (an "auto" field)."""
    check = getattr(factory(cfg.task), "check_config", None)
    recorded = check(cfg) if check is not None else None
    return cfg.options if recorded is None else recorded


def moved_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """A config mapping (a workdir's config.json) with the task's fields of a config written
    before 2026-12-05, `task_options`, moved into the task's own section, and the fields of
    `model` and `data` that are a family's own (`FAMILY_FIELDS`, until 2026-12-06) moved into
    the section of a task whose options class has them (BERT pretraining's "bert",
    fine-tuning's "glue", translation's "translation") or dropped: such a run then reads,
    resumes and compares as one written since. Other mappings are returned as given."""
    values = dict(values)
    for shared in FAMILY_FIELDS:
        values = _moved_family_fields(values, shared)
    if LEGACY_SECTION not in values:
        return values
    old = values.pop(LEGACY_SECTION)
    section = options_section(values.get("task", "bert_pretraining"))
    if section is not None and (old or section in values):
        values[section] = {**dict(old or {}), **dict(values.get(section) or {})}
    elif old:
        values[LEGACY_SECTION] = old  # a task without a section: the config's error says so
    return values


def _moved_family_fields(values: dict[str, Any], shared: str) -> dict[str, Any]:
    """`values` with the family fields of its section `shared` ("model": `type_vocab_size`,
    `nsp_head`; "data": `nsp`, `max_tokens`, ...) in the task's section if its options class
    declares them, else dropped (`moved_options`)."""
    given, moved = values.get(shared), FAMILY_FIELDS[shared]
    if not isinstance(given, Mapping) or not set(given) & set(moved):
        return values
    given = dict(given)
    old = {name: given.pop(name) for name in moved if name in given}
    values[shared] = given
    task = values.get("task", "bert_pretraining")
    kind, section = getattr(factory(task), "options_class", None), options_section(task)
    names = {f.name for f in dataclasses.fields(kind)} if kind is not None else set()
    kept = {name: value for name, value in old.items() if name in names}
    if kept:
        values[section] = {**kept, **dict(values.get(section) or {})}
    return values


_REQUIRED = (
    "name",
    "cfg",
    "build",
    "abstract_batch",
    "normalizers",
    "loss",
    "eval_batch",
    "eval_metrics",
    "pipelines",
    "forward_measures",
    "parameter_measures",
)
