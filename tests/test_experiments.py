"""The studies of ln_jax.experiments: grids, steps to target, divergence, plateau, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from configs import study as study_config
from ln_jax.config import override
from ln_jax.experiments import grids, plateau, report, runner, study
from ln_jax.experiments.runner import RunSpec

pytest_plugins = ("tests.data_fixtures",)


def base_config(data_dir: str, **overrides) -> dict:
    """configs/study.py:depth shrunk to seconds, on the 2x2x2 mesh of 8 fake devices."""
    c = study_config.get_config("depth")
    c.data.data_dir = data_dir
    c.data.vocab_size = 8000  # the tests' shared tokenizer
    c.data.global_batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    c.model.num_layers, c.model.hidden_size, c.model.mlp_dim = 1, 32, 64
    c.total_steps, c.eval_every, c.checkpoint_every, c.log_every, c.eval_batches = 4, 2, 2, 1, 1
    c.monitor.every = 0  # tests/test_monitor.py measures
    # No NSP: with 8 sequences a batch's NSP labels can be 7 to 1 (the pipeline draws them
    # per example), and that loss alone moves a 4-step run's train curve by ~0.8 nats, which
    # the divergence rule (last losses above the first) would read as a failure.
    c.data.nsp, c.model.nsp_head = False, False
    return override(c, overrides)


# --------------------------------------------------------------------------- pure functions


def test_steps_to_target_interpolates_between_evaluations():
    evals = [[100, 7.0, 1.0], [200, 6.0, 2.0], [300, 5.0, 3.0]]
    assert runner.steps_to_target(evals, 6.5) == pytest.approx(150.0)
    assert runner.steps_to_target(evals, 5.0) == pytest.approx(300.0)
    assert runner.steps_to_target(evals, 7.5) == pytest.approx(100.0)  # already at the first
    assert runner.steps_to_target(evals, 4.9) is None
    # A NaN evaluation breaks the bracket: no interpolation across it.
    assert runner.steps_to_target([[1, 7.0, 0], [2, math.nan, 0], [3, 5.0, 0]], 6.0) == 3.0


def test_divergence_rule():
    ok = [[1, 9.0, 0], [2, 8.0, 0], [3, 7.0, 0]]
    assert runner.diverged(ok, None) == (False, "")
    up = [[1, 7.0, 0], [2, 8.0, 0], [3, 9.0, 0]]
    bad, reason = runner.diverged(up, None)
    assert bad and "above the first 7.000" in reason
    assert runner.diverged([[1, 7.0, 0], [2, math.nan, 0]], None)[0]
    assert runner.diverged(ok, "non-finite loss at step 3") == (True, "non-finite loss at step 3")


def test_unigram_cross_entropy_matches_hand_computation():
    train = np.array([0, 0, 0, 1])  # counts 3, 1, 0 -> add-one: 4/7, 2/7, 1/7
    evals = np.array([0, 2])
    expected = -(math.log(4 / 7) + math.log(1 / 7)) / 2
    assert plateau.unigram_cross_entropy(train, evals, 3) == pytest.approx(expected)


def test_corpus_plateau_is_below_uniform(data_dir):
    from ln_jax.config import TrainConfig

    value = plateau.corpus_plateau(TrainConfig.from_mapping(base_config(data_dir)).data)
    assert value["vocab_size"] == 8000 and value["eval_tokens"] > 500
    # Frequencies carry information: well below the uniform log(V), well above zero.
    assert 4.0 < value["unigram_xent"] < math.log(8000) - 1.0


def test_grids_name_arms_and_scale_warmup():
    specs = grids.depth_grid([6, 12], ["post", "post_warmup", "pre"], [0, 1], 1e-3, 60)
    assert len(specs) == 12 and len({s.name for s in specs}) == 12
    warm = next(s for s in specs if s.name == "L12-post_warmup-s1")
    assert warm.overrides["model.placement"] == "post"
    assert warm.overrides["optim.warmup_steps"] == 60
    assert warm.overrides["model.num_layers"] == 12 and warm.overrides["seed"] == 1
    pre = next(s for s in specs if s.arm == "pre")
    assert pre.overrides["optim.warmup_steps"] == 0
    assert pre.overrides["optim.schedule"] == "linear_decay"
    # Any row of the placement table is an arm; "+qk" adds qk_norm.
    rows = grids.depth_grid([6], ["olmo2", "lns", "dyt+qk"], [0], 1e-3, 60)
    assert [s.overrides["model.placement"] for s in rows] == ["olmo2", "lns", "dyt"]
    assert [s.overrides.get("model.qk_norm", False) for s in rows] == [False, False, True]
    assert rows[2].name == "L6-dyt+qk-s0"

    w = grids.warmup_grid(1000, lrs=[5e-4, 1e-3], lengths=[1, 500, 4000])
    by_name = {s.name: s for s in w}
    assert by_name["post_warmup4000-lr1e-3-s0"].overrides["optim.warmup_steps"] == 80
    assert by_name["post_warmup500-lr5e-4-s0"].overrides["optim.warmup_steps"] == 10
    assert by_name["post_nowarmup-lr1e-3-s0"].overrides["optim.warmup_steps"] == 0
    assert by_name["post_radam-s0"].overrides["optim.optimizer"] == "radam"
    assert by_name["post_smalllr-s0"].overrides["optim.peak_lr"] == 1e-4
    assert {"pre-lr5e-4-s0", "admin-lr1e-3-s0"} <= set(by_name)
    assert all(s.overrides.get("optim.b2", 0.98) == 0.98 for s in w)
    two = grids.warmup_grid(1000, seeds=[0, 1])
    assert [s.tags["seed"] for s in two] == [0] * len(w) + [1] * len(w)  # seed-major


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grids.depth_grid([6], ["postln"], [0], 1e-3, 1), "unknown depth-study arm"),
        (lambda: grids.depth_grid([], ["post"], [0], 1e-3, 1), "--depths is empty"),
        (lambda: grids.warmup_grid(100, lrs=[]), "--lrs is empty"),
    ],
)
def test_bad_grid_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_misspelt_override_is_caught_before_training(data_dir, tmp_path):
    spec = RunSpec("r", "pre", {"model.placment": "pre"})
    with pytest.raises(ValueError, match="placement"):
        runner.run_grid(base_config(data_dir), [spec], str(tmp_path))
    assert not (tmp_path / "runs").exists()


def _lines(out, name: str) -> int:
    return len((out / "runs" / name / "metrics.jsonl").read_text().splitlines())


def _result(name, arm, evals, lr=1e-3, diverged=False):
    return {
        "name": name,
        "arm": arm,
        "tags": {"lr": lr},
        "diverged": diverged,
        "eval_curve": evals,
        "final_eval_mlm_loss": evals[-1][1],
        "best_eval_mlm_loss": min(e[1] for e in evals),
        "wall_s": evals[-1][2],
    }


def test_warmup_summary_ratio_on_synthetic_curves():
    post = _result("post_warmup500", "post_warmup500", [[100, 7, 10], [200, 6, 20], [400, 5, 40]])
    pre = _result("pre", "pre", [[100, 6.5, 10], [200, 5.0, 20], [400, 4.5, 40]])
    nowarm = _result("post_nowarmup", "post_nowarmup", [[100, 7, 10], [400, 8, 40]], diverged=True)
    summary = report.warmup_summary([post, pre, nowarm])
    assert summary["target"] == 5.0 and summary["target_from"] == "post_warmup500"
    # Post-LN reaches 5.0 at step 400; Pre-LN at step 200: ratio 0.5.
    assert summary["steps_ratio_pre_over_post_warmup"] == pytest.approx(0.5)
    rows = {r["name"]: r for r in summary["runs"]}
    assert rows["post_nowarmup"]["steps_to_target"] is None
    assert rows["pre"]["seconds_to_target"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="--target"):
        report.warmup_summary([pre, nowarm])


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
    plt.close(fig)
    changed = [results[0], results[1], run("post", 12, [[100, 7.0, 1], [200, 6.5, 2]])]
    plot = lambda rs, path: report.plot_depth(rs, ["post", "pre"], 6.7, path)  # noqa: E731
    _assert_png_of(plot, tmp_path, results, changed)


def _two_lr_summary():
    post = _result("post_warmup500", "post_warmup500", [[100, 7, 10], [200, 6, 20], [400, 5, 40]])
    pre = _result("pre", "pre", [[100, 6.5, 11], [200, 5.0, 21]], lr=5e-4)
    return report.warmup_summary([post, pre])


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
    assert list(target.get_ydata()) == [5.0, 5.0]
    plt.close(fig)
    changed = json.loads(json.dumps(summary))
    changed["cells"][1]["curve"][1][1] = 5.5
    plot = lambda s, path: report.plot_warmup(s, 6.7, path)  # noqa: E731
    _assert_png_of(plot, tmp_path, summary, changed)


def test_warmup_summary_pools_seeds_on_the_mean_curve():
    def seeded(name, arm, seed, evals):
        r = _result(f"{name}-s{seed}", arm, evals)
        r["tags"]["seed"] = seed
        return r

    runs = [
        seeded(
            "post_warmup500", "post_warmup500", 0, [[100, 7.0, 10], [200, 6.0, 20], [400, 5.0, 40]]
        ),
        seeded(
            "post_warmup500", "post_warmup500", 1, [[100, 7.2, 12], [200, 6.2, 22], [400, 5.4, 44]]
        ),
        seeded("pre", "pre", 0, [[100, 6.4, 10], [200, 5.0, 20], [400, 4.5, 40]]),
        seeded("pre", "pre", 1, [[100, 6.6, 10], [200, 5.4, 20], [400, 4.7, 40]]),
    ]
    summary = report.warmup_summary(runs, plateau=6.7)
    cells = {c["cell"]: c for c in summary["cells"]}
    assert set(cells) == {"post_warmup500", "pre"}
    assert cells["post_warmup500"]["curve"] == [[100, 7.1, 11], [200, 6.1, 21], [400, 5.2, 42]]
    assert summary["target"] == pytest.approx(5.2) and summary["target_from"] == "post_warmup500"
    # Pre-LN's mean curve (6.5, 5.2, 4.6) reaches 5.2 at step 200; Post-LN's at step 400.
    assert cells["pre"]["steps_to_target"] == pytest.approx(200)
    assert summary["steps_ratio_pre_over_post_warmup"] == pytest.approx(0.5)
    by_run = {r["name"]: r["steps_to_target"] for r in summary["runs"]}
    assert by_run["post_warmup500-s1"] is None  # one seed alone ends above the mean
    # 0.1 nats below the plateau (6.6): Post-LN's mean 7.1 -> 6.1 crosses it at step 150.
    assert cells["post_warmup500"]["steps_below_plateau"] == pytest.approx(150)
    assert cells["pre"]["steps_below_plateau"] == pytest.approx(100)
    table = report.warmup_table(summary, plateau=6.7)
    assert "| post_warmup500 | 0.001 | 0 | 2 | 5.200 ± 0.200 | 400 | 42 | 150 |" in table


# --------------------------------------------------------------------------- real runs


def test_tiny_grid_end_to_end_writes_results_and_plot(data_dir, tmp_path):
    base = base_config(data_dir)
    specs = grids.depth_grid([1], ["post", "pre"], [0], 1e-3, 1)
    out = str(tmp_path)
    result = study.run("depth", base, specs, out, plateau=6.7, arms=["post", "pre"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["complete"] and [r["name"] for r in saved["runs"]] == ["L1-post-s0", "L1-pre-s0"]
    for r in saved["runs"]:
        assert r["steps"] == 4 and [e[0] for e in r["eval_curve"]] == [2, 4]
        assert all(math.isfinite(e[1]) and e[1] > 0 for e in r["eval_curve"])
        assert r["wall_s"] > 0 and not r["diverged"]
    # Two placements, same data and seed: different losses (the arms really differ).
    a, b = (r["final_eval_mlm_loss"] for r in saved["runs"])
    assert a != b
    # The plot is the depth figure of the saved runs (tested on synthetic runs above).
    replot = report.plot_depth(saved["runs"], ["post", "pre"], 6.7, str(tmp_path / "re.png"))
    assert (tmp_path / "curves.png").read_bytes() == Path(replot).read_bytes()
    assert "| post | 0/1 | 0/1 |" in result["table"] and "6.700 nats" in result["table"]

    # Rerun: nothing is retrained (no new metrics lines), the same results come back.
    lines = {s.name: _lines(tmp_path, s.name) for s in specs}
    again = study.run("depth", base, specs, out, plateau=6.7, arms=["post", "pre"])
    assert [r["final_eval_mlm_loss"] for r in again["results"]] == [a, b]
    for s in specs:
        assert _lines(tmp_path, s.name) == lines[s.name]


def test_interrupted_grid_resumes_without_redoing_finished_runs(data_dir, tmp_path):
    base = base_config(data_dir)
    specs = grids.depth_grid([1], ["pre", "post"], [0], 1e-3, 1)
    out = str(tmp_path)
    # "Interrupted" after its first run: only that one finished.
    study.run_only(base, specs, out, specs[0].name, plateau=6.7)
    first = tmp_path / "runs" / specs[0].name / "result.json"
    stamp = first.stat().st_mtime_ns
    results = runner.run_grid(base, specs, out, plateau=6.7)
    assert [r["name"] for r in results] == [s.name for s in specs]
    assert first.stat().st_mtime_ns == stamp  # not redone
    # A stored result of other overrides is not silently reused.
    changed = [RunSpec(specs[0].name, "pre", {**specs[0].overrides, "optim.peak_lr": 5e-4})]
    with pytest.raises(ValueError, match="other overrides"):
        runner.run_grid(base, changed, out)


def test_forced_nan_run_is_recorded_as_diverged(data_dir, tmp_path):
    base = base_config(data_dir, **{"optim.clip_norm": 0.0})
    spec = RunSpec("nan", "post", {"model.placement": "post", "optim.peak_lr": 1e6})
    (result,) = runner.run_grid(base, [spec], str(tmp_path), plateau=6.7)
    assert result["diverged"]
    assert (
        "non-finite" in result["diverged_reason"] or "above the first" in result["diverged_reason"]
    )
    assert not result["below_plateau"]


def test_tiny_warmup_grid_end_to_end_reports_the_key_ratio(data_dir, tmp_path):
    base = base_config(data_dir, total_steps=6, eval_every=2)
    grid = grids.warmup_grid(6, lrs=[1e-3], lengths=[4000])
    specs = [s for s in grid if s.arm in ("post_warmup4000", "pre")]
    assert [s.name for s in specs] == ["post_warmup4000-lr1e-3-s0", "pre-lr1e-3-s0"]
    result = study.run("warmup", base, specs, str(tmp_path), plateau=6.7)
    saved = json.loads((tmp_path / "results.json").read_text())
    summary = saved["summary"]
    post = next(r for r in saved["runs"] if r["arm"] == "post_warmup4000")
    # The target is Post-LN-with-warm-up's final loss; it reaches it by its last evaluation.
    assert summary["target"] == post["final_eval_mlm_loss"]
    assert summary["post_warmup_run"] == "post_warmup4000-lr1e-3"  # its cell (one seed)
    rows = {r["name"]: r for r in summary["runs"]}
    post_steps = rows[post["name"]]["steps_to_target"]
    assert 0 < post_steps <= 6
    pre_steps = rows["pre-lr1e-3-s0"]["steps_to_target"]
    ratio = summary["steps_ratio_pre_over_post_warmup"]
    if pre_steps is None:
        assert ratio is None
    else:
        assert ratio == pytest.approx(pre_steps / post_steps)
    assert "Post-LN with warm-up (post_warmup4000-lr1e-3) = " in result["table"]
    # The plot is the warm-up figure of the saved summary (tested on a synthetic one above).
    replot = report.plot_warmup(summary, 6.7, str(tmp_path / "re.png"))
    assert (tmp_path / "curves.png").read_bytes() == Path(replot).read_bytes()
