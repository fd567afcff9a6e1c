"""Mean and standard deviation over models (seeds) and mini-batches; JSON output."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np


def summarize(values: Sequence[Any]) -> dict[str, Any]:
    """Mean and standard deviation of per-model, per-batch measurements.

    Args:
      values: [models, batches, ...] (nested lists or an array): one measurement per model
        (seed) and mini-batch; trailing axes (e.g. layers) are kept.

    Returns:
      {"mean": ..., "std": ..., "std_over": ...}: the mean over everything; the sample standard
      deviation (ddof=1) of the per-model means over models when there are several ("seeds"),
      else over the mini-batches of the one model ("batches"), else 0 ("none").
    """
    a = np.asarray(values, np.float64)
    if a.ndim < 2:
        raise ValueError(f"summarize needs [models, batches, ...] values, got shape {a.shape}.")
    per_model = a.mean(axis=1)
    if a.shape[0] > 1:
        std, over = per_model.std(axis=0, ddof=1), "seeds"
    elif a.shape[1] > 1:
        std, over = a[0].std(axis=0, ddof=1), "batches"
    else:
        std, over = np.zeros_like(per_model[0]), "none"
    return {"mean": jsonable(per_model.mean(axis=0)), "std": jsonable(std), "std_over": over}


def jsonable(x: Any) -> Any:
    """numpy scalars/arrays (nested in dicts and lists) -> floats and lists; NaN -> None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray | np.generic):
        return jsonable(x.tolist())
    if isinstance(x, float):
        return None if math.isnan(x) else x
    return x


def _rounded(x: Any, digits: int) -> Any:
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    return float(f"{x:.{digits}g}") if isinstance(x, float) else x


def write_json(result: dict[str, Any], path: str, digits: int = 6) -> str:
    """Writes `result` (JSON-safe, floats to `digits` significant digits) to `path`, creating
    its folder; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = json.dumps(_rounded(jsonable(result), digits), indent=1)
    # innermost lists of numbers on one line each (a [36, 37] matrix stays readable)
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    with open(path, "w") as f:
        f.write(text + "\n")
    return path
