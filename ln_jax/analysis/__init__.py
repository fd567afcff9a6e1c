"""The papers' measurements at initialisation, with plots (Xiong et al. 2020, Liu et al. 2020).

  python -m ln_jax.analysis {depth,layers,lemma2,output-change,dependency} --out=DIR ...

Each subcommand writes DIR/<name>.json (the numbers, mean and std over seeds, and the config
used) and DIR/<name>.png; the same measurements are these functions.

  python -m ln_jax.analysis monitor WORKDIR [WORKDIR ...] --out=DIR

draws the measurements logged during training (`ln_jax.train.monitor`) by layer and step
(`ln_jax.analysis.training`).
"""

from ln_jax.analysis.gradients import grad_norm_by_depth, grad_norm_by_layer
from ln_jax.analysis.hidden import lemma2
from ln_jax.analysis.models import TheoryModel, load_checkpoint
from ln_jax.analysis.plots import (
    PLOTS,
    plot_dependency,
    plot_depth,
    plot_layers,
    plot_lemma2,
    plot_output_change,
)
from ln_jax.analysis.residual import layer_dependency, output_change
from ln_jax.analysis.settings import ANALYSIS_DEFAULTS, Settings, analysis_config
from ln_jax.analysis.stats import seed_mean_std
from ln_jax.results import write_json

__all__ = [
    "ANALYSIS_DEFAULTS",
    "PLOTS",
    "Settings",
    "TheoryModel",
    "analysis_config",
    "grad_norm_by_depth",
    "grad_norm_by_layer",
    "layer_dependency",
    "lemma2",
    "load_checkpoint",
    "output_change",
    "plot_dependency",
    "plot_depth",
    "plot_layers",
    "plot_lemma2",
    "plot_output_change",
    "seed_mean_std",
    "write_json",
]
