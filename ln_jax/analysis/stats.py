"""Mean and standard deviation over models (seeds) and mini-batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ln_jax.results import jsonable


def seed_mean_std(values: Sequence[Any]) -> dict[str, Any]:
    """Mean and standard deviation of per-model, per-batch measurements.

    Args:
      values: [models, batches, ...] (nested lists or an array): one measurement per model
        (seed) and mini-batch; trailing axes (e.g. layers) are kept.

    Returns:
      {"mean": ..., "std": ..., "std_over": ...}: the mean over everything; the sample standard
      deviation (ddof=1) of the per-model means over models when there are several ("seeds"),
      else over the mini-batches of the one model ("batches"), else 0 ("none"). Numbers are
      plain floats and lists, NaN is None.
    """
    a = np.asarray(values, np.float64)
    if a.ndim < 2:
        raise ValueError(f"seed_mean_std needs [models, batches, ...] values, got {a.shape}.")
    per_model = a.mean(axis=1)
    if a.shape[0] > 1:
        std, over = per_model.std(axis=0, ddof=1), "seeds"
    elif a.shape[1] > 1:
        std, over = a[0].std(axis=0, ddof=1), "batches"
    else:
        std, over = np.zeros_like(per_model[0]), "none"
    mean, std = (jsonable(x, nan_as_null=True) for x in (per_model.mean(axis=0), std))
    return {"mean": mean, "std": std, "std_over": over}
