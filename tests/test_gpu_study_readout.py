"""bench/gpu/gpu_study_readout.py: the GPU studies' pre-registered readouts, from synthetic study
folders (result.json files as `ln_jax.experiments` writes them, and a run cut off by the budget
that left only its metrics.jsonl)."""

from __future__ import annotations

import json
import math

import pytest

from bench.gpu import gpu_study_readout as readout


def _result(name, arm, depth, evals, bleus, train, collapse, diverged=False):
    return {
        "name": name, "arm": arm, "tags": {"num_layers": depth, "seed": 0},
        "eval_curve": [[s, v, 10.0 * s] for s, v in evals],
        "bleu_curve": [[s, v, 10.0 * s] for s, v in bleus],
        "train_curve": [[s, v, 1.0 * s] for s, v in train],
        "monitor_traces": {"collapse/encoder/output": collapse,
                           "collapse/layer_00/encoder": [[1, 0.1]]},
        "diverged": diverged, "steps": train[-1][0],
    }  # fmt: skip


def _write(study, result):
    folder = study / "runs" / result["name"]
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))


# losses every 100 steps: trailing means of 5 fall to 7.0 at step 500 and climb to 9.0 at step
# 1,000: a rise of 2.0 (the 20.0 at 1,100 is past the first 1,000 steps)
TRAIN = [(100 * i, v) for i, v in enumerate([9, 8, 7, 6, 5, 9, 9, 9, 9, 9, 20], 1)]
FLAT = [(1, 9.0), (1000, 5.0)]
# arm: (NLL by step, BLEU by step, train loss by step, encoder-output collapse); post has an
# evaluation at 3,000 the others lack, so the last step the four share is 2,000
FIG2 = {
    "post": ([(1000, 6.0), (2000, 5.0), (3000, 1.0)], [(1000, 1.0), (2000, 2.0), (3000, 30.0)],
             TRAIN, [[1, 0.82], [500, 0.9], [2000, 0.95]]),
    "post_warmup": ([(1000, 5.5), (2000, 4.0)], [(1000, 3.0), (2000, 12.0)], FLAT,
                    [[1, 0.82], [2000, 0.5]]),
    "pre": ([(1000, 5.2), (2000, 4.6)], [(1000, 4.0), (2000, 7.0)], FLAT, [[1, 0.6], [2000, 0.4]]),
    "pre_warmup": ([(1000, 5.0), (2000, 4.5)], [(1000, 5.0), (2000, 12.5)], FLAT,
                   [[1, 0.6], [2000, 0.3]]),
}  # fmt: skip


def _fig2_study(tmp_path, post_nll=5.0, post_diverged=False, baseline=None):
    """The FIG2 study; `baseline` = (NLL, BLEU) of post_warmup at step 2,000 in place of FIG2's."""
    study = tmp_path / "study"
    for arm, (evals, bleus, train, collapse) in FIG2.items():
        if arm == "post":
            evals = [(s, post_nll if s == 2000 else v) for s, v in evals]
        if arm == "post_warmup" and baseline is not None:
            evals, bleus = [(1000, 5.5), (2000, baseline[0])], [(1000, 3.0), (2000, baseline[1])]
        diverged = post_diverged and arm == "post"
        _write(study, _result(f"L6-{arm}-s0", arm, 6, evals, bleus, train, collapse, diverged))
    return study


def test_fig2_readout_did_at_the_last_common_step_early_rise_and_collapse(tmp_path, capsys):
    study = _fig2_study(tmp_path)
    out = readout.main(["fig2", str(study), f"--out={tmp_path / 'r.json'}"])
    e = out["seeds"][0]
    assert e["step"] == 2000
    # (5.0 - 4.0) - (4.6 - 4.5) = 0.9
    assert e["did"] == pytest.approx(0.9)
    # at 1,000: (6.0 - 5.5) - (5.2 - 5.0)
    assert e["did_by_step"] == {1000: pytest.approx(0.3), 2000: pytest.approx(0.9)}
    assert e["verdict"].startswith("as Xiong")
    assert e["gate"] == {"step": 2000, "post": [4.0, 12.0], "pre": [4.5, 12.5],
                         "translates": True, "level": True, "passed": True}  # fmt: skip
    post = e["arms"]["post"]
    assert post["early_rise"] == pytest.approx(2.0)
    assert post["collapse"] == [[1, 0.82], [2000, 0.95]]
    assert post["evals"][1] == [2000, 5.0, 2.0] and not post["partial"]
    assert e["arms"]["pre"]["early_rise"] == 0.0
    text = capsys.readouterr().out
    assert "DiD at step 2000 = (5.000 - 4.000) - (4.600 - 4.500) = 0.900 nats" in text
    assert "0.820 (step 1) -> 0.950 (step 2000)" in text
    assert "DiD by step (the verdict reads the last): 1000 +0.300, 2000 +0.900" in text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["seeds"]["0"]["did"] == pytest.approx(0.9)


@pytest.mark.parametrize(
    "post_nll, diverged, verdict",
    [(4.0, False, "budget"), (4.2, False, "not separated"), (math.nan, True, "as Xiong")],
)
def test_fig2_verdicts(tmp_path, post_nll, diverged, verdict):
    runs = readout.load_runs(str(_fig2_study(tmp_path, post_nll, diverged)))
    assert readout.fig2(runs)["seeds"][0]["verdict"].startswith(verdict)


@pytest.mark.parametrize(
    "baseline, fails",
    [((4.61, 12.0), "not level"),  # NLL 0.11 above Pre-LN's 4.5
     ((4.0, 11.4), "not level"),  # BLEU 1.1 below Pre-LN's 12.5
     ((4.0, 9.9), "does not translate and not level")],  # below 10 BLEU, 2.6 below
)  # fmt: skip
def test_a_baseline_that_fails_the_gate_gets_no_verdict(tmp_path, capsys, baseline, fails):
    """PLAN_MT2's rule on post_warmup against pre_warmup (4.5 / 12.5 at step 2,000): below it
    the DiD is printed but no verdict is read, however large the DiD (post's NLL 5.0 here)."""
    study = _fig2_study(tmp_path, baseline=baseline)
    e = readout.main(["fig2", str(study)])["seeds"][0]
    assert e["gate"]["step"] == 2000 and not e["gate"]["passed"]
    assert e["verdict"].startswith("baseline fails the gate") and e["did"] is not None
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "gate at step" in x]
    assert line.startswith(f"  gate at step 2000: post_warmup {baseline[0]:.3f} / ")
    assert line.endswith(f": fails: {fails}")


def test_a_baseline_at_the_gate_s_limits_passes(tmp_path):
    study = _fig2_study(tmp_path, baseline=(4.6, 11.5))  # + 0.10 nats, - 1.0 BLEU, BLEU >= 10
    e = readout.fig2(readout.load_runs(str(study)))["seeds"][0]
    assert e["gate"]["passed"] and e["verdict"].startswith("as Xiong")


def test_fig2_names_the_missing_arms(tmp_path):
    study = _fig2_study(tmp_path)
    for name in ("L6-pre-s0", "L6-pre_warmup-s0"):
        (study / "runs" / name / "result.json").unlink()
    e = readout.fig2(readout.load_runs(str(study)))["seeds"][0]
    assert e["verdict"] == "incomplete: no run of pre, pre_warmup" and e["did"] is None


def _held_study(tmp_path, post_nll=5.0, pre_nll=4.6, plateau=6.85):
    """FIG2's runs as the held study's: post_held and pre_held in post's and pre's places
    (their NLL at step 2,000 given), the study's plateau.json beside them."""
    study = tmp_path / "held"
    for arm, (evals, bleus, train, collapse) in FIG2.items():
        name = {"post": "post_held", "pre": "pre_held"}.get(arm, arm)
        final = {"post_held": post_nll, "pre_held": pre_nll}.get(name)
        evals = [(s, final if final is not None and s == 2000 else v) for s, v in evals]
        _write(study, _result(f"L6-{name}-s0", name, 6, evals, bleus, train, collapse))
    if plateau is not None:
        (study / "plateau.json").write_text(json.dumps({"unigram_xent": plateau}))
    return study


@pytest.mark.parametrize(
    "post_nll, pre_nll, verdict",
    [(4.0, 4.6, "no placement effect: DiD <= 0"),  # (4.0 - 4.0) - (4.6 - 4.5) = -0.1
     (4.1, 4.5, "not separated"),  # 0.1
     (4.3, 4.5, "as Xiong: DiD >= 0.2"),  # 0.3
     (6.8, 6.8, "as Xiong: DiD >= 0.2"),  # both stuck: the DiD (0.5) decides
     (6.8, 4.5, "as Xiong: Post-LN held (no warm-up) is stuck at the plateau"),
     (6.8, 7.4, "no placement effect")],  # both stuck, Pre-LN the worse: DiD -0.1
)  # fmt: skip
def test_the_held_readout_reads_the_held_arms_in_fig2_s_roles(
    tmp_path, capsys, post_nll, pre_nll, verdict
):
    """PLAN_MT2 section 2b: DiD = [post_held - post_warmup] - [pre_held - pre_warmup] at the
    last common step (post_warmup 4.0, pre_warmup 4.5 at step 2,000); Post-LN held within 0.1
    nats of the study's plateau (6.85) while Pre-LN held is not reads as Xiong's."""
    out = readout.main(["held", str(_held_study(tmp_path, post_nll, pre_nll))])
    e = out["seeds"][0]
    assert out["plateau"] == 6.85 and set(e["arms"]) == set(readout.HELD_ARMS)
    assert e["did"] == pytest.approx((post_nll - 4.0) - (pre_nll - 4.5))
    assert e["verdict"].startswith(verdict), e["verdict"]
    text = capsys.readouterr().out
    assert text.startswith(readout.HELD_TITLE)
    assert "DiD at step 2000 = [post_held - post_warmup] - [pre_held - pre_warmup] = (" in text


def test_the_held_readout_needs_the_study_s_plateau(tmp_path):
    with pytest.raises(SystemExit, match="no plateau.json"):
        readout.main(["held", str(_held_study(tmp_path, plateau=None))])


def test_a_run_cut_off_by_the_budget_is_read_from_its_metrics(tmp_path):
    """SIGTERM saves a checkpoint and writes no result.json: the readout summarises the run's
    metrics.jsonl as the study would (its NLL is nll_loss, its BLEU bleu) and marks it."""
    folder = tmp_path / "study" / "runs" / "L18-admin_warmup-s0"
    folder.mkdir(parents=True)
    records = [
        {"split": "train", "step": 1, "loss": 9.0, "time": 100.0},
        {"split": "monitor", "step": 1, "collapse/encoder/output": 0.7, "time": 100.0},
        {"split": "train", "step": 50, "loss": 7.0, "time": 110.0},
        {"split": "eval", "step": 50, "loss": 6.9, "nll_loss": 6.5, "bleu": 0.5, "time": 111.0},
        {"split": "train", "step": 100, "loss": 7.4, "time": 120.0},
        {"split": "monitor", "step": 100, "collapse/encoder/output": 0.8, "time": 120.0},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run,) = readout.load_runs(str(tmp_path / "study"))
    assert run["partial"] and run["arm"] == "admin_warmup"
    assert (run["depth"], run["seed"]) == (18, 0)
    row = readout.depth([run])["seeds"][0][18]["arms"]["admin_warmup"]
    assert row["final_nll"] == 6.5 and row["final_bleu"] == 0.5 and row["final_step"] == 50
    # 9, 7, 7.4 as trailing means: 9, 8, 7.8: no rise; unsmoothed it would be 0.4
    assert row["early_rise"] == 0.0 and row["collapse"] == [[1, 0.7], [100, 0.8]]
    assert row["stuck"] and not row["diverged"] and row["steps"] == 100


# (depth, arm): (NLL by step, BLEU by step, train loss, diverged); at 18-18 Post-LN diverged
# and Pre-LN was cut at 1,500 (the last step the three share there)
DEPTH = {
    (6, "post_warmup"): ([(1500, 5.0), (3000, 4.0)], [(1500, 5.0), (3000, 12.0)], None, False),
    (6, "admin_warmup"): ([(1500, 5.0), (3000, 4.1)], [(1500, 5.0), (3000, 11.5)], None, False),
    (6, "pre_warmup"): ([(1500, 5.0), (3000, 4.3)], [(1500, 5.0), (3000, 10.0)], None, False),
    (18, "post_warmup"): ([(1500, 7.5), (3000, 7.6)], [(1500, 0.0), (3000, 0.0)],
                          [(1, 9.0), (3000, 9.5)], True),
    (18, "admin_warmup"): ([(1500, 4.8), (3000, 3.9)], [(1500, 6.0), (3000, 13.0)], None, False),
    (18, "pre_warmup"): ([(1500, 5.1)], [(1500, 0.5)], [(1, 9.0), (1500, 6.0)], False),
}  # fmt: skip


def test_depth_readout_flags_and_differences_at_each_depth(tmp_path, capsys):
    study = tmp_path / "study"
    for (depth, arm), (evals, bleus, train, diverged) in DEPTH.items():
        train = train or [(1, 9.0), (3000, 4.0)]
        collapse = [[1, 0.8], [3000, 0.9]]
        _write(study, _result(f"L{depth}-{arm}-s0", arm, depth, evals, bleus, train, collapse,
                              diverged))  # fmt: skip
    out = readout.main(["depth", str(study)])["seeds"][0]
    assert out[6]["step"] == 3000
    assert out[6]["diffs"]["admin_warmup - pre_warmup"]["nll"] == pytest.approx(-0.2)
    assert out[6]["diffs"]["post_warmup - pre_warmup"]["bleu"] == pytest.approx(2.0)
    assert out[18]["step"] == 1500
    assert out[18]["diffs"]["admin_warmup - pre_warmup"]["nll"] == pytest.approx(-0.3)
    assert out[18]["diffs"]["post_warmup - pre_warmup"]["bleu"] == pytest.approx(-0.5)
    post18 = out[18]["arms"]["post_warmup"]
    assert post18["diverged"] and not post18["stuck"] and post18["final_nll"] == 7.6
    pre18 = out[18]["arms"]["pre_warmup"]
    assert pre18["stuck"] and pre18["final_step"] == 1500  # 0.5 BLEU: translates nothing
    assert not out[6]["arms"]["pre_warmup"]["stuck"]
    text = capsys.readouterr().out
    assert "L18 at step 1500: admin_warmup - pre_warmup: NLL -0.300, BLEU +5.50" in text


def test_the_early_rise_is_of_smoothed_losses_within_the_first_steps():
    one_batch = [[s, 5.0 + (0.3 if s % 200 else 0.0)] for s in range(20, 1001, 20)]
    assert readout.early_rise(one_batch) < 0.1  # alternating batches: no rise to speak of
    assert readout.early_rise(one_batch, window=1) == pytest.approx(0.3)
    assert readout.early_rise([[1, 9.0], [20, math.nan]]) == math.inf
    assert readout.early_rise([[1, 9.0], [2000, math.nan]]) == 0.0  # past the first 1,000
