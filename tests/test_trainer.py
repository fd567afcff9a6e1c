"""The main job: configs, the sharded step, end-to-end training, resume, SIGTERM, NaN, errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import bert_postln, bert_preln
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.data import make_pipeline
from ln_jax.task import make_task
from ln_jax.train import loop, optim, steps, trainer
from ln_jax.train.setup import finish_setup, setup
from tests.xla_env import xla_flags

pytest_plugins = ("tests.data_fixtures",)
ROOT = Path(__file__).resolve().parents[1]


def tiny_config(data_dir: str, **overrides) -> TrainConfig:
    """`:tiny` on the shared prepared corpus, on the 2x2x2 mesh, with overrides."""
    c = bert_preln.get_config("tiny")
    c.data.data_dir = data_dir
    c.data.global_batch_size = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    c.eval_batches = 1
    c.log_every = 1
    c.monitor.every = 0  # tests/test_monitor.py turns the measurements on
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return TrainConfig.from_mapping(c.to_dict())


def read_metrics(workdir) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def train_losses(workdir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if r["split"] == "train"}


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("module", [bert_preln, bert_postln])
@pytest.mark.parametrize("variant", [None, "base", "mini", "tiny"])
def test_every_config_loads(module, variant):
    cfg = TrainConfig.from_mapping(module.get_config(variant).to_dict())
    assert cfg.optim.total_steps == cfg.total_steps
    assert cfg.model.vocab_size == cfg.data.vocab_size
    assert cfg.data.dataset == "ln_jax_pydocs"
    assert cfg.name.endswith(variant or "base")


def test_the_papers_recipes():
    pre = TrainConfig.from_mapping(bert_preln.get_config().to_dict())
    post = TrainConfig.from_mapping(bert_postln.get_config().to_dict())
    assert (pre.model.placement, pre.optim.schedule, pre.optim.peak_lr, pre.optim.warmup_steps) == (
        "pre",
        "linear_decay",
        3e-4,
        0,
    )
    assert (
        post.model.placement,
        post.optim.schedule,
        post.optim.peak_lr,
        post.optim.warmup_steps,
    ) == ("post", "warmup_linear_decay", 1e-4, 10_000)
    assert pre.model.size == "base" and pre.data.global_batch_size == 256
    mini = TrainConfig.from_mapping(bert_postln.get_config("mini").to_dict())
    assert mini.optim.warmup_steps == round(0.01 * mini.total_steps)


def test_misspelt_fields_name_the_closest():
    c = bert_preln.get_config("tiny").to_dict()
    c["model"]["placment"] = "post"
    with pytest.raises(ValueError, match="Did you mean 'placement'"):
        TrainConfig.from_mapping(c)
    c = bert_preln.get_config("tiny").to_dict()
    c["totl_steps"] = 3
    with pytest.raises(ValueError, match="Did you mean 'total_steps'"):
        TrainConfig.from_mapping(c)


def test_cli_rejects_a_misspelt_override():
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--config=configs/bert_preln.py:tiny",
            "--config.model.placment=post",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Did you mean 'model.placement'" in proc.stderr


def test_a_mesh_that_does_not_fit_says_both_numbers(data_dir):
    cfg = tiny_config(data_dir, **{"mesh.data": 3})
    with pytest.raises(ValueError, match="needs 12 devices but 8 are available"):
        setup(cfg)


# --------------------------------------------------------------------------- steps


def test_grad_accumulation_matches_one_big_batch(data_dir):
    base = dict(**{"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0})
    one = tiny_config(data_dir, **base)
    mesh = sharding.make_mesh(2, 2, 2)
    batch = next(make_pipeline(one.data, examples=one.options, split="train", seed=0, mesh=mesh)[0])
    weights = np.asarray(batch["masked_weights"]).reshape(2, 4, -1).sum(axis=(0, 2))
    assert len(set(weights.tolist())) > 1  # the 4 micro-batches mask different token counts
    results = []
    for accum in (1, 2, 4):
        cfg = tiny_config(data_dir, grad_accum_steps=accum, **base)
        task = make_task(cfg)
        pieces = steps.init_state(task, mesh)
        step = steps.in_mesh(steps.jit_steps(cfg, task, mesh, pieces)[0], mesh)
        results.append(step(pieces.state, pieces.rest, batch))
    (s1, m1), *others = results
    for s2, m2 in others:  # weighted by masked tokens: the big batch's loss, to round-off
        for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "grad_norm"):
            np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, err_msg=key)
        # Adam's first update is ~lr * sign(g): compare to 0.1% of the update's size.
        leaves = zip(jax.tree.leaves(s2["params"]), jax.tree.leaves(s1["params"]), strict=True)
        for new, ref in leaves:
            np.testing.assert_allclose(new, ref, rtol=0, atol=1e-3 * one.optim.peak_lr)
        assert int(s2["step"]) == 1


def test_choose_accumulation():
    from ln_jax.train.accumulation import choose_accumulation

    assert choose_accumulation(256, 4, fixed=10, temp=100, budget=1000) == 1
    assert choose_accumulation(256, 4, fixed=10, temp=100, budget=40) == 4
    # never below the mesh's batch divisor per micro-batch: 256/64 = 4 rows is the last option
    assert choose_accumulation(256, 4, fixed=10, temp=10**9, budget=40) == 64


def test_a_larger_accumulation_when_the_compiled_one_is_over_the_budget():
    from ln_jax.train.accumulation import larger_if_over

    assert larger_if_over(256, 4, accum=2, needed=50, budget=40) == 4
    assert larger_if_over(256, 4, accum=2, needed=40, budget=40) is None  # it fits
    assert larger_if_over(256, 4, accum=64, needed=50, budget=40) is None  # no more rows


@pytest.mark.parametrize("ahead", [True, False])
def test_auto_accumulation_grows_while_the_compiled_step_is_over_the_budget(
    data_dir, monkeypatch, ahead, fresh_programs
):
    """The probe (one micro-batch) estimates 2 micro-batches; the step compiled at 2 needs
    more than that estimate, so set-up compiles it at 4, which fits (as the trainer would
    have run out of memory where libtpu's compile for a v5e-1 needed 14.56 GiB against the
    estimate's 12.8: docs/tpu.md). Compiled ahead (a run) and lazily alike."""
    from ln_jax.train import accumulation

    needs = iter([(2**20, 40 * 2**20), (2**20, 30 * 2**20), (2**20, 15 * 2**20)])  # 1, 2, 4
    monkeypatch.setattr(accumulation, "device_memory_bytes", lambda device=None: 30 * 2**20)
    monkeypatch.setattr(accumulation, "step_memory", lambda compiled: next(needs))
    compiles: list[str] = []
    listen = _step_compiles(compiles)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        cfg = tiny_config(data_dir, grad_accum_steps=0, **{"data.global_batch_size": 16})
        run = setup(cfg, compile_ahead=ahead)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert run.cfg.grad_accum_steps == 4
    assert len(compiles) == 3, compiles  # the probe, the step at 2, the step at 4
    assert next(needs, None) is None


def _step_compiles(into: list[str]):
    """A jax.monitoring listener that appends the name of each train-step program compiled."""

    def listen(event: str, seconds: float, **kwargs) -> None:
        name = str(kwargs.get("fun_name", ""))
        if event == "/jax/core/compile/backend_compile_duration" and "step_fn" in name:
            into.append(name)

    return listen


def test_set_up_compiles_each_train_program_once_and_auto_accumulation_fits_it(
    data_dir, monkeypatch, fresh_programs
):
    from ln_jax.train import accumulation

    compiles: list[str] = []
    listen = _step_compiles(compiles)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        cfg = tiny_config(data_dir, grad_accum_steps=0, **{"monitor.every": 2})
        run = setup(cfg, wait=False)  # returns while the programs compile
        assert run.train_step is None and run.monitor_step is None and run.pending is not None
        run = finish_setup(run)
        assert run.pending is None and finish_setup(run) is run
        assert run.cfg.grad_accum_steps == 1  # tiny fits in 24 GiB at once
        # The auto accumulation's probe is the run's train step: two programs, not three.
        assert len(compiles) == 2, compiles
        batch = next(run.train_iter)
        run.state, _ = run.monitor_step(run.state, run.rest, batch)
        run.state, metrics = run.train_step(run.state, run.rest, batch)
        assert np.isfinite(float(metrics["loss"])) and int(run.state["step"]) == 2
        assert len(compiles) == 2, compiles  # the calls used what set-up compiled
        # A step of 1 MiB fixed + 100 MiB temporaries on a 30 MiB device: as many
        # micro-batches as the batch allows (8 rows over data x fsdp = 4 -> at most 2), and
        # the programs compiled again at 2.
        monkeypatch.setattr(accumulation, "device_memory_bytes", lambda device=None: 30 * 2**20)
        monkeypatch.setattr(accumulation, "step_memory", lambda compiled: (2**20, 100 * 2**20))
        del compiles[:]
        run = setup(tiny_config(data_dir, grad_accum_steps=0))  # monitor off
        assert run.cfg.grad_accum_steps == 2 and run.monitor_step is None
        run.state, _ = run.train_step(run.state, run.rest, batch)
        assert int(run.state["step"]) == 1
        # The probe at one micro-batch is the first set-up's train step, kept in the process
        # (`steps.program_key`: monitoring is not in it): only the step at 2 compiles.
        assert len(compiles) == 1, compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_evaluation_launches_its_batches_ahead_and_gets_the_same_metrics(data_dir, monkeypatch):
    """On one device (no lockstep) `evaluate` fetches the batches' outputs after launching
    them all; its metrics equal those of fetching each batch's output at once."""
    one = sharding.single_device_mesh()
    monkeypatch.setattr(sharding, "make_mesh", lambda *args, **kwargs: one)
    run = setup(tiny_config(data_dir, eval_batches=3), compile_ahead=False)
    assert not sharding.lockstep(run.mesh) and run.mesh.size == 1
    params = run.state["params"]
    fetched = [jax.device_get(run.eval_step(params, run.rest, b)) for b in run.eval_batches]
    assert len(fetched) == 3
    expected = run.task.eval_metrics(fetched)
    assert loop.evaluate(run) == expected
    assert 0 < expected["loss"] < 20


def test_shardings_and_fsdp_memory(data_dir):
    cfg = tiny_config(data_dir)
    run = setup(cfg, compile_ahead=False)
    for path, var in nnx.to_flat_state(run.state["params"]):
        want = sharding.param_spec(var.get_metadata()["out_sharding"], var[...].shape, run.mesh)
        assert var[...].sharding.is_equivalent_to(
            jax.sharding.NamedSharding(run.mesh, want), var[...].ndim
        ), path
    batch = next(run.train_iter)
    assert all(
        x.sharding.is_equivalent_to(sharding.batch_sharding(run.mesh), x.ndim)
        for x in batch.values()
    )
    # fsdp=8: each device holds ~1/8 of parameters + optimizer state.
    fsdp = tiny_config(data_dir, **{"mesh.data": 1, "mesh.fsdp": 8, "mesh.tensor": 1})
    state = steps.init_state(make_task(fsdp), sharding.make_mesh(1, 8, 1)).state
    tree = (state["params"], state["opt_state"])
    total = sum(x.nbytes for x in jax.tree.leaves(tree))
    held = sharding.bytes_per_device(tree)
    assert len(held) == 8
    assert max(held.values()) <= total / 8 * 1.05, (max(held.values()), total / 8)


# --------------------------------------------------------------------------- end to end


def test_train_end_to_end_on_8_devices(data_dir, tmp_path):
    cfg = tiny_config(data_dir, total_steps=16, eval_every=8, **{"optim.peak_lr": 1e-3})
    result = trainer.train_and_evaluate(cfg, str(tmp_path))
    records = read_metrics(tmp_path)
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train] == list(range(1, 17))
    assert [r["step"] for r in evals] == [8, 16]
    for r in train:
        assert {"loss", "learning_rate", "grad_norm", "mlm_accuracy", "tokens_per_s"} <= set(r)
        assert not any(k.startswith(("grad_norm/", "collapse/")) for k in r)
    assert {r["split"] for r in records} == {"train", "eval"}  # monitoring off: no "monitor"
    np.testing.assert_allclose(train[0]["learning_rate"], 1e-3)  # no warm-up: peak at step 0
    first, last = np.mean([r["loss"] for r in train[:3]]), np.mean([r["loss"] for r in train[-3:]])
    assert last < first - 0.5, (first, last)
    assert evals[-1]["mlm_loss"] < evals[0]["mlm_loss"] + 0.5
    assert result["step"] == 16 and result["eval"]["loss"] == evals[-1]["loss"]
    assert list((tmp_path / "tensorboard").iterdir())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [
        "16"
    ]


def test_interrupted_and_resumed_equals_uninterrupted(data_dir, tmp_path):
    cfg = tiny_config(data_dir, total_steps=6, checkpoint_every=0)
    ready = []  # on 8 CPU devices the loop waits for each step (`sharding.lockstep`: running
    # ahead deadlocks XLA:CPU's collectives), so a hook sees a finished state

    def note_ready(step, run):
        ready.append(all(x.is_ready() for x in jax.tree.leaves(run.state)))

    trainer.train_and_evaluate(cfg, str(tmp_path / "straight"), hooks=[note_ready])
    assert ready == [True] * 6
    assert not sharding.lockstep(sharding.single_device_mesh())

    def preempt_at_3(step, run):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the trainer: save, stop

    first = trainer.train_and_evaluate(cfg, str(tmp_path / "split"), hooks=[preempt_at_3])
    assert first["preempted"] and first["step"] == 3
    assert (tmp_path / "split" / "checkpoints" / "3").exists()
    second = trainer.train_and_evaluate(cfg, str(tmp_path / "split"))
    assert second["step"] == 6 and not second["preempted"]
    straight, split = train_losses(tmp_path / "straight"), train_losses(tmp_path / "split")
    assert list(split) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(
        [split[s] for s in range(1, 7)], [straight[s] for s in range(1, 7)], rtol=1e-6
    )


def test_a_stop_saves_before_its_evaluation_and_a_rerun_makes_up_a_cut_one(
    data_dir, tmp_path, monkeypatch
):
    """A preemption's grace period may end during the evaluation of the step it stops at: the
    checkpoint is written first, and the rerun evaluates that step before going on; a cut
    final evaluation is made up by a rerun that trains nothing. The records are then those of
    an uninterrupted run (fails if the save follows the evaluation, or if a rerun skips it)."""
    cfg = tiny_config(data_dir, total_steps=6, checkpoint_every=0, eval_every=3)
    trainer.train_and_evaluate(cfg, str(tmp_path / "straight"))
    cut, real_evaluate = [], loop.evaluate

    def evaluate_unless_cut(run):
        if cut:
            raise TimeoutError(f"the grace period ended in the evaluation of step {cut.pop()}")
        return real_evaluate(run)

    def preempt_at(at):
        def hook(step, run):
            if step == at:
                cut.append(step)
                os.kill(os.getpid(), signal.SIGTERM)

        return hook

    monkeypatch.setattr(loop, "evaluate", evaluate_unless_cut)
    workdir, steps = tmp_path / "split", []
    for at in (3, 6):
        with pytest.raises(TimeoutError, match=f"step {at}"):
            trainer.train_and_evaluate(cfg, str(workdir), hooks=[preempt_at(at)])
        steps.append(sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()))
    assert steps == [[3], [3, 6]]
    trained = train_losses(workdir)
    last = trainer.train_and_evaluate(cfg, str(workdir))
    assert last["step"] == 6 and loop.eval_line(last).startswith("final eval at step 6:")
    assert train_losses(workdir) == trained  # nothing trained again
    evals = lambda w: [(r["step"], r["loss"]) for r in read_metrics(w) if r["split"] == "eval"]  # noqa: E731
    got, want = evals(workdir), evals(tmp_path / "straight")
    assert [s for s, _ in got] == [3, 6] == [s for s, _ in want]
    np.testing.assert_allclose([x for _, x in got], [x for _, x in want], rtol=1e-6)


def test_nan_policy_skip_drops_the_update_and_goes_on(data_dir, tmp_path, caplog):
    # The "stop" policy is tested in test_run_trust.py (exact step, checkpoint kept).
    skip = tiny_config(
        data_dir, total_steps=8, nan_policy="skip", **{"optim.peak_lr": 1e6, "optim.clip_norm": 0.0}
    )
    last = {}
    keep_last = lambda step, run: last.update(params=run.state["params"])
    result = trainer.train_and_evaluate(skip, str(tmp_path / "skip"), hooks=[keep_last])
    assert result["step"] == 8
    records = [r for r in read_metrics(tmp_path / "skip") if r["split"] == "train"]
    dropped = [r["step"] for r in records if not r["finite"]]
    assert dropped
    # Every step is recorded (log_every=1): the count is the dropped steps up to each step.
    assert [r["skipped_updates"] for r in records] == [
        sum(d <= r["step"] for d in dropped) for r in records
    ]
    warnings = [r.getMessage() for r in caplog.records if "nan_policy=skip" in r.getMessage()]
    assert len(warnings) == len(set(dropped)) and f"{len(dropped)} update(s)" in warnings[-1]
    # The non-finite updates were dropped: the parameters stayed finite.
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(last["params"]))


def test_a_skipped_update_leaves_the_schedule_on_the_trainer_s_step(data_dir):
    """The update after a skipped one uses the learning rate of its own step, the one the
    metrics report, not that of optax's count (which counts applied updates only)."""
    overrides = {"optim.optimizer": "sgd", "optim.momentum": 0.0, "optim.clip_norm": 0.0}
    overrides |= {"optim.peak_lr": 0.5}  # updates far above float32 rounding of the weights
    overrides |= {"optim.schedule": "warmup_linear_decay", "optim.warmup_steps": 4}
    no_dropout = {"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0}
    cfg = tiny_config(data_dir, nan_policy="skip", **overrides, **no_dropout)
    mesh = sharding.make_mesh(2, 2, 2)
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    batch = next(iter(task.pipelines(mesh)[0]))
    poisoned = {**batch, "masked_weights": jnp.full_like(batch["masked_weights"], jnp.nan)}
    step = steps.jit_train_step(cfg, task, mesh, pieces)

    def run(batches):
        state = jax.tree.map(jnp.copy, pieces.state)  # the step donates it
        with sharding.use_mesh(mesh):
            for b in batches:
                state, metrics = step(state, pieces.rest, b)
        after, before, metrics = jax.device_get((state["params"], pieces.state["params"], metrics))
        return jax.tree.map(np.subtract, after, before), metrics  # on the host

    # Warm-up: lr(k) = peak * k / 4, so lr(0) = 0 and optax's count would stay on it.
    once, m_once = run([poisoned, batch])  # step 0 dropped, update at step 1: -lr(1) * g
    twice, m_twice = run([poisoned, poisoned, batch])  # update at step 2: -lr(2) * g
    lr = optim.make_schedule(cfg.optim)
    assert (m_once["learning_rate"], m_twice["learning_rate"]) == (lr(1), lr(2))
    assert bool(m_once["finite"]) and bool(m_twice["finite"])
    assert (int(m_once["skipped_updates"]), int(m_twice["skipped_updates"])) == (1, 2)
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(once)) > 0
    # Without dropout, both updates see the same gradient g; lr(2) = 2 lr(1).
    ratio = lambda a, b: np.testing.assert_allclose(a, 2 * b, rtol=1e-4, atol=1e-6)
    jax.tree.map(ratio, twice, once)


def test_corrupt_checkpoint_names_its_path_and_can_fall_back(data_dir, tmp_path):
    # 6 steps: the train step the resume tests compile (shared through the compilation cache).
    cfg = tiny_config(data_dir, total_steps=6, checkpoint_every=1)

    def preempt_at_2(step, run):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert trainer.train_and_evaluate(cfg, str(tmp_path), hooks=[preempt_at_2])["step"] == 2
    for f in (tmp_path / "checkpoints" / "2" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(trainer.CheckpointError, match=str(tmp_path / "checkpoints" / "2")):
        trainer.train_and_evaluate(cfg, str(tmp_path))
    fallback = tiny_config(
        data_dir, total_steps=6, checkpoint_every=1, **{"checkpoint.fallback": True}
    )
    result = trainer.train_and_evaluate(fallback, str(tmp_path), accept_changes=True)
    assert result["step"] == 6
    assert (tmp_path / "checkpoints" / "corrupt_2").is_dir()
    assert read_metrics(tmp_path)[-1]["step"] == 6


def test_sigterm_saves_and_exits_zero(data_dir, tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": xla_flags(1),
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "--config=configs/bert_preln.py:tiny",
            f"--config.data.data_dir={data_dir}",
            "--config.total_steps=100000",
            "--config.log_every=1",
            "--config.monitor.every=0",
            "--config.checkpoint_every=0",
            f"--workdir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    steps = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(steps) == 1 and steps[0] >= 1
    assert jnp.isfinite(read_metrics(tmp_path)[-1]["loss"])
    # Library logs (orbax's ~50 INFO lines per save) go to train.log, not over the progress line.
    assert "checkpoint_manager.py" not in out and "I1" not in out, out[-3000:]
    assert "checkpoint_manager.py" in (tmp_path / "train.log").read_text()
    assert f"SIGTERM: saved step {steps[0]}" in out
    assert out.index("SIGTERM: saving after this step") < out.index("SIGTERM: saved step")
    assert out.count("saving") + out.count("saved step") == 2, out[-2000:]  # each said once


def test_a_workdir_trained_by_a_live_process_is_refused_and_kept(data_dir, tmp_path):
    """Two runs on one workdir: the second is refused (naming the holder) and writes nothing;
    once the holder is gone its stale lock is taken over and released at the end."""
    import subprocess
    import sys

    from ln_jax.train.workdir_lock import LOCK_FILE, RunLockedError

    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = workdir / LOCK_FILE
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock.write_text(str(holder.pid))
        with pytest.raises(RunLockedError, match=f"process {holder.pid}"):
            trainer.train_and_evaluate(tiny_config(data_dir, total_steps=2), str(workdir))
        assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE]
        assert lock.read_text() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    result = trainer.train_and_evaluate(tiny_config(data_dir, total_steps=2), str(workdir))
    assert result["step"] == 2 and not lock.exists()


# --------------------------------------------------------------------------- optional task hooks


def _warm_toy_class():
    from tests.toy_task import ToyRegression

    class WarmToy(ToyRegression):
        """The toy with a warm start (its head predicting 3 everywhere) and a result record."""

        calls: list = []

        def initialize(self, model) -> bool:
            WarmToy.calls.append(self.cfg.seed)
            model.head.kernel[...] = model.head.kernel[...] * 0.0
            model.head.bias[...] = model.head.bias[...] * 0.0 + 3.0
            return True

        def run_result(self, evals) -> dict:
            return {"evals": len(evals), "best_mse": min(r["mse"] for r in evals)}

        def eval_description(self) -> str:
            return "scoring the toy's 4 points"

    return WarmToy


WarmToy = _warm_toy_class()


def test_a_warm_start_runs_on_a_fresh_run_only_and_the_result_is_recorded_once(tmp_path, capsys):
    from tests.test_task import records, toy_config

    cfg = toy_config(task="tests.test_trainer:WarmToy", steps_per_epoch=4)
    WarmToy.calls.clear()

    def preempt_at_5(step, run):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    first = trainer.train_and_evaluate(cfg, str(tmp_path), hooks=[preempt_at_5])
    assert first["preempted"] and first["step"] == 5 and not first["result"]
    second = trainer.train_and_evaluate(cfg, str(tmp_path))
    assert WarmToy.calls == [0]  # the resumed run restored its parameters instead
    recs = records(tmp_path)
    train = {r["step"]: r["mse"] for r in recs if r["split"] == "train"}
    assert train[1] > 5.0  # predictions of 3 against targets in [-1, 1]: the warm start held
    assert [(r["step"], r["epoch"]) for r in recs if r["split"] == "eval"] == [(4, 1), (8, 2)]
    results = [r for r in recs if r["split"] == "result"]
    assert len(results) == 1 and results[0]["evals"] == 2 and results[0]["step"] == 8
    assert second["result"] == results[0]
    third = trainer.train_and_evaluate(cfg, str(tmp_path))  # finished: read back, not rerun
    assert third["already_done"] and third["result"] == results[0]
    assert records(tmp_path) == recs
    # A task's eval_description: a line before each evaluation and its time after (scoring
    # translation's BLEU printed nothing for 35 s).
    lines = capsys.readouterr().out.splitlines()
    shown = [line for line in lines if line.startswith(("step 4: ", "step 8: "))]
    assert [line.split(": ", 1)[1].split(" in ")[0] for line in shown] == [
        "scoring the toy's 4 points ...", "evaluated", "scoring the toy's 4 points ...",
        "evaluated",
    ]  # fmt: skip
    assert all(re.fullmatch(r"step \d: evaluated in \d+\.\d s", s) for s in shown[1::2])
