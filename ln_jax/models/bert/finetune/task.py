"""GLUE fine-tuning as a `ln_jax.task.Task` ("glue_classification"): what the one trainer
(`ln_jax.train.trainer.train_and_evaluate`) needs to fine-tune a pretrained encoder.

A run's `TrainConfig` (made by `finetune.config.train_config`) names the task and carries its
settings in its section "glue" (`GlueOptions`, `TrainConfig.options`):

  glue_task            a key of `finetune.tasks.GLUE_TASKS` ("offline", "mrpc", "rte", ...)
  init_from, init_step the pretrained source (a `train.py` workdir and its step, or "hf:PATH")
  classifier_dropout   dropout on the pooled [CLS] vector
  max_train_examples / max_eval_examples   the first N examples of each split (None = all)

`cfg.model` is the pretrained encoder's config (its dropouts possibly replaced) and `cfg.data`
holds the batch sizes, the sequence length, the TFDS data dir and the seed of the example
order. Step 0's encoder (and pooler) are the source's (`initialize`, a warm start); batches
come from `ln_jax.data.bert.glue` (batch s a function of (seed, s) only, with iterator state), so a
run resumed mid-epoch logs what an uninterrupted one logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ln_jax import sharding
from ln_jax.data.bert import glue
from ln_jax.models.bert.finetune import pretrained as pretrained_lib
from ln_jax.models.bert.finetune.model import BertClassifier, classification_loss
from ln_jax.models.bert.finetune.options import SECTION, GlueOptions
from ln_jax.models.bert.finetune.tasks import GLUE_TASKS, GlueTask, predictions, task_scores
from ln_jax.task import Task
from ln_jax.validate import ConfigError

log = logging.getLogger(__name__)

Array = jax.Array
Batch = dict[str, Array]

_DATA: dict[tuple, tuple[dict, dict]] = {}  # the last task's encoded splits (`cached_arrays`)


class GlueClassification(Task):
    """Sentence(-pair) classification or regression with BERT's [CLS] classifier.

    Batch keys: input_ids, segment_ids, attention_mask int32 [batch, length]; label [batch]
    (int32 classes, float32 for regression); evaluation batches add valid int32 [batch].
    """

    name = "glue_classification"
    options_section = SECTION
    options_class = GlueOptions

    def __init__(self, cfg: Any):
        self.cfg = cfg
        options: GlueOptions = cfg.options
        if options.glue_task not in GLUE_TASKS:
            raise ConfigError(
                f"{SECTION}.glue_task={options.glue_task!r}: task glue_classification "
                f"needs one of {', '.join(GLUE_TASKS)}."
            )
        self.glue: GlueTask = GLUE_TASKS[options.glue_task]
        dropout = options.classifier_dropout
        self.classifier_dropout = cfg.model.hidden_dropout if dropout is None else float(dropout)

    def build(self, rngs: Any) -> BertClassifier:
        return BertClassifier(
            self.cfg.model,
            self.glue.num_labels,
            self.classifier_dropout,
            rngs=rngs,
            type_vocab_size=self.cfg.options.type_vocab_size,
        )

    def abstract_batch(self, mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
        b, t = self.cfg.data.global_batch_size, self.cfg.data.max_seq_length
        spec = sharding.batch_struct(mesh)
        label = jnp.float32 if self.glue.regression else jnp.int32
        return {
            "input_ids": spec((b, t)),
            "segment_ids": spec((b, t)),
            "attention_mask": spec((b, t)),
            "label": spec((b,), label),
        }

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        """Losses are means over the whole batch's examples."""
        return {"num_examples": jnp.asarray(batch["label"].shape[0], jnp.float32)}

    def loss(
        self,
        model: BertClassifier,
        batch: Batch,
        key: Array | None,
        normalizers: Mapping[str, Array],
        record: bool = False,
    ) -> tuple[Array, dict[str, Array], Array]:
        """Cross-entropy (squared error for regression) and accuracy; outputs: the logits."""
        del record  # no activation measures
        logits = self._logits(model, batch, key)
        count = normalizers["num_examples"]
        metrics = classification_loss(logits, batch["label"], self.glue.regression, count)
        return metrics["loss"], metrics, logits

    def eval_batch(self, model: BertClassifier, batch: Batch) -> dict[str, Array]:
        """The batch's outputs [B, labels], labels [B] and valid [B] (padding rows are 0)."""
        output = self._logits(model, batch, None)
        return {"output": output, "label": batch["label"], "valid": batch["valid"]}

    def eval_metrics(self, outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """The GLUE task's metrics on the dev split and `score`, their mean."""
        joined = {k: np.concatenate([np.asarray(o[k]) for o in outputs]) for k in outputs[0]}
        valid = joined["valid"] > 0
        pred = predictions(self.glue, joined["output"][valid])
        return task_scores(self.glue, pred, joined["label"][valid])

    def pipelines(self, mesh: jax.sharding.Mesh) -> tuple[Any, glue.DevBatches]:
        from ln_jax.data import batches

        data = self.cfg.data
        train, dev = self.arrays(mesh)
        prefetch = batches.device_prefetch(data, mesh)
        batch = data.global_batch_size
        iterator = glue.train_iterator(train, batch, data.seed, mesh, prefetch)
        return iterator, glue.DevBatches(dev, data.eval_batch_size or batch, mesh)

    def forward_measures(self, model: Any, outputs: Any, batch: Batch) -> dict:
        return {}

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict:
        return {}

    def initialize(self, model: BertClassifier) -> bool:
        """The warm start: the pretrained encoder (and pooler) in the classifier's shardings;
        the classifier layer keeps its initialisation from the run's seed."""
        pretrained_lib.warm_start(model, self.pretrained(_mesh_of(self.cfg)))
        return True

    def run_result(self, evals: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return result_of(evals)

    # ----------------------------------------------------------------------- data

    def pretrained(self, mesh: jax.sharding.Mesh) -> pretrained_lib.Pretrained:
        options = self.cfg.options
        init = (options.init_from, options.init_step)
        return pretrained_lib.cached_pretrained(*init, mesh)

    def arrays(self, mesh: jax.sharding.Mesh) -> tuple[dict, dict]:
        """(train, dev) `glue.encode_examples` of the task (`cached_arrays`)."""
        data, options = self.cfg.data, self.cfg.options
        limits = (options.max_train_examples, options.max_eval_examples)
        where = (data.data_dir, data.download, data.max_seq_length)
        return cached_arrays(self.glue, *where, *limits, self.pretrained(mesh))

    def _logits(self, model: BertClassifier, batch: Batch, key: Array | None) -> Array:
        ids, segments, mask = batch["input_ids"], batch["segment_ids"], batch["attention_mask"]
        return model(ids, segments, mask, dropout_key=key)


def cached_arrays(
    task: GlueTask,
    data_dir: str | None,
    download: bool,
    max_seq_length: int,
    max_train: int | None,
    max_eval: int | None,
    source: pretrained_lib.Pretrained,
) -> tuple[dict, dict]:
    """(train, dev) BERT inputs of `task` read through TFDS (`ln_jax.data.bert.glue`), tokenized
    with `source`'s tokenizer; kept for the next run of the same task and source."""
    key = (task.name, data_dir, download, max_seq_length, max_train, max_eval, source.source)
    if key not in _DATA:
        _DATA.clear()
        log.info("reading and tokenizing %s (train and dev splits)", task.name)
        builder = glue.open_task_dataset(task.dataset, data_dir, download)
        read = lambda split, limit: glue.read_split(builder, split, task.text_features, limit)
        encode = lambda ex: glue.encode_examples(ex, source.tokenizer, max_seq_length)
        _DATA[key] = (
            encode(read(task.train_split, max_train)),
            encode(read(task.eval_split, max_eval)),
        )
    return _DATA[key]


def release() -> None:
    """Drops the kept pretrained source and encoded splits."""
    _DATA.clear()
    pretrained_lib.release()


def result_of(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The best epoch's (by `score`) and the last epoch's dev scores of a run's eval records:
    best_score, best_epoch, best_<metric>, last_score, last_<metric>."""
    evals = [r for r in records if r["split"] == "eval"]
    best = max(evals, key=lambda r: r["score"])  # the earliest of equal scores
    skip = ("step", "split", "time", "epoch")
    out = {f"best_{k}": v for k, v in best.items() if k not in skip}
    out["best_epoch"] = best["epoch"]
    out.update({f"last_{k}": v for k, v in evals[-1].items() if k not in skip})
    return out


def _mesh_of(cfg: Any) -> jax.sharding.Mesh:
    return sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
