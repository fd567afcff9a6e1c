"""model.scan_layers / scan_unroll "auto" (issue 67 item 2): stacked layers on a GPU wherever
every feature of the config works stacked, a list elsewhere; the features alike either way
(the monitor's per-layer records, a translation workdir's parameters as a warm start); and a
workdir whose run began with its layers as a list resumes as a list under the new rule."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal

import jax
import numpy as np
import pytest
from flax import nnx

from bench.speed.bench_translate_hf import train_batch
from bench.speed.measure import make_batch
from configs import bert_preln, mt
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.nn.stack import relayout
from ln_jax.runtime import platforms
from ln_jax.task import make_task
from ln_jax.train import monitor, run_identity, steps, trainer
from tests.test_trainer import tiny_config, train_losses

pytest_plugins = ("tests.data_fixtures",)


def built(module, variant: str, on: str, **model) -> TrainConfig:
    """`module`'s variant with `model` overrides, its "auto" fields resolved as on `on`."""
    c = module.get_config(variant)
    c.model.update(model)
    c.compilation_cache = "off"
    with platforms.lowering_for(on):
        return TrainConfig.from_mapping(c.to_dict())


STACKABLE = [
    (bert_preln, "tiny", {}),
    (bert_preln, "base", {"placement": "post"}),
    (bert_preln, "tiny", {"placement": "admin"}),  # Admin's omega profiled stacked
    (mt, "iwslt", {}),
    (mt, "wmt_deep", {}),  # 18-18 Admin
]
NOT_STACKABLE = [  # the features a stacked model lacks
    (bert_preln, "tiny", {"placement": "post*1,pre*1"}),  # a per-layer placement list
    (bert_preln, "mini", {"placement": "mixln"}),
    (bert_preln, "tiny", {"dlcl": True}),
    (mt, "wang_deep", {}),  # Wang et al.'s 30-6 with DLCL
]


@pytest.mark.parametrize("module, variant, model", STACKABLE)
def test_auto_stacks_the_layers_on_a_gpu_and_keeps_a_list_on_a_cpu_or_tpu(module, variant, model):
    gpu = built(module, variant, "gpu", **model).model
    assert gpu.scan_layers is True
    assert gpu.scan_unroll == gpu.num_layers  # straight-line code: the arm the H200 measured
    assert {"scan_layers", "scan_unroll"} <= gpu.auto_chosen
    for on in ("cpu", "tpu"):
        other = built(module, variant, on, **model).model
        assert (other.scan_layers, other.scan_unroll) == (False, 1), on


@pytest.mark.parametrize("module, variant, model", NOT_STACKABLE)
def test_auto_keeps_a_list_on_a_gpu_for_a_feature_a_stacked_model_lacks(module, variant, model):
    gpu = built(module, variant, "gpu", **model).model
    assert (gpu.scan_layers, gpu.scan_unroll) == (False, 1)


def test_explicit_values_win_and_text_from_a_command_line_is_parsed():
    cfg = built(bert_preln, "tiny", "gpu", scan_layers="false").model
    assert (cfg.scan_layers, cfg.scan_unroll) == (False, 1)
    assert cfg.auto_chosen == {"scan_unroll"}
    cfg = built(bert_preln, "tiny", "cpu", scan_layers="true").model
    assert (cfg.scan_layers, cfg.scan_unroll) == (True, 2)
    cfg = built(bert_preln, "tiny", "gpu", scan_unroll="1").model
    assert (cfg.scan_layers, cfg.scan_unroll) == (True, 1)
    assert cfg.replace(hidden_dropout=0.0).auto_chosen == {"scan_layers"}  # kept by replace
    with pytest.raises(ValueError, match="model.scan_layers='yes': give True or False, or auto"):
        built(bert_preln, "tiny", "gpu", scan_layers="yes")


def test_a_decoder_deeper_than_its_encoder_is_straight_line_code_too():
    cfg = built(mt, "tiny", "gpu")
    options = dataclasses.replace(cfg.options, decoder_layers=5).resolved(cfg.model)
    decoder = options.decoder_config(cfg.model)
    assert (decoder.scan_layers, decoder.scan_unroll) == (True, 5)


# --------------------------------------------------------------------------- features alike


def _states(cfg: TrainConfig, mesh):
    """The list and the stacked train state of `cfg` (dropout off) with the same parameters."""
    cfgs = {"list": _layout(cfg, False), "stacked": _layout(cfg, True)}
    tasks = {name: make_task(c) for name, c in cfgs.items()}
    pieces = {name: steps.init_state(tasks[name], mesh) for name in cfgs}
    source = dict(nnx.to_flat_state(pieces["list"].state["params"]))
    params = pieces["stacked"].state["params"]
    wanted = [p for p, _ in nnx.to_flat_state(params)]
    values = relayout({p: v.get_value() for p, v in source.items()}, wanted)
    nnx.replace_by_pure_dict(params, _nested(values))
    return cfgs, pieces


def _layout(cfg: TrainConfig, scan: bool) -> TrainConfig:
    model = cfg.model.replace(
        scan_layers=scan, scan_unroll=cfg.model.num_layers if scan else 1, hidden_dropout=0.0,
        attention_dropout=0.0,
    )  # fmt: skip
    return dataclasses.replace(cfg, model=model, grad_accum_steps=1)


def _nested(flat: dict) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


@pytest.mark.parametrize("task", ["bert", "translation"])
def test_the_monitors_per_layer_records_are_the_same_stacked(task):
    if task == "bert":
        cfg = built(bert_preln, "tiny", "cpu", vocab_size=None)
        shape = dict(layers=2, d=128, heads=2, mlp=512, vocab=cfg.model.vocab_size, batch=4,
                     seq=32, predictions=4)  # fmt: skip
        batch = make_batch(shape)
    else:
        cfg = built(mt, "tiny", "cpu")
        batch = train_batch(4, 16, vocab=cfg.model.vocab_size)
    mesh = sharding.single_device_mesh()
    cfgs, pieces = _states(cfg, mesh)
    records = {}
    for name, p in pieces.items():
        task = make_task(cfgs[name])
        step = jax.jit(steps.make_train_step(cfgs[name], task, p.graphdef, measure=True))
        with sharding.use_mesh(mesh):
            _, metrics = step(p.state, p.rest, batch, steps.run_values(cfgs[name]))
        records[name] = monitor.named(jax.device_get(metrics["monitor"]))
        records[name]["loss"] = float(metrics["loss"])
    assert set(records["stacked"]) == set(records["list"])
    assert any(k.startswith("grad_norm/layer_01/") for k in records["list"])
    for key, value in records["list"].items():
        np.testing.assert_allclose(
            records["stacked"][key], value, rtol=2e-4, atol=1e-6, err_msg=key
        )


def test_relayout_stacks_a_list_and_slices_it_back():
    flat = {("enc", "layers", i, "w"): np.full((2, 3), i) for i in range(3)}
    flat[("emb",)] = np.ones(4)
    stacked = relayout(flat, [("enc", "layers", "w"), ("emb",)])
    assert stacked[("enc", "layers", "w")].shape == (3, 2, 3)
    assert relayout(stacked, list(flat)).keys() == flat.keys()
    np.testing.assert_array_equal(relayout(stacked, list(flat))[("enc", "layers", 2, "w")], 2)
    assert relayout(flat, [("dec", "layers", "w")]) == {}  # found in neither: left out


# --------------------------------------------------------------------------- resuming


@pytest.mark.slow
def test_a_workdir_begun_as_a_list_resumes_as_a_list_when_auto_would_stack(
    data_dir, tmp_path, caplog
):
    """A run begun before "auto" stacked the layers (its config.json: scan_layers false) goes
    on where it stopped under a config whose "auto" resolves to stacked (as on a GPU), and
    trains the same losses as the uninterrupted run; a fresh workdir gets the stacked layers;
    stacked asked for explicitly is still a mismatch."""
    common = {"total_steps": 4, "checkpoint_every": 0, "model.dtype": "float32",
              "model.attention_impl": "xla", "model.activation_layout": "xla",
              "compilation_cache": "off"}  # fmt: skip
    whole, old = str(tmp_path / "whole"), str(tmp_path / "old")
    trainer.train_and_evaluate(tiny_config(data_dir, **common), whole)

    def preempt_at_2(step, run):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the trainer: save, stop

    first = trainer.train_and_evaluate(tiny_config(data_dir, **common), old, hooks=[preempt_at_2])
    assert first["step"] == 2 and run_identity.read_config(old)["model"]["scan_layers"] is False
    with platforms.lowering_for("gpu"):  # "auto" resolves as on a GPU: stacked
        stacking = tiny_config(data_dir, **common)
    assert stacking.model.scan_layers is True
    with caplog.at_level(logging.INFO, logger="ln_jax.train.run_identity"):
        out = trainer.train_and_evaluate(stacking, old)  # no --accept_changes needed
    assert out["step"] == 4
    assert run_identity.read_config(old)["model"]["scan_layers"] is False
    assert train_losses(old) == pytest.approx(train_losses(whole), rel=1e-6)
    kept = "auto keeps the layers as the workdir's run has them: model.scan_layers=False"
    assert kept in caplog.text

    fresh = str(tmp_path / "fresh")
    trainer.train_and_evaluate(stacking, fresh)
    with open(os.path.join(fresh, "config.json")) as f:
        assert json.load(f)["model"]["scan_layers"] is True
    explicit = tiny_config(data_dir, **common, **{"model.scan_layers": True})
    with pytest.raises(run_identity.RunMismatchError, match="model.scan_layers"):
        trainer.train_and_evaluate(dataclasses.replace(explicit, total_steps=6), old)


def test_a_translation_warm_start_takes_parameters_of_the_other_layout():
    """`translation.init_from` a workdir trained with its layers as a list into a run whose
    "auto" stacks them (and back): every parameter arrives, in the model's layout."""
    from ln_jax.models.translation.task import Translation, _set_params

    models = {}
    with sharding.use_mesh(sharding.single_device_mesh()):
        for seed, scan in ((0, False), (1, True)):
            cfg = _layout(built(mt, "tiny", "cpu"), scan)
            models[scan] = Translation(cfg).build(nnx.Rngs(params=seed))
        flat = lambda m: {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}
        source = flat(models[False])
        _set_params(models[True], source, "workdirs/mt_tiny")
        stacked = flat(models[True])
    assert any(a.ndim == 3 for p, a in stacked.items() if "layers" in p)
    back = relayout(stacked, list(source))
    assert back.keys() == source.keys()
    for path, value in source.items():
        np.testing.assert_array_equal(back[path], value, err_msg=str(path))
