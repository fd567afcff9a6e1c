"""The studies' reports and figures (ln_jax.experiments.report / targets): summaries, steps to
targets, t-intervals on paired per-seed ratios, the pilot's choice, the depth and warm-up
tables and figures, from hand-made run results (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex
from scipy import stats

from ln_jax.experiments import grids, report, study, targets
from tests.test_experiments import _result, _seeded


def _warmup_runs():
    """Plateau 7.0, targets 6.7 / 6.4 / 6.0. post_warmup100 reaches 6.4 at steps 225 and 183.3;
    post_warmup500 is faster but one seed diverged; pre-lr5e-4 at 166.7 (both sweep seeds), its
    key seed 2 at 140; pre-lr1e-3 never reaches 6.4."""
    return [
        _seeded("post_warmup100-lr2e-4", "post_warmup100", 0, [7.0, 6.5, 6.1, 5.9], warmup=100),
        _seeded("post_warmup100-lr2e-4", "post_warmup100", 1, [6.9, 6.3, 6.0, 5.8], warmup=100),
        _seeded("post_warmup500-lr5e-4", "post_warmup500", 0, [6.5, 6.0, 5.5, 5.0], 5e-4, 500),
        _seeded(
            "post_warmup500-lr5e-4", "post_warmup500", 1, [6.5, 9.0, 9, 9], 5e-4, 500, diverged=True
        ),
        _seeded("pre-lr5e-4", "pre", 0, [6.8, 6.2, 5.9, 5.7], 5e-4),
        _seeded("pre-lr5e-4", "pre", 1, [6.8, 6.2, 5.9, 5.7], 5e-4),
        _seeded("pre-lr5e-4", "pre", 2, [6.6, 6.1, 5.9, 5.7], 5e-4, key=True),
        _seeded("pre-lr1e-3", "pre", 0, [6.9, 6.6, 6.5, 6.45], 1e-3),
        _seeded("pre-lr1e-3", "pre", 1, [6.9, 6.6, 6.5, 6.45], 1e-3),
    ]


def test_warmup_summary_steps_to_each_target_best_cells_and_ratio():
    summary = report.warmup_summary(_warmup_runs(), plateau=7.0)
    assert [t[0] for t in summary["targets"]] == ["plateau-0.3", "plateau-0.6", "plateau-1"]
    assert summary["middle"] == "plateau-0.6" and summary["target"] == pytest.approx(6.4)
    cells = {c["cell"]: c for c in summary["cells"]}
    post = cells["post_warmup100-lr2e-4"]["steps"]
    assert post["plateau-0.3"] == pytest.approx([160, 100 + 100 * 0.2 / 0.6])
    assert post["plateau-0.6"] == pytest.approx([225, 100 + 100 * 0.5 / 0.6])
    assert post["plateau-1"] == pytest.approx([350, 300])
    assert cells["pre-lr1e-3"]["steps"]["plateau-0.6"] == [None, None]
    # Best = fewest mean steps to the middle target, no seed diverged, chosen on sweep seeds.
    assert summary["best"] == {"post": "post_warmup100-lr2e-4", "pre": "pre-lr5e-4"}
    # The ratio is per seed, over the seeds both cells ran (0 and 1; Pre-LN's key seed 2 has no
    # Post-LN partner): 166.7 / 225 and 166.7 / 183.3.
    middle = next(r for r in summary["ratios"] if r["target"] == "plateau-0.6")
    r0, r1 = 166.6667 / 225, 166.6667 / 183.3333
    assert middle["per_seed"] == pytest.approx([r0, r1], rel=1e-5) and middle["n"] == 2
    assert middle["ratio"] == pytest.approx((r0 + r1) / 2, rel=1e-5)
    ci = stats.ttest_1samp([r0, r1], 0.0).confidence_interval(0.95)  # scipy's own t-interval
    assert (middle["lo"], middle["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-4)
    assert middle["below_one"] == 2 and middle["pre_missing"] == middle["post_missing"] == 0
    assert middle["holds_xiong"] == (middle["lo"] <= 0.71 <= middle["hi"])
    table = report.warmup_table(summary, plateau=7.0)
    assert (
        "| post_warmup100-lr2e-4 * | 0.0002 | 100 | 2 | 5.850 ± 0.050 | 147 ± 13 (2/2) | "
        "204 ± 21 (2/2) | 325 ± 25 (2/2) |" in table
    )
    assert "| pre-lr1e-3 | 0.001 | 0 | 2 | 6.450 ± 0.000 | 167 ± 0 (2/2) | never (0/2) |" in table
    holds = "yes" if middle["holds_xiong"] else "no"
    assert (
        f"| plateau-0.6 | {middle['ratio']:.2f} | [{middle['lo']:.2f}, {middle['hi']:.2f}] | 2 | "
        f"2 of 2 | {holds} |" in table
    )
    assert "* post_warmup100-lr2e-4: plateau-0.3: 160, 133; plateau-0.6: 225, 183; " in table
    assert "* pre-lr5e-4: plateau-0.3: 117, 117, 100; plateau-0.6: 167, 167, 140;" in table
    # With the key seed, the choice is the same: the sweep seeds decide.
    assert report.best_cells(_warmup_runs(), 7.0) == summary["best"]


def test_best_cell_falls_back_to_the_lowest_final_loss():
    runs = [
        _seeded("post_nowarmup-lr2e-4", "post_nowarmup", 0, [7.0, 6.9]),
        _seeded("post_warmup100-lr2e-4", "post_warmup100", 0, [7.0, 6.8], warmup=100),
        _seeded("pre-lr5e-4", "pre", 0, [7.0, math.nan], diverged=True),
    ]
    summary = report.warmup_summary(runs, plateau=7.0)
    assert summary["best"] == {"post": "post_warmup100-lr2e-4", "pre": None}
    assert all(r["ratio"] is None for r in summary["ratios"])
    assert "| plateau-0.6 | – | – | – | – |" in report.warmup_table(summary, 7.0)


def test_paired_t_is_scipys_paired_t_test_and_narrows_with_seeds():
    rng = np.random.default_rng(1)
    widths = []
    for n in (5, 80):
        pre, post = 700 + 40 * rng.standard_normal(n), 1000 + 60 * rng.standard_normal(n)
        d = targets.paired_t(pre, post)
        ci = stats.ttest_rel(pre, post).confidence_interval(0.95)  # an independent implementation
        assert (d["lo"], d["hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
        assert d["diff"] == pytest.approx(np.mean(pre - post)) and d["n"] == n
        assert d["below"] == int(np.sum(pre < post)) and d["above"] == int(np.sum(pre > post))
        widths.append(d["hi"] - d["lo"])
    assert widths[1] < widths[0] / 2  # ~1/sqrt(n)
    one = targets.paired_t([5.0], [10.0])
    assert (one["diff"], one["lo"], one["hi"], one["n"]) == (-5.0, -5.0, -5.0, 1)
    with pytest.raises(ValueError, match="pair the seeds"):
        targets.paired_t([1.0, 2.0], [1.0])


def test_pairing_removes_the_shared_seed_effect():
    # Each seed has its own speed, shared by both cells (same data order); Pre-LN takes 0.8x.
    rng = np.random.default_rng(3)
    seed_speed = 300 * rng.lognormal(0.0, 0.4, 5)
    post = seed_speed * (1 + 0.02 * rng.standard_normal(5))
    pre = 0.8 * seed_speed * (1 + 0.02 * rng.standard_normal(5))
    paired = targets.paired_t_ratio(pre, post)
    assert paired["per_seed"] == pytest.approx(list(pre / post)) and paired["n"] == 5
    assert paired["lo"] < 0.8 < paired["hi"] and paired["below_one"] == 5
    unpaired = stats.ttest_ind(pre, post, equal_var=False).confidence_interval(0.95)
    assert paired["hi"] - paired["lo"] < (unpaired.high - unpaired.low) / np.mean(post) / 5


def test_below_five_seeds_the_verdict_is_the_sign_count():
    three = targets.paired_t([1.2, 0.9, 1.4], [1.0, 1.0, 1.0])  # +0.2, -0.1, +0.4
    assert targets.describe(three).endswith(" t, 2 of 3 seeds > 0")
    assert not targets.excludes(three)  # 3 seeds: no interval verdict, however narrow
    five = targets.paired_t([1.1, 1.2, 1.15, 1.12, 1.18], [1.0] * 5)
    assert targets.excludes(five) and targets.describe(five).endswith("t, excludes 0")
    wide = targets.paired_t([1.5, 0.6, 1.4, 0.7, 1.3], [1.0] * 5)
    assert not targets.excludes(wide) and targets.describe(wide).endswith("includes 0")
    assert targets.describe(targets.paired_t([2.0], [1.0])) == "+1.00 (1 seed)"


def test_key_ratios_pair_runs_by_seed_and_skip_unreached():
    label = "plateau-0.3"
    pre = {"seeds": [0, 1, 2, 3], "steps": {label: [80.0, 90.0, None, 400.0]}}
    post = {"seeds": [3, 0, 1, 2], "steps": {label: [500.0, 100.0, 100.0, 120.0]}}
    (row,) = targets.key_ratios(pre, post, [label])
    assert row["pre_missing"] == 1 and row["post_missing"] == 0
    # seeds 0, 1, 3 (seed 2 unreached by pre), matched by seed, not by position
    assert row["n"] == 3 and row["per_seed"] == pytest.approx([0.8, 0.9, 0.8])
    table = report._ratio_rows([row])[0]
    holds = "yes" if row["lo"] <= 0.71 <= row["hi"] else "no"
    assert row["holds_xiong"] == (holds == "yes")
    interval = f"| {row['ratio']:.2f} | [{row['lo']:.2f}, {row['hi']:.2f}] |"
    assert table == f"| {label} {interval} 3 (1 / 0 never reached) | 3 of 3 | {holds} |"


def test_key_seed_expansion_adds_the_best_cells_seeds():
    sweep = grids.warmup_grid(
        seeds=[0, 1], post_lrs=[2e-4, 5e-4], warmups=[100, 500], pre_lrs=[5e-4, 1e-3]
    )
    results = [r for r in _warmup_runs() if not r["tags"].get("key")]
    extra = study.key_seed_expansion(sweep, 7.0, [2, 3], targets.OFFSETS)(results)
    assert [s.name for s in extra] == [
        "post_warmup100-lr2e-4-s2",
        "pre-lr5e-4-s2",
        "post_warmup100-lr2e-4-s3",
        "pre-lr5e-4-s3",
    ]
    assert all(s.tags["key"] for s in extra)


def test_largest_spike_is_the_rise_above_the_running_minimum():
    assert report.largest_spike([[1, 7.0], [2, 6.5], [3, 6.2]]) == 0.0
    # 6.2 -> 9.3 (recovered to 6.1 later) is a 3.1-nat spike; the earlier 6.5 -> 6.6 is smaller.
    curve = [[1, 7.0], [2, 6.5], [3, 6.6], [4, 6.2], [5, 9.3], [6, math.nan], [7, 6.1]]
    assert report.largest_spike(curve) == pytest.approx(3.1)


def test_escape_table_reads_the_step_below_the_plateau_per_seed():
    def run(arm, seed, evals):
        r = _result(f"L6-{arm}-s{seed}", arm, evals)
        r["tags"].update(num_layers=6, seed=seed)
        return r

    results = [
        run("pre", 1, [[100, 6.5, 1], [200, 6.3, 2], [300, 6.0, 3]]),  # 6.1 crossed at 267
        run("pre", 0, [[100, 6.5, 1], [200, 6.0, 2]]),  # crossed at 180
        run("post", 0, [[100, 6.5, 1], [200, 6.15, 2]]),  # below 6.2 but never below 6.1
    ]
    table = report.escape_table(results, ["post", "pre"], plateau=6.2)
    assert "| pre | 180, 267 |" in table and "| post | never |" in table


def _depth_run(arm, layers, final, lr=1e-3, seed=0, collapse=None):
    r = _result(f"L{layers}-{arm}-lr{lr:g}-s{seed}", arm, [[100, 7.0, 1], [200, final, 2]], lr)
    r["tags"].update(num_layers=layers, seed=seed)
    r["below_plateau"] = final < 7.0
    r["collapse_curve"] = collapse or []
    return r


def _is(run, arm, layers, lr):
    return (run["arm"], run["tags"]["num_layers"], run["tags"]["lr"]) == (arm, layers, lr)


def test_pilot_chooses_the_largest_rate_with_lius_regime():
    def pilot_runs(post18_at_1e3, pre18_at_1e3):
        runs = []
        for lr in (2e-4, 1e-3):
            for d in (6, 18):
                runs += [_depth_run("pre", d, 6.5, lr), _depth_run("admin_warmup", d, 6.5, lr)]
                runs.append(_depth_run("post_warmup", d, 6.5, lr))
        for r in runs:  # at 1e-3 and 18 layers: Post-LN (and maybe Pre-LN) stays on the plateau
            if r["tags"]["lr"] == 1e-3 and r["tags"]["num_layers"] == 18:
                r["final_eval_mlm_loss"] = {"post_warmup": post18_at_1e3, "pre": pre18_at_1e3}.get(
                    r["arm"], 6.5
                )
        return runs

    def pilot(post18_at_1e3, pre18_at_1e3):
        return report.pilot_choice(pilot_runs(post18_at_1e3, pre18_at_1e3), plateau=7.0)

    regime = pilot(post18_at_1e3=7.0, pre18_at_1e3=6.5)
    assert (regime["lr"], regime["regime"]) == (1e-3, True)
    assert regime["per_lr"][2e-4] == {"stable_everywhere": True, "post_regime": False}
    # Pre-LN fails at 18 layers at 1e-3: the largest rate where it trains, regime not found.
    unstable = pilot(post18_at_1e3=7.0, pre18_at_1e3=6.95)  # 6.95 > 7.0 - 0.1: not trained
    assert (unstable["lr"], unstable["regime"]) == (2e-4, False)
    assert "chosen learning rate: 0.0002 (Liu's regime not found" in report.pilot_table(unstable)
    # a rate whose Admin run at 18 layers is missing is not "stable everywhere"
    missing = [r for r in pilot_runs(7.0, 6.5) if not _is(r, "admin_warmup", 18, 1e-3)]
    choice = report.pilot_choice(missing, plateau=7.0)
    assert choice["per_lr"][1e-3]["stable_everywhere"] is False and choice["lr"] == 2e-4


def test_depth_table_shows_the_collapse_measure_and_pilot_rows():
    runs = [
        _depth_run("post_warmup", 6, 6.5, 2e-4, 0, [[1, 0.80, 0], [100, 0.97, 1]]),
        _depth_run("post_warmup", 6, 6.6, 2e-4, 1, [[1, 0.90, 0], [100, 0.99, 1]]),
        _depth_run("post_warmup", 6, 6.5, 1e-3),
    ]
    assert report.collapse_ends(runs[0]) == (0.80, 0.97) and report.collapse_ends(runs[2]) is None
    table = report.depth_table(runs, ["post_warmup"], plateau=7.0)
    assert "| post_warmup lr=0.0002 | 0/2 | 2/2 | 6.550 ± 0.050 | 0.85 → 0.98 |" in table
    assert "| post_warmup lr=0.001 | 0/1 | 1/1 | 6.500 | – |" in table
    assert "chosen learning rate" in table


def test_depth_table_of_a_study_lists_each_seeds_final_and_steps_to_deeper_targets():
    def run(arm, layers, seed, losses):
        r = _depth_run(arm, layers, losses[-1], 1e-3, seed)
        r["eval_curve"] = [[100 * (i + 1), v, i] for i, v in enumerate(losses)]
        return r

    runs = [
        run("pre", 6, 1, [6.9, 6.6, 6.4]),  # plateau 7: 6.7 at step 167, 6.5 at 250
        run("pre", 6, 0, [6.5, 6.4, 6.3]),
        run("post", 6, 0, [7.0, 6.9, 6.8]),
    ]
    table = report.depth_table(runs, ["post", "pre"], plateau=7.0)
    assert "| pre | 6 | 0,1 | 6.300, 6.400 | 100, 167 | 100, 250 |" in table
    assert "| post | 6 | 0 | 6.800 | never | never |" in table


def _by_gid(ax) -> dict:
    """The curves drawn on `ax`, by the gid the plot gave each (a run's or a cell's name)."""
    return {line.get_gid(): line for line in ax.lines if line.get_gid()}


def _assert_curve(line, xs, ys, colour, style="-"):
    np.testing.assert_array_equal(line.get_xdata(), xs)
    np.testing.assert_allclose(line.get_ydata(), ys)
    assert to_hex(line.get_color()) == to_hex(colour) and line.get_linestyle() == style


def _assert_png_of(plot, tmp_path, one, other):
    """`plot(input, path)` writes a PNG and returns its path; `one` twice gives the same image,
    `other` a different one."""
    inputs = (one, one, other)
    images = [Path(plot(x, str(tmp_path / f"{i}.png"))).read_bytes() for i, x in enumerate(inputs)]
    assert images[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert images[0] == images[1] and images[0] != images[2]


def test_depth_figure_draws_each_run_in_its_panel(tmp_path):
    def run(arm, layers, evals, diverged=False):
        r = _result(f"L{layers}-{arm}-s0", arm, evals, diverged=diverged)
        r["tags"]["num_layers"] = layers
        return r

    results = [
        run("pre", 6, [[100, 6.5, 1], [200, 6.0, 2]]),
        run("post", 6, [[100, 6.8, 1], [200, math.nan, 2]], diverged=True),
        run("post", 12, [[100, 7.0, 1], [200, 6.9, 2]]),
    ]
    fig = report.depth_figure(results, ["post", "pre"], plateau=6.7)
    six, twelve = fig.axes
    assert (six.get_title(), twelve.get_title()) == ("6 layers", "12 layers")
    lines = _by_gid(six)
    assert set(lines) == {"L6-pre-s0", "L6-post-s0"} and set(_by_gid(twelve)) == {"L12-post-s0"}
    _assert_curve(lines["L6-pre-s0"], [100, 200], [6.5, 6.0], "tab:blue")
    # A diverged run: dotted, its NaN evaluation left out.
    _assert_curve(lines["L6-post-s0"], [100], [6.8], "tab:red", ":")
    _assert_curve(_by_gid(twelve)["L12-post-s0"], [100, 200], [7.0, 6.9], "tab:red")
    legend = [t.get_text() for t in six.get_legend().get_texts()]
    assert legend == ["post", "pre", "unigram plateau"]
    plateau_line = next(x for x in six.lines if x.get_label() == "unigram plateau")
    assert list(plateau_line.get_ydata()) == [6.7, 6.7]
    # Both panels: from 0.1 under the lowest loss of any run (6.0) to 0.5 above the plateau.
    for ax in (six, twelve):
        np.testing.assert_allclose(ax.get_ylim(), (5.9, 7.2))
    plt.close(fig)
    changed = [results[0], results[1], run("post", 12, [[100, 7.0, 1], [200, 6.5, 2]])]
    plot = lambda rs, path: report.plot_depth(rs, ["post", "pre"], 6.7, path)  # noqa: E731
    _assert_png_of(plot, tmp_path, results, changed)
    assert lines["L6-pre-s0"].get_marker() in ("None", None, "")  # one rate: no markers


def test_depth_figure_of_a_pilot_marks_each_rate():
    runs = [_depth_run(arm, 6, 6.5, lr) for arm in ("pre", "post_warmup") for lr in (1e-3, 2e-4)]
    (ax,) = report.depth_figure(runs, ["post_warmup", "pre"], plateau=7.0).axes
    lines = _by_gid(ax)
    markers = {name: lines[name].get_marker() for name in lines}
    assert markers["L6-pre-lr0.0002-s0"] == markers["L6-post_warmup-lr0.0002-s0"] == "o"
    assert markers["L6-pre-lr0.001-s0"] == markers["L6-post_warmup-lr0.001-s0"] == "s"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["post_warmup lr=0.0002", "post_warmup lr=0.001"]
    plt.close(ax.figure)


def _two_lr_summary():
    post = _result("post_warmup500", "post_warmup500", [[100, 7, 10], [200, 6, 20], [400, 5, 40]])
    pre = _result("pre", "pre", [[100, 6.5, 11], [200, 5.0, 21]], lr=5e-4)
    return report.warmup_summary([post, pre], plateau=6.7)


def test_warmup_figure_draws_each_cell_against_steps_and_seconds(tmp_path):
    summary = _two_lr_summary()
    fig = report.warmup_figure(summary, plateau=6.7)
    by_step_5e4, by_step_1e3, by_time_5e4, by_time_1e3 = fig.axes  # rows: steps, seconds
    assert [ax.get_title() for ax in (by_step_5e4, by_step_1e3)] == [
        "lr_max = 0.0005",
        "lr_max = 0.001",
    ]
    for ax in (by_step_5e4, by_time_5e4):
        assert set(_by_gid(ax)) == {"pre"}
    for ax in (by_step_1e3, by_time_1e3):
        assert set(_by_gid(ax)) == {"post_warmup500"}
    _assert_curve(_by_gid(by_step_1e3)["post_warmup500"], [100, 200, 400], [7, 6, 5], "gold")
    _assert_curve(_by_gid(by_time_1e3)["post_warmup500"], [10, 20, 40], [7, 6, 5], "gold")
    _assert_curve(_by_gid(by_step_5e4)["pre"], [100, 200], [6.5, 5.0], "tab:blue")
    _assert_curve(_by_gid(by_time_5e4)["pre"], [11, 21], [6.5, 5.0], "tab:blue")
    target = next(x for x in by_time_5e4.lines if x.get_label() == "target")
    assert list(target.get_ydata()) == pytest.approx([6.1, 6.1])  # the middle target
    plt.close(fig)
    changed = json.loads(json.dumps(summary))
    changed["cells"][1]["curve"][1][1] = 5.5
    plot = lambda s, path: report.plot_warmup(s, 6.7, path)  # noqa: E731
    _assert_png_of(plot, tmp_path, summary, changed)


def test_mean_curve_pools_seeds_at_common_steps():
    runs = [
        _seeded("pre-lr5e-4", "pre", 0, [7.0, 6.0, 5.0]),
        _seeded("pre-lr5e-4", "pre", 1, [7.2, 6.2]),
    ]
    assert report.mean_curve(runs) == [[100, 7.1, 10.0], [200, 6.1, 20.0]]


# --------------------------------------------------------------------------- real runs
