"""The studies of ln_jax.experiments: grids, steps to target, divergence, plateau, resume."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from configs import study as study_config
from ln_jax.config.load import override
from ln_jax.experiments import grids, plateau, report, runner, study
from ln_jax.experiments.runner import RunSpec
from ln_jax.train import run_identity, steps

pytest_plugins = ("tests.data_fixtures",)


def base_config(data_dir: str, **overrides) -> dict:
    """configs/study.py:depth shrunk to seconds, on the 2x2x2 mesh of 8 fake devices."""
    c = study_config.get_config("depth")
    c.data.data_dir = data_dir
    c.data.dataset = "ln_jax_pydocs"  # the embedded corpus (the studies read ln_jax_sitedocs)
    c.data.vocab_size = 8000  # the tests' shared tokenizer
    c.data.global_batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    c.model.num_layers, c.model.hidden_size, c.model.mlp_dim = 1, 32, 64
    c.total_steps, c.eval_every, c.checkpoint_every, c.log_every, c.eval_batches = 4, 2, 2, 1, 1
    c.monitor.every = 0  # tests/test_monitor.py measures
    # No NSP: with 8 sequences a batch's NSP labels can be 7 to 1 (the pipeline draws them
    # per example), and that loss alone moves a 4-step run's train curve by ~0.8 nats, which
    # the divergence rule (last losses above the first) would read as a failure.
    c.bert.nsp, c.bert.nsp_head = False, False
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
    from ln_jax.config.run import TrainConfig

    value = plateau.corpus_plateau(TrainConfig.from_mapping(base_config(data_dir)).data)
    assert value["vocab_size"] == 8000 and value["eval_tokens"] > 500
    # Frequencies carry information: well below the uniform log(V), well above zero.
    assert 4.0 < value["unigram_xent"] < math.log(8000) - 1.0


def test_depth_grid_arms_absolute_warmup_and_beta2():
    specs = grids.depth_grid([6, 12], ["post_warmup", "pre", "admin_radam"], [0, 1], [5e-4], 500)
    assert len(specs) == 12 and len({s.name for s in specs}) == 12
    by_name = {s.name: s.overrides for s in specs}
    warm = by_name["L12-post_warmup-s1"]
    assert (warm["model.placement"], warm["optim.warmup_steps"]) == ("post", 500)
    assert warm["model.num_layers"] == 12 and warm["seed"] == warm["data.seed"] == 1
    radam = by_name["L6-admin_radam-s0"]
    assert (radam["model.placement"], radam["optim.optimizer"]) == ("admin", "radam")
    assert radam["optim.warmup_steps"] == 0 and by_name["L6-pre-s0"]["optim.warmup_steps"] == 0
    for o in by_name.values():
        assert (o["optim.b2"], o["optim.schedule"], o["optim.peak_lr"]) == (0.98, "constant", 5e-4)
    # Any placement row is an arm, with a suffix; "+qk" adds qk_norm; several rates = a pilot.
    rows = grids.depth_grid([6], ["deepnorm_beta_warmup", "deepnorm_alpha", "dyt+qk"], [0], [1e-3])
    assert [s.overrides["model.placement"] for s in rows] == [
        "deepnorm_beta",
        "deepnorm_alpha",
        "dyt",
    ]
    assert [s.overrides["optim.warmup_steps"] for s in rows] == [grids.DEPTH_WARMUP, 0, 0]
    assert [s.overrides.get("model.qk_norm", False) for s in rows] == [False, False, True]
    pilot = grids.depth_grid([6], ["pre"], [0], [2e-4, 1e-3], schedule="warmup_rsqrt", b2=0.99)
    assert [s.name for s in pilot] == ["L6-pre-lr2e-4-s0", "L6-pre-lr1e-3-s0"]
    assert [s.tags["lr"] for s in pilot] == [2e-4, 1e-3]
    assert {(s.overrides["optim.schedule"], s.overrides["optim.b2"]) for s in pilot} == {
        ("warmup_rsqrt", 0.99)
    }


def test_warmup_grid_cells_lrs_and_seeds():
    w = grids.warmup_grid(seeds=[0, 1], extras=["admin_warmup", "admin_radam"], extra_warmup=100)
    # Post-LN 4 rates x 4 warm-ups, Pre-LN 3 rates, 2 extras x 4 rates; seed-major.
    cells = 16 + 3 + 8
    assert len(w) == 2 * cells and [s.tags["seed"] for s in w] == [0] * cells + [1] * cells
    by_name = {s.name: s.overrides for s in w}
    post = by_name["post_warmup1000-lr2e-4-s1"]
    assert (post["optim.warmup_steps"], post["optim.peak_lr"]) == (1000, 2e-4)
    assert by_name["post_nowarmup-lr3e-4-s0"]["optim.warmup_steps"] == 0
    assert {k for k in by_name if k.startswith("pre-")} == {
        f"pre-lr{t}-s{s}" for t in ("3e-4", "5e-4", "1e-3") for s in (0, 1)
    }
    assert all(by_name[f"pre-lr1e-3-s{s}"]["optim.warmup_steps"] == 0 for s in (0, 1))
    assert by_name["admin_warmup-lr1e-4-s0"]["optim.warmup_steps"] == 100
    assert by_name["admin_radam-lr5e-4-s0"]["optim.optimizer"] == "radam"
    assert all(
        o["optim.b2"] == 0.98 and o["optim.schedule"] == "constant" for o in by_name.values()
    )
    # The key cells' extra seeds: only the seeds a cell does not have yet.
    extra = grids.key_cell_specs(w, ["post_warmup500-lr2e-4", "pre-lr5e-4"], [1, 2, 3])
    assert [s.name for s in extra] == [
        "post_warmup500-lr2e-4-s2",
        "pre-lr5e-4-s2",
        "post_warmup500-lr2e-4-s3",
        "pre-lr5e-4-s3",
    ]
    assert extra[0].overrides == {**by_name["post_warmup500-lr2e-4-s0"], "seed": 2, "data.seed": 2}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: grids.depth_grid([6], ["postln"], [0]), "unknown study arm 'postln'"),
        (lambda: grids.depth_grid([6], ["pre_warmpu"], [0]), "unknown study arm"),
        (lambda: grids.depth_grid([], ["post"], [0]), "--depths is empty"),
        (lambda: grids.warmup_grid(post_lrs=[]), "--lrs is empty"),
        (lambda: grids.warmup_grid(schedule="linear_decay"), "not a study schedule"),
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


def _seeded(cell, arm, seed, losses, lr=2e-4, warmup=0, key=False, diverged=False):
    """A run of `cell` at `seed` whose validation losses at steps 100, 200, ... are `losses`."""
    r = _result(
        f"{cell}-s{seed}",
        arm,
        [[100 * (i + 1), v, 10.0 * (i + 1)] for i, v in enumerate(losses)],
        lr,
        diverged,
    )
    r["tags"].update(seed=seed, warmup_steps=warmup, **({"key": True} if key else {}))
    return r


def test_tiny_grid_end_to_end_writes_results_and_plot(data_dir, tmp_path):
    base = base_config(data_dir, **{"monitor.every": 2})
    specs = grids.depth_grid([1], ["post", "pre"], [0], [1e-3])
    out = str(tmp_path)
    result = study.run("depth", base, specs, out, plateau=6.7, arms=["post", "pre"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["complete"] and [r["name"] for r in saved["runs"]] == ["L1-post-s0", "L1-pre-s0"]
    for r in saved["runs"]:
        assert r["steps"] == 4 and [e[0] for e in r["eval_curve"]] == [2, 4]
        assert all(math.isfinite(e[1]) and e[1] > 0 for e in r["eval_curve"])
        assert r["wall_s"] > 0 and not r["diverged"]
        # The collapse measure at step 1 (initialisation), 2 and 4: cosines in (0, 1].
        assert [c[0] for c in r["collapse_curve"]] == [1, 2, 4]
        assert all(0 < c[1] <= 1 for c in r["collapse_curve"])
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


def test_interrupted_grid_resumes_without_redoing_finished_runs(data_dir, tmp_path, monkeypatch):
    base = base_config(data_dir)
    specs = grids.depth_grid([1], ["pre", "post"], [0], [1e-3])
    out = str(tmp_path)
    # "Interrupted" after its first run: only that one finished.
    study.run_only(base, specs, out, specs[0].name, plateau=6.7)
    first = tmp_path / "runs" / specs[0].name / "result.json"
    stamp = first.stat().st_mtime_ns
    # The second run fails: the report covers the first (marked incomplete), then the error.
    with monkeypatch.context() as m:
        m.setattr(runner, "run_one", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
        with pytest.raises(runner.RunsFailed, match=f"{specs[1].name} \\(OSError: disk\\)"):
            study.run("depth", base, specs, out, plateau=6.7, arms=["pre", "post"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert not saved["complete"] and [r["name"] for r in saved["runs"]] == [specs[0].name]
    assert "| pre | 0/1 |" in (tmp_path / "table.md").read_text()
    results = runner.run_grid(base, specs, out, plateau=6.7)
    assert [r["name"] for r in results] == [s.name for s in specs]
    assert first.stat().st_mtime_ns == stamp  # not redone
    # A stored result of other overrides is not silently reused.
    changed = [RunSpec(specs[0].name, "pre", {**specs[0].overrides, "optim.peak_lr": 5e-4})]
    with pytest.raises(ValueError, match="other overrides"):
        runner.run_grid(base, changed, out)


def test_extend_continues_named_finished_runs_as_a_longer_run(data_dir, tmp_path):
    specs = grids.depth_grid([1], ["pre", "post"], [0], [1e-3], warmup_steps=2)
    short, out = base_config(data_dir), str(tmp_path / "study")
    runner.run_grid(short, specs, out, plateau=6.7)
    post_lines = _lines(tmp_path / "study", "L1-post-s0")
    longer = override(short, {"total_steps": 8})
    extended = {r["name"]: r for r in runner.run_grid(longer, specs, out, extend=["L1-pre*"])}
    # Only the named run goes on, from its step-4 checkpoint, to step 8.
    assert extended["L1-pre-s0"]["steps"] == 8 and extended["L1-post-s0"]["steps"] == 4
    assert _lines(tmp_path / "study", "L1-post-s0") == post_lines
    # Under a constant rate after the warm-up it is the 8-step run trained from scratch.
    (fresh,) = runner.run_grid(longer, specs[:1], str(tmp_path / "fresh"))
    got, want = extended["L1-pre-s0"]["eval_curve"], fresh["eval_curve"]
    assert [e[0] for e in got] == [e[0] for e in want] == [2, 4, 6, 8]
    np.testing.assert_allclose([e[1] for e in got], [e[1] for e in want], rtol=1e-5)
    # Rerun: nothing left to extend.
    assert not runner.needs_training(longer, specs[0], out, ["L1-pre*"])


@pytest.mark.parametrize("schedule", ["warmup_linear_decay", "constant", "warmup_rsqrt"])
def test_extend_refuses_a_schedule_that_depends_on_the_run_length(data_dir, tmp_path, schedule):
    (spec,) = grids.depth_grid([1], ["pre"], [0], [1e-3], 2, schedule=schedule)
    done = runner.run_config(base_config(data_dir), spec)  # what a finished 4-step run recorded
    run_identity.record_config(str(tmp_path), run_identity.as_dict(done))
    longer = runner.run_config(base_config(data_dir, total_steps=8), spec)
    if schedule == "warmup_linear_decay":
        with pytest.raises(ValueError, match="depends on the run's length"):
            runner.check_extendable(longer, str(tmp_path))
    else:
        runner.check_extendable(longer, str(tmp_path))


def test_extension_due_skips_diverged_unnamed_and_long_enough_runs(data_dir):
    (spec,) = grids.depth_grid([1], ["pre"], [0], [1e-3])
    base = base_config(data_dir, total_steps=8)
    assert runner.extension_due(base, spec, {"steps": 4, "diverged": False}, ["L1-*"])
    assert not runner.extension_due(base, spec, {"steps": 4, "diverged": True}, ["L1-*"])
    assert not runner.extension_due(base, spec, {"steps": 4, "diverged": False}, ["L6-*"])
    assert not runner.extension_due(base, spec, {"steps": 8, "diverged": False}, ["*"])


def test_a_run_held_by_a_live_process_is_not_trained_twice(data_dir, tmp_path):
    (spec,) = grids.depth_grid([1], ["pre"], [0], [1e-3])
    lock = tmp_path / "runs" / spec.name / runner.LOCK_FILE
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock.write_text(str(holder.pid))
        with pytest.raises(runner.RunsFailed, match=f"RunLockedError: .*process {holder.pid}"):
            runner.run_grid(base_config(data_dir), [spec], str(tmp_path))
        assert not (lock.parent / "metrics.jsonl").exists()  # nothing trained
    finally:
        holder.kill()
        holder.wait()
    # Its process gone, the stale lock is taken over, held while training, then released.
    with runner.run_lock(str(lock.parent)):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()


def test_a_failed_run_does_not_stop_the_grid(data_dir, tmp_path, monkeypatch):
    """In-process: the run after a failing one still trains; the failure is named at the end
    (with the finished runs' results), and a SIGTERM still stops the grid at once."""
    specs = grids.depth_grid([1], ["post", "pre", "admin"], [0], [1e-3])
    tried = []

    def fake_run_one(base, spec, out, plateau, extend=False):
        tried.append(spec.name)
        if spec.arm == "post":
            raise TimeoutError("the checkpoint save took longer than 1200 s")
        if spec.arm == "pre":
            raise runner.RunLockedError(f"{spec.name} is being trained by process 7")

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    with pytest.raises(runner.RunsFailed) as info:
        runner.run_grid(base_config(data_dir), specs, str(tmp_path))
    assert tried == [s.name for s in specs]
    post, pre = specs[0].name, specs[1].name
    assert info.value.failed == {
        post: "TimeoutError: the checkpoint save took longer than 1200 s",
        pre: f"RunLockedError: {pre} is being trained by process 7",
    }
    assert info.value.results == []
    assert "2 run(s) failed" in str(info.value) and "rerun the same command" in str(info.value)

    def preempted(*args, **kwargs):
        tried.append("preempted")
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_one", preempted)
    with pytest.raises(SystemExit):
        runner.run_grid(base_config(data_dir), specs, str(tmp_path))
    assert tried[-1] == "preempted" and tried.count("preempted") == 1


def test_a_failed_worker_does_not_stop_the_others(data_dir, tmp_path, monkeypatch):
    specs = grids.depth_grid([1], ["post", "pre", "admin"], [0], [1e-3])
    bad = specs[1].name

    def child(argv, name):  # a worker that exits 3 for one run, 0 for the others
        return [sys.executable, "-c", f"import sys; sys.exit({3 if name == bad else 0})"]

    monkeypatch.setattr(runner, "_child_command", child)
    with pytest.raises(runner.RunsFailed) as info:
        runner.run_grid(base_config(data_dir), specs, str(tmp_path), jobs=2)
    assert list(info.value.failed) == [bad]
    assert "exit status 3" in info.value.failed[bad]
    assert f"runs/{bad}/log.txt" in info.value.failed[bad]


def test_each_worker_pins_itself_to_its_share_and_this_process_does_not_fork(tmp_path, monkeypatch):
    """`--jobs` workers get their CPUs in $LN_JAX_CPUS and pin themselves (`pin_to_share`):
    with a `preexec_fn` the parent forked while JAX's threads ran, and JAX warned of a
    deadlock on the user's terminal."""
    import jax

    specs = grids.depth_grid([1], ["pre", "post"], [0], [1e-3])
    code = "import os; from ln_jax.experiments import runner; p = runner.pin_to_share(); "
    code += "print(p, sorted(os.sched_getaffinity(0)))"
    monkeypatch.setattr(runner, "_child_command", lambda argv, name: [sys.executable, "-c", code])
    jax.devices()  # JAX's threads run in this process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert runner.run_parallel(specs, [], 2, str(tmp_path)) == {}
    assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]
    for slot, spec in enumerate(specs):
        share = runner.cpu_share(slot, 2)
        cpus = share or sorted(os.sched_getaffinity(0))
        printed = (tmp_path / "runs" / spec.name / "log.txt").read_text().strip()
        assert printed == f"{share} {cpus}"


def test_a_study_whose_runs_all_failed_says_so(data_dir, tmp_path, monkeypatch):
    specs = grids.depth_grid([1], ["pre"], [0], [1e-3])

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, "run_one", broken)
    with pytest.raises(runner.RunsFailed, match="No space left on device"):
        study.run("depth", base_config(data_dir), specs, str(tmp_path), plateau=6.7)
    assert not (tmp_path / "results.json").exists()


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
    specs = grids.warmup_grid(seeds=[0], post_lrs=[1e-3], warmups=[2], pre_lrs=[1e-3])
    assert [s.name for s in specs] == ["post_warmup2-lr1e-3-s0", "pre-lr1e-3-s0"]
    # A plateau far above the start: every target is reached at an evaluation.
    result = study.run("warmup", base, specs, str(tmp_path), plateau=12.0)
    saved = json.loads((tmp_path / "results.json").read_text())
    summary = saved["summary"]
    assert summary["best"] == {"post": "post_warmup2-lr1e-3", "pre": "pre-lr1e-3"}
    steps = {r["arm"]: runner.steps_to_target(r["eval_curve"], 11.4) for r in saved["runs"]}
    assert all(0 < x <= 6 for x in steps.values())
    middle = next(r for r in summary["ratios"] if r["target"] == "plateau-0.6")
    assert middle["ratio"] == pytest.approx(steps["pre"] / steps["post_warmup2"])
    assert "Steps Pre-LN (pre-lr1e-3) / Post-LN (post_warmup2-lr1e-3)" in result["table"]
    # The plot is the warm-up figure of the saved summary (tested on a synthetic one above).
    replot = report.plot_warmup(summary, 12.0, str(tmp_path / "re.png"))
    assert (tmp_path / "curves.png").read_bytes() == Path(replot).read_bytes()


def test_a_grid_on_a_cpu_compiles_its_train_step_once_in_the_study_folder(
    data_dir, tmp_path, monkeypatch, fresh_programs
):
    """Two runs of one arm with other seeds and learning rates: one compiled train step in
    OUT/jax_compilation (config "auto" on a CPU), two different runs; "off" stays off."""
    import jax

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # the suite's own folder would win
    base = base_config(data_dir, total_steps=2, eval_every=0, checkpoint_every=0)
    specs = [
        RunSpec("a", "pre", {"model.placement": "pre", "seed": 0, "optim.peak_lr": 1e-3}),
        RunSpec("b", "pre", {"model.placement": "pre", "seed": 1, "optim.peak_lr": 3e-3}),
    ]
    min_secs = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        results = []
        for spec in specs:  # each as in a process of its own: nothing kept from the last
            steps.forget_programs()
            results.append(runner.run_one(base, spec, str(tmp_path), plateau=6.7))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
    folder = tmp_path / "jax_compilation"
    assert len([p for p in os.listdir(folder) if p.startswith("jit_step_fn-")]) == 1
    for spec in specs:
        saved = json.loads((tmp_path / "runs" / spec.name / "config.json").read_text())
        assert saved["compilation_cache"] == str(folder)
    assert results[0]["final_eval_mlm_loss"] != results[1]["final_eval_mlm_loss"]
    off = override(base, {"compilation_cache": "off"})
    assert runner.run_config(off, specs[0], str(tmp_path)).compilation_cache == "off"
