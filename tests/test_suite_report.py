"""bench/gpu/suite_report.py's targets from given result files: the PyTorch target is judged against
the like-for-like anchor (HuggingFace + torch.compile with MLM at the masked positions, issue
67), the every-position anchor printed beside it; the translation targets against Marian."""

from __future__ import annotations

import json

import pytest

from bench.gpu import suite_report


def _arm(ms: float, ms_in_flight: float, mfu: float, batch: int = 256) -> dict:
    config = {"attention_impl": "pallas", "dropout_rng": "hash", "hidden_dropout": 0.1,
              "attention_dropout": 0.1, "activation": "gelu"}  # fmt: skip
    feed = lambda t: {"ms_per_step": t, "median_s": t / 1e3, "sequences_per_s": batch / t * 1e3,
                      "mfu_6nd": mfu}  # fmt: skip
    return {"config": config, "shape": {"vocab": 30522, "batch": batch},
            "device": {"platform": "gpu"},
            "feeds": {"fixed": feed(ms), "pipelined": {**feed(ms_in_flight),
                                                       "steps_in_flight": 5}}}  # fmt: skip


def _mode(ms: float, ms_in_flight: float, batch: int = 256) -> dict:
    rate = lambda t: {"ms_per_step": t, "sequences_per_s": batch / t * 1e3}
    return {**rate(ms), "pipelined": {**rate(ms_in_flight), "steps_in_flight": 5}}


def _write(folder, arms: dict, modes: dict) -> None:
    (folder / "arms.json").write_text(json.dumps({"arms": arms}))
    (folder / "torch.json").write_text(json.dumps({"modes": modes}))


# The H200 of 2026-12-04 (ms a step, blocked / 5 in flight)
ARMS = {"default": _arm(56.2, 49.8, 0.398), "stacked": _arm(52.3, 49.4, 0.428)}
MODES = {"compile_all": _mode(61.6, 62.3), "compile_masked": _mode(53.8, 54.3)}


def test_the_torch_target_is_judged_against_the_masked_anchor_with_every_position_beside(
    tmp_path,
):
    _write(tmp_path, ARMS, MODES)
    summary = suite_report.main([str(tmp_path)])
    targets = summary["targets"]
    judged = targets["x_torch_compile"]
    assert judged["anchor"] == "compile_masked" and judged["target"] == 1.25
    assert judged["value"] == pytest.approx(53.8 / 56.2)  # 0.957: ln_jax's rate over HF's
    assert judged["met"] is False
    assert targets["pipelined_x_torch_compile"]["value"] == pytest.approx(54.3 / 49.8)  # 1.09
    assert targets["fastest_recipe_arm"] == "stacked"
    assert targets["fastest_recipe_arm_x_torch_compile"]["value"] == pytest.approx(53.8 / 52.3)
    assert targets["pipelined_fastest_recipe_arm_x_torch_compile"]["value"] == pytest.approx(
        54.3 / 49.4
    )
    beside = targets["x_torch_compile_all"]
    assert beside["anchor"] == "compile_all" and beside["target"] is None
    assert beside["met"] is None and beside["value"] == pytest.approx(61.6 / 56.2)  # 1.10
    text = (tmp_path / "summary.md").read_text()
    assert (
        "- x_torch_compile: 0.957 x HF + torch.compile, MLM at the masked positions "
        "(target 1.25): NOT met" in text
    )
    assert "- x_torch_compile_all: 1.096 x HF + torch.compile, MLM at every position" in text


def test_without_the_masked_mode_the_every_position_anchor_is_judged_and_named(tmp_path):
    _write(tmp_path, {"default": _arm(40.0, 40.0, 0.55)}, {"compile_all": _mode(61.6, 62.3)})
    targets = suite_report.main([str(tmp_path)])["targets"]
    assert targets["x_torch_compile"]["anchor"] == "compile_all"
    assert targets["x_torch_compile"]["met"] is True  # 1.54x
    assert "x_torch_compile_all" not in targets
    assert targets["mfu_6nd"]["met"] is True
