"""bench/speed/bench_mt_accel.py: its counted FLOPs (the formula of its docstring, checked against
XLA's own count of the same forward pass on the CPU, where XLA's cost analysis sees every dot),
and its CPU mode against HuggingFace Marian with both layers' layouts in flight."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from bench.speed import bench_mt_accel
from ln_jax import sharding
from ln_jax.models.translation.task import Translation


def test_counted_flops_match_xla_on_the_forward_pass():
    cfg = bench_mt_accel.build_config("configs/mt.py:tiny", "float32")
    rows, length = 2, 16
    with sharding.use_mesh(sharding.single_device_mesh()):
        model = Translation(cfg).build(nnx.Rngs(params=0))
        graphdef, state = nnx.split(model)
        ids = jnp.full((rows, length), 5, jnp.int32)
        mask = jnp.ones((rows, length), jnp.int32)

        def forward(state, src, mask, tgt):
            m = nnx.merge(graphdef, state)
            return m(src, mask, tgt)["logits"]

        cost = jax.jit(forward).lower(state, ids, mask, ids).compile().cost_analysis()
    xla = cost["flops"] if isinstance(cost, dict) else cost[0]["flops"]
    counted = bench_mt_accel.step_flops(cfg, rows, length) / 3.0
    # XLA also counts the softmaxes, norms and biases (a few % at this width), no more
    assert counted == pytest.approx(xla, rel=0.05)
    assert counted < xla


def test_both_layouts_in_flight_against_marian_and_the_reports_targets(tmp_path, monkeypatch):
    """The CPU mode of the translation bench's PyTorch anchor (issue 67 item 4): the config's
    layout ("auto": a list on a CPU) and the stacked one, 2 steps in flight, HuggingFace Marian
    (eager here; torch.compile on a GPU) on the same batch, ln_jax's search against Marian's
    generate on one model's weights; the targets follow from the timings, and the suite's
    report prints them (judged only on a GPU)."""
    from bench.gpu import suite_report

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # what --marian sets
    out = tmp_path / "mt.json"
    result = bench_mt_accel.main([
        "--config=configs/mt.py:tiny", "--batches=8x16", "--steps=2", "--warmup=1",
        "--sentences=4", "--max_length=8", "--rounds=1", "--layouts=auto,stacked",
        "--pipeline=2", "--marian=eager", "--decodes=marian", f"--out={out}",
    ])  # fmt: skip
    arms = result["train"]["arms"]
    assert list(arms) == ["8x16", "8x16 stacked", "marian_eager"]
    assert (arms["8x16"]["layout"], arms["8x16 stacked"]["layout"]) == ("list", "stacked")
    for r in arms.values():
        assert r["pipelined"]["steps_in_flight"] == 2
        assert r["target_tokens_per_s"] == pytest.approx(
            r["target_tokens_per_step"] / (r["median_ms"] / 1e3)
        )
    decode = result["marian_decode"]
    assert decode["same_tokens"] and decode["same_fraction"] == 1.0  # float32: the same search
    rate = decode["sentences_per_s"]
    assert decode["ratio"] == pytest.approx(rate["ln_jax"] / rate["hf_generate"])
    targets = result["targets"]
    mine, theirs = arms["8x16"], arms["marian_eager"]
    assert targets["mt_train_x_marian"]["value"] == pytest.approx(
        mine["target_tokens_per_s"] / theirs["target_tokens_per_s"]
    )
    assert targets["pipelined_mt_train_x_marian"]["anchor"] == "marian_eager"
    assert targets["mt_beam_x_generate"] == {
        "value": decode["ratio"], "target": 1.5, "anchor": "hf_generate"
    }  # fmt: skip
    saved = json.loads(out.read_text())
    assert saved["targets"] == targets and saved["platform"] == "cpu"

    verdict: dict = {}
    lines = "\n".join(suite_report.translation_lines(saved, verdict))
    assert "- translation HF Marian eager train step (float32): " in lines
    assert "train step 8x16 stacked (float32), layers stacked: " in lines
    assert "x HF Marian's generate (target 1.5, a GPU's; this ran on cpu: not judged)" in lines
    assert verdict["mt_beam_x_generate"]["met"] is None
    on_gpu: dict = {}
    suite_report.translation_lines({**saved, "platform": "gpu"}, on_gpu)
    value = targets["mt_train_x_marian"]["value"]
    assert on_gpu["mt_train_x_marian"]["met"] == (value >= 1.25)
