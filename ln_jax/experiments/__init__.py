"""Studies that train grids of runs: `python -m ln_jax.experiments {depth,warmup} --out=DIR`.

* depth: Liu et al. 2020's regime (Post-LN trains shallow, fails deep; Admin and Pre-LN train at
  every depth): arms post_warmup, pre, admin_warmup, admin_radam and DeepNorm with its two
  changes apart (deepnorm_alpha, deepnorm_beta) at 6/12/18 layers, a learning rate chosen by a
  pilot (several --lrs), the collapse measure logged.
* warmup: Xiong et al. 2020's warm-up grid in absolute steps: Post-LN lr x warm-up, Pre-LN
  without warm-up, each arm at its best cell; steps to several targets below the unigram plateau
  and the Pre-LN / Post-LN step ratio with a bootstrap interval (Xiong: 0.71).

* mt_warmup, mt_depth, mt_deep_encoder, mt_gradients: the translation studies of issue 35
  (`mt_grids`, `report_mt`; docs/results/studies/PLAN_MT.md): Xiong et al.'s Fig. 2 warm-up cells,
  Liu et al.'s Table 2 depths, Wang et al.'s deep encoders, reported in BLEU with paired bootstrap
  intervals, and Fig. 3 on the encoder-decoder (`ln_jax.analysis.gradients`).

Python API: `grids.depth_grid` / `grids.warmup_grid` build `RunSpec` lists, `study.run` trains
and reports them, `runner.steps_to_target`, `targets.bootstrap_ratio`,
`plateau.unigram_cross_entropy`. The plan and its CPU budget: docs/results/studies/PLAN.md.
"""

from ln_jax.experiments.grids import depth_grid, warmup_grid
from ln_jax.experiments.plateau import corpus_plateau, unigram_cross_entropy
from ln_jax.experiments.runner import RunSpec, run_grid, steps_to_target

__all__ = [
    "RunSpec",
    "corpus_plateau",
    "depth_grid",
    "run_grid",
    "steps_to_target",
    "unigram_cross_entropy",
    "warmup_grid",
]
