"""The translation studies (issue 35): grids, BLEU reports on fake results, a tiny study end to
end through `python -m ln_jax.experiments mt_warmup` that resumes, and Fig. 3 on the
encoder-decoder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from configs import study_mt
from ln_jax.experiments import __main__ as cmd
from ln_jax.experiments import mt_grids, report_mt, runner, two_by_two

# --------------------------------------------------------------------------- grids


def test_full_warmup_is_the_papers_fraction_of_the_run():
    assert mt_grids.full_warmup(1600) == 128  # 4,000 / 50,000 = 8%
    assert mt_grids.full_warmup(1200) == 100  # 96, raised to the floor (PLAN_MT.md)
    assert mt_grids.full_warmup(500) == 100  # floored at 2 / (1 - 0.98)
    assert mt_grids.resolve_warmup("full", 1600) == 128
    assert mt_grids.resolve_warmup("FULL", 1600, full=300) == 300
    assert mt_grids.resolve_warmup("500", 1600) == 500
    with pytest.raises(ValueError, match="neither a number of steps nor 'full'"):
        mt_grids.resolve_warmup("long", 1600)


def test_warmup_grid_cells_optimizer_and_clipping_off():
    specs = mt_grids.mt_warmup_grid(
        [0], [5e-4, 1e-3], [0, 500, 128], [1e-3], full=128,
        key_cells=["post_nowarmup-lr1e-3", "pre-lr1e-3"], key_seeds=[1, 2],
    )  # fmt: skip
    names = [s.name for s in specs]
    assert names[:7] == [
        "post_nowarmup-lr5e-4-s0", "post_warmup500-lr5e-4-s0", "post_warmup128-lr5e-4-s0",
        "post_nowarmup-lr1e-3-s0", "post_warmup500-lr1e-3-s0", "post_warmup128-lr1e-3-s0",
        "pre-lr1e-3-s0",
    ]  # fmt: skip
    assert names[7:] == [
        "post_nowarmup-lr1e-3-s1",
        "pre-lr1e-3-s1",
        "post_nowarmup-lr1e-3-s2",
        "pre-lr1e-3-s2",
    ]
    assert all(s.tags.get("key") for s in specs[7:]) and not specs[0].tags.get("key")
    by = {s.name: s for s in specs}
    for s in specs:
        o = s.overrides
        assert o["optim.clip_norm"] == 0.0 and o["optim.optimizer"] == "adam"
        assert o["optim.b2"] == 0.98 and o["optim.schedule"] == "warmup_rsqrt"
        assert o["optim.weight_decay"] == 0.0 and o["seed"] == o["data.seed"] == s.tags["seed"]
    assert by["post_warmup500-lr5e-4-s0"].overrides["optim.warmup_steps"] == 500
    assert by["post_warmup500-lr5e-4-s0"].overrides["optim.peak_lr"] == 5e-4
    assert by["post_warmup128-lr1e-3-s0"].tags["full"] is True
    assert not by["post_warmup500-lr1e-3-s0"].tags["full"]
    pre = by["pre-lr1e-3-s2"].overrides
    assert pre["model.placement"] == "pre" and pre["optim.warmup_steps"] == 0
    with pytest.raises(ValueError, match="not in the grid"):
        mt_grids.mt_warmup_grid([0], [1e-3], [0], [1e-3], full=128, key_cells=["pre-lr5e-4"])


def test_depth_and_deep_encoder_grids():
    specs = mt_grids.mt_depth_grid([6, 12], ["post_warmup", "admin_radam"], [0, 1], 1e-3, 96)
    assert [s.name for s in specs][:3] == [
        "L6-post_warmup-s0",
        "L6-post_warmup-s1",
        "L6-admin_radam-s0",
    ]
    post = specs[0].overrides
    assert post["model.num_layers"] == post["translation.decoder_layers"] == 6
    assert post["optim.warmup_steps"] == 96 and post["optim.clip_norm"] == 0.0
    radam = specs[-1].overrides
    assert radam["model.placement"] == "admin" and radam["optim.optimizer"] == "radam"
    assert radam["optim.warmup_steps"] == 0 and radam["translation.decoder_layers"] == 12
    deep = mt_grids.mt_depth_grid([18], mt_grids.DEEP_ENCODER_ARMS, [0], 1e-3, 96, decoder_layers=6)
    assert [s.name for s in deep] == [
        "E18D6-post_warmup-s0", "E18D6-pre_warmup-s0", "E18D6-pre_warmup+dlcl-s0"
    ]  # fmt: skip
    dlcl = deep[2].overrides
    assert dlcl["model.dlcl"] is True and dlcl["model.placement"] == "pre"
    assert "model.dlcl" not in deep[1].overrides
    assert dlcl["model.num_layers"] == 18 and dlcl["translation.decoder_layers"] == 6
    with pytest.raises(ValueError, match="unknown study arm"):
        mt_grids.mt_depth_grid([6], ["postln_warmup"], [0], 1e-3, 96)


def test_a_held_arm_has_the_peak_rate_from_step_one_then_the_warmup_arms_rate():
    """`post_held`: no warm-up, the peak held for the warm-up's steps, then exactly the
    `_warmup` arm's inverse square root (the schedule as the run builds it from its config)."""
    from ln_jax.train.optim import make_schedule

    specs = mt_grids.mt_depth_grid([6], ["post_held", "pre_warmup", "pre_held+qk"], [0], 5e-4, 500)
    assert [s.name for s in specs] == ["L6-post_held-s0", "L6-pre_warmup-s0", "L6-pre_held+qk-s0"]
    base = study_mt.get_config("gate").to_dict()
    held, warm, qk = (runner.run_config(base, s) for s in specs)
    assert held.model.placement == "post" and held.optim.warmup_steps == 0
    assert qk.model.placement == "pre" and qk.model.qk_norm and qk.optim.decay_step == 500
    rate = {name: make_schedule(c.optim) for name, c in (("held", held), ("warm", warm))}
    steps = [0, 1, 250, 499, 500, 501, 1000, 3999]
    lr = {name: [float(f(t)) for t in steps] for name, f in rate.items()}
    assert lr["held"][:4] == [pytest.approx(5e-4)] * 4  # the peak from the first step
    assert lr["warm"][:4] == pytest.approx([0.0, 1e-6, 2.5e-4, 4.99e-4])
    assert lr["held"][4:] == pytest.approx(lr["warm"][4:])  # the same rate from step 500
    assert lr["held"][6] == pytest.approx(5e-4 * math.sqrt(500 / 1000))
    with pytest.raises(ValueError, match="also take '_held'"):
        mt_grids.mt_depth_grid([6], ["post_hold"], [0], 5e-4, 500)
    with pytest.raises(ValueError, match="--warmup_steps >= 1"):
        mt_grids.mt_depth_grid([6], ["post_held"], [0], 5e-4, 0)
    with pytest.raises(ValueError, match="plain placement row"):
        mt_grids.mt_depth_grid([6], ["post_warmup_held"], [0], 5e-4, 500)


def test_study_configs_build_with_the_papers_protocol():
    from ln_jax.config.load import build_config

    spec = mt_grids.mt_depth_grid([12], ["pre_warmup+dlcl"], [3], 1e-3, 96)[0]
    cfg = runner.run_config(study_mt.get_config("depth").to_dict(), spec)
    assert cfg.task == "translation" and cfg.model.num_layers == 12 and cfg.model.dlcl
    assert cfg.options.decoder_layers == 12 and cfg.options.label_smoothing == 0.1
    assert cfg.optim.clip_norm == 0.0 and cfg.optim.b2 == 0.98 and cfg.seed == 3
    assert build_config(study_mt.get_config("warmup").to_dict()).optim.clip_norm == 0.0


# --------------------------------------------------------------------------- report (fake runs)


def fake_run(name, arm, seed, bleus, losses, lr=1e-3, warmup=0, full=False, diverged=False):
    """A summarised translation run with BLEU/NLL evaluated at steps 100, 200, ..."""
    steps = [100 * (i + 1) for i in range(len(bleus))]
    return {
        "name": f"{name}-s{seed}",
        "arm": arm,
        "tags": {"seed": seed, "lr": lr, "warmup_steps": warmup, "full": full},
        "bleu_curve": [[s, b, s / 10] for s, b in zip(steps, bleus, strict=True)],
        "eval_curve": [[s, v, s / 10] for s, v in zip(steps, losses, strict=True)],
        "final_bleu": bleus[-1],
        "best_bleu": max(bleus),
        "final_nll": losses[-1],
        "diverged": diverged,
        "overrides": {"model.placement": arm.split("_")[0], "optim.warmup_steps": warmup},
        "train_curve": [[s, v, s / 10] for s, v in zip(steps, losses, strict=True)],
    }


def fake_warmup_results():
    out = []
    for seed, shift in enumerate((0.0, 1.0, 2.0)):
        out.append(fake_run("post_nowarmup-lr1e-3", "post_nowarmup", seed,
                            [1.0, 2.0 + shift, 4.0 + shift], [6.0, 5.5, 5.2]))  # fmt: skip
        out.append(fake_run("post_warmup128-lr1e-3", "post_warmup128", seed,
                            [2.0, 8.0 + shift, 12.0 + shift], [5.5, 4.5, 4.0],
                            warmup=128, full=True))  # fmt: skip
        out.append(fake_run("pre-lr1e-3", "pre", seed,
                            [6.0, 11.0 + shift, 14.0 + shift], [5.0, 4.2, 3.8]))  # fmt: skip
    return out


def test_warmup_report_targets_intervals_and_comparisons():
    summary = report_mt.warmup_summary(fake_warmup_results(), (5.0, 10.0), (4.5,))
    cells = {c["cell"]: c for c in summary["cells"]}
    pre = cells["pre-lr1e-3"]
    # Seed 0 reaches BLEU 10 between steps 100 (6) and 200 (11): 100 + 4/5 * 100 = 180.
    assert pre["steps"]["bleu>=10"][0] == pytest.approx(180.0)
    assert pre["steps"]["bleu>=5"] == [100.0, 100.0, 100.0]  # already at the first evaluation
    assert cells["post_nowarmup-lr1e-3"]["steps"]["bleu>=10"] == [None, None, None]
    # Loss target 4.5 (lower is better): post_warmup reaches it exactly at 200.
    assert cells["post_warmup128-lr1e-3"]["steps"]["loss<=4.5"] == [200.0] * 3
    assert cells["post_nowarmup-lr1e-3"]["final_bleu"] == [4.0, 5.0, 6.0]
    comps = {c["label"]: c for c in summary["comparisons"]}
    gain = comps["lr 0.001: Post-LN: full warm-up − none"]["bleu_diff"]
    # Every seed's difference is 8.0: the paired t-interval collapses onto it.
    assert [gain["diff"], gain["lo"], gain["hi"]] == pytest.approx([8.0, 8.0, 8.0])
    assert gain["above"] == 3 and gain["n"] == 3
    pre_vs = comps["lr 0.001: Pre-LN without − Post-LN with full warm-up"]
    assert pre_vs["bleu_diff"]["diff"] == pytest.approx(2.0)
    ratio = pre_vs["step_ratios"]["bleu>=10"]
    assert ratio["n"] == 3 and ratio["ratio"] < 1.0  # Pre-LN gets to BLEU 10 sooner
    table = report_mt.warmup_table(summary)
    assert "| post_nowarmup-lr1e-3 | 3 | 0/3 | – | 5.00 ± 0.82" in table  # stuck: no plateau
    assert "+8.00 [+8.00, +8.00] t, 3 of 3 seeds > 0" in table
    assert "never (0/3)" in table and "8.45" in table


def test_monitor_rows_show_collapse_and_the_largest_gradient_of_each_stack():
    runs = fake_warmup_results()[:2]  # post_nowarmup and post_warmup128, seed 0
    runs[0]["monitor_traces"] = {
        "collapse/encoder/output": [[1, 0.3], [100, 0.9], [200, 0.99]],
        "collapse/decoder/output": [[1, 0.2], [200, 0.5]],
        "grad_norm/layer_00/encoder/ffn": [[1, 1.0], [100, 40.0], [200, 2.0]],
        "grad_norm/layer_01/encoder/attention": [[1, 3.0], [200, 1.0]],
        "grad_norm/layer_00/decoder/ffn": [[1, 0.5], [200, 0.25]],
        # Cross-attention entropy, mean over the decoder's layers at the steps both logged.
        "attention_entropy/layer_00/decoder/cross_attention": [[1, 2.0], [100, 2.5], [200, 3.0]],
        "attention_entropy/layer_01/decoder/cross_attention": [[1, 1.0], [200, 2.0]],
        "attention_entropy/layer_00/decoder/self_attention": [[1, 9.0], [200, 9.0]],
    }
    cells = {c["cell"]: c for c in report_mt.cells(runs, (5.0,))}
    post = cells["post_nowarmup-lr1e-3"]
    assert post["collapse"] == {"encoder": [0.3, 0.99], "decoder": [0.2, 0.5]}
    # At init the largest is layer 1's attention (3.0); over the run layer 0's FFN spike (40).
    assert post["max_grad"] == {"encoder": [3.0, 40.0], "decoder": [0.5, 0.5]}
    assert report_mt.cross_attention_entropy(runs[0]) == [[1, 1.5], [200, 2.5]]
    assert post["cross_entropy"] == [1.5, 2.5]
    assert post["traces"]["cross_entropy"] == [[1, 1.5], [200, 2.5]]
    assert cells["post_warmup128-lr1e-3"]["collapse"]["encoder"] is None
    rows = "\n".join(report_mt.monitor_rows(list(cells.values())))
    assert "| post_nowarmup-lr1e-3 | 0.30 → 0.99 | 0.20 → 0.50 | 3.000 → 40.000 |" in rows
    assert "| 0.500 → 0.500 | 1.50 → 2.50 |" in rows
    assert "| post_warmup128-lr1e-3 | – | – | – | – | – |" in rows


def test_the_2x2_separates_warmup_need_from_learning_rate_budget():
    """Per seed: Post-LN's warm-up gain 0.4 + 0.1 s, Pre-LN's 1.4: DiD = -1.0 - 0.1 s."""
    runs = []
    for seed in (0, 1, 2):
        finals = {("post", 0): 6.7, ("post", 160): 6.3 - 0.1 * seed, ("pre", 0): 6.5,
                  ("pre", 160): 5.1}  # fmt: skip
        for (placement, warmup), nll in finals.items():
            arm = placement + ("_warmup" if warmup else "")
            r = fake_run(f"L6-{arm}", arm, seed, [0.1, 1.0 + (nll < 6)], [7.0, nll],
                         warmup=warmup)  # fmt: skip
            r["bleu_curve"].append([300, 0.0, 30.0])
            r["train_curve"] = [[20 * i, 9.0 - 0.01 * i, 0.0] for i in range(1, 40)]
            if placement == "post" and not warmup:  # a rise of 1 nat at steps 120-200
                r["train_curve"][5:10] = [[20 * i, 10.0, 0.0] for i in range(6, 11)]
            runs.append(r)
    square = two_by_two.two_by_two(runs, step=200)
    assert square["seeds"] == [0, 1, 2] and square["step"] == 200
    post, pre = square["gain"]["post"]["nll"], square["gain"]["pre"]["nll"]
    assert post["per_seed"] == pytest.approx([0.4, 0.5, 0.6]) and pre["diff"] == pytest.approx(1.4)
    did = square["did"]["nll"]
    assert did["per_seed"] == pytest.approx([-1.0, -0.9, -0.8]) and did["below"] == 3
    ci = stats.ttest_1samp([-1.0, -0.9, -0.8], 0.0).confidence_interval(0.95)
    assert (did["lo"], did["hi"]) == pytest.approx((ci.low, ci.high))
    assert square["did"]["bleu"]["per_seed"] == pytest.approx([-1.0, -1.0, -1.0])  # pre: +1
    # The largest rise of the train loss (100-step means) in the first 500 steps.
    rises = square["cells"]["post/none"]["early_rise"]
    assert rises[0] == pytest.approx(10.0 - np.mean([9.0 - 0.01 * i for i in range(1, 6)]))
    assert square["cells"]["pre/warmup"]["early_rise"] == [0.0, 0.0, 0.0]
    # Default step: the last one every run evaluated (300 is BLEU only, 200 the last NLL).
    assert two_by_two.two_by_two(runs)["step"] == 200
    table = two_by_two.two_by_two_table(square)
    assert "| Post-LN | 6.700, 6.700, 6.700 (1.00, 1.00, 1.00) | 6.300, 6.200, 6.100" in table
    assert "DiD (Post-LN's gain − Pre-LN's): NLL -0.900 [" in table and "3 of 3 seeds < 0" in table
    assert two_by_two.two_by_two([r for r in runs if r["arm"] != "pre"]) is None
    with pytest.raises(ValueError, match="both post/warmup with seed 0; give one run per cell"):
        two_by_two.two_by_two([*runs, {**runs[1], "name": "L6-post_warmup-lr5e-4-s0"}])
    # The depth study's report carries it when its runs hold the four cells at one depth.
    for r in runs:
        r["tags"].update(num_layers=6, decoder_layers=6)
    summary = report_mt.depth_summary(runs)
    assert summary["two_by_two"][0]["did"]["nll"]["diff"] == pytest.approx(-0.9)
    assert "Placement × warm-up, 6 layers, lr 0.001 at step 200" in report_mt.depth_table(summary)


def test_stuck_and_the_task_named_record():
    assert runner.stuck(6.80, False, 6.85) and runner.stuck(7.2, False, 6.85)
    assert not runner.stuck(6.70, False, 6.85) and not runner.stuck(7.2, True, 6.85)
    assert runner.stuck(6.80, False, None) is None
    old = {"bleu_curve": [], "final_eval_mlm_loss": 6.5, "best_eval_mlm_loss": 6.4,
           "final_eval_loss": 6.5, "steps": 600}  # fmt: skip
    assert runner.task_named(old) == {"bleu_curve": [], "final_nll": 6.5, "best_nll": 6.4,
                                      "steps": 600}  # fmt: skip
    bert = {"final_eval_mlm_loss": 5.0}
    assert runner.task_named(bert) is bert


def test_the_translation_plateau_is_the_target_unigram_with_eos():
    from ln_jax.config.load import build_config
    from ln_jax.data.translation import batches as translation
    from ln_jax.experiments import plateau as plateau_mod

    values = study_mt.get_config("warmup").to_dict()
    values["data"].update(dataset="synthetic:copy", vocab_size=36)
    data = build_config(values).data
    got = plateau_mod.translation_plateau(data)
    train, evals = (translation.load_split(data, s) for s in ("train", "eval"))
    eos = train.tokenizer.eos_id
    counts = np.bincount(np.append(np.asarray(train.encoded.tgt), [eos] * len(train.encoded)),
                         minlength=got["vocab_size"]) + 1.0  # fmt: skip
    tokens = np.append(np.asarray(evals.encoded.tgt), [eos] * len(evals.encoded))
    want = -np.mean(np.log(counts[tokens] / counts.sum()))
    assert got["unigram_xent"] == pytest.approx(want) and got["eval_tokens"] == tokens.size


def test_mt_2x2_reads_finished_runs_and_writes_the_table(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        for placement, warmup, nll in (("post", 0, 6.7), ("post", 100, 6.2), ("pre", 0, 6.5),
                                       ("pre", 100, 5.0)):  # fmt: skip
            arm = placement + ("_warmup" if warmup else "")
            r = fake_run(arm, arm, seed, [0.5, 1.0], [7.0, nll - 0.1 * seed], warmup=warmup)
            r["final_eval_mlm_loss"] = r.pop("final_nll")  # a record written before issue 64
            r["best_eval_mlm_loss"] = 7.0
            folder = runs / r["name"]
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(r))
    out = tmp_path / "square"
    argv = ["mt_2x2", f"--out={out}", f"--runs={runs}/*", "--steps=200",
            "--config.data.dataset=synthetic:copy", "--config.data.vocab_size=36"]  # fmt: skip
    assert cmd.COMMAND.run(cmd.main, argv) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["two_by_two"]["did"]["nll"]["per_seed"] == pytest.approx([-1.0, -1.0])
    assert {r["result"] for r in saved["runs"]} == {
        f"../runs/{n}/result.json" for n in (r.name for r in runs.iterdir())
    }
    assert saved["runs"][0]["final_nll"] is not None
    assert "DiD (Post-LN's gain − Pre-LN's): NLL -1.000" in (out / "table.md").read_text()
    assert cmd.COMMAND.run(cmd.main, [*argv[:2], f"--runs={tmp_path}/none*"]) == 2
    assert "no result.json under --runs=" in capsys.readouterr().err


def test_depth_report_compares_admin_and_post_with_pre_at_each_depth():
    results = []
    for depth, post_bleu in ((6, 10.0), (18, 0.5)):
        for seed in (0, 1):
            for arm, bleu in (
                ("post_warmup", post_bleu),
                ("pre_warmup", 9.0),
                ("admin_warmup", 11.0),
            ):
                nll = 4.0 - (0.1 + 0.2 * seed) * (arm == "admin_warmup")
                r = fake_run(f"L{depth}-{arm}", arm, seed, [1.0, bleu + seed], [6.0, nll])
                r["tags"].update(num_layers=depth, decoder_layers=depth)
                r["diverged"] = arm == "post_warmup" and depth == 18
                results.append(r)
    summary = report_mt.depth_summary(results)
    comps = {c["label"]: c for c in summary["comparisons"]}
    assert comps["L6: admin_warmup − pre_warmup"]["bleu_diff"]["diff"] == pytest.approx(2.0)
    assert comps["L18: post_warmup − pre_warmup"]["bleu_diff"]["diff"] == pytest.approx(-8.5)
    # Final validation NLL a − b, paired by seed: Admin 0.1 (seed 0) and 0.3 (seed 1) below.
    nll = comps["L18: admin_warmup − pre_warmup"]["nll_diff"]
    # t-interval of (-0.1, -0.3): -0.2 ± 12.706 * 0.1 (1 degree of freedom)
    assert nll["diff"] == pytest.approx(-0.2) and nll["lo"] == pytest.approx(-0.2 - 1.27062, 1e-4)
    table = report_mt.depth_table(summary)
    assert "| L18: admin_warmup − pre_warmup | 2 | +2.00 [+2.00, +2.00] t, 2 of 2 seeds > 0 |" in (
        table
    )
    assert "-0.200 [-1.471, +1.071] t, 2 of 2 seeds < 0 |" in table
    assert "| L18-post_warmup | 2 | 2/2 | – |" in table and "18L 28.80" in table


def test_deep_encoder_report_names_the_shape_and_compares_dlcl_with_plain_pre():
    results = []
    for arm, bleu in (("post_warmup", 0.5), ("pre_warmup", 9.0), ("pre_warmup+dlcl", 9.75)):
        r = fake_run(f"E18D6-{arm}", arm, 0, [1.0, bleu], [6.0, 4.0])
        r["tags"].update(num_layers=18, decoder_layers=6)
        results.append(r)
    comps = {c["label"]: c for c in report_mt.depth_summary(results)["comparisons"]}
    assert set(comps) == {"E18D6: post_warmup − pre_warmup", "E18D6: pre_warmup+dlcl − pre_warmup"}
    assert comps["E18D6: pre_warmup+dlcl − pre_warmup"]["bleu_diff"]["diff"] == pytest.approx(0.75)


# --------------------------------------------------------------------------- end to end


def _argv(out, *extra):
    return [
        "mt_warmup", f"--out={out}", "--config=configs/mt.py:tiny",
        "--config.data.dataset=synthetic:copy", "--config.data.vocab_size=36",
        "--config.translation.max_source_length=16", "--config.translation.max_target_length=16",
        "--config.translation.max_tokens=512", "--config.total_steps=12", "--config.eval_every=6",
        "--config.checkpoint_every=6", "--config.log_every=4", "--config.monitor.every=6",
        "--config.model.hidden_dropout=0", "--config.model.attention_dropout=0",
        "--lrs=3e-3", "--warmup_steps=0", "--pre_lrs=3e-3", "--seeds=0", "--bleu_targets=1",
        *extra,
    ]  # fmt: skip


def _train_lines(out, name):
    lines = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [ln for ln in lines if '"split": "train"' in ln]


def test_tiny_translation_study_writes_bleu_and_resumes(tmp_path, capsys):
    out = tmp_path / "study"
    assert cmd.COMMAND.run(cmd.main, _argv(out)) == 0
    names = ["post_nowarmup-lr3e-3-s0", "pre-lr3e-3-s0"]
    for name in names:
        r = json.loads((out / "runs" / name / "result.json").read_text())
        assert [p[0] for p in r["bleu_curve"]] == [6, 12] and r["steps"] == 12
        assert 0.0 <= r["final_bleu"] <= 100.0 and math.isfinite(r["final_nll"])
        assert "final_eval_mlm_loss" not in r and isinstance(r["stuck"], bool)
        assert r["overrides"]["optim.clip_norm"] == 0.0
        # The monitor's traces of both stacks, at initialisation (step 1) onwards.
        assert r["monitor_traces"]["grad_norm/layer_01/decoder/ffn"][0][0] == 1
        assert any(k.startswith("grad_norm/layer_00/encoder/") for k in r["monitor_traces"])
        assert 0 < r["monitor_traces"]["collapse/encoder/output"][0][1] <= 1
    post, pre = (json.loads((out / "runs" / n / "result.json").read_text()) for n in names)
    assert post["eval_curve"] != pre["eval_curve"]  # the placements really differ
    saved = json.loads((out / "results.json").read_text())
    plateau = json.loads((out / "plateau.json").read_text())["unigram_xent"]
    assert saved["complete"] and saved["plateau"] == plateau and 0 < plateau < math.log(36)
    # results.json: one line per run, its metrics named for translation
    by_name = {r["name"]: r for r in saved["runs"]}
    assert set(by_name) == set(names) and by_name[names[1]]["arm"] == "pre"
    assert by_name[names[1]]["final_nll"] == pre["final_nll"] == pre["eval_curve"][-1][1]
    assert by_name[names[1]]["best_bleu"] == max(p[1] for p in pre["bleu_curve"])
    assert by_name[names[0]]["stuck"] == (post["final_nll"] > plateau - runner.STUCK_MARGIN)
    assert "bleu_curve" not in by_name[names[0]]
    assert (out / "curves.png").stat().st_size > 0
    assert "pre-lr3e-3" in (out / "table.md").read_text()
    # Each run's library logs (orbax's) in its train.log, as train.py's; not on the terminal.
    for name in names:
        assert "CheckpointManager" in (out / "runs" / name / "train.log").read_text()
    assert "CheckpointManager" not in capsys.readouterr().err
    # Rerun: nothing is retrained; a lost result.json is rebuilt from the run's own files.
    before = {n: _train_lines(out, n) for n in names}
    (out / "runs" / names[1] / "result.json").unlink()
    assert cmd.COMMAND.run(cmd.main, _argv(out)) == 0
    assert "2 runs: 1 done, 1 to run" in capsys.readouterr().out
    assert {n: _train_lines(out, n) for n in names} == before
    again = json.loads((out / "runs" / names[1] / "result.json").read_text())
    assert again["bleu_curve"] == pre["bleu_curve"]


def test_translation_study_flag_errors_are_one_line(tmp_path, capsys):
    rc = cmd.COMMAND.run(cmd.main, _argv(tmp_path, "--warmup_steps=long"))
    err = capsys.readouterr().err
    assert rc == 2 and "neither a number of steps nor 'full'" in err
    rc = cmd.COMMAND.run(cmd.main, ["mt_depth", f"--out={tmp_path}", "--lrs=5e-4,1e-3"])
    assert rc == 2 and "take one value each" in capsys.readouterr().err


def test_mt_specs_defaults_follow_the_plan():
    from ln_jax.cli.command import Invocation  # noqa: F401  (the flags are parsed by COMMAND.run)

    seen = {}

    def body(inv):
        seen["specs"] = cmd._mt_specs(inv.words[0], inv.config_values())
        return 0

    assert cmd.COMMAND.run(body, ["mt_deep_encoder", "--out=/tmp/unused"]) == 0
    specs = seen["specs"]
    assert [s.name for s in specs][:3] == [
        "E18D6-post_warmup-s0", "E18D6-post_warmup-s1", "E18D6-pre_warmup-s0"
    ]  # fmt: skip
    total = study_mt.get_config("deep_encoder").total_steps
    assert specs[0].overrides["optim.warmup_steps"] == mt_grids.full_warmup(total)


# --------------------------------------------------------------------------- Fig. 3


def test_ffn_gradient_norms_by_layer_of_both_stacks():
    import jax.numpy as jnp
    from flax import nnx

    from ln_jax.analysis import gradients
    from ln_jax.nn.stack import StackView

    class Leaf(nnx.Module):
        def __init__(self, value):
            self.kernel = nnx.Param(value)

    class Branch(nnx.Module):
        def __init__(self, scale):
            self.wi = Leaf(jnp.full((2, 3), scale))
            self.wo = Leaf(jnp.full((3, 2), 2 * scale))

    class Ffn(nnx.Module):
        def __init__(self, scale):
            self.branch = Branch(scale)

    class Layer(nnx.Module):
        def __init__(self, scale):
            self.ffn = Ffn(scale)

    class Stack(nnx.Module):
        def __init__(self, scales):
            self.layers = nnx.List([Layer(s) for s in scales])

    class Model(nnx.Module):
        def __init__(self):
            self.encoder, self.decoder = Stack([1.0, 2.0]), Stack([3.0])

    views = [
        StackView(("encoder", "layers"), 2, ("ffn",)),
        StackView(("decoder", "layers"), 1, ("ffn",)),
    ]
    norms = gradients.ffn_grad_norms(nnx.state(Model(), nnx.Param), views)
    # ||c * ones(2, 3)||_F = c * sqrt(6)
    np.testing.assert_allclose(norms["encoder/W1"], [np.sqrt(6), 2 * np.sqrt(6)], rtol=1e-6)
    np.testing.assert_allclose(norms["encoder/W2"], [2 * np.sqrt(6), 4 * np.sqrt(6)], rtol=1e-6)
    np.testing.assert_allclose(norms["decoder/W1"], [3 * np.sqrt(6)], rtol=1e-6)


def test_monitor_curves_take_the_largest_sublayer_and_omega_in_forward_order(tmp_path):
    runs = fake_warmup_results()[:2]
    runs[0]["monitor_traces"] = {
        "collapse/encoder/output": [[1, 0.3], [100, 0.9]],
        "grad_norm/layer_00/decoder/ffn": [[1, 0.5], [100, 4.0]],
        "grad_norm/layer_01/decoder/self_attention": [[1, 2.0], [100, 1.0]],
        "omega/layer_00/decoder/self_attention": [[1, 1.0], [100, 1.1]],
        "omega/layer_00/decoder/cross_attention": [[1, 1.5], [100, 1.4]],
        "omega/layer_00/decoder/ffn": [[1, 2.0], [100, 2.0]],
        "omega/layer_01/decoder/self_attention": [[1, 2.5], [100, 2.6]],
    }
    cells = {c["cell"]: c for c in report_mt.cells(runs, (5.0,))}
    traces = cells["post_nowarmup-lr1e-3"]["traces"]
    assert traces["grad/decoder"] == [[1, 2.0], [100, 4.0]]  # the largest at each step
    assert traces["collapse/encoder"] == [[1, 0.3], [100, 0.9]]
    # self-attention, cross-attention, FFN of layer 0, then layer 1: [profiled, end].
    assert traces["omega/decoder"] == [[1.0, 1.1], [1.5, 1.4], [2.0, 2.0], [2.5, 2.6]]
    assert traces["omega/encoder"] == [] and traces["grad/encoder"] == []
    assert traces["cross_entropy"] == []  # no entropy logged
    path = report_mt.plot_monitor(list(cells.values()), "t", str(tmp_path / "monitor.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_line_styles_tell_depths_and_dlcl_apart_within_an_arm():
    cs = [
        {"cell": "L6-pre", "arm": "pre_warmup", "num_layers": 6},
        {"cell": "L18-pre", "arm": "pre_warmup", "num_layers": 18},
        {"cell": "L18-dlcl", "arm": "pre_warmup+dlcl", "num_layers": 18},
        {"cell": "L6-post", "arm": "post_warmup", "num_layers": 6},
    ]
    styles = report_mt.line_styles(cs)
    assert styles["L6-pre"] == styles["L6-post"] == "-"
    assert len({styles["L6-pre"], styles["L18-pre"], styles["L18-dlcl"]}) == 3
