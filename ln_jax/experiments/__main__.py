"""Command line of the studies (see `ln_jax.experiments`; the plan: docs/results/studies/PLAN.md).

  python -m ln_jax.experiments depth --out=DIR [--depths=6,12,18] [--arms=...] [--seeds=0,1,2]
      [--lrs=5e-4 (several = a pilot)] [--warmup_steps=200] [--schedule=constant] [--b2=0.98]
      [--jobs=2] [--config=FILE[:variant]] [--config.FIELD=value ...]
  python -m ln_jax.experiments downstream --out=DIR --runs=pre=WORKDIR1,post=WORKDIR2
      [--steps=100,200] [--config=configs/glue.py:offline] [--config.FIELD=value ...]
  python -m ln_jax.experiments warmup --out=DIR [--lrs=1e-4,2e-4,3e-4,5e-4]
      [--warmup_steps=0,100,500,1000] [--pre_lrs=3e-4,5e-4,1e-3] [--extras=admin_radam,...]
      [--seeds=0,1] [--key_seeds=2,3,4] [--target_offsets=0.3,0.6,1.0] [--target=LOSS]
      [--schedule=constant] [--b2=0.98] [--jobs=2] [--config=...] [--config.FIELD=value ...]

Translation (issue 35; the plan: docs/results/studies/PLAN_MT.md), on configs/study_mt.py:<study>:

  python -m ln_jax.experiments mt_warmup --out=DIR [--lrs=5e-4,1e-3] [--warmup_steps=0,500,full]
      [--full_warmup=N] [--pre_lrs=5e-4,1e-3] [--seeds=0] [--key_cells=CELL,...]
      [--key_seeds=1,2] [--bleu_targets=5,10] [--target=NLL] [--b2=0.98] [--jobs=2]
  python -m ln_jax.experiments mt_depth --out=DIR [--depths=6,12,18]
      [--arms=post_warmup,pre_warmup,admin_warmup] [--lrs=1e-3] [--warmup_steps=full]
      [--seeds=0,1,2]
  python -m ln_jax.experiments mt_deep_encoder --out=DIR [--depths=18] [--decoder_layers=6]
      [--arms=post_warmup,pre_warmup,pre_warmup+dlcl] [--lrs=1e-3] [--seeds=0,1]
  python -m ln_jax.experiments mt_gradients --out=DIR [--depths=6] [--arms=post,pre]
      [--seeds=0,...,9] [--batches=4]

Every translation arm: Adam (0.9, 0.98), no weight decay, gradient clipping OFF, the inverse
square root after a linear warm-up (`warmup_rsqrt`; 0 = none), label smoothing 0.1; "full" is
the paper's 4,000 warm-up steps scaled to the run (8% of total_steps, `mt_grids.full_warmup`).
Results report BLEU by step (greedy or `--config.translation.eval_beam`), final BLEU, steps
to each BLEU target, validation NLL, and paired bootstrap intervals of the cells' differences.
mt_gradients measures Xiong et al.'s Fig. 3 on the encoder-decoder at initialisation.

  python -m ln_jax.experiments mt_2x2 --out=DIR --runs=RUNDIR_GLOB,... [--steps=600]

mt_2x2 trains nothing: it reads finished translation runs (each RUNDIR holds a result.json;
globs allowed), sorts them by placement x warm-up, and writes Xiong Fig. 2's 2 x 2 at one step
(default: the last step every run evaluated) to OUT/table.md and OUT/results.json: each cell's
NLL and BLEU per seed, warm-up's gain per placement and the difference-in-differences, with
t-intervals over the shared seeds (`ln_jax.experiments.two_by_two`).

The default config is `configs/study.py:depth` or `:warmup`. Warm-up lengths are absolute steps
(0 = none); the default schedule, a linear warm-up then a constant rate, does not depend on the
run's length; every Adam arm uses beta2 = 0.98. An arm of the depth study is a placement row
with an optional `_warmup` (the --warmup_steps warm-up) or `_radam` (RAdam, no warm-up) suffix
and `+qk`. With --key_seeds the warm-up study, once its sweep is finished, trains the extra seeds
of the best Post-LN and Pre-LN cells (see `targets.best_cell`) and reports the step ratio with
a bootstrap interval. Rerunning the same command resumes: finished runs are kept, a run cut off
midway continues from its checkpoint. A run that fails (a failed checkpoint save, a run held
by another process) does not stop the others: the report covers the finished runs and the
command exits 1 naming the failed ones. `--only=NAME` trains one run; `--report` only rewrites
the report. `--extend=PATTERN,...` with a larger `--config.total_steps` continues the finished
runs it names from their last checkpoint (schedules independent of the run's length only):

  python -m ln_jax.experiments warmup --out=DIR ... --config.total_steps=2000 \
      --extend='post_nowarmup-lr5e-4-s*,pre-lr1e-3-s*' --jobs=2

The protocol before issue 20 (Xavier init, beta2 0.999 in the depth study, warm-up scaled to a
600-step run, linear decay to zero, the embedded corpus, eval every 50 steps):

  python -m ln_jax.experiments depth --out=DIR --seeds=0,1 --lrs=1e-3 --warmup_steps=60 \
      --arms=post,post_warmup,pre,admin,deepnorm --schedule=warmup_linear_decay --b2=0.999 \
      --config.model.init=xavier --config.data.dataset=ln_jax_pydocs --config.total_steps=600 \
      --config.eval_every=50 --config.monitor.every=0
  python -m ln_jax.experiments warmup --out=DIR --lrs=5e-4,1e-3 --warmup_steps=0,6,48 \
      --pre_lrs=5e-4,1e-3 --extras=admin,post_radam --schedule=warmup_linear_decay \
      --config.model.init=xavier --config.data.dataset=ln_jax_pydocs --config.total_steps=600 \
      --config.eval_every=50

(the old warm-up grid also had a constant-1e-4 Post-LN arm, and its Admin/RAdam arms ran at one
rate each.)
"""

from __future__ import annotations

import json
import os
import sys

from ln_jax import console
from ln_jax.cli import command as cli
from ln_jax.experiments.grids import B2, DEPTH_ARMS, SCHEDULE, STUDY_SCHEDULES
from ln_jax.validate import UserError

STUDIES = {
    "depth": "post/pre/admin/... arms at depths 6, 12, 18 (docs/results/studies/PLAN.md)",
    "warmup": "Post-LN warm-up lengths x learning rates against Pre-LN without warm-up",
    "downstream": "fine-tuning along pretraining runs' checkpoints",
    "mt_warmup": "translation: Post-LN warm-up x rate against Pre-LN (Xiong Fig. 2; PLAN_MT.md)",
    "mt_depth": "translation: encoder = decoder depth, post/pre/admin (Liu Table 2)",
    "mt_deep_encoder": "translation: deep encoder, 6-layer decoder, post/pre/pre+DLCL (Wang)",
    "mt_gradients": "translation: FFN gradient norms by layer at initialisation (Xiong Fig. 3)",
    "mt_2x2": "translation: placement x warm-up of finished runs, with the DiD (Xiong Fig. 2)",
}
MT_DEFAULTS = {  # flag -> default, per translation study
    "mt_warmup": {"lrs": "5e-4,1e-3", "warmup_steps": "0,500,full", "seeds": "0",
                  "pre_lrs": "5e-4,1e-3", "depths": "6"},
    "mt_depth": {"lrs": "1e-3", "warmup_steps": "full", "seeds": "0,1,2", "depths": "6,12,18",
                 "arms": "post_warmup,pre_warmup,admin_warmup"},
    "mt_deep_encoder": {"lrs": "1e-3", "warmup_steps": "full", "seeds": "0,1", "depths": "18",
                        "arms": "post_warmup,pre_warmup,pre_warmup+dlcl"},
    "mt_gradients": {"seeds": ",".join(map(str, range(10))), "depths": "6", "arms": "post,pre"},
}  # fmt: skip
COMMANDS = tuple(STUDIES)


def _command(argv: list[str]) -> str | None:
    words = [a for a in argv[1:] if not a.startswith("-")]
    return words[0] if words else None


def default_config(words: list[str]) -> str:
    """The config of a study without --config: configs/study.py:<study>, or the fine-tuning
    config for downstream."""
    study = words[0] if words else None
    if study == "downstream":
        return "configs/glue.py:offline"
    if study == "mt_2x2":
        return "configs/study_mt.py:warmup"  # its corpus, for the unigram plateau
    if study in MT_DEFAULTS:
        return f"configs/study_mt.py:{study[len('mt_') :]}"
    return f"configs/study.py:{study if study in COMMANDS else 'depth'}"


def _build(values: dict):
    """The typed config of a study's base (a fine-tuning config for downstream)."""
    if "init_from" in values:
        from ln_jax.models.bert.finetune import build_finetune_config

        return build_finetune_config(values)
    from ln_jax.config.load import build_config

    return build_config(values)


def _config_front() -> cli.ConfigFront:
    from ln_jax.config.run import TrainConfig

    return cli.ConfigFront(
        lambda: TrainConfig, _build, default_config, example="configs/study.py:depth"
    )


COMMAND = cli.Command(
    "python -m ln_jax.experiments",
    __doc__,
    _config_front(),
    positionals=[("STUDY", " | ".join(STUDIES))],
    subcommands=STUDIES,
)
_OUT = COMMAND.string(
    "out", None, "Study directory (runs/, results.json, plots).", required=True, meta="DIR"
)
_JOBS = COMMAND.integer("jobs", 1, "Runs trained at once, each in its own process.")
_ONLY = COMMAND.string("only", None, "Train only this run (by name).", meta="NAME")
_RUNS = COMMAND.strings(
    "runs",
    [],
    "downstream: NAME=WORKDIR of pretraining runs whose checkpoints are fine-tuned; mt_2x2: "
    "run folders (globs) holding result.json.",
)
_STEPS = COMMAND.strings(
    "steps",
    [],
    "downstream: checkpoint steps (default: every one kept); mt_2x2: the one step compared.",
)
_REPORT = COMMAND.boolean("report", False, "Only rewrite the report from stored results.")
_EXTEND = COMMAND.strings(
    "extend",
    [],
    "Finished runs (names or fnmatch patterns, e.g. 'pre-lr1e-3-s*') to continue from their "
    "last checkpoint to a larger --config.total_steps; only with a schedule that does not "
    "depend on the run's length (constant, warmup_rsqrt).",
)
_SEEDS = COMMAND.strings(
    "seeds", None, "Seeds (default: depth 0,1,2; warmup 0,1; mt_*: see the usage above)."
)
_DEPTHS = COMMAND.strings(
    "depths", None, "depth, mt_*: encoder depths (default 6,12,18; mt_deep_encoder 18)."
)
_ARMS = COMMAND.strings(
    "arms",
    None,
    "depth, mt_depth, mt_deep_encoder: arms: a placement row (post, pre, admin, "
    "deepnorm_alpha, ...) with an optional _warmup or _radam suffix (translation: or _held, "
    "the peak rate held for --warmup_steps, then the _warmup arms' decay); '+qk' adds qk_norm, "
    f"'+dlcl' DLCL (translation). Default depth: {','.join(DEPTH_ARMS)}; mt_gradients: "
    "placements.",
)
_LRS = COMMAND.strings(
    "lrs",
    None,
    "Peak learning rates: depth: of every arm (several = a pilot; default 5e-4); "
    "warmup: of Post-LN and the extras (default 1e-4,2e-4,3e-4,5e-4).",
)
_WARMUP_STEPS = COMMAND.strings(
    "warmup_steps",
    None,
    "Absolute warm-up steps: depth: one, of the _warmup arms (default "
    "200); warmup: the Post-LN lengths, 0 = none (default 0,100,500,1000).",
)
_SCHEDULE = COMMAND.enum(
    "schedule",
    SCHEDULE,
    list(STUDY_SCHEDULES),
    "After the warm-up: constant | warmup_rsqrt "
    "(both independent of the run's length) | warmup_linear_decay (to 0 at the run's end).",
)
_B2 = COMMAND.real("b2", B2, "Adam's/RAdam's beta2 of every arm.")
_PRE_LRS = COMMAND.strings(
    "pre_lrs", None, "warmup, mt_warmup: Pre-LN's rates (default 3e-4,5e-4,1e-3; mt 5e-4,1e-3)."
)
_EXTRAS = COMMAND.strings(
    "extras", [], "warmup: extra arms at every --lrs rate (post_radam, admin_warmup, ...)."
)
_EXTRA_WARMUP = COMMAND.integer("extra_warmup", 500, "warmup: warm-up of _warmup extras.")
_KEY_SEEDS = COMMAND.strings(
    "key_seeds",
    [],
    "warmup: extra seeds of the best Post-LN and Pre-LN cells of the sweep; mt_warmup: of "
    "the --key_cells.",
)
_KEY_CELLS = COMMAND.strings(
    "key_cells", [], "mt_warmup: cells (e.g. post_nowarmup-lr1e-3,pre-lr1e-3) run at --key_seeds."
)
_FULL_WARMUP = COMMAND.integer(
    "full_warmup", None, "mt_*: steps of a 'full' warm-up (default 8% of total_steps)."
)
_BLEU_TARGETS = COMMAND.strings(
    "bleu_targets", ["5", "10"], "mt_warmup: BLEU targets (steps to reach each)."
)
_DECODER_LAYERS = COMMAND.integer("decoder_layers", 6, "mt_deep_encoder: the decoder's depth.")
_BATCHES = COMMAND.integer("batches", 4, "mt_gradients: measurement batches per seed.")
_OFFSETS = COMMAND.strings(
    "target_offsets", ["0.3", "0.6", "1.0"], "warmup: targets, nats below the plateau."
)
_TARGET = COMMAND.real(
    "target", None, "warmup: an extra absolute target loss; mt_warmup: a validation NLL target."
)
_WARMUPS = COMMAND.strings("warmups", None, "Removed: use --warmup_steps (absolute).")


def _ints(values: list[str], name: str) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError as err:
        raise ValueError(f"--{name}: {err}; give comma-separated integers.") from None


def _floats(values: list[str], name: str) -> list[float]:
    try:
        return [float(v) for v in values]
    except ValueError as err:
        raise ValueError(f"--{name}: {err}; give comma-separated numbers.") from None


def _list(flag, default: list[str]) -> list[str]:
    return flag.value if flag.value is not None else default


def _mt_list(flag, command: str, name: str) -> list[str]:
    """A flag's values, else the translation study's default (`MT_DEFAULTS`)."""
    default = MT_DEFAULTS[command].get(name)
    return _list(flag, default.split(",") if default else [])


def _mt_specs(command: str, base: dict) -> list:
    """The runs of a translation study from its flags (defaults: `MT_DEFAULTS`)."""
    from ln_jax.experiments import mt_grids

    total = int(base["total_steps"])  # the base's own warm-up may not fit: each arm sets one
    full = _FULL_WARMUP.value or mt_grids.full_warmup(total)
    warmups = [
        mt_grids.resolve_warmup(v, total, full)
        for v in _mt_list(_WARMUP_STEPS, command, "warmup_steps")
    ]
    seeds = _ints(_mt_list(_SEEDS, command, "seeds"), "seeds")
    lrs = _floats(_mt_list(_LRS, command, "lrs"), "lrs")
    if command == "mt_warmup":
        return mt_grids.mt_warmup_grid(
            seeds,
            lrs,
            warmups,
            _floats(_mt_list(_PRE_LRS, command, "pre_lrs"), "pre_lrs"),
            full=full,
            key_cells=_KEY_CELLS.value,
            key_seeds=_ints(_KEY_SEEDS.value, "key_seeds"),
            b2=_B2.value,
        )
    if len(lrs) != 1 or len(warmups) != 1:
        raise ValueError(
            f"{command}: --lrs={_LRS.value} and --warmup_steps={_WARMUP_STEPS.value} take one "
            "value each (the warm-up of the _warmup arms); give one."
        )
    return mt_grids.mt_depth_grid(
        _ints(_mt_list(_DEPTHS, command, "depths"), "depths"),
        _mt_list(_ARMS, command, "arms"),
        seeds,
        lrs[0],
        warmups[0],
        decoder_layers=_DECODER_LAYERS.value if command == "mt_deep_encoder" else None,
        b2=_B2.value,
    )


def _specs(command: str) -> list:
    from ln_jax.experiments import grids

    if _WARMUPS.value is not None:
        raise ValueError(
            "--warmups (lengths out of Xiong's 50k updates, scaled to the run) was replaced by "
            "--warmup_steps in absolute steps (e.g. --warmup_steps=0,100,500,1000)."
        )
    common = {"schedule": _SCHEDULE.value, "b2": _B2.value}
    if command == "depth":
        warmup = _ints(_list(_WARMUP_STEPS, [str(grids.DEPTH_WARMUP)]), "warmup_steps")
        if len(warmup) != 1:
            raise ValueError(f"depth: --warmup_steps={warmup} takes one length; give one.")
        return grids.depth_grid(
            _ints(_list(_DEPTHS, ["6", "12", "18"]), "depths"),
            _list(_ARMS, list(DEPTH_ARMS)),
            _ints(_list(_SEEDS, ["0", "1", "2"]), "seeds"),
            _floats(_list(_LRS, [str(grids.DEPTH_LR)]), "lrs"),
            warmup[0],
            **common,
        )
    return grids.warmup_grid(
        seeds=_ints(_list(_SEEDS, ["0", "1"]), "seeds"),
        post_lrs=_floats(_list(_LRS, [str(x) for x in grids.POST_LRS]), "lrs"),
        warmups=_ints(_list(_WARMUP_STEPS, [str(x) for x in grids.WARMUPS]), "warmup_steps"),
        pre_lrs=_floats(_list(_PRE_LRS, ["3e-4", "5e-4", "1e-3"]), "pre_lrs"),
        extras=_EXTRAS.value,
        extra_warmup=_EXTRA_WARMUP.value,
        **common,
    )


def _plateau(out: str, base: dict, translation: bool = False) -> dict:
    """The corpus's unigram plateau (of the MLM loss, or of a translation's validation NLL),
    computed once per study and kept in OUT/plateau.json."""
    from ln_jax.data.config import DataConfig
    from ln_jax.experiments.plateau import corpus_plateau, translation_plateau
    from ln_jax.results import write_json

    path = os.path.join(out, "plateau.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    measure = translation_plateau if translation else corpus_plateau
    value = measure(DataConfig.from_mapping(base["data"]))  # the rest may be the arms' to set
    write_json(path, value)
    return value


def main(inv: cli.Invocation) -> int:
    """The command's body: the study's runs (or the report), errors in one line (exit 2).

    A worker of `--jobs` pins itself to its CPUs first (`runner.pin_to_share`). The terminal
    shows what `train.py`'s does (ln_jax's lines, other libraries' warnings in one line);
    each run's library logs go to OUT/runs/NAME/train.log (`runner.run_one`)."""
    from ln_jax.experiments import runner

    runner.pin_to_share()
    console.configure_logging()
    try:
        return _main(inv)
    finally:
        console.close_logging()


def _main(inv: cli.Invocation) -> int:
    from ln_jax.experiments import runner, study

    try:
        base = inv.config_values()
    except UserError as err:
        return inv.report(err)
    command = inv.words[0]
    out = _OUT.value
    if command == "downstream":  # fine-tuning along pretraining runs (ln_jax.models.bert.finetune)
        return _downstream(inv, base, out)
    if command == "mt_gradients":
        return _mt_gradients(inv, base, out)
    if command == "mt_2x2":
        return _mt_2x2(inv, base, out)
    mt = command in MT_DEFAULTS
    try:
        specs = _mt_specs(command, base) if mt else _specs(command)
        plateau = _plateau(out, base, translation=mt)["unigram_xent"]
        offsets = _floats(_BLEU_TARGETS.value if mt else _OFFSETS.value, "target_offsets")
        expand = None
        if command == "warmup" and _KEY_SEEDS.value:
            keys = _ints(_KEY_SEEDS.value, "key_seeds")
            expand = study.key_seed_expansion(specs, plateau, keys, offsets)
        if _ONLY.value:
            if expand and _ONLY.value not in {s.name for s in specs}:
                done = runner.collect(specs, out, plateau)
                specs = [*specs, *(expand(done) if len(done) == len(specs) else [])]
            return study.run_only(base, specs, out, _ONLY.value, plateau, _EXTEND.value)
        results = study.run(
            command,
            base,
            specs,
            out,
            plateau=plateau,
            jobs=_JOBS.value,
            argv=inv.argv,  # as given: the runner re-runs it per run (--only=NAME)
            train=not _REPORT.value,
            target=_TARGET.value,
            arms=_list(_ARMS, list(DEPTH_ARMS)) if command == "depth" else None,
            offsets=offsets,
            expand=expand,
            extend=_EXTEND.value,
        )
    except runner.RunsFailed as err:  # the table of the finished runs is printed already
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    except (UserError, ValueError) as err:
        return inv.report(err)
    print(results["table"])
    return 0


def _downstream(inv: cli.Invocation, base: dict, out: str) -> int:
    from ln_jax.experiments import downstream, runner

    try:
        runs = downstream.parse_runs(_RUNS.value)
        downstream.run(base, runs, out, _ints(_STEPS.value, "steps") or None)
    except (UserError, ValueError) as err:
        return inv.report(err)
    except runner.Preempted as stop:  # SIGTERM / Ctrl-C: the run in flight saved its step
        print(f"{stop}; run the same command to resume", flush=True)
        return 0
    print(f"wrote {os.path.join(out, downstream.RESULTS_FILE)} and {downstream.PLOT_FILE}")
    return 0


def _mt_2x2(inv: cli.Invocation, base: dict, out: str) -> int:
    """Xiong Fig. 2's 2 x 2 of finished runs (`two_by_two.two_by_two`): OUT/table.md and
    OUT/results.json (the runs read, their one-line records, the 2 x 2)."""
    import glob

    from ln_jax.experiments import report_mt, runner, two_by_two
    from ln_jax.results import write_json

    try:
        folders = sorted({f for g in _RUNS.value for f in glob.glob(g)})
        paths = [os.path.join(f, runner.RESULT) for f in folders]
        paths = [p for p in paths if os.path.isfile(p)]
        if not paths:
            raise UserError(
                f"mt_2x2: no result.json under --runs={','.join(_RUNS.value) or '(none)'}; give "
                "finished translation runs' folders, e.g. --runs='studies/mt/runs/L6-*'."
            )
        steps = _ints(_STEPS.value, "steps")
        plateau = _plateau(out, base, translation=True)["unigram_xent"]
        results = []
        for path in paths:
            with open(path) as f:
                r = runner.task_named(json.load(f))
            r["stuck"] = runner.stuck(r["final_nll"], r["diverged"], plateau)
            results.append(r)
        square = two_by_two.two_by_two(results, steps[0] if steps else None)
        if square is None:
            raise UserError(
                "mt_2x2: the runs do not hold Post-LN and Pre-LN each without and with warm-up "
                "on a shared seed (cells by model.placement and optim.warmup_steps > 0)."
            )
    except (UserError, ValueError) as err:
        return inv.report(err)
    table = "\n\n".join([two_by_two.two_by_two_table(square), report_mt.plateau_line(plateau)])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    records = report_mt.run_records(results)
    for record, path in zip(records, paths, strict=True):
        record["result"] = os.path.relpath(path, out)
    write_json(
        os.path.join(out, "results.json"),
        {"study": "mt_2x2", "plateau": plateau, "runs": records, "two_by_two": square},
    )
    print(table)
    return 0


def _mt_gradients(inv: cli.Invocation, base: dict, out: str) -> int:
    """Xiong et al.'s Fig. 3 on the encoder-decoder: OUT/gradients.json, table.md, plot."""
    from ln_jax.analysis import gradients
    from ln_jax.config.load import build_config
    from ln_jax.results import write_json

    try:
        cfg = build_config(base)
        depths = _ints(_mt_list(_DEPTHS, "mt_gradients", "depths"), "depths")
        seeds = _ints(_mt_list(_SEEDS, "mt_gradients", "seeds"), "seeds")
        placements = _mt_list(_ARMS, "mt_gradients", "arms")
        result = gradients.translation_grad_norm_by_layer(
            cfg, placements, depths, seeds, _BATCHES.value
        )
    except (UserError, ValueError) as err:
        return inv.report(err)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "gradients.json"), result)
    table = gradients.translation_table(result)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    gradients.plot_translation(result, os.path.join(out, "gradients.png"))
    print(table)
    return 0


def command_config(argv: list[str]) -> tuple[dict, list[str]]:
    """(the nested base config, the other arguments) of a study's command line; the default
    config is `configs/study.py:<study>` (`default_config`)."""
    from ln_jax.config.load import config_from_command_line

    values, line = config_from_command_line(argv, default_config([_command(["", *argv])]))
    return values, line.rest


def run(argv: list[str] | None = None) -> None:
    """The command line (sys.argv by default); exits with the study's status."""
    sys.exit(COMMAND.run(main, argv))


if __name__ == "__main__":
    run()
