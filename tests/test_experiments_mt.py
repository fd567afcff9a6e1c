"""The translation studies (issue 35): grids, BLEU reports on fake results, a tiny study end to
end through `python -m ln_jax.experiments mt_warmup` that resumes, and Fig. 3 on the
encoder-decoder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from configs import study_mt
from ln_jax.experiments import __main__ as cmd
from ln_jax.experiments import mt_grids, report_mt, runner, targets

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
    assert post["model.num_layers"] == post["task_options.decoder_layers"] == 6
    assert post["optim.warmup_steps"] == 96 and post["optim.clip_norm"] == 0.0
    radam = specs[-1].overrides
    assert radam["model.placement"] == "admin" and radam["optim.optimizer"] == "radam"
    assert radam["optim.warmup_steps"] == 0 and radam["task_options.decoder_layers"] == 12
    deep = mt_grids.mt_depth_grid([18], mt_grids.DEEP_ENCODER_ARMS, [0], 1e-3, 96, decoder_layers=6)
    assert [s.name for s in deep] == [
        "E18D6-post_warmup-s0", "E18D6-pre_warmup-s0", "E18D6-pre_warmup+dlcl-s0"
    ]  # fmt: skip
    dlcl = deep[2].overrides
    assert dlcl["model.dlcl"] is True and dlcl["model.placement"] == "pre"
    assert "model.dlcl" not in deep[1].overrides
    assert dlcl["model.num_layers"] == 18 and dlcl["task_options.decoder_layers"] == 6
    with pytest.raises(ValueError, match="unknown study arm"):
        mt_grids.mt_depth_grid([6], ["postln_warmup"], [0], 1e-3, 96)


def test_study_configs_build_with_the_papers_protocol():
    from ln_jax.config_front import build_config

    spec = mt_grids.mt_depth_grid([12], ["pre_warmup+dlcl"], [3], 1e-3, 96)[0]
    cfg = runner.run_config(study_mt.get_config("depth").to_dict(), spec)
    assert cfg.task == "translation" and cfg.model.num_layers == 12 and cfg.model.dlcl
    assert cfg.task_options["decoder_layers"] == 12 and cfg.task_options["label_smoothing"] == 0.1
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
        "final_eval_loss": losses[-1],
        "diverged": diverged,
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
    # Every seed's difference is 8.0: the paired interval collapses onto it.
    assert [gain["diff"], gain["lo"], gain["hi"]] == pytest.approx([8.0, 8.0, 8.0])
    pre_vs = comps["lr 0.001: Pre-LN without − Post-LN with full warm-up"]
    assert pre_vs["bleu_diff"]["diff"] == pytest.approx(2.0)
    ratio = pre_vs["step_ratios"]["bleu>=10"]
    assert ratio["n"] == 3 and ratio["ratio"] < 1.0  # Pre-LN gets to BLEU 10 sooner
    table = report_mt.warmup_table(summary)
    assert "| post_nowarmup-lr1e-3 | 3 | 0/3 | 5.00 ± 0.82" in table
    assert "+8.00 [+8.00, +8.00]" in table and "never (0/3)" in table and "8.45" in table


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


def test_bootstrap_diff_interval_widens_with_unpaired_noise():
    a, b = [10.0, 12.0, 14.0, 11.0], [8.0, 11.0, 12.0, 9.0]
    paired = targets.bootstrap_diff(a, b)
    unpaired = targets.bootstrap_diff(a, b, paired=False)
    assert paired["diff"] == unpaired["diff"] == pytest.approx(1.75)
    assert paired["lo"] <= 1.75 <= paired["hi"]
    # The seeds' shared part cancels in the pairs: a narrower interval.
    assert paired["hi"] - paired["lo"] < unpaired["hi"] - unpaired["lo"]
    mean, lo, hi = targets.bootstrap_mean([3.0, 3.0, 3.0])
    assert mean == lo == hi == 3.0
    with pytest.raises(ValueError, match="equally long"):
        targets.bootstrap_diff([1.0], [1.0, 2.0])


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
    assert nll["diff"] == pytest.approx(-0.2) and nll["lo"] == pytest.approx(-0.3)
    table = report_mt.depth_table(summary)
    assert "| L18: admin_warmup − pre_warmup | 2 | +2.00 [+2.00, +2.00] | -0.200 [-0.300," in table
    assert "| L18-post_warmup | 2 | 2/2 |" in table and "18L 28.80" in table


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
        "--config.task_options.max_source_length=16", "--config.task_options.max_target_length=16",
        "--config.data.max_tokens=512", "--config.total_steps=12", "--config.eval_every=6",
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
        assert 0.0 <= r["final_bleu"] <= 100.0 and math.isfinite(r["final_eval_loss"])
        assert r["overrides"]["optim.clip_norm"] == 0.0
        # The monitor's traces of both stacks, at initialisation (step 1) onwards.
        assert r["monitor_traces"]["grad_norm/layer_01/decoder/ffn"][0][0] == 1
        assert any(k.startswith("grad_norm/layer_00/encoder/") for k in r["monitor_traces"])
        assert 0 < r["monitor_traces"]["collapse/encoder/output"][0][1] <= 1
    post, pre = (json.loads((out / "runs" / n / "result.json").read_text()) for n in names)
    assert post["eval_curve"] != pre["eval_curve"]  # the placements really differ
    saved = json.loads((out / "results.json").read_text())
    assert saved["complete"] and saved["plateau"] is None
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
    from ln_jax.cli import Invocation  # noqa: F401  (the flags are parsed by COMMAND.run)

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

    norms = gradients.translation_ffn_grads(
        nnx.state(Model(), nnx.Param), [("encoder", 2), ("decoder", 1)]
    )
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
