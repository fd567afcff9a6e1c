"""bench/gpu/gpu_call.sh in its CPU mode: the suite's part (every step skipped: its CPU mode runs in
tests/test_accelerator_suite.py), then bench/gpu/gpu_mt_fig2.sh in its CPU mode (tiny shapes, 2
steps), in one results folder; the readout's figures follow from the runs' result.json files.

One study only, for the suite's time: on 2 loaded cores the fig2 part took 81 s, the liu part
(bench/gpu/gpu_mt_liu_depth.sh --cpu: Admin's profiling and a third compiled placement) 75 s
more. The readouts of both are tested on made-up study folders (tests/test_gpu_study_readout.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _results(study):
    runs = {}
    for name in os.listdir(study / "runs"):
        with open(study / "runs" / name / "result.json") as f:
            runs[name] = json.load(f)
    return runs


def _nll(result, step):
    (value,) = [v for s, v, _ in result["eval_curve"] if s == step]
    return value


def _rise(train):
    """The pre-registered early rise, written out again: trailing means of 5 logged losses."""
    losses = [v for s, v, _ in train if s <= 1000]
    means = [sum(losses[max(0, i - 4) : i + 1]) / len(losses[max(0, i - 4) : i + 1])
             for i in range(len(losses))]  # fmt: skip
    return max([0.0] + [m - min(means[:i]) for i, m in enumerate(means) if i])


@pytest.mark.slow
def test_the_call_runs_the_suite_then_the_fig2_study_and_reads_it_out(tmp_path):
    out, back = tmp_path / "call", tmp_path / "back"
    run = subprocess.run(
        ["bash", "bench/gpu/gpu_call.sh", "--cpu", f"--out={out}", f"--collect={back}",
         "--suite_skip=bench,profile,torch,mt,main_job", "--studies=fig2", "--budget=400"],
        cwd=ROOT, env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    status = (out / "status.txt").read_text().splitlines()
    assert [line.split(" (")[0] for line in status] == ["suite: rc=0", "fig2: rc=0"]

    fig2 = _results(out / "fig2" / "study")
    assert sorted(fig2) == [f"L1-{a}-s0" for a in ("post", "post_warmup", "pre", "pre_warmup")]
    assert all(r["steps"] == 2 and not r["diverged"] for r in fig2.values())
    read = json.loads((out / "fig2" / "readout.json").read_text())["seeds"]["0"]
    nll = {r["arm"]: _nll(r, 2) for r in fig2.values()}
    assert read["step"] == 2
    did = (nll["post"] - nll["post_warmup"]) - (nll["pre"] - nll["pre_warmup"])
    assert read["did"] == pytest.approx(did)
    for r in fig2.values():
        row = read["arms"][r["arm"]]
        assert row["early_rise"] == pytest.approx(_rise(r["train_curve"]))
        trace = r["monitor_traces"]["collapse/encoder/output"]
        assert row["collapse"] == [trace[0], trace[-1]] and trace[0][0] == 1
        assert row["evals"] == [[2, _nll(r, 2), r["bleu_curve"][-1][1]]]
    assert "DiD at step 2 = " in (out / "fig2" / "readout.txt").read_text()
    config = json.loads(
        (out / "fig2" / "study" / "runs" / "L1-post-s0" / "config.json").read_text()
    )
    assert config["model"]["init"] == "fairseq"  # the papers' code's, not configs/mt.py's xavier
    assert read["gate"]["step"] == 2 and not read["gate"]["passed"]  # 2 steps translate nothing
    assert read["verdict"].startswith("baseline fails the gate")

    text = (out / "readout.txt").read_text()
    assert text.startswith("Xiong Fig. 2 readout") and "Liu depth readout" not in text
    assert text in run.stdout
    # what travels back: results, readouts, logs; no checkpoints or caches
    assert (back / "fig2" / "readout.json").exists() and (back / "status.txt").exists()
    assert (back / "fig2" / "study" / "runs" / "L1-pre-s0" / "metrics.jsonl").exists()
    kept = {d for _, dirs, _ in os.walk(back) for d in dirs}
    assert not kept & {"checkpoints", "jax_cache", "jax_compilation", "tfds"}
