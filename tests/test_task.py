"""The task boundary (ln_jax/task.py): a model family defined only in a test file
(tests/toy_task.py) trains, accumulates, measures, evaluates and checkpoints on ln_jax's one
trainer through the public protocol, with no change to ln_jax."""

from __future__ import annotations

import json
import os
import signal

import jax
import numpy as np
import pytest

from ln_jax.config.load import build_config, load_config, override
from ln_jax.task import TASKS, make_task
from ln_jax.train import trainer

TOY = "tests.toy_task:ToyRegression"


class NotATask:
    name = "half"

    def __init__(self, cfg):
        self.cfg = cfg


def toy_config(**extra):
    """The toy's own config (tests/toy_config.py: no BERT recipe) with `extra` overrides."""
    return build_config(override(load_config("tests/toy_config.py"), extra))


def records(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def final_params(workdir) -> list[np.ndarray]:
    from ln_jax import sharding
    from ln_jax.train import steps
    from ln_jax.train.checkpoint import Checkpointer

    cfg = toy_config()
    mesh = sharding.make_mesh(2, 2, 2)
    ckpt = Checkpointer(str(workdir / "checkpoints"), cfg.checkpoint)
    try:
        _, state, _ = ckpt.restore(steps.abstract_state(make_task(cfg), mesh).state)
    finally:
        ckpt.close()
    return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """The toy trained 8 steps in one micro-batch, and in two micro-batches stopped after 4
    steps and resumed (on a 2x2x2 mesh)."""
    base = tmp_path_factory.mktemp("toy")
    whole, split = base / "whole", base / "split"
    trainer.train_and_evaluate(toy_config(), str(whole))

    def preempt_at_5(step, run):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer saves step 5 and stops

    accumulated = toy_config(grad_accum_steps=2)
    first = trainer.train_and_evaluate(accumulated, str(split), hooks=[preempt_at_5])
    assert first["preempted"] and first["step"] == 5
    trainer.train_and_evaluate(accumulated, str(split))
    return whole, split


def test_a_family_defined_in_a_test_file_trains_measures_and_evaluates(toy_runs):
    whole, _ = toy_runs
    recs = records(whole)
    train = [r for r in recs if r["split"] == "train"]
    assert train[-1]["mse"] < 0.7 * train[0]["mse"], train  # it learns (0.172 -> 0.095)
    evals = [r for r in recs if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [4, 8] and evals[1]["mse"] < evals[0]["mse"]
    assert evals[1]["correlation"] > evals[0]["correlation"] > 0  # reduced by the task itself
    measured = [r for r in recs if r["split"] == "monitor"]
    assert {r["step"] for r in measured} >= {1, 2, 4, 8}
    for r in measured:  # its own measures, named per layer by the generic monitor
        assert set(r) >= {"grad_norm/layer_00", "grad_norm/layer_01", "stream_rms/layer_01"}
        assert all(r[k] > 0 for k in ("grad_norm/layer_00", "stream_rms/layer_00"))
    assert sorted(p.name for p in (whole / "checkpoints").iterdir() if p.name.isdigit()) == [
        "4",
        "8",
    ]


def test_its_accumulation_and_resume_equal_one_uninterrupted_big_batch(toy_runs):
    """Two micro-batches with uneven weights (the task's normalizers) and a SIGTERM after
    step 5 (the task's data state saved and restored) give the parameters of eight
    uninterrupted one-micro-batch steps."""
    whole, split = toy_runs
    for a, b in zip(final_params(whole), final_params(split), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    first = {r["step"]: r["loss"] for r in records(whole) if r["split"] == "train"}
    second = {r["step"]: r["loss"] for r in records(split) if r["split"] == "train"}
    for step in (2, 4, 6, 8):
        assert second[step] == pytest.approx(first[step], rel=1e-5)


def test_a_task_is_named_or_imported_and_errors_say_what_is_wrong():
    assert TASKS["bert_pretraining"].endswith(":BertPretraining")
    assert make_task(toy_config()).name == "toy_regression"
    with pytest.raises(Exception, match="unknown task 'nope': give one of bert_pretraining"):
        toy_config(task="nope")
    with pytest.raises(Exception, match="cannot import 'tests.toy_task:Missing'"):
        toy_config(task="tests.toy_task:Missing")
    cfg = toy_config()
    import dataclasses

    with pytest.raises(ValueError, match="is not a Task: it lacks"):
        make_task(dataclasses.replace(cfg, task="tests.test_task:NotATask", options=None))


def test_the_toy_s_own_config_section_is_its_file_s(tmp_path):
    """The toy declares its fields (tests/toy_task.py's `ToyOptions`, section "toy"): set on
    the command line's way, typed, checked and recorded under its name, with no edit to ln_jax."""
    from tests.toy_task import ToyOptions

    assert toy_config().options == ToyOptions()
    values = load_config("tests/toy_config.py")
    cfg = build_config(override(values, {"toy.length": "6", "model.hidden_size": 16}))
    assert cfg.options == ToyOptions(length=6) and cfg.to_dict()["toy"] == {"length": 6}
    from ln_jax import sharding

    assert make_task(cfg).abstract_batch(sharding.single_device_mesh())["x"].shape[1] == 6
    with pytest.raises(Exception, match="unknown toy field 'lenght'.*'length'"):
        build_config({**values, "toy": {"lenght": 3}})
    with pytest.raises(Exception, match="toy.length=0 must be positive"):
        build_config({**values, "toy": {"length": 0}})
