"""Results of ln_jax.analysis and ln_jax.experiments: JSON files, a run's metrics, arm colours
and PNG figures, each written once here.

  write_json(path, value)     JSON, written atomically; numpy values become lists and floats
  read_metrics(workdir)       the records of WORKDIR/metrics.jsonl, one per (split, step)
  arm_colour(arm)             one colour per arm, the same in every plot
  new_figure / save_figure    a figure of panels; its PNG (folder created, figure closed)
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from ln_jax import paths
from ln_jax.train.metrics import METRICS_FILE, read_records

# ------------------------------------------------------------------------------------ JSON


def jsonable(x: Any, *, digits: int | None = None, nan_as_null: bool = False) -> Any:
    """`x` with numpy scalars and arrays (nested in dicts, lists, tuples) as floats and lists.

    Args:
      x: the value.
      digits: round floats to this many significant digits; None keeps them exact.
      nan_as_null: NaN -> None (strict JSON). Without it NaN stays NaN, which Python's json
        writes as `NaN` and reads back as NaN.
    """

    def convert(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): convert(u) for k, u in v.items()}
        if isinstance(v, list | tuple):
            return [convert(u) for u in v]
        if isinstance(v, np.ndarray | np.generic):
            return convert(v.tolist())
        if isinstance(v, float):
            if math.isnan(v) and nan_as_null:
                return None
            return float(f"{v:.{digits}g}") if digits is not None else v
        return v

    return convert(x)


# A list that json.dumps(indent=...) spread over lines and that holds no list or object. JSON
# strings hold no raw newline, so the brackets matched after/before one are the list's own.
_FLAT_LIST = re.compile(r"\[\n\s*([^\[\]{}]*?)\n\s*\]")


def _one_line(match: re.Match) -> str:
    return "[" + re.sub(r",\n\s*", ", ", match[1]) + "]"


def write_json(
    path: str, value: Any, *, digits: int | None = None, nan_as_null: bool = False
) -> str:
    """Writes `value` to `path` as JSON, creating its folder; returns the path.

    Atomic (a temporary file renamed over `path`), so an interrupted write leaves the old file.
    Innermost lists sit on one line each (a [36, 37] matrix stays readable).

    Args:
      path: the file.
      value: dicts, lists, numbers, strings; numpy values are converted (see `jsonable`).
      digits: round floats to this many significant digits (None: exact).
      nan_as_null: write NaN as null (strict JSON) instead of `NaN`.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = json.dumps(jsonable(value, digits=digits, nan_as_null=nan_as_null), indent=1)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(_FLAT_LIST.sub(_one_line, text) + "\n")
    os.replace(tmp, path)
    return path


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of WORKDIR/metrics.jsonl, sorted by (step, split); [] if there is none.

    The trainer keeps each step once (`ln_jax.train.metrics.MetricsWriter`); in workdirs written
    before it did, of records with the same (split, step) the last one written is kept.
    """
    path = paths.as_path(workdir) / METRICS_FILE  # a local folder or a URL
    if not path.exists():
        return []
    by_key = {(r["split"], r["step"]): r for r in read_records(path)}
    return sorted(by_key.values(), key=lambda r: (r["step"], r["split"]))


# ------------------------------------------------------------------------------------ plots

ARM_COLOURS = {
    "post": "tab:red",
    "post_nowarmup": "tab:red",
    "post_warmup": "tab:orange",
    "post_warmup100": "sandybrown",
    "post_warmup500": "gold",
    "post_warmup1000": "tab:orange",
    "post_warmup4000": "tab:orange",
    "post_radam": "tab:brown",
    "post_smalllr": "tab:pink",
    "post_sgd": "tab:gray",
    "post_sgd_warmup": "tab:olive",
    "admin_radam": "yellowgreen",  # apart from admin_warmup, which takes admin's colour
    "pre": "tab:blue",
    "admin": "tab:green",
    "deepnorm": "tab:purple",
    "deepnorm_alpha": "mediumorchid",
    "deepnorm_beta": "indigo",
    "sandwich": "tab:gray",
    "rezero": "tab:olive",
    "olmo2": "tab:cyan",
    "lns": "navy",
    "dyt": "darkgoldenrod",
    "checkpoint": "black",
}


def arm_colour(arm: str, index: int | None = None) -> str:
    """The colour of an arm (a placement, or a study's arm such as "post_warmup500").

    Args:
      arm: the arm's name.
      index: the arm's position in its plot; an arm without a colour of its own (nor a
        "<row>_warmup" arm of a row with one) then takes matplotlib's colour C{index + 3},
        else black.
    """
    if arm in ARM_COLOURS:
        return ARM_COLOURS[arm]
    if arm.startswith("post_warmup"):
        return ARM_COLOURS["post_warmup"]
    if arm.endswith("_warmup") and arm.removesuffix("_warmup") in ARM_COLOURS:
        return ARM_COLOURS[arm.removesuffix("_warmup")]  # e.g. deepnorm_alpha_warmup
    return f"C{index + 3}" if index is not None else "black"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 5.5, height: float = 4.0, **kw):
    """(figure, axes) of `nrows` x `ncols` panels, each `width` x `height` inches.

    Extra keywords go to `plt.subplots` (e.g. sharey=True, squeeze=False).
    """
    plt = _pyplot()
    size = (width * ncols, height * nrows)
    return plt.subplots(nrows, ncols, figsize=size, layout="constrained", **kw)


def save_figure(fig: Any, path: str) -> str:
    """Saves `fig` as a PNG at `path` (creating its folder), closes it; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
