"""Training-time measurements (ln_jax.train.monitor), early warnings and their plots.

One monitored 6-step run (the 6-step tiny train config of tests/test_trainer.py, monitoring on)
is shared by the tests of the records, the warnings, the kept checkpoint and the plots.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ln_jax import sharding
from ln_jax.analysis import training
from ln_jax.config.run import MonitorConfig
from ln_jax.data import make_pipeline
from ln_jax.models.bert.model import encoder_view
from ln_jax.task import make_task
from ln_jax.train import monitor, steps, trainer
from ln_jax.train.early_warning import EarlyWarning
from tests.test_trainer import read_metrics, tiny_config

pytest_plugins = ("tests.data_fixtures",)
SPIKE_AFTER = 4  # the hook scales the word embeddings after this step: step 5's loss spikes


def monitored_config(data_dir, **overrides):
    return tiny_config(data_dir, total_steps=6, **{"monitor.every": 1, **overrides})


# --------------------------------------------------------------------------- measures


def test_measurements_are_on_at_the_logging_cadence_by_default(data_dir):
    from configs import bert_preln
    from ln_jax.config.run import TrainConfig

    cfg = TrainConfig.from_mapping(bert_preln.get_config("mini").to_dict())
    assert cfg.monitor.every is None and cfg.monitor_every == cfg.log_every == 10
    assert tiny_config(data_dir).monitor_every == 0  # the other tests' runs measure nothing


def test_collapse_is_1_for_identical_rows_and_0_for_orthogonal_rows():
    rng = np.random.default_rng(0)
    row = rng.normal(size=16)
    same = np.tile(3.0 * row, (6, 1))
    orthogonal, _ = np.linalg.qr(rng.normal(size=(16, 6)))  # 6 orthonormal columns
    x = jnp.asarray(np.stack([same, orthogonal.T]), jnp.float32)  # [2, 6, 16]
    mask = jnp.ones((2, 6))
    np.testing.assert_allclose(monitor.mean_pairwise_cosine(x, mask), [1.0, 0.0], atol=1e-5)
    # Padded positions do not count: rows 4-5 replaced by noise, masked out.
    noisy = x.at[:, 4:].set(jnp.asarray(rng.normal(size=(2, 2, 16)), jnp.float32))
    masked = jnp.ones((2, 6)).at[:, 4:].set(0)
    np.testing.assert_allclose(monitor.mean_pairwise_cosine(noisy, masked), [1.0, 0.0], atol=1e-5)


def test_dyt_alpha_is_read_per_layer_and_sublayer():
    from flax import nnx

    import ln_jax

    cfg = ln_jax.model_config("tiny", placement="pre,dyt,dyt", num_layers=3, vocab_size=50)
    model = ln_jax.create_model(cfg, seed=0)
    model.bert.encoder.layers[2].ffn.pre_norm.alpha[...] = jnp.array([0.7])
    params = nnx.state(model, nnx.Param)
    zeros = jax.tree.map(jnp.zeros_like, params)
    view = encoder_view(cfg)
    named = monitor.named(monitor.parameter_stats(zeros, zeros, params, view))
    alphas = {k: round(v, 6) for k, v in named.items() if k.startswith("dyt_alpha/")}
    assert alphas == {  # layer 0 is Pre-LN: no alpha, left out
        "dyt_alpha/layer_01/attention": 0.5,
        "dyt_alpha/layer_01/ffn": 0.5,
        "dyt_alpha/layer_02/attention": 0.5,
        "dyt_alpha/layer_02/ffn": 0.7,
    }


def test_a_forced_spike_warns_and_names_the_layer():
    watch = EarlyWarning(MonitorConfig(window=5))
    calm = {"loss": 7.0, "grad_norm": 1.0, "grad_norm/layer_02/ffn": 0.1, "collapse/layer_01": 0.5}
    for step, wiggle in enumerate((0.01, -0.02, 0.0, 0.015), start=1):
        values = {k: v * (1 + wiggle) for k, v in calm.items()}
        assert watch.check(step, values) == []
    spike = {**calm, "loss": 9.0, "grad_norm/layer_02/ffn": 5.0, "collapse/layer_01": 0.995}
    alerts = {a.rule: a for a in watch.check(5, spike)}
    assert set(alerts) == {"loss_spike", "grad_jump", "collapse"}
    assert alerts["grad_jump"].measurement == "grad_norm/layer_02/ffn"
    assert alerts["grad_jump"].layer == 2 and "in layer 2" in alerts["grad_jump"].message
    assert alerts["collapse"].layer == 1 and "collapse/layer_01" in alerts["collapse"].message
    # The spikes are warnings (a new high of the gradient norm); a collapse that begins is a note.
    levels = {rule: a.level for rule, a in alerts.items()}
    assert levels == {"loss_spike": "warning", "grad_jump": "warning", "collapse": "note"}
    assert watch.episode_start  # the warnings start an episode (the checkpoint before is kept)
    again = {a.rule: a.level for a in watch.check(6, spike)}
    # One collapse note per crossing; the same gradient norm again is no new high: a note.
    assert again == {"loss_spike": "warning", "grad_jump": "note"}


# --------------------------------------------------------------------------- in a run


@pytest.fixture(scope="module")
def monitored_run(data_dir, tmp_path_factory):
    """A 6-step monitored run whose word embeddings are scaled x30 after step 4."""
    workdir = tmp_path_factory.mktemp("monitored")
    cfg = monitored_config(data_dir, checkpoint_every=2, **{"checkpoint.keep": 1})

    def spike(step, run):
        if step == SPIKE_AFTER:
            word = run.state["params"]["bert"]["embeddings"]["word"]
            word[...] = word[...] * 30.0

    trainer.train_and_evaluate(cfg, str(workdir), hooks=[spike])
    return workdir, read_metrics(workdir)


def test_measurements_are_logged_with_readable_names(monitored_run):
    _, records = monitored_run
    measured = [r for r in records if r["split"] == "monitor"]
    assert [r["step"] for r in measured] == list(range(1, 7))
    names = set(measured[0])
    for layer in ("00", "01"):
        for part in ("attention", "ffn"):
            for measure in ("grad_norm", "update_ratio", "stream_rms", "branch_rms"):
                assert f"{measure}/layer_{layer}/{part}" in names
            assert f"norm_in_rms/layer_{layer}/{part}/pre_norm" in names  # Pre-LN
        assert {f"collapse/layer_{layer}", f"attention_entropy/layer_{layer}"} <= names
    assert "collapse/output" in names
    first = measured[0]
    assert 0 < first["attention_entropy/layer_00"] <= np.log(128) + 1e-4
    assert -1 <= first["collapse/layer_01"] <= 1


def test_sublayer_grad_norms_equal_a_separate_grad(data_dir, monitored_run):
    """Step 1's logged norms against jax.grad of the same loss on the same batch and key."""
    _, records = monitored_run
    logged = next(r for r in records if r["split"] == "monitor" and r["step"] == 1)
    cfg = monitored_config(data_dir)
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    batches, _ = make_pipeline(
        cfg.data, examples=cfg.options, split="train", seed=cfg.data.seed, mesh=mesh
    )
    batch = next(batches)
    batches.close()
    normalizers = task.normalizers(batch)
    loss = lambda p: steps._forward(
        pieces.graphdef, p, pieces.rest, batch, steps.dropout_key(cfg, 0), task, normalizers
    )[0]
    with sharding.use_mesh(mesh):
        grads = jax.jit(jax.grad(loss))(pieces.state["params"])
    layers = grads["bert"]["encoder"]["layers"]
    for i in range(cfg.model.num_layers):
        for part in ("attention", "ffn"):
            leaves = jax.tree.leaves(layers[i][part])
            expected = float(np.sqrt(sum(float(jnp.sum(jnp.square(g))) for g in leaves)))
            np.testing.assert_allclose(logged[f"grad_norm/layer_{i:02d}/{part}"], expected, 1e-4)


def test_the_spike_warns_and_keeps_the_checkpoint_before_it(monitored_run):
    workdir, records = monitored_run
    spike = [r for r in records if r["split"] == "warning/loss_spike"]
    assert spike[0]["step"] == SPIKE_AFTER + 1  # and on, while the loss stays high
    assert "loss spike at step 5" in spike[0]["message"]
    assert "checkpoint 4 is kept" in spike[0]["message"]
    kept = sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == ["4", "6"]  # keep=1 would have deleted 4
    assert json.loads((workdir / "checkpoints" / "kept_steps.json").read_text()) == [4]


def test_a_note_goes_to_metrics_and_train_log_never_to_the_terminal(data_dir, tmp_path, capfd):
    """Every layer above a (tiny) collapse threshold from step 1: a collapse note, no warning
    (it would have to last 1000 steps; the spike rules are off)."""
    import logging

    from ln_jax import console

    quiet = {"monitor.loss_spike": 0.0, "monitor.grad_jump": 0.0, "monitor.collapse_steps": 1000}
    settings = {"total_steps": 3, "monitor.every": 1, "monitor.collapse": 1e-6, **quiet}
    cfg = tiny_config(data_dir, **settings)
    workdir, log_file = tmp_path / "run", tmp_path / "train.log"
    console.configure_logging(str(log_file))
    try:
        trainer.train_and_evaluate(cfg, str(workdir))
        control = "control: an ln_jax warning reaches the terminal"
        logging.getLogger("ln_jax.train.trainer").warning(control)
    finally:
        console.close_logging()
    records = read_metrics(workdir)
    notes = [r for r in records if r["split"].startswith("note/")]
    assert [(r["split"], r["step"]) for r in notes] == [("note/collapse", 1)], notes
    assert notes[0]["message"].startswith("rank collapse begins at step 1")
    assert not [r for r in records if r["split"].startswith("warning/")]
    logged = log_file.read_text()
    assert "early-warning note: rank collapse begins at step 1" in logged
    terminal = capfd.readouterr()
    shown = terminal.out + terminal.err
    assert control in shown  # the terminal was captured
    assert "rank collapse" not in shown and "note" not in shown.lower(), shown


def test_plots_show_the_logged_values(monitored_run, tmp_path):
    workdir, records = monitored_run
    out = tmp_path / "plots"
    assert training.main([str(workdir), f"--out={out}", "--measures=grad_norm,collapse"]) == 0
    data = json.loads((out / "monitor.json").read_text())
    run = data["runs"][workdir.name]
    heat = run["grad_norm/ffn"]
    assert heat["steps"] == list(range(1, 7)) and heat["layers"] == [0, 1]
    measured = {r["step"]: r for r in records if r["split"] == "monitor"}
    expected = [
        [measured[s][f"grad_norm/layer_{i:02d}/ffn"] for s in heat["steps"]] for i in (0, 1)
    ]
    np.testing.assert_allclose(heat["values"], expected, rtol=1e-6)
    names = {p.name for p in out.iterdir()}
    assert {"grad_norm_heatmap.png", "grad_norm_layers.png", "collapse_heatmap.png"} <= names
    assert "gradients_by_layer.png" in names  # Xiong Fig. 3 across training
