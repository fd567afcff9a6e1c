"""Studies that train grids of runs: `python -m ln_jax.experiments {depth,warmup} --out=DIR`.

* depth: Post-LN (with and without warm-up), Pre-LN, Admin and DeepNorm at 6/12/18 layers
  with one large learning rate (Liu et al. 2020; Wang et al. 2019).
* warmup: Xiong et al. 2020's warm-up grid: Post-LN with warm-up lengths and peak learning
  rates, RAdam, a small constant rate; Pre-LN and Admin without warm-up.

Python API: `grids.depth_grid` / `grids.warmup_grid` build `RunSpec` lists, `study.run` trains
and reports them, `runner.steps_to_target`, `plateau.unigram_cross_entropy`.
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
