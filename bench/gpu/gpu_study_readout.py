"""The pre-registered readouts of the one-call GPU studies, from a study folder's runs.

  python bench/gpu/gpu_study_readout.py fig2 STUDY_DIR [--out=FILE.json]    # gpu_mt_fig2.sh
  python bench/gpu/gpu_study_readout.py depth STUDY_DIR [--out=FILE.json]   # gpu_mt_liu_depth.sh
  python bench/gpu/gpu_study_readout.py held STUDY_DIR [--out=FILE.json]    # PLAN_MT2 section 2b

STUDY_DIR is a `python -m ln_jax.experiments mt_depth --out=STUDY_DIR` folder. Each run's figures
come from its `runs/NAME/result.json` (keys `eval_curve` [[step, nll, seconds], ...],
`bleu_curve`, `train_curve`, `monitor_traces` {"collapse/encoder/output": [[step, value], ...]},
`tags`, `arm`, `diverged`); a run the budget cut off before its result was written (SIGTERM:
its checkpoint saved, no result) is read from its `metrics.jsonl` by the same summary
(`ln_jax.experiments.runner.summarize_run`) and marked "partial": the call after continues it.

fig2 (Xiong et al. Fig. 2 as a 2x2: Post-LN / Pre-LN x without / with warm-up), per seed:
- the gate first (docs/results/studies/PLAN_MT2.md's rule, added here 2026-12-05 before any run
  of this readout): at the last evaluation step post_warmup and pre_warmup share, Post-LN with
  warm-up translates (greedy BLEU >= `GATE_BLEU`) and is level with Pre-LN with warm-up (NLL at
  most `GATE_NLL` nats above, BLEU at most `GATE_BLEU_GAP` below). A baseline that fails it
  gets no verdict ("baseline fails the gate"): the DiD is printed, not read;
- per arm: the largest rise of the training loss (a trailing mean of `SMOOTH` logged values)
  above its running minimum over the first `EARLY_STEPS` steps (nats; an instability shows as
  a rise, one batch's noise mostly not), validation NLL and greedy
  BLEU at each evaluation, and the encoder output's collapse (the monitor's mean cosine between
  positions) at its first measurement (step 1) and its last;
- DiD = [NLL(post) - NLL(post_warmup)] - [NLL(pre) - NLL(pre_warmup)] at the last evaluation
  step the four arms share. Xiong et al. predict DiD well above 0 (warm-up is what Post-LN
  needs); a learning-rate-budget effect alone (warm-up changes how much rate each arm has had)
  predicts DiD <= 0. Verdict: "as Xiong" if DiD >= `XIONG_DID` or Post-LN without warm-up
  diverged while the other three did not; "budget" if DiD <= 0; otherwise "not separated".
  DiD at each earlier common step is printed beside it (a sign that changes over the run, or a
  late rise of every NLL from overfitting the small corpus, shows there).

held (PLAN_MT2 section 2b, fixed 2026-12-06 before its runs): fig2's readout with `post_held`
and `pre_held` (the peak rate from step 1 for the warm-up's steps, then the warm-up arms' decay)
in place of `post` and `pre`; "as Xiong" also when Post-LN held is stuck at the verdict's step (its
NLL within `STUCK_NATS` of the study's unigram plateau, `plateau.json`, or above) and Pre-LN held
is not; "no placement effect" where fig2 says "budget" (DiD <= 0), the budget being matched here.

depth (Liu et al. Table 2 at two depths), per seed and depth: each arm's final validation NLL
and BLEU (its last evaluation), diverged (`result["diverged"]`: a non-finite loss, or the last
train losses above the first), stuck (did not diverge and ends below `STUCK_BLEU` greedy BLEU:
it translates nothing), and admin_warmup - pre_warmup, post_warmup - pre_warmup (NLL and BLEU) at
the last evaluation step the three arms share at that depth.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

EARLY_STEPS = 1000  # the window of the early train-loss rise (Xiong's Fig. 2: the first 1k)
SMOOTH = 5  # logged training losses averaged (a trailing mean) before the rise is read
XIONG_DID = 0.2  # nats: about 1.5x the 0.14 of two same-seed reruns (issue 64), fixed before
GATE_BLEU = 10.0  # the gate (PLAN_MT2): Post-LN with warm-up translates ...
GATE_NLL = 0.10  # ... its NLL at most this above Pre-LN's with warm-up ...
GATE_BLEU_GAP = 1.0  # ... and its BLEU at most this below
STUCK_BLEU = 1.0  # greedy BLEU below this at the end: translates nothing
COLLAPSE = "collapse/encoder/output"
FIG2_ARMS = ("post", "post_warmup", "pre", "pre_warmup")
HELD_ARMS = ("post_held", "post_warmup", "pre_held", "pre_warmup")  # in FIG2_ARMS' roles
STUCK_NATS = 0.1  # a run within this of the unigram plateau (or above it) translates nothing
DEPTH_ARMS = ("post_warmup", "admin_warmup", "pre_warmup")
RUN_NAME = re.compile(r"^L(\d+)-(.+)-s(\d+)$")  # mt_depth's "L6-post_warmup-s0"


def load_runs(study: str) -> list[dict[str, Any]]:
    """Every started run of the study: its result.json, else a summary of its metrics.jsonl
    ("partial": True); each with "depth" and "seed" (from its tags, else its name)."""
    from ln_jax.experiments import runner

    runs = []
    for folder in sorted(glob.glob(os.path.join(study, "runs", "*"))):
        name = os.path.basename(folder)
        match = RUN_NAME.match(name)
        path = os.path.join(folder, runner.RESULT)
        if os.path.exists(path):
            with open(path) as f:
                result = {**json.load(f), "partial": False}
        elif os.path.exists(os.path.join(folder, "metrics.jsonl")) and match:
            tags = {"num_layers": int(match.group(1)), "seed": int(match.group(3))}
            spec = runner.RunSpec(name, match.group(2), {}, tags)
            result = {**runner.summarize_run(spec, folder, None, None), "partial": True}
        else:
            continue
        tags = result.get("tags") or {}
        depth = tags.get("num_layers", int(match.group(1)) if match else None)
        seed = tags.get("seed", int(match.group(3)) if match else 0)
        runs.append({**result, "depth": depth, "seed": seed})
    return runs


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def early_rise(
    train_curve: Sequence[Sequence[float]], until: int = EARLY_STEPS, window: int = SMOOTH
) -> float:
    """The largest rise of the training loss above its running minimum over the logged steps
    <= `until`, the loss taken as the mean of the last `window` logged values (each is one
    batch's: the mean keeps one batch's noise out); 0 if it never rose, inf at a non-finite
    loss."""
    losses = [loss for step, loss, *_ in train_curve if step <= until]
    if not all(_finite(v) for v in losses):
        return math.inf
    smooth = [sum(losses[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
              for i in range(len(losses))]  # fmt: skip
    return max([0.0] + [v - min(smooth[:i]) for i, v in enumerate(smooth) if i])


def at_step(curve: Sequence[Sequence[float]], step: int) -> float:
    """The curve's value at `step` (nan if it has none there)."""
    return next((float(p[1]) for p in curve if p[0] == step), math.nan)


def collapse_ends(result: dict[str, Any]) -> list[list[float]]:
    """[[step, value] of the encoder output's collapse at its first and last measurement]."""
    trace = (result.get("monitor_traces") or {}).get(COLLAPSE) or []
    return [list(trace[0]), list(trace[-1])] if trace else []


def _common_steps(results: Sequence[dict[str, Any]]) -> list[int]:
    """The evaluation steps every one of `results` has, in order."""
    steps = [{int(p[0]) for p in r.get("eval_curve") or []} for r in results]
    return sorted(set.intersection(*steps)) if steps else []


def _last_common_step(results: Sequence[dict[str, Any]]) -> int | None:
    common = _common_steps(results)
    return common[-1] if common else None


def _arm_row(result: dict[str, Any]) -> dict[str, Any]:
    bleu = result.get("bleu_curve") or []
    return {
        "name": result["name"],
        "steps": result.get("steps", 0),
        "partial": result["partial"],
        "diverged": bool(result.get("diverged")),
        "early_rise": early_rise(result.get("train_curve") or []),
        "evals": [[int(p[0]), p[1], at_step(bleu, p[0])] for p in result.get("eval_curve") or []],
        "collapse": collapse_ends(result),
    }


def _by_seed(runs: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    seeds: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        seeds.setdefault(int(r["seed"]), []).append(r)
    return dict(sorted(seeds.items()))


def gate(post: dict[str, Any], pre: dict[str, Any]) -> dict[str, Any] | None:
    """The gate of `post` (Post-LN with warm-up) against `pre` (Pre-LN with warm-up) at the last
    evaluation step they share: {"step", "post": [nll, bleu], "pre": [nll, bleu], "translates",
    "level", "passed"}; None without a common step. A diverged Post-LN fails it."""
    step = _last_common_step([post, pre])
    if step is None:
        return None
    (pn, pb), (qn, qb) = (
        (at_step(r["eval_curve"], step), at_step(r.get("bleu_curve") or [], step))
        for r in (post, pre)
    )
    translates = not post.get("diverged") and pb >= GATE_BLEU
    level = pn <= qn + GATE_NLL and pb >= qb - GATE_BLEU_GAP
    return {"step": step, "post": [pn, pb], "pre": [qn, qb], "translates": translates,
            "level": level, "passed": translates and level}  # fmt: skip


def fig2(
    runs: Sequence[dict[str, Any]], arms_of: Sequence[str] = FIG2_ARMS, plateau: float | None = None
) -> dict[str, Any]:
    """{"seeds": {seed: {"arms": {arm: row}, "gate", "step", "did", "verdict"}}} (module
    docstring). `arms_of`: the arms in the roles of FIG2_ARMS (`HELD_ARMS` for held);
    `plateau`: the unigram plateau's NLL, for held's stuck rule (None: not read)."""
    names = dict(zip(FIG2_ARMS, arms_of, strict=True))  # role -> arm
    out = {}
    for seed, group in _by_seed(runs).items():
        by_arm = {r["arm"]: r for r in group}
        arms = {role: by_arm[a] for role, a in names.items() if a in by_arm}
        rows = {names[role]: _arm_row(r) for role, r in arms.items()}
        entry: dict[str, Any] = {"arms": rows, "step": None, "nll": {}, "did": None,
                                 "roles": names}  # fmt: skip
        baseline = [arms.get(a) for a in ("post_warmup", "pre_warmup")]
        entry["gate"] = None if None in baseline else gate(*baseline)
        missing = [names[role] for role in FIG2_ARMS if role not in arms]
        steps = [] if missing else _common_steps(list(arms.values()))
        if steps:
            nll = {s: {a: at_step(arms[a]["eval_curve"], s) for a in FIG2_ARMS} for s in steps}
            did = {s: (n["post"] - n["post_warmup"]) - (n["pre"] - n["pre_warmup"])
                   for s, n in nll.items()}  # fmt: skip
            entry.update(step=steps[-1], nll=nll[steps[-1]], did=did[steps[-1]], did_by_step=did)
        entry["verdict"] = _fig2_verdict(entry, rows, missing, plateau)
        out[seed] = entry
    return {"seeds": out}


def _fig2_verdict(
    entry: dict[str, Any], rows: dict[str, Any], missing: list[str], plateau: float | None = None
) -> str:
    """fig2's verdict; with `plateau` (held), also the stuck rule and held's wording."""
    if missing:
        return f"incomplete: no run of {', '.join(missing)}"
    if entry["gate"] is not None and not entry["gate"]["passed"]:
        return "baseline fails the gate: no verdict (the DiD is printed, not read)"
    row = {role: rows[arm] for role, arm in entry["roles"].items()}
    held = plateau is not None
    without = "held (no warm-up)" if held else "without warm-up"
    others_fine = not any(row[a]["diverged"] for a in ("post_warmup", "pre", "pre_warmup"))
    if row["post"]["diverged"] and others_fine:
        return f"as Xiong: Post-LN {without} diverged, the other three did not"
    did = entry["did"]
    if entry["step"] is None:
        return "incomplete: no evaluation step common to the four arms"
    if held:
        stuck = {r: not entry["nll"][r] < plateau - STUCK_NATS for r in ("post", "pre")}
        if stuck["post"] and not stuck["pre"]:
            return f"as Xiong: Post-LN {without} is stuck at the plateau, Pre-LN {without} is not"
    if not _finite(did):
        return "not separated: DiD is not finite (a non-finite NLL)"
    if did >= XIONG_DID:
        return f"as Xiong: DiD >= {XIONG_DID} (warm-up helps Post-LN more than Pre-LN)"
    if did <= 0:
        what = "no placement effect" if held else "budget"
        return f"{what}: DiD <= 0 (warm-up helps Pre-LN as much or more)"
    return f"not separated: 0 < DiD < {XIONG_DID} (one seed)"


def depth(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"seeds": {seed: {depth: {"arms": {arm: row}, "step", "diffs"}}}} (module docstring)."""
    out: dict[int, dict[int, Any]] = {}
    for seed, group in _by_seed(runs).items():
        for d in sorted({r["depth"] for r in group}):
            arms = {r["arm"]: r for r in group if r["depth"] == d and r["arm"] in DEPTH_ARMS}
            rows = {}
            for arm in DEPTH_ARMS:
                if arm not in arms:
                    continue
                r = arms[arm]
                row = _arm_row(r)
                final_bleu = row["evals"][-1][2] if row["evals"] else math.nan
                row.update(
                    final_step=row["evals"][-1][0] if row["evals"] else None,
                    final_nll=row["evals"][-1][1] if row["evals"] else math.nan,
                    final_bleu=final_bleu,
                    stuck=not row["diverged"] and not final_bleu >= STUCK_BLEU,
                )
                rows[arm] = row
            entry: dict[str, Any] = {"arms": rows, "step": None, "diffs": {}}
            if len(arms) == len(DEPTH_ARMS):
                step = _last_common_step(list(arms.values()))
                entry["step"] = step
                if step is not None:
                    entry["diffs"] = _diffs(arms, step)
            out.setdefault(seed, {})[d] = entry
    return {"seeds": out}


def _diffs(arms: dict[str, dict[str, Any]], step: int) -> dict[str, dict[str, float]]:
    def nll_bleu(arm):
        r = arms[arm]
        return at_step(r["eval_curve"], step), at_step(r.get("bleu_curve") or [], step)

    pre_nll, pre_bleu = nll_bleu("pre_warmup")
    diffs = {}
    for arm in ("admin_warmup", "post_warmup"):
        nll, bleu = nll_bleu(arm)
        diffs[f"{arm} - pre_warmup"] = {"nll": nll - pre_nll, "bleu": bleu - pre_bleu}
    return diffs


# ------------------------------------------------------------------------------------ text


def _num(x: Any, fmt: str = ".3f") -> str:
    return format(x, fmt) if _finite(x) else ("inf" if x == math.inf else "-")


def _collapse_text(points: list[list[float]]) -> str:
    if not points:
        return "-"
    (s0, v0), (s1, v1) = points
    return f"{v0:.3f} (step {s0:g}) -> {v1:.3f} (step {s1:g})"


def _flags(row: dict[str, Any]) -> str:
    return ", ".join(
        f for f, on in (("diverged", row["diverged"]), ("partial", row["partial"])) if on
    )


def format_fig2(readout: dict[str, Any], title: str = "") -> str:
    """The fig2 (or held) readout as text."""
    title = title or "Xiong Fig. 2 readout (pre-registered: bench/gpu/gpu_mt_fig2.sh's header)"
    lines = [title]
    if not readout["seeds"]:
        return lines[0] + "\n  no run has started"
    for seed, e in readout["seeds"].items():
        lines.append(f"seed {seed}:")
        lines.append(f"  {'arm':<12s}{'steps':>6s}  {'rise<=1k':>8s}  collapse (encoder output)")
        for arm, row in e["arms"].items():
            flags = _flags(row)
            lines.append(
                f"  {arm:<12s}{row['steps']:>6d}  {_num(row['early_rise']):>8s}  "
                f"{_collapse_text(row['collapse'])}{'  [' + flags + ']' if flags else ''}"
            )
        steps = sorted({ev[0] for row in e["arms"].values() for ev in row["evals"]})
        arms = list(e["arms"])
        lines.append("  validation NLL / greedy BLEU by step:")
        lines.append("  " + f"{'step':>6s}" + "".join(f"{a:>16s}" for a in arms))
        for step in steps:
            cells = []
            for a in arms:
                ev = next((v for v in e["arms"][a]["evals"] if v[0] == step), None)
                cells.append(f"{_num(ev[1])} / {_num(ev[2], '.2f')}" if ev else "-")
            lines.append("  " + f"{step:>6d}" + "".join(f"{c:>16s}" for c in cells))
        if e.get("gate") is not None:
            lines.append(_gate_text(e["gate"]))
        if e["step"] is not None:
            n, r = e["nll"], e["roles"]
            named = "" if list(r.values()) == list(FIG2_ARMS) else (
                f"[{r['post']} - {r['post_warmup']}] - [{r['pre']} - {r['pre_warmup']}] = "
            )  # fmt: skip
            lines.append(
                f"  DiD at step {e['step']} = {named}({_num(n['post'])} - "
                f"{_num(n['post_warmup'])}) - ({_num(n['pre'])} - {_num(n['pre_warmup'])}) = "
                f"{_num(e['did'])} nats"
            )
            by_step = ", ".join(f"{s} {_num(d, '+.3f')}" for s, d in e["did_by_step"].items())
            lines.append(f"  DiD by step (the verdict reads the last): {by_step}")
        lines.append(f"  verdict: {e['verdict']}")
    return "\n".join(lines)


def _gate_text(g: dict[str, Any]) -> str:
    (pn, pb), (qn, qb) = g["post"], g["pre"]
    fails = [why for why, ok in (("does not translate", g["translates"]), ("not level", g["level"]))
             if not ok]  # fmt: skip
    return (
        f"  gate at step {g['step']}: post_warmup {_num(pn)} / {_num(pb, '.2f')}, pre_warmup "
        f"{_num(qn)} / {_num(qb, '.2f')} (BLEU >= {GATE_BLEU:g}; NLL <= Pre-LN's + {GATE_NLL:g}, "
        f"BLEU >= Pre-LN's - {GATE_BLEU_GAP:g}): "
        + ("fails: " + " and ".join(fails) if fails else "passed")
    )


def format_depth(readout: dict[str, Any]) -> str:
    """The depth readout as text."""
    lines = ["Liu depth readout (pre-registered: bench/gpu/gpu_mt_liu_depth.sh's header)"]
    if not readout["seeds"]:
        return lines[0] + "\n  no run has started"
    for seed, depths in readout["seeds"].items():
        lines.append(f"seed {seed}:")
        lines.append(
            f"  {'depth':>5s}  {'arm':<13s}{'step':>6s}{'NLL':>8s}{'BLEU':>7s}  "
            "diverged stuck  collapse (encoder output)"
        )
        for d, e in depths.items():
            for arm, row in e["arms"].items():
                step = row["final_step"] if row["final_step"] is not None else row["steps"]
                yes = {True: "yes", False: "no"}
                lines.append(
                    f"  {d:>5d}  {arm:<13s}{step:>6d}{_num(row['final_nll']):>8s}"
                    f"{_num(row['final_bleu'], '.2f'):>7s}  {yes[row['diverged']]:<9s}"
                    f"{yes[row['stuck']]:<6s} {_collapse_text(row['collapse'])}"
                    f"{'  [partial]' if row['partial'] else ''}"
                )
        for d, e in depths.items():
            if not e["diffs"]:
                lines.append(f"  L{d}: no step common to {', '.join(DEPTH_ARMS)}")
                continue
            parts = [
                f"{k}: NLL {_num(v['nll'], '+.3f')}, BLEU {_num(v['bleu'], '+.2f')}"
                for k, v in e["diffs"].items()
            ]
            lines.append(f"  L{d} at step {e['step']}: " + "; ".join(parts))
    return "\n".join(lines)


HELD_TITLE = "Warm-up against a held rate (pre-registered: PLAN_MT2 section 2b)"


def read_plateau(folder: str) -> float:
    """The study's unigram plateau (`plateau.json`'s "unigram_xent", written by the study)."""
    path = os.path.join(folder, "plateau.json")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: no plateau.json; the held readout's stuck rule needs the "
                         "study's own (run the study's command once: it writes it).")  # fmt: skip
    with open(path) as f:
        return float(json.load(f)["unigram_xent"])


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("study", choices=("fig2", "depth", "held"))
    p.add_argument("folder", help="the study's --out folder (holds runs/)")
    p.add_argument("--out", default=None, help="also write the readout as JSON here")
    args = p.parse_args(argv)
    runs = load_runs(args.folder)
    if args.study == "depth":
        readout = depth(runs)
        print(format_depth(readout))
    elif args.study == "held":
        plateau = read_plateau(args.folder)
        readout = {**fig2(runs, HELD_ARMS, plateau), "plateau": plateau}
        print(format_fig2(readout, HELD_TITLE))
    else:
        readout = fig2(runs)
        print(format_fig2(readout))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(_jsonable(readout), f, indent=1)
    return readout


if __name__ == "__main__":
    main()
