"""The two studies as grids of `RunSpec`s.

`depth_grid` (Liu et al. 2020 Table / Wang et al. 2019): 6-, 12-, 18-layer encoders, one large
learning rate, no warm-up except for the "post_warmup" arm; arms post, post_warmup, pre, admin,
deepnorm; several seeds.

`warmup_grid` (Xiong et al. 2020 section 3.2 and 4): Post-LN with warm-up lengths scaled to the
run, at two peak learning rates (Adam beta2 = 0.98); Post-LN without warm-up under RAdam; Post-LN
with a small constant learning rate; Pre-LN and Admin without warm-up (linear decay from the
peak); optionally SGD with and without warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ln_jax.experiments.runner import RunSpec

DEPTH_ARMS = ("post", "post_warmup", "pre", "admin", "deepnorm")
# Xiong et al.'s warm-up lengths (updates) and the run length they are taken relative to:
# T_warmup = round(T / REFERENCE_STEPS * total_steps), at least 1 ("1" = no warm-up).
WARMUP_LENGTHS = (1, 500, 4000)
REFERENCE_STEPS = 50_000
WARMUP_LRS = (5e-4, 1e-3)


def _lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def no_warmup(lr: float) -> dict[str, Any]:
    """Linear decay from `lr` at step 0 (Xiong et al.'s Pre-LN schedule)."""
    return {"optim.peak_lr": lr, "optim.schedule": "linear_decay", "optim.warmup_steps": 0}


def with_warmup(lr: float, steps: int) -> dict[str, Any]:
    """Linear warm-up over `steps` to `lr`, then linear decay (BERT's schedule)."""
    return {
        "optim.peak_lr": lr,
        "optim.schedule": "warmup_linear_decay",
        "optim.warmup_steps": steps,
    }


def depth_arm(arm: str, lr: float, warmup_steps: int) -> dict[str, Any]:
    """Overrides of one arm of the depth study.

    An arm is `post_warmup` (Post-LN with a linear warm-up of `warmup_steps`) or any row of the
    placement table (`ln_jax.config.PLACEMENTS`: post, pre, admin, deepnorm, olmo2, lns, dyt,
    ...), trained from `lr` with no warm-up; a `+qk` suffix adds `model.qk_norm` (`pre+qk`).
    """
    from ln_jax.config import PLACEMENTS

    base, qk = (arm[: -len("+qk")], True) if arm.endswith("+qk") else (arm, False)
    placement = {"post_warmup": "post"}.get(base, base)
    if placement not in PLACEMENTS:
        valid = ", ".join((*DEPTH_ARMS, *(p for p in PLACEMENTS if p not in DEPTH_ARMS)))
        raise ValueError(
            f"unknown depth-study arm {arm!r}; valid: {valid} (any of them with a '+qk' suffix "
            "for model.qk_norm)."
        )
    schedule = with_warmup(lr, warmup_steps) if base == "post_warmup" else no_warmup(lr)
    return {"model.placement": placement, **({"model.qk_norm": True} if qk else {}), **schedule}


def depth_grid(
    depths: Sequence[int],
    arms: Sequence[str],
    seeds: Sequence[int],
    lr: float,
    warmup_steps: int,
) -> list[RunSpec]:
    """Every (depth, arm, seed) run; names like "L12-admin-s1"."""
    _check_nonempty(depths=depths, arms=arms, seeds=seeds)
    specs = []
    for depth in depths:
        for arm in arms:
            for seed in seeds:
                overrides = {
                    "model.num_layers": depth,
                    "seed": seed,
                    "data.seed": seed,
                    **depth_arm(arm, lr, warmup_steps),
                }
                tags = {"num_layers": depth, "seed": seed}
                specs.append(RunSpec(f"L{depth}-{arm}-s{seed}", arm, overrides, tags))
    return specs


def scaled_warmup(length: int, total_steps: int) -> int:
    """Xiong et al.'s warm-up `length` (of REFERENCE_STEPS updates) scaled to `total_steps`."""
    return max(1, round(length / REFERENCE_STEPS * total_steps))


def warmup_grid(
    total_steps: int,
    lrs: Sequence[float] = WARMUP_LRS,
    lengths: Sequence[int] = WARMUP_LENGTHS,
    seeds: Sequence[int] = (0,),
    small_lr: float = 1e-4,
    sgd: bool = False,
    sgd_lr: float = 0.1,
) -> list[RunSpec]:
    """The warm-up grid. Adam runs use beta2 = 0.98 (Xiong et al. section 3.2)."""
    _check_nonempty(lrs=lrs, lengths=lengths, seeds=seeds)
    adam = {"optim.optimizer": "adam", "optim.b2": 0.98, "optim.weight_decay": 0.0}
    arms: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
    for lr in lrs:
        for length in lengths:
            steps = scaled_warmup(length, total_steps)
            schedule = no_warmup(lr) if length == 1 else with_warmup(lr, steps)
            arm = "post_nowarmup" if length == 1 else f"post_warmup{length}"
            tags = {"lr": lr, "warmup": length, "warmup_steps": 0 if length == 1 else steps}
            arms.append(
                (
                    f"{arm}-lr{_lr_tag(lr)}",
                    arm,
                    {"model.placement": "post", **adam, **schedule},
                    tags,
                )
            )
    top = max(lrs)
    arms.append(
        (
            "post_radam",
            "post_radam",
            {"model.placement": "post", **adam, "optim.optimizer": "radam", **no_warmup(top)},
            {"lr": top, "warmup": 1},
        )
    )
    arms.append(
        (
            "post_smalllr",
            "post_smalllr",
            {
                "model.placement": "post",
                **adam,
                "optim.peak_lr": small_lr,
                "optim.schedule": "constant",
                "optim.warmup_steps": 0,
            },
            {"lr": small_lr, "warmup": 1},
        )
    )
    for placement in ("pre", "admin"):
        for lr in lrs:
            arms.append(
                (
                    f"{placement}-lr{_lr_tag(lr)}",
                    placement,
                    {"model.placement": placement, **adam, **no_warmup(lr)},
                    {"lr": lr, "warmup": 1},
                )
            )
    if sgd:
        sgd_opt = {"optim.optimizer": "sgd", "optim.weight_decay": 0.0}
        steps = scaled_warmup(max(lengths), total_steps)
        arms.append(
            (
                "post_sgd",
                "post_sgd",
                {"model.placement": "post", **sgd_opt, **no_warmup(sgd_lr)},
                {"lr": sgd_lr, "warmup": 1},
            )
        )
        arms.append(
            (
                "post_sgd_warmup",
                "post_sgd_warmup",
                {"model.placement": "post", **sgd_opt, **with_warmup(sgd_lr, steps)},
                {"lr": sgd_lr, "warmup": steps},
            )
        )
    # Seed-major: a study cut off part-way has whole grids of the first seeds.
    return [
        RunSpec(f"{name}-s{seed}", arm, {**o, "seed": seed, "data.seed": seed}, {**t, "seed": seed})
        for seed in seeds
        for name, arm, o, t in arms
    ]


def _check_nonempty(**lists: Sequence[Any]) -> None:
    for name, values in lists.items():
        if not values:
            raise ValueError(f"--{name} is empty; give at least one value (comma-separated).")
