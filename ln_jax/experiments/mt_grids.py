"""The translation studies as grids of `RunSpec`s (issue 35; docs/results/studies/PLAN_MT.md).

Every arm follows the papers' optimiser: Adam (0.9, 0.98) without weight decay, gradient
clipping OFF (`optim.clip_norm=0`, as Xiong et al., Liu et al. and fairseq's default; the BERT
studies measured clipping doing much of warm-up's job, so leaving it on would hide the effect
measured here), label smoothing 0.1 (the study config), and the inverse-square-root schedule
after a linear warm-up (`warmup_rsqrt`; warm-up 0 = Xiong's "T_warmup = 1": the peak rate at
the first step, then peak / sqrt(t)).

* `mt_warmup_grid` (Xiong et al. 3.2, Fig. 2): Post-LN at each peak rate x each warm-up (0,
  500 and "full", the paper's 4,000 scaled to the run, see `resolve_warmup`), Pre-LN at each
  rate without warm-up; extra seeds on named key cells (`key_cell_specs`).
* `mt_depth_grid` (Liu et al. Table 2): encoder = decoder depth, arms `post_warmup`,
  `pre_warmup`, `admin_warmup` (`admin_radam`: RAdam, no warm-up), one rate, several seeds.
* `mt_deep_encoder_grid` (Wang et al. 2019): a deep encoder over a fixed decoder, arms
  `post_warmup`, `pre_warmup`, `pre_warmup+dlcl` (`+dlcl`: dynamic linear combination of
  layers on the encoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ln_jax.experiments import grids
from ln_jax.experiments.runner import RunSpec

MT_SCHEDULE = "warmup_rsqrt"  # the papers': inverse square root after the warm-up
MT_B2 = 0.98
MT_LRS = (5e-4, 1e-3)  # Xiong et al.'s two peak rates (Fig. 2)
# The paper's 4,000 warm-up steps of a 50,000-step IWSLT14 run (fairseq's transformer_iwslt
# recipe, configs/mt.py:iwslt; Liu et al.'s 8,000 of WMT14's 100,000 is the same 8%): a "full"
# warm-up is this fraction of the study's run.
PAPER_WARMUP, PAPER_STEPS = 4_000, 50_000
FULL = "full"
MT_WARMUPS = ("0", "500", FULL)
DEPTH_ARMS = ("post_warmup", "pre_warmup", "admin_warmup")
DEEP_ENCODER_ARMS = ("post_warmup", "pre_warmup", "pre_warmup+dlcl")
DLCL = "+dlcl"
# An arm "post_held": no warm-up, the peak rate held for the --warmup_steps steps the _warmup
# arms ramp over, then their inverse square root (`decay_rsqrt` with D = W, f = 1): the same
# rate as the _warmup arm from step W on, so that warm-up is compared without the budget
# confound of W = 0 (the peak only at step 1, then peak / sqrt(t)).
HELD = "_held"


def full_warmup(total_steps: int) -> int:
    """The paper's 4,000 warm-up steps scaled to a run of `total_steps`: the same fraction of
    the run (8%), at least 2 / (1 - beta2) = 100 steps (Adam's second moment settles first)."""
    return max(100, round(total_steps * PAPER_WARMUP / PAPER_STEPS))


def resolve_warmup(value: str | int, total_steps: int, full: int | None = None) -> int:
    """An absolute warm-up from a study flag: a number of steps, or "full" (`full` if given,
    else `full_warmup(total_steps)`)."""
    if str(value).strip().lower() == FULL:
        return full if full is not None else full_warmup(total_steps)
    try:
        steps = int(value)
    except ValueError:
        raise ValueError(
            f"--warmup_steps: {value!r} is neither a number of steps nor 'full'; give e.g. "
            "0,500,full."
        ) from None
    if steps < 0:
        raise ValueError(f"--warmup_steps: {steps} is negative; give 0 (none) or more.")
    return steps


def mt_optimizer(
    lr: float, warmup_steps: int, *, radam: bool = False, b2: float = MT_B2,
    schedule: str = MT_SCHEDULE,
) -> dict[str, Any]:  # fmt: skip
    """The papers' optimiser overrides: Adam (0.9, b2) or RAdam, no weight decay, a linear
    warm-up of `warmup_steps` into `schedule`, and no gradient clipping."""
    return {
        **grids.optimizer(lr, warmup_steps, radam=radam, schedule=schedule, b2=b2),
        "optim.clip_norm": 0.0,
    }


def mt_arm_overrides(
    arm: str, lr: float, warmup_steps: int, b2: float = MT_B2, schedule: str = MT_SCHEDULE
) -> dict[str, Any]:
    """One arm's placement and optimiser (`grids.parse_arm` names, plus a `+dlcl` suffix: DLCL
    on the encoder, and `_held`: `HELD`); only `_warmup` arms get the warm-up."""
    dlcl = arm.endswith(DLCL)
    name, held = _without_held(arm[: -len(DLCL)] if dlcl else arm)
    try:
        placement, suffix, qk = grids.parse_arm(name)
    except ValueError as err:
        raise ValueError(
            f"{err} Translation studies also take '_held' (the peak rate from step 1 for "
            "--warmup_steps steps, then the _warmup arms' decay; e.g. post_held) and '+dlcl'."
        ) from None
    if held and (suffix or warmup_steps < 1):
        raise ValueError(
            f"study arm {arm!r}: '_held' holds the peak rate for --warmup_steps steps, so it "
            f"takes a plain placement row (e.g. post_held) and --warmup_steps >= 1 (got "
            f"{warmup_steps})."
        )
    steps = warmup_steps if suffix == "_warmup" else 0
    optim = mt_optimizer(lr, steps, radam=suffix == "_radam", b2=b2, schedule=schedule)
    if held:
        optim.update({"optim.schedule": "decay_rsqrt", "optim.decay_step": warmup_steps,
                      "optim.decay_factor": 1.0})  # fmt: skip
    return {
        "model.placement": placement,
        **({"model.qk_norm": True} if qk else {}),
        **({"model.dlcl": True} if dlcl else {}),
        **optim,
    }


def _without_held(arm: str) -> tuple[str, bool]:
    """("post+qk", True) for "post_held+qk"; (arm, False) for an arm without `HELD`."""
    core, qk = (arm[: -len("+qk")], "+qk") if arm.endswith("+qk") else (arm, "")
    if core.endswith(HELD):
        return core[: -len(HELD)] + qk, True
    return arm, False


def _seed(overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**overrides, "seed": seed, "data.seed": seed}


def mt_warmup_cells(
    lrs: Sequence[float], warmups: Sequence[int], pre_lrs: Sequence[float], full: int,
    b2: float = MT_B2,
) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:  # fmt: skip
    """The warm-up study's cells (name, arm, overrides, tags), without a seed: Post-LN
    "post_nowarmup-lr1e-3" / "post_warmup500-lr1e-3" at every rate and warm-up, then Pre-LN
    "pre-lr1e-3" at every rate without one; tags carry lr, warmup_steps and "full" (the warm-up
    is the scaled paper's)."""
    grids._check_nonempty(lrs=lrs, warmup_steps=warmups, pre_lrs=pre_lrs)
    cells = []
    for lr in lrs:
        for w in warmups:
            arm = f"post_warmup{w}" if w else "post_nowarmup"
            over = {"model.placement": "post", **mt_optimizer(lr, w, b2=b2)}
            tags = {"lr": lr, "warmup_steps": w, "full": w == full}
            cells.append((f"{arm}-lr{grids.lr_tag(lr)}", arm, over, tags))
    for lr in pre_lrs:
        over = {"model.placement": "pre", **mt_optimizer(lr, 0, b2=b2)}
        tags = {"lr": lr, "warmup_steps": 0, "full": False}
        cells.append((f"pre-lr{grids.lr_tag(lr)}", "pre", over, tags))
    return cells


def mt_warmup_grid(
    seeds: Sequence[int],
    lrs: Sequence[float] = MT_LRS,
    warmups: Sequence[int] = (0, 500),
    pre_lrs: Sequence[float] = MT_LRS,
    *,
    full: int,
    key_cells: Sequence[str] = (),
    key_seeds: Sequence[int] = (),
    b2: float = MT_B2,
) -> list[RunSpec]:
    """Every cell at `seeds` (seed-major), then the `key_cells` (cell names) at `key_seeds`,
    tagged "key"; `full` is the full warm-up's length (marks its cells)."""
    grids._check_nonempty(seeds=seeds)
    specs = grids.seeded(mt_warmup_cells(lrs, warmups, pre_lrs, full, b2), seeds)
    cells = {s.name.rsplit("-s", 1)[0] for s in specs}
    unknown = [c for c in key_cells if c not in cells]
    if unknown:
        raise ValueError(
            f"--key_cells: {', '.join(unknown)} not in the grid; its cells: "
            f"{', '.join(sorted(cells))}."
        )
    extra = grids.key_cell_specs(specs, list(key_cells), [s for s in key_seeds])
    return specs + [RunSpec(s.name, s.arm, s.overrides, {**s.tags, "key": True}) for s in extra]


def mt_depth_grid(
    depths: Sequence[int],
    arms: Sequence[str],
    seeds: Sequence[int],
    lr: float,
    warmup_steps: int,
    *,
    decoder_layers: int | None = None,
    b2: float = MT_B2,
) -> list[RunSpec]:
    """Every (encoder depth, arm, seed) run; the decoder has the encoder's depth (Liu et al.
    Table 2: "L18-admin_warmup-s1") or `decoder_layers` (Wang et al.'s deep encoders:
    "E18D6-pre_warmup+dlcl-s0")."""
    grids._check_nonempty(depths=depths, arms=arms, seeds=seeds)
    specs = []
    for depth in depths:
        dec = depth if decoder_layers is None else decoder_layers
        prefix = f"L{depth}" if decoder_layers is None else f"E{depth}D{dec}"
        for arm in arms:
            over = mt_arm_overrides(arm, lr, warmup_steps, b2)
            for seed in seeds:
                layers = {"model.num_layers": depth, "translation.decoder_layers": dec}
                tags = {"num_layers": depth, "decoder_layers": dec, "seed": seed, "lr": lr}
                specs.append(
                    RunSpec(f"{prefix}-{arm}-s{seed}", arm, _seed({**layers, **over}, seed), tags)
                )
    return specs
