"""Figures of the training-time measurements (`ln_jax.train.monitor`) of one or more runs.

  python -m ln_jax.analysis monitor WORKDIR [WORKDIR ...] --out=DIR [--measures=grad_norm,...]

reads each workdir's metrics.jsonl (records of split "monitor", and "warning/<rule>") and
writes, per measurement (grad_norm, update_ratio, stream_rms, branch_rms, norm_in_rms,
collapse, attention_entropy, omega, gate):
  DIR/<measure>_heatmap.png   layer x step, one column per workdir, one row per sub-layer part
  DIR/<measure>_layers.png    the same values as one curve per layer against the step
and DIR/gradients_by_layer.png (Xiong et al. Fig. 3 across training: each sub-layer's gradient
norm by layer at four steps of each run) and DIR/monitor.json, the arrays drawn:
{"runs": {run: {"<measure>/<part>": {"steps": [S], "layers": [L], "values": [L][S]}}},
 "warnings": {run: [records]}}. Runs are named by their workdir's folder name.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm, Normalize

from ln_jax.results import jsonable, new_figure, save_figure, write_json
from ln_jax.train.metrics import METRICS_FILE, read_records
from ln_jax.train.monitor import LAYER_NAME

Series = dict[str, Any]  # {"steps": [S], "layers": [L], "values": [L, S] array}
# Measures spanning decades are drawn on log colour scales.
LOG_SCALE = ("grad_norm", "update_ratio", "stream_rms", "branch_rms", "norm_in_rms")


def series(records: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """The "monitor" records of one run as layer x step arrays.

    Returns:
      {"<measure>/<part>" (or "<measure>" for per-layer measures without a part): {"steps":
       [S] logged steps, "layers": [L], "values": [L, S] float array, NaN where not logged}}.
    """
    monitored = sorted((r for r in records if r.get("split") == "monitor"), key=lambda r: r["step"])
    steps = [r["step"] for r in monitored]
    cells: dict[str, dict[tuple[int, int], float]] = {}
    for column, record in enumerate(monitored):
        for name, value in record.items():
            match = LAYER_NAME.match(name)
            if match and isinstance(value, (int, float)):
                key = "/".join(filter(None, (match["measure"], match["part"])))
                cells.setdefault(key, {})[(int(match["layer"]), column)] = value
    out = {}
    for key, found in cells.items():
        layers = sorted({layer for layer, _ in found})
        values = np.full((len(layers), len(steps)), np.nan)
        for (layer, column), value in found.items():
            values[layers.index(layer), column] = value
        out[key] = {"steps": steps, "layers": layers, "values": values}
    return out


def load_runs(workdirs: Sequence[str]) -> tuple[dict[str, dict[str, Series]], dict[str, list]]:
    """({run name: `series`}, {run name: warning records}) of each workdir's metrics.jsonl."""
    runs, warnings = {}, {}
    for workdir in workdirs:
        path = os.path.join(workdir, METRICS_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist: is {workdir!r} a run's workdir?")
        records = read_records(path)
        name = os.path.basename(os.path.normpath(workdir))
        runs[name] = series(records)
        warnings[name] = [r for r in records if r.get("split", "").startswith("warning/")]
        if not runs[name]:
            raise ValueError(f"{path} holds no measurements (split 'monitor'): monitor.every=0?")
    return runs, warnings


def _parts(runs: dict[str, dict[str, Series]], measure: str) -> list[str]:
    keys = {k for run in runs.values() for k in run if k.split("/")[0] == measure}
    return sorted(keys)


def _shared_norm(arrays: list[np.ndarray], measure: str) -> Normalize | LogNorm | None:
    """One colour scale for the runs of a row (log for LOG_SCALE measures), so that the
    same colour is the same value in every run compared."""
    values = np.concatenate([a[np.isfinite(a)].ravel() for a in arrays]) if arrays else []
    if not len(values):
        return None
    positive = values[values > 0]
    if measure in LOG_SCALE and positive.size:
        return LogNorm(positive.min(), positive.max())
    return Normalize(values.min(), values.max())


def heatmap_figure(runs: dict[str, dict[str, Series]], measure: str, warnings=None):
    """Layer x step images of `measure`: a row per part (e.g. attention, ffn), a column per run;
    warnings are marked on the step axis."""
    parts = _parts(runs, measure)
    fig, axes = new_figure(len(runs), len(parts), width=4.5, height=2.6, squeeze=False)
    norms = {
        key: _shared_norm([run[key]["values"] for run in runs.values() if key in run], measure)
        for key in parts
    }
    for ax, name, key, s in _panels(axes, runs, parts):
        image = ax.pcolormesh(s["steps"], s["layers"], s["values"], norm=norms[key],
                              shading="nearest")  # fmt: skip
        fig.colorbar(image, ax=ax)
        for w in (warnings or {}).get(name, []):
            ax.axvline(w["step"], color="red", lw=0.8, alpha=0.7)
        ax.set_ylabel("layer")
    return fig


def _panels(axes, runs: dict[str, dict[str, Series]], parts: list[str]):
    """Yields (ax, run name, part, series) for each panel of a part x run grid, titled and
    with a step axis; a run without that part gets an empty panel."""
    for row, key in enumerate(parts):
        for col, (name, run) in enumerate(runs.items()):
            ax = axes[row][col]
            if key not in run:
                ax.set_axis_off()
                continue
            ax.set_title(f"{name}: {key}", fontsize=9)
            ax.set_xlabel("step")
            yield ax, name, key, run[key]


def layers_figure(runs: dict[str, dict[str, Series]], measure: str):
    """`measure` against the step, one curve per layer (dark = first layer, light = last)."""
    parts = _parts(runs, measure)
    fig, axes = new_figure(len(runs), len(parts), width=4.5, height=2.8, squeeze=False)
    cmap = matplotlib.colormaps["viridis"]
    legends = set()
    for ax, _, key, s in _panels(axes, runs, parts):
        count = max(len(s["layers"]) - 1, 1)
        for i, layer in enumerate(s["layers"]):
            ax.plot(s["steps"], s["values"][i], color=cmap(i / count), label=f"layer {layer}")
        if measure in LOG_SCALE:
            ax.set_yscale("log")
        if key not in legends:  # one legend per row, on its first panel
            legends.add(key)
            ax.legend(fontsize=6)
    return fig


def gradients_figure(runs: dict[str, dict[str, Series]]):
    """Xiong et al. Fig. 3 across training: each sub-layer's gradient norm by layer at the
    first, two middle and last measured steps, one colour per run (darker = later)."""
    parts = _parts(runs, "grad_norm")
    fig, axes = new_figure(len(parts), width=4.5, squeeze=False)
    for col, key in enumerate(parts):
        ax = axes[0][col]
        for i, (name, run) in enumerate(runs.items()):
            if key not in run:
                continue
            s = run[key]
            picks = sorted({0, len(s["steps"]) // 3, 2 * len(s["steps"]) // 3, len(s["steps"]) - 1})
            for j, column in enumerate(picks):
                alpha = 0.35 + 0.65 * j / max(len(picks) - 1, 1)
                label = f"{name}, step {s['steps'][column]}"
                ax.plot(
                    s["layers"],
                    s["values"][:, column],
                    "-o",
                    color=f"C{i}",
                    alpha=alpha,
                    label=label,
                )
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel(r"$\|\partial L / \partial \theta\|$")
        ax.set_title(key)
        ax.legend(fontsize=6)
    return fig


def plot_runs(
    workdirs: Sequence[str], out: str, measures: Sequence[str] | None = None
) -> list[str]:
    """Writes the figures and monitor.json of `workdirs` into `out`; returns the paths."""
    runs, warnings = load_runs(workdirs)
    found = sorted({k.split("/")[0] for run in runs.values() for k in run})
    chosen = [m for m in found if measures is None or m in measures]
    written = []
    for measure in chosen:
        heat = heatmap_figure(runs, measure, warnings)
        written.append(save_figure(heat, os.path.join(out, f"{measure}_heatmap.png")))
        curves = layers_figure(runs, measure)
        written.append(save_figure(curves, os.path.join(out, f"{measure}_layers.png")))
    if "grad_norm" in found:
        written.append(
            save_figure(gradients_figure(runs), os.path.join(out, "gradients_by_layer.png"))
        )
    data = {
        "runs": {
            n: {k: _plain(s) for k, s in run.items() if k.split("/")[0] in chosen}
            for n, run in runs.items()
        }
    }
    data["warnings"] = warnings
    path = os.path.join(out, "monitor.json")
    write_json(path, data, nan_as_null=True)
    return [*written, path]


def _plain(s: Series) -> dict[str, Any]:
    return {
        "steps": s["steps"],
        "layers": s["layers"],
        "values": jsonable(s["values"], nan_as_null=True),
    }


def main(argv: Sequence[str]) -> int:
    """`python -m ln_jax.analysis monitor WORKDIR [WORKDIR ...] --out=DIR [--measures=...]`."""
    p = argparse.ArgumentParser(
        prog="python -m ln_jax.analysis monitor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("workdirs", nargs="+", help="run workdirs (several: compared side by side)")
    p.add_argument("--out", required=True, help="folder for the PNGs and monitor.json")
    p.add_argument("--measures", help="comma-separated measurements (default: all logged)")
    args = p.parse_args(argv)
    measures = [m.strip() for m in args.measures.split(",")] if args.measures else None
    try:
        written = plot_runs(args.workdirs, args.out, measures)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}")
        return 2
    print(f"wrote {len(written)} files to {args.out}")
    return 0
