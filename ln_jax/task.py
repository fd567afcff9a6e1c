"""The task boundary: what the one trainer needs to know of a model family and its objective.

`ln_jax.train.steps`, `ln_jax.train.trainer`, `ln_jax.compile_check`, accumulation and the
benchmarks work through a `Task` and import no model family. `TrainConfig.task` names it: a name of
`TASKS` (BERT pretraining is "bert_pretraining") or any importable "module:attribute", a Task class
(or factory) that `make_task` calls with the TrainConfig. So a family defined outside ln_jax (a test
file, a user's package) trains on the same trainer, steps, accumulation, checkpoints and
monitor with no change to ln_jax:

    class MyTask:                      # satisfies `Task`; see ln_jax/models/bert/pretraining.py
        name = "my_task"
        def __init__(self, cfg): self.cfg = cfg
        def build(self, rngs): ...
        ...
    python train.py --config=my_config.py --config.task=my_package.tasks:MyTask

A batch is a dict of global arrays whose leading axis is the example axis (split over the data
and fsdp devices, and into micro-batches under accumulation).

Optional methods (a task without them trains as before; see `OPTIONAL`):

    def initialize(self, model) -> bool:
        # Initial parameters from elsewhere (a pretrained checkpoint), set in place in the
        # fresh model's shardings; called on a fresh run only (a restore overwrites it), before
        # step 1. True: it set them, so the placements' data-dependent set-up is skipped.
    def run_result(self, evals: Sequence[dict]) -> dict[str, float]:
        # The run's result from all its eval records, written once (split "result") after the
        # last step, e.g. the best and the last evaluation's scores.
    def tokens_per_step(self) -> int:
        # Tokens a step trains on, for the progress line's rate (default: data.global_batch_size
        # x data.max_seq_length); translation: its token budget.
    @staticmethod
    def check_config(cfg) -> None:
        # Raises ValueError for settings the task cannot run (its task_options), when the
        # TrainConfig is built: a command line's error before anything is set up.
    def eval_description(self) -> str | None:
        # What an evaluation does that takes a while (decoding for BLEU), for the lines the
        # trainer shows before it and with its time after; None: nothing to say.
    def random_batch(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        # One training batch of random tokens on the host (numpy, `abstract_batch`'s shapes),
        # for the analyses' measurements on random data (`ln_jax.analysis`).
    def host_batches(self) -> Iterator[dict[str, np.ndarray]]:
        # The training corpus's batches on the host (one process, no loader threads), for the
        # analyses' measurements on real data.

Fine-tuning (`ln_jax.models.bert.finetune.task.GlueClassification`, "glue_classification")
has the first two; translation (`ln_jax.models.translation.task.Translation`) `tokens_per_step`,
`check_config` and `eval_description`; BERT pretraining the last two; the toy of
tests/toy_task.py none. The model a task builds may also be `ln_jax.nn.stack.Stacked` (its
stacks seen by Admin's profiling and the analyses).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

Array = jax.Array
Batch = dict[str, Array]

# name -> "module:attribute" of the tasks ln_jax ships (imported on first use)
TASKS: dict[str, str] = {
    "bert_pretraining": "ln_jax.models.bert.pretraining:BertPretraining",
    "glue_classification": "ln_jax.models.bert.finetune.task:GlueClassification",
    "translation": "ln_jax.models.translation.task:Translation",
}
# Methods the trainer calls when a task has them (see the module docstring).
OPTIONAL = (
    "initialize",
    "run_result",
    "tokens_per_step",
    "check_config",
    "eval_description",
    "random_batch",
    "host_batches",
)


@runtime_checkable
class Task(Protocol):
    """A model family and its training objective, for one TrainConfig.

    Attributes:
      name: the task's name (in logs, errors and the compiled-initialiser cache key).
      cfg: the TrainConfig it was made for.
    """

    name: str
    cfg: Any

    def build(self, rngs: Any) -> Any:
        """The model of `cfg` as an nnx.Module, parameters from `rngs` (called under
        `jax.eval_shape` for abstract shapes and inside the mesh for sharded creation).
        Equal configs must build equal structures."""

    def abstract_batch(self, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes, dtypes and shardings (`sharding.batch_sharding(mesh)`) of one global
        training batch."""

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        """The whole batch's loss denominators (token weights, sequence counts): under
        gradient accumulation every micro-batch divides by these, so the micro-batch losses
        add up to the whole batch's loss exactly."""

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

    def eval_batch(self, model: Any, batch: Batch) -> dict[str, Array]:
        """What one evaluation batch contributes (jitted; fetched to the host): e.g. summed
        losses and their counts, or the batch's predictions."""

    def eval_metrics(self, outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """The evaluation's metrics (a "loss" among them) from every batch's `eval_batch`
        output, in order: sums reduce to exact averages, predictions to any score."""

    def pipelines(self, mesh: Any) -> tuple[Iterator[Batch], Iterable[Batch]]:
        """(training iterator with get_state/set_state/close, evaluation batches)."""

    def forward_measures(self, model: Any, outputs: Any, batch: Batch) -> dict[str, Array]:
        """Per-layer activation measures of a training forward pass (`ln_jax.train.monitor`); {}
        if the family measures none. Called on measured steps only."""

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict[str, Array]:
        """Per-layer gradient / update measures of a step (trees like the parameters); {} if
        none."""


def make_task(cfg: Any) -> Task:
    """The Task of `cfg.task` made for `cfg` (a TrainConfig).

    Raises:
      ValueError: naming the known tasks, what could not be imported, or what a non-Task
        lacks.
    """
    task = factory(cfg.task)(cfg)
    missing = [name for name in _REQUIRED if not hasattr(task, name)]
    if missing:
        raise ValueError(f"task {cfg.task!r} is not a Task: it lacks {', '.join(missing)}.")
    return task


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
