"""The fine-tuning tasks (GLUE's and the offline one) and their dev-set metrics.

Each task names its TFDS dataset, the text features that make a pair, its label space and the
metrics GLUE reports for it. A task's `score` is the mean of its metrics (GLUE's convention for
MRPC, QQP and STS-B, whose two metrics it averages; the others have one).

Metrics are computed in NumPy from the dev set's predictions, so they can be checked by hand:
accuracy, F1 of the positive class (label 1), Matthews correlation, Pearson and Spearman
correlations (Spearman: Pearson of the ranks, ties given their average rank).
"""

from __future__ import annotations

import dataclasses

import numpy as np

OFFLINE_DATASET = "ln_jax_pairs"


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One downstream task (a GLUE task or the offline one; the trainer's `ln_jax.task.Task` is
    `ln_jax.models.bert.finetune.task.GlueClassification`, which trains any of these).

    Attributes:
      name: the config variant (`configs/glue.py:<name>`).
      dataset: TFDS dataset, e.g. "glue/mrpc", or the offline `ln_jax_pairs`.
      text_features: the one or two text features of an example (sentence A, sentence B).
      num_labels: classes; 1 = regression (STS-B's similarity in [0, 5]).
      metrics: names in `METRICS`, in GLUE's order.
      train_split / eval_split: TFDS splits (GLUE's test labels are hidden: dev is the split
        every paper reports).
    """

    name: str
    dataset: str
    text_features: tuple[str, ...]
    num_labels: int
    metrics: tuple[str, ...]
    train_split: str = "train"
    eval_split: str = "validation"

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("offline", OFFLINE_DATASET, ("sentence1", "sentence2"), 2, ("accuracy", "f1")),
        GlueTask("mrpc", "glue/mrpc", ("sentence1", "sentence2"), 2, ("accuracy", "f1")),
        GlueTask("rte", "glue/rte", ("sentence1", "sentence2"), 2, ("accuracy",)),
        GlueTask("sst2", "glue/sst2", ("sentence",), 2, ("accuracy",)),
        GlueTask("cola", "glue/cola", ("sentence",), 2, ("matthews",)),
        GlueTask("qnli", "glue/qnli", ("question", "sentence"), 2, ("accuracy",)),
        GlueTask("stsb", "glue/stsb", ("sentence1", "sentence2"), 1, ("pearson", "spearman")),
        GlueTask("qqp", "glue/qqp", ("question1", "question2"), 2, ("accuracy", "f1")),
        GlueTask(
            "mnli",
            "glue/mnli",
            ("premise", "hypothesis"),
            3,
            ("accuracy",),
            eval_split="validation_matched",
        ),
    )
}


def accuracy(pred: np.ndarray, label: np.ndarray) -> float:
    """Fraction of predictions [N] equal to the labels [N]."""
    return float(np.mean(pred == label))


def f1(pred: np.ndarray, label: np.ndarray) -> float:
    """F1 of class 1: 2·TP / (2·TP + FP + FN); 0 when there is no positive at all."""
    tp = np.sum((pred == 1) & (label == 1))
    wrong = np.sum(pred != label)
    return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def matthews(pred: np.ndarray, label: np.ndarray) -> float:
    """Matthews correlation of binary predictions: (TP·TN − FP·FN) / sqrt of the product of
    the four margins; 0 when a margin is empty (a constant prediction)."""
    tp = float(np.sum((pred == 1) & (label == 1)))
    tn = float(np.sum((pred == 0) & (label == 0)))
    fp = float(np.sum((pred == 1) & (label == 0)))
    fn = float(np.sum((pred == 0) & (label == 1)))
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denom) if denom else 0.0


def pearson(pred: np.ndarray, label: np.ndarray) -> float:
    """Pearson correlation of two [N] float arrays; 0 if either is constant."""
    x, y = pred - pred.mean(), label - label.mean()
    denom = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / denom) if denom else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks [N]; tied values share their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(values))
    return (sums / np.bincount(inverse, minlength=len(values)))[inverse]


def spearman(pred: np.ndarray, label: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson of the (tie-averaged) ranks."""
    return pearson(_ranks(pred), _ranks(label))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
}


def predictions(task: GlueTask, outputs: np.ndarray) -> np.ndarray:
    """The classifier's outputs [N, num_labels] -> predictions [N]: the argmax class, or the
    regressed value itself."""
    return outputs[:, 0] if task.regression else outputs.argmax(-1)


def task_scores(task: GlueTask, pred: np.ndarray, label: np.ndarray) -> dict[str, float]:
    """{metric: value for each of the task's metrics, "score": their mean} on [N] arrays."""
    pred, label = np.asarray(pred), np.asarray(label)
    if task.regression:
        pred, label = pred.astype(np.float64), label.astype(np.float64)
    scores = {name: METRICS[name](pred, label) for name in task.metrics}
    scores["score"] = float(np.mean(list(scores.values())))
    return scores
