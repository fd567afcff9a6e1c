"""One PNG per measurement, drawn from the result dicts (so a saved JSON can be re-plotted).

Each `plot_NAME(result, path)` saves the figure that `NAME_figure(result)` draws.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from ln_jax.results import arm_colour, new_figure, save_figure


def _array(x: Any) -> np.ndarray:
    """JSON numbers or lists (None for NaN) -> float array."""
    return np.array(x, dtype=float)


def _by_depth(ax, results: dict[str, Any]) -> None:
    """Mean +- std against the number of layers, one line per arm."""
    for i, (label, by_depth) in enumerate(results.items()):
        depths = sorted(by_depth, key=int)
        mean = _array([by_depth[n]["mean"] for n in depths])
        std = _array([by_depth[n]["std"] for n in depths])
        x = [int(n) for n in depths]
        ax.errorbar(
            x, mean, yerr=std, marker="o", capsize=3, color=arm_colour(label, i), label=label
        )
    ax.set_xlabel("number of layers")
    ax.legend(fontsize=8)


def depth_figure(result: dict[str, Any]) -> Figure:
    """Xiong Figure 3(c,d): ||dL/dW^{2,L}||_F against depth, with Pre-LN's 1/sqrt(L) guide."""
    fig, ax = new_figure()
    results = result["results"]
    _by_depth(ax, results)
    if "pre" in results:
        depths = sorted(results["pre"], key=int)
        first = results["pre"][depths[0]]["mean"]
        x = np.array([int(n) for n in depths], float)
        guide = first * np.sqrt(x[0] / x)
        ax.plot(x, guide, "--", color="tab:blue", alpha=0.5, label=r"pre: $\propto 1/\sqrt{L}$")
        ax.legend(fontsize=8)
    ax.set_ylabel(r"$\|\partial L / \partial W^{2,L}\|_F$ at initialisation")
    ax.set_title(f"Last layer's FFN $W^2$ ({result['config']['setting']} setting)")
    ax.set_ylim(bottom=0)
    return fig


# The two norms of `layers`, one row of panels each.
LAYER_QUANTITIES = {
    "mean_of_norm": r"$E_{batches}\|\partial L / \partial W\|_F$",
    "norm_of_mean": r"$\|E_{batches}[\partial L / \partial W]\|_F$",
}


def layers_figure(result: dict[str, Any]) -> Figure:
    """Xiong Figure 3(a,b) on an encoder: E||g|| (top row) beside ||E g|| (bottom row) of W1
    (left) and W2 (right) by layer, at init and after the warm-up steps."""
    fig, axes = new_figure(2, 2, width=5, sharey="row", squeeze=False)
    for row, (quantity, ylabel) in zip(axes, LAYER_QUANTITIES.items(), strict=True):
        for ax, matrix in zip(row, ("W1", "W2"), strict=True):
            _layer_curves(ax, result, quantity, matrix)
            ax.set_title(f"${matrix[0]}^{matrix[1]}$ of the FFN sub-layers (encoder only)")
        row[0].set_ylabel(ylabel)
    axes[0][1].legend(fontsize=8)
    return fig


def _layer_curves(ax, result: dict[str, Any], quantity: str, matrix: str) -> None:
    """Mean +- std over seeds against the layer index, per arm and stage."""
    steps = result["config"]["train_steps"]
    for i, (label, arm) in enumerate(result["results"].items()):
        for stage, style in (("init", "-o"), ("after_warmup", "--s")):
            if stage not in arm:
                continue
            node = arm[stage][quantity][matrix]
            mean, std = _array(node["mean"]), _array(node["std"])
            name = f"{label}, init" if stage == "init" else f"{label}, {steps} warm-up steps"
            ax.errorbar(
                np.arange(1, len(mean) + 1),
                mean,
                yerr=std,
                fmt=style,
                capsize=3,
                color=arm_colour(label, i),
                label=name,
                alpha=1.0 if stage == "init" else 0.6,
            )
    ax.set_xlabel("encoder layer")
    ax.set_ylim(bottom=0)


def lemma2_figure(result: dict[str, Any]) -> Figure:
    """Lemma 2: measured E||x||^2 / d beside 1.5 (Post-LN) and the Pre-LN interval."""
    settings = list(result["results"])
    fig, axes = new_figure(len(settings), squeeze=False)
    for ax, name in zip(axes[0], settings, strict=True):
        res = dict(result["results"][name])
        pred = res.pop("prediction")
        d0 = result["config"][name]["hidden_size"]
        lower, upper = _array(pred["stream_lower"]) / d0, _array(pred["stream_upper"]) / d0
        ls = np.arange(len(lower))
        ax.fill_between(
            ls, lower, upper, color="tab:blue", alpha=0.12, label="pre: Lemma 2 interval"
        )
        ax.axhline(1.5, color="tab:red", ls="--", alpha=0.6, label="post: Lemma 2, 1.5")
        for i, (label, arm) in enumerate(res.items()):
            _lemma2_curve(ax, label, arm, arm_colour(label, i))
        ax.set_xlabel("l (layers applied)")
        ax.set_ylabel(r"$E\|x\|^2 / d$")
        ax.set_title(f"{name} setting")
        ax.legend(fontsize=8)
    return fig


def _lemma2_curve(ax, label: str, arm: dict[str, Any], colour: str) -> None:
    d = arm["hidden_size"]
    post5 = _array(arm["post5"]["mean"])
    if np.all(np.isfinite(post5)):
        std = _array(arm["post5"]["std"]) / d
        ax.errorbar(
            np.arange(1, len(post5) + 1),
            post5 / d,
            yerr=std,
            fmt="-o",
            capsize=3,
            color=colour,
            label=f"{label}: " + r"$x^{post,5}_l$",
        )
    else:
        mean, std = _array(arm["stream"]["mean"]) / d, _array(arm["stream"]["std"]) / d
        ax.errorbar(
            np.arange(len(mean)),
            mean,
            yerr=std,
            fmt="-s",
            capsize=3,
            color=colour,
            label=f"{label}: residual stream " + r"$x_l$",
        )


def output_change_figure(result: dict[str, Any]) -> Figure:
    """Liu Figure 2: output change against depth, one line per arm."""
    fig, ax = new_figure()
    _by_depth(ax, result["results"])
    eps = result["config"]["epsilon"]
    ax.set_ylabel(r"$E_{tokens}\,|F(x,\theta) - F(x,\theta^*)|^2$")
    ax.set_title(rf"Output change, random $\delta$, $|\delta| = {eps}\,|W|$")
    ax.set_ylim(bottom=0)  # linear: Liu et al. predict O(N) for Post-LN, O(log N) for Pre-LN
    return fig


def dependency_figure(result: dict[str, Any]) -> Figure:
    """Liu Figures 7-8: heatmaps of beta^2_{i,j}, one per arm, on a shared colour scale."""
    arms = result["results"]
    fig, axes = new_figure(len(arms), width=4.2, squeeze=False)
    image = None
    for ax, (label, arm) in zip(axes[0], arms.items(), strict=True):
        share = _array(arm["share"]["mean"])
        shown = np.where(np.tril(np.ones_like(share), k=1) > 0, share, np.nan)
        image = ax.imshow(
            shown,
            norm=PowerNorm(0.5, vmin=0, vmax=1),
            cmap="viridis",
            origin="upper",
            extent=(-0.5, share.shape[1] - 0.5, share.shape[0] + 0.5, 0.5),
        )
        ax.set_title(label if label != "checkpoint" else f"trained ({arm['placement']})")
        ax.set_xlabel("residual branch j (0 = input)")
        ax.set_ylabel("sub-layer output i")
    label = r"$\beta^2_{ij}$: share of branch j in output i"
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85, label=label)
    return fig


def plot_depth(result: dict[str, Any], path: str) -> str:
    """Saves `depth_figure(result)` as the PNG `path`; returns the path."""
    return save_figure(depth_figure(result), path)


def plot_layers(result: dict[str, Any], path: str) -> str:
    """Saves `layers_figure(result)` as the PNG `path`; returns the path."""
    return save_figure(layers_figure(result), path)


def plot_lemma2(result: dict[str, Any], path: str) -> str:
    """Saves `lemma2_figure(result)` as the PNG `path`; returns the path."""
    return save_figure(lemma2_figure(result), path)


def plot_output_change(result: dict[str, Any], path: str) -> str:
    """Saves `output_change_figure(result)` as the PNG `path`; returns the path."""
    return save_figure(output_change_figure(result), path)


def plot_dependency(result: dict[str, Any], path: str) -> str:
    """Saves `dependency_figure(result)` as the PNG `path`; returns the path."""
    return save_figure(dependency_figure(result), path)


PLOTS = {
    "depth": plot_depth,
    "layers": plot_layers,
    "lemma2": plot_lemma2,
    "output-change": plot_output_change,
    "dependency": plot_dependency,
}
