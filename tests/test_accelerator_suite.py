"""bench/gpu/accelerator_suite.sh in its CPU mode (tiny shapes): every step runs, and the table it
prints follows from the step results it wrote (so the GPU mode's table can be trusted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.gpu import suite_report

pytest_plugins = ("tests.data_fixtures",)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.mark.slow
def test_the_suite_runs_on_cpu_and_its_table_follows_from_its_results(
    data_dir, tmp_path, cpu_to_itself
):
    out = tmp_path / "suite"
    env = dict(os.environ, TFDS_DATA_DIR=data_dir, PYTHON=sys.executable)
    run = subprocess.run(
        # Two of the arms (each compiles its own step: the others add CI minutes, not checks;
        # an arm's fields are parsed in tests/test_bench_accel.py, the kernel's step runs in
        # tests/test_flash.py)
        ["bash", "bench/gpu/accelerator_suite.sh", "--cpu", "--out", str(out), "--budget", "400",
         "--arms", "default,main"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = (out / "status.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in status] == [
        "flash", "bench", "profile", "torch", "mt", "main_job"
    ]  # fmt: skip
    flash = json.loads((out / "flash.json").read_text())
    tuned = {n: ms for n, ms in flash["ms"].items() if n.startswith("pallas")}
    assert flash["best_tuning"] in (out / "tuning.env").read_text()
    assert set(tuned) == {"pallas_w4", "pallas_w8", "pallas_w8_s3", "pallas_split"}
    assert all(": rc=0 " in line for line in status), status

    arms, torch, profile = _check_arms(out)
    _check_mt(out, run.stdout)
    _check_summary(out, run.stdout, arms, torch, profile)


def _check_arms(out) -> tuple[dict, dict, dict]:
    """arms.json, torch.json and profile.json agree with themselves; returns them."""
    arms = json.loads((out / "arms.json").read_text())["arms"]
    assert list(arms) == ["default", "main"]
    assert arms["default"]["config"]["dropout_rng"] == "hash"  # "auto" on a CPU
    assert arms["default"]["config"]["attention_impl"] == "xla"
    assert arms["main"]["shape"]["vocab"] == 8000 and arms["default"]["shape"]["vocab"] == 30522
    base = arms["default"]["feeds"]["fixed"]["median_s"]
    for r in arms.values():
        assert r["speedup_over_first"] == pytest.approx(base / r["feeds"]["fixed"]["median_s"])
    # --pipeline=2: max(2, 2 // 2) timed bursts of 2 steps after the 1 + 2 blocked ones, each
    # a real update of the state
    for r in arms.values():
        x = r["feeds"]["pipelined"]
        assert x["steps_in_flight"] == 2 and r["updates"] == 1 + 2 + 2 * 2
        assert x["sequences_per_s"] == pytest.approx(8 / x["median_s"])
    torch = json.loads((out / "torch.json").read_text())["modes"]
    assert set(torch) == {"eager_all", "eager_masked"}
    assert torch["eager_all"]["pipelined"]["steps_in_flight"] == 2
    profile = json.loads((out / "profile.json").read_text())
    assert profile["kernel_ms_per_step"] == pytest.approx(
        sum(c["ms_per_step"] for c in profile["classes"].values())
    )
    assert profile["kernel_ms_per_step"] == pytest.approx(
        sum(b["ms_per_step"] for b in profile["by_duration"])
    )

    return arms, torch, profile


def _check_mt(out, stdout: str) -> None:
    mt = json.loads((out / "mt.json").read_text())
    step = mt["train"]["arms"]["8x16"]
    assert step["target_tokens_per_s"] == pytest.approx(
        step["target_tokens_per_step"] / (step["median_ms"] / 1e3)
    )
    assert mt["decode"]["sentences_per_s"] == pytest.approx(4 / mt["decode"]["median_s"])
    assert "- translation configs/mt.py:tiny train step 8x16 (float32)" in stdout


def _check_summary(out, stdout: str, arms: dict, torch: dict, profile: dict) -> None:
    """The summary's table and targets follow from the results they were made from."""
    summary = json.loads((out / "summary.json").read_text())
    table = {r["what"].split(" (")[0]: r for r in summary["rows"]}
    assert (
        table["ln_jax default"]["ms_per_step"] == arms["default"]["feeds"]["fixed"]["ms_per_step"]
    )
    assert table["HuggingFace PyTorch eager_all"]["sequences_per_s"] == pytest.approx(
        torch["eager_all"]["sequences_per_s"]
    )
    piped = table["ln_jax default, 2 steps in flight"]
    assert piped["ms_per_step"] == arms["default"]["feeds"]["pipelined"]["ms_per_step"]
    assert "HuggingFace PyTorch eager_masked, 2 steps in flight" in table
    assert summary["targets"]["pipelined_mfu_6nd"]["value"] == pytest.approx(
        arms["default"]["feeds"]["pipelined"]["mfu_6nd"]
    )
    # a GPU's targets are not judged on a CPU (its "peak" is a small measured matmul)
    assert summary["targets"]["mfu_6nd"]["met"] is None
    assert "mfu_6nd: " in stdout and "this ran on cpu: not judged" in stdout
    main_s = suite_report.main_job_step_s(str(out))
    ratio = summary["targets"]["main_job_over_fixed"]
    assert ratio["value"] == pytest.approx(main_s / arms["main"]["feeds"]["fixed"]["median_s"])
    assert ratio["met"] == (ratio["value"] <= 1.05)
    assert "main_job_over_fixed" in (out / "summary.md").read_text()
    # the main job's start, as train.log wrote it, with its first step's seconds
    log = (out / "main_job" / "train.log").read_text()
    (setup,) = [line.split("] ", 1)[1] for line in log.splitlines() if "] set up in " in line]
    assert f"- main job: {setup}; first step " in (out / "summary.md").read_text()
    assert (
        f"- its {profile['kernels_per_step']:.0f} kernels a step by duration: 0-5 us: "
        in (out / "summary.md").read_text()
    )
    # the host's launch of each blocked step: timed, and inside the step's own time
    launch = {n: r["feeds"]["fixed"]["launch_ms"] for n, r in arms.items()}
    assert all(
        0 < ms < r["feeds"]["fixed"]["p75_s"] * 1e3
        for ms, r in zip(launch.values(), arms.values(), strict=True)
    )
    assert (
        f"the device idles meanwhile): default {launch['default']:.1f}"
        in (out / "summary.md").read_text()
    )
    recipe = {n: r["feeds"]["fixed"]["median_s"] for n, r in arms.items() if n != "main"}
    assert summary["targets"]["fastest_recipe_arm"] == min(recipe, key=recipe.get)
    assert "| ln_jax default (xla, hash, V=30522) |" in stdout


def test_the_fastest_recipe_arm_keeps_the_recipes_dropout_activation_and_vocabulary():
    def arm(seconds, activation="gelu", attention_dropout=0.1, vocab=30522):
        config = {"hidden_dropout": 0.1, "attention_dropout": attention_dropout,
                  "activation": activation}  # fmt: skip
        return {"config": config, "shape": {"vocab": vocab},
                "feeds": {"fixed": {"median_s": seconds}}}  # fmt: skip

    arms = {"default": arm(0.073), "gelu_tanh": arm(0.060, activation="gelu_tanh"),
            "cudnn_nodrop": arm(0.065, attention_dropout=0.0), "main": arm(0.050, vocab=8000),
            "pallas": arm(0.077)}  # fmt: skip
    assert suite_report.fastest_recipe_arm(arms) == "default"
    del arms["default"]
    assert suite_report.fastest_recipe_arm(arms) == "pallas"
