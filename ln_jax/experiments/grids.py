"""The two studies as grids of `RunSpec`s (the protocol of issue 20; docs/results/studies/PLAN.md).

`depth_grid` (Liu et al. 2020, Wang et al. 2022): encoders of several depths, one or more peak
learning rates (a pilot sweeps several, the study runs the chosen one), several seeds. An arm is
a row of the placement table, optionally with a suffix: `_warmup` (a linear warm-up of an
absolute number of steps) or `_radam` (RAdam, no warm-up), and `+qk` (model.qk_norm). Liu's
recipes are `post_warmup` and `admin_warmup` (Adam (0.9, 0.98) with warm-up) and `admin_radam`.

`warmup_grid` (Xiong et al. 2020 section 3.2): Post-LN at each peak learning rate x each absolute
warm-up length (0 = none), Pre-LN at each of its learning rates without warm-up; optionally
extra arms (`post_radam`, `admin_warmup`, `admin_radam`, ...) at every Post-LN rate.
`key_cell_specs` adds seeds to the cells the sweep chose (`report.best_cells`).

Every Adam arm uses (beta1, beta2) = (0.9, `b2`), 0.98 by default (Xiong's and Liu's value;
1/(1 - beta2) = 50 steps, so every warm-up here is at least 2/(1 - beta2)). The schedule is one
that does not depend on the run's length (`constant` after the warm-up, or `warmup_rsqrt`), so
steps to a target mean the same in a short and a long run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ln_jax.experiments.runner import RunSpec

DEPTH_ARMS = (
    "post_warmup",
    "pre",
    "admin_warmup",
    "admin_radam",
    "deepnorm_warmup",
    "deepnorm_alpha_warmup",
    "deepnorm_beta_warmup",
)
SUFFIXES = ("_warmup", "_radam")
B2 = 0.98  # Adam's beta2 in both studies (Xiong et al. 3.2; Liu et al.'s recipe)
DEPTH_LR = 5e-4
DEPTH_WARMUP = 200  # absolute steps: 4 x 1/(1 - beta2) at beta2 = 0.98 (rule of thumb: >= 2x)
SCHEDULE = "constant"  # linear warm-up, then constant: independent of the run's length
# Schedules a study may use: "constant" and "warmup_rsqrt" do not depend on total_steps;
# "warmup_linear_decay" reproduces the old protocol (decay to 0 at the end of the run);
# "warmup_cosine" decays to end_lr by the end of the run too (neither can be --extend-ed).
STUDY_SCHEDULES = ("constant", "warmup_rsqrt", "warmup_linear_decay", "warmup_cosine")
POST_LRS = (1e-4, 2e-4, 3e-4, 5e-4)
PRE_LRS = (3e-4, 5e-4, 1e-3)
WARMUPS = (0, 100, 500, 1000)
WARMUP_EXTRAS = ("post_radam", "admin_warmup", "admin_radam", "admin")


def lr_tag(lr: float) -> str:
    """A learning rate as it appears in run names: 5e-4, 1e-3, 2.5e-4."""
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


def optimizer(
    lr: float, warmup_steps: int, *, radam: bool = False, schedule: str = SCHEDULE, b2: float = B2
) -> dict[str, Any]:
    """Overrides of the optimizer and schedule: Adam (0.9, b2) or RAdam, no weight decay, a
    linear warm-up of `warmup_steps` (absolute; 0 = none) into `schedule`."""
    if schedule not in STUDY_SCHEDULES:
        raise ValueError(
            f"--schedule={schedule!r} is not a study schedule; valid: {', '.join(STUDY_SCHEDULES)}."
        )
    if warmup_steps < 0:
        raise ValueError(f"warm-up of {warmup_steps} steps; give 0 (none) or more.")
    return {
        "optim.optimizer": "radam" if radam else "adam",
        "optim.b2": b2,
        "optim.weight_decay": 0.0,
        "optim.peak_lr": lr,
        "optim.schedule": schedule,
        "optim.warmup_steps": warmup_steps,
    }


def parse_arm(arm: str) -> tuple[str, str, bool]:
    """(placement row, suffix "" | "_warmup" | "_radam", qk_norm) of an arm name such as
    "admin_radam", "deepnorm_beta_warmup" or "pre+qk"."""
    from ln_jax.nn.placements import PLACEMENTS

    base, qk = (arm[: -len("+qk")], True) if arm.endswith("+qk") else (arm, False)
    suffix = next((s for s in SUFFIXES if base.endswith(s) and base not in PLACEMENTS), "")
    placement = base[: len(base) - len(suffix)]
    if placement not in PLACEMENTS:
        raise ValueError(
            f"unknown study arm {arm!r}; give a placement row ({', '.join(PLACEMENTS)}), "
            "optionally with '_warmup' (absolute warm-up) or '_radam' (RAdam, no warm-up), "
            "and '+qk' for model.qk_norm (e.g. admin_radam, post_warmup, pre+qk)."
        )
    return placement, suffix, qk


def arm_overrides(
    arm: str, lr: float, warmup_steps: int, schedule: str = SCHEDULE, b2: float = B2
) -> dict[str, Any]:
    """Overrides of one arm: its placement (and qk_norm) and optimizer; only a `_warmup` arm
    gets the `warmup_steps` warm-up."""
    placement, suffix, qk = parse_arm(arm)
    steps = warmup_steps if suffix == "_warmup" else 0
    opt = optimizer(lr, steps, radam=suffix == "_radam", schedule=schedule, b2=b2)
    return {"model.placement": placement, **({"model.qk_norm": True} if qk else {}), **opt}


def depth_grid(
    depths: Sequence[int],
    arms: Sequence[str],
    seeds: Sequence[int],
    lrs: Sequence[float] = (DEPTH_LR,),
    warmup_steps: int = DEPTH_WARMUP,
    schedule: str = SCHEDULE,
    b2: float = B2,
) -> list[RunSpec]:
    """Every (depth, arm, lr, seed) run; names like "L12-admin_radam-s1", with the rate in the
    name ("L12-pre-lr5e-4-s1") when there are several (a pilot)."""
    _check_nonempty(depths=depths, arms=arms, seeds=seeds, lrs=lrs)
    specs = []
    for depth in depths:
        for arm in arms:
            for lr in lrs:
                for seed in seeds:
                    lr_part = f"-lr{lr_tag(lr)}" if len(lrs) > 1 else ""
                    overrides = {
                        "model.num_layers": depth,
                        "seed": seed,
                        "data.seed": seed,
                        **arm_overrides(arm, lr, warmup_steps, schedule, b2),
                    }
                    tags = {"num_layers": depth, "seed": seed, "lr": lr}
                    name = f"L{depth}-{arm}{lr_part}-s{seed}"
                    specs.append(RunSpec(name, arm, overrides, tags))
    return specs


def warmup_cells(
    post_lrs: Sequence[float] = POST_LRS,
    warmups: Sequence[int] = WARMUPS,
    pre_lrs: Sequence[float] = PRE_LRS,
    extras: Sequence[str] = (),
    extra_warmup: int = 500,
    schedule: str = SCHEDULE,
    b2: float = B2,
) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """The warm-up study's cells, each (cell name, arm, overrides, tags) without a seed.

    Post-LN cells are "post_warmup{W}-lr{lr}" ("post_nowarmup-lr{lr}" for W = 0), Pre-LN cells
    "pre-lr{lr}"; an extra arm (`WARMUP_EXTRAS` or any `parse_arm` name) runs at every Post-LN
    rate, a `_warmup` one with `extra_warmup` steps.
    """
    _check_nonempty(lrs=post_lrs, warmups=warmups, pre_lrs=pre_lrs)
    cells = []
    for lr in post_lrs:
        for w in warmups:
            arm = f"post_warmup{w}" if w else "post_nowarmup"
            opt = optimizer(lr, w, schedule=schedule, b2=b2)
            tags = {"lr": lr, "warmup_steps": w}
            cells.append((f"{arm}-lr{lr_tag(lr)}", arm, {"model.placement": "post", **opt}, tags))
    for lr in pre_lrs:
        opt = optimizer(lr, 0, schedule=schedule, b2=b2)
        cells.append((f"pre-lr{lr_tag(lr)}", "pre", {"model.placement": "pre", **opt}, {"lr": lr}))
    for arm in extras:
        warm = extra_warmup if parse_arm(arm)[1] == "_warmup" else 0
        for lr in post_lrs:
            over = arm_overrides(arm, lr, extra_warmup, schedule, b2)
            cells.append((f"{arm}-lr{lr_tag(lr)}", arm, over, {"lr": lr, "warmup_steps": warm}))
    return cells


def seeded(
    cells: Sequence[tuple[str, str, dict[str, Any], dict[str, Any]]], seeds: Sequence[int]
) -> list[RunSpec]:
    """The runs of `cells` at `seeds`, seed-major (a study cut off part-way has whole grids of
    the first seeds); names "{cell}-s{seed}"."""
    return [
        RunSpec(f"{name}-s{seed}", arm, {**o, "seed": seed, "data.seed": seed}, {**t, "seed": seed})
        for seed in seeds
        for name, arm, o, t in cells
    ]


def warmup_grid(seeds: Sequence[int] = (0, 1), **cell_args: Any) -> list[RunSpec]:
    """The warm-up sweep: every cell of `warmup_cells(**cell_args)` at every seed."""
    _check_nonempty(seeds=seeds)
    return seeded(warmup_cells(**cell_args), seeds)


def key_cell_specs(
    sweep: Sequence[RunSpec], cells: Sequence[str], seeds: Sequence[int]
) -> list[RunSpec]:
    """Runs of the chosen `cells` of a sweep at the extra `seeds` (those it does not have)."""
    have = {s.name for s in sweep}
    by_cell = {}
    for spec in sweep:
        by_cell.setdefault(spec.name.rsplit("-s", 1)[0], spec)
    out = []
    for seed in seeds:
        for cell in cells:
            spec = by_cell[cell]
            name = f"{cell}-s{seed}"
            if name not in have:
                over = {**spec.overrides, "seed": seed, "data.seed": seed}
                out.append(RunSpec(name, spec.arm, over, {**spec.tags, "seed": seed}))
    return out


def _check_nonempty(**lists: Sequence[Any]) -> None:
    for name, values in lists.items():
        if not values:
            raise ValueError(f"--{name} is empty; give at least one value (comma-separated).")
