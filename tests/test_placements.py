"""Placements beyond Table 1: Admin, DeepNorm, sandwich, ReZero, RMSNorm, DLCL, per-layer lists."""

from __future__ import annotations

import json
import math
import os
import signal

import jax
import numpy as np
import pytest
from flax import nnx

import ln_jax
from ln_jax.models.bert.fold import fold_admin
from ln_jax.models.bert.model import encoder_view
from ln_jax.nn import admin
from ln_jax.nn.init import bert_std
from ln_jax.nn.norms import DyT, RMSNorm
from ln_jax.nn.placements import PlacementRule
from tests import reference
from tests.test_models import ODD, batch, build, flat_params, randomize

pytest_plugins = ("tests.data_fixtures",)


def inputs(seed=0):
    ids, seg, mask, pos = batch(np.random.default_rng(seed))
    return ids, seg, mask, pos


@pytest.mark.parametrize(
    "placement, extra",
    [
        ("admin", {}),
        ("deepnorm", {}),
        ("sandwich", {}),
        ("rezero", {}),
        ("olmo2", {}),
        ("olmo2*1,pre*2", {}),
        ("lns", {}),
        ("pre*1,lns*2", {}),
        ("lns", {"qk_norm": True, "norm": "rmsnorm"}),
        ("dyt", {}),
        ("dyt*2,pre*1", {}),
        ("pre*2,dyt*1", {"qk_norm": True}),
        ("post,pre,pre", {}),
        ("pre", {"norm": "rmsnorm"}),
        ("deepnorm_alpha,deepnorm_beta,deepnorm", {"norm": "rmsnorm"}),
        ("pre", {"dlcl": True}),
        ("pre", {"qk_norm": True}),
        ("post", {"qk_norm": True, "norm": "rmsnorm"}),
    ],
)
def test_matches_numpy_reference(placement, extra):
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement=placement, activation="relu", **extra)
    model = randomize(build(cfg, seed=2))  # omega, gates, W: all non-trivial
    ids, seg, mask, pos = inputs()
    out = model(ids, seg, mask, pos)
    hidden, _ = model.bert(ids, seg, mask)
    ref_seq, ref_mlm, ref_nsp = reference.bert_forward(flat_params(model), cfg, ids, seg, mask, pos)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(hidden)[real], ref_seq[real], atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(out["mlm_logits"], ref_mlm, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(out["nsp_logits"], ref_nsp, atol=5e-5, rtol=1e-4)


def test_rmsnorm_matches_numpy():
    cfg = ln_jax.ModelConfig(**ODD, norm="rmsnorm")
    with nnx.use_eager_sharding(False):
        layer = RMSNorm(12, eps=cfg.layer_norm_eps, dtype=cfg.compute_dtype)
    layer.scale[...] = jax.random.normal(jax.random.key(0), (12,))
    x = np.random.default_rng(0).normal(2.0, 3.0, (4, 12)).astype(np.float32)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(layer(x), expected * np.asarray(layer.scale[...]), rtol=1e-5)
    assert not hasattr(layer, "bias")


# --------------------------------------------------------------------------- Admin


def admin_model(num_layers=6, options=None, **extra):
    cfg = ln_jax.ModelConfig(
        **{**ODD, "hidden_size": 24, "num_heads": 3},
        num_layers=num_layers,
        placement="admin",
        init="xavier",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **extra,
    )
    return build(cfg, seed=3, options=options)


def as_batch(ids, seg, mask, pos):
    return dict(input_ids=ids, segment_ids=seg, attention_mask=mask, masked_positions=pos)


def test_admin_profile_grows_with_depth_and_matches_branch_variances():
    model = admin_model()
    ids, seg, mask, pos = inputs()
    omegas = admin.admin_profile(model, as_batch(ids, seg, mask, pos), None)
    assert omegas.shape == (12,) and omegas[0] == 1.0
    assert np.all(np.diff(omegas) > 0), omegas
    np.testing.assert_allclose(admin.get_admin_omega(model), np.repeat(omegas[:, None], 24, 1))
    # Measured independently on the profiled model: omega_i^2 = 1 + sum_{j<i} Var F_j.
    rec = model(ids, seg, mask, pos, record=True)["intermediates"]
    branch = np.stack(
        [np.asarray(rec["attention/branch_out"]), np.asarray(rec["ffn/branch_out"])], 1
    )
    var = branch.reshape(12, -1).var(-1)
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(var)[:-1]])
    np.testing.assert_allclose(omegas**2, expected, rtol=2e-3)


def test_admin_closed_form_and_config_alias():
    # sqrt((N+1)/ln(N+1) - 1) for N = 12: sqrt(13/2.564949 - 1) = 2.01701
    assert admin.admin_closed_form(12) == pytest.approx(2.01701, abs=1e-4)
    model = admin_model(num_layers=2, admin_omega="closed_form")
    np.testing.assert_allclose(admin.get_admin_omega(model), admin.admin_closed_form(4), rtol=1e-6)
    cfg = ln_jax.ModelConfig(placement="post", init="admin")
    assert (cfg.placement, cfg.init) == ("admin", "bert")
    with pytest.raises(ValueError, match="needs model.placement 'post' or 'admin'"):
        ln_jax.ModelConfig(placement="pre", init="admin")


def test_fold_admin_is_exact():
    model = randomize(admin_model(num_layers=3), seed=4)  # per-channel omegas
    folded = fold_admin(model)
    assert folded.cfg.placement == "post"
    assert not any(path[-1] == "omega" for path, _ in nnx.to_flat_state(nnx.state(folded)))
    ids, seg, mask, pos = inputs(1)
    a, b = model(ids, seg, mask, pos), folded(ids, seg, mask, pos)
    np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(a["nsp_logits"], b["nsp_logits"], atol=2e-5, rtol=1e-5)
    # BERT's own fields are the model's: 3 segment rows, no NSP head
    options = ln_jax.BertOptions(type_vocab_size=3, nsp_head=False)
    model = randomize(admin_model(num_layers=1, options=options), seed=5)
    folded = fold_admin(model)
    assert folded.options == options and folded.nsp is None
    a, b = model(ids, 2 * seg, mask, pos), folded(ids, 2 * seg, mask, pos)
    assert "nsp_logits" not in b
    np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the others


def test_deepnorm_alpha_and_beta():
    base = dict(**{**ODD, "hidden_size": 48, "mlp_dim": 60}, num_layers=4, init="xavier")
    deep = build(ln_jax.ModelConfig(**base, placement="deepnorm"), seed=5)
    post = build(ln_jax.ModelConfig(**base, placement="post"), seed=5)
    alpha, beta = 8**0.25, 32**-0.25  # (2N)^(1/4), (8N)^(-1/4) for N = 4
    layer_d, layer_p = deep.bert.encoder.layers[2], post.bert.encoder.layers[2]
    assert layer_d.attention.alpha == pytest.approx(alpha)
    std = lambda m, sub, name: np.asarray(getattr(getattr(m, sub).branch, name).kernel[...]).std()
    for sub, name in [("attention", "value"), ("attention", "out"), ("ffn", "wi"), ("ffn", "wo")]:
        assert std(layer_d, sub, name) / std(layer_p, sub, name) == pytest.approx(beta, rel=1e-5)
    for name in ("query", "key"):
        assert std(layer_d, "attention", name) == pytest.approx(std(layer_p, "attention", name))
    # DeepNorm's two changes apart: deepnorm_alpha has the skip scale and plain weights,
    # deepnorm_beta the beta-scaled weights and an identity skip.
    only_a = build(ln_jax.ModelConfig(**base, placement="deepnorm_alpha"), seed=5)
    only_b = build(ln_jax.ModelConfig(**base, placement="deepnorm_beta"), seed=5)
    layer_a, layer_b = only_a.bert.encoder.layers[2], only_b.bert.encoder.layers[2]
    assert layer_a.attention.alpha == pytest.approx(alpha) and layer_b.ffn.alpha == 1.0
    for sub, name in [("attention", "value"), ("ffn", "wo")]:
        assert std(layer_a, sub, name) == pytest.approx(std(layer_p, sub, name), rel=1e-6)
        assert std(layer_b, sub, name) == pytest.approx(std(layer_d, sub, name), rel=1e-6)


def test_rezero_is_the_identity_at_initialisation():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement="rezero")
    model = build(cfg)
    ids, seg, mask, _ = inputs()
    hidden, rec = model.bert(ids, seg, mask, record=True)
    np.testing.assert_array_equal(hidden, rec["embeddings"])
    assert model.bert.encoder.final_norm is None
    assert not any("norm" in ".".join(map(str, k)) for k, _ in flat_encoder(model))


def flat_encoder(model):
    return nnx.to_flat_state(nnx.state(model.bert.encoder, nnx.Param))


def test_dlcl_starts_at_averages_and_learns():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement="pre", dlcl=True)
    model = build(cfg)
    w = np.asarray(model.bert.encoder.dlcl.weights[...])
    np.testing.assert_allclose(w, [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    ids, seg, mask, pos = inputs()

    def loss(m):
        return (m(ids, seg, mask, pos)["mlm_logits"] ** 2).mean()

    grads = nnx.grad(loss)(model)
    g = np.asarray(grads["bert"]["encoder"]["dlcl"]["weights"][...])
    assert np.all(np.abs(g[np.tril_indices(3)]) > 0) and np.all(g[np.triu_indices(3, 1)] == 0)


def test_per_layer_placements_build_the_right_norms():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement="post*1,pre*2")
    assert cfg.layer_placements == ("post", "post", "pre")[:1] + ("pre", "pre")
    layers = build(cfg).bert.encoder.layers
    assert layers[0].ffn.post_norm is not None and layers[0].ffn.pre_norm is None
    assert all(layer.attention.pre_norm is not None for layer in layers[1:])
    assert all(layer.attention.post_norm is None for layer in layers[1:])
    assert ln_jax.model_config("tiny", num_layers=8, placement="mixln").layer_placements == (
        ("post",) * 2 + ("pre",) * 6
    )
    assert ln_jax.model_config("tiny", placement=("pre", "post")).rule.final_norm is False


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(placement="post,pre", scan_layers=True), "scan_layers needs one placement"),
        (dict(placement="post*3"), "names 3 layers but model.num_layers=2"),
        (dict(placement="post,sandwhich"), "'sandwhich'; valid names: admin, deepnorm, "),
        (dict(placement="post", dlcl=True), "dlcl is for Pre-LN"),
        (dict(placement="pre", dlcl=True, scan_layers=True), "dlcl is for Pre-LN"),
        (dict(norm="batchnorm"), "valid names: layernorm, rmsnorm"),
        (dict(placement="post*x,pre"), "count after '\\*' must be a positive integer"),
        (dict(placement="post*0,pre*2"), "count after '\\*' must be a positive integer"),
        (dict(placement="pre,ngpt"), "nGPT is not available: .* renormalises every weight"),
    ],
)
def test_layout_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        ln_jax.model_config("tiny", **overrides)


# --------------------------------------------------------------------------- trainer


def read_omegas(path):
    with open(path) as f:
        return json.load(f)["omega"]


def test_trainer_profiles_once_and_reuses_on_resume(data_dir, tmp_path, monkeypatch):
    from ln_jax.train import trainer
    from tests.test_trainer import tiny_config

    cfg = tiny_config(
        data_dir,
        **{"model.placement": "post", "model.init": "admin", "total_steps": 3, "eval_every": 0},
    )
    assert cfg.model.placement == "admin"

    def preempt_at_2(step, run):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer saves step 2 and stops

    assert trainer.train_and_evaluate(cfg, str(tmp_path), hooks=[preempt_at_2])["step"] == 2
    path = os.path.join(tmp_path, "admin_profile.json")
    omegas = read_omegas(path)
    assert len(omegas) == 2 * cfg.model.num_layers and omegas[0] == 1.0
    assert all(math.isfinite(w) and w >= 1.0 for w in omegas)

    def fail(*args, **kwargs):
        raise AssertionError("re-profiled on resume")

    monkeypatch.setattr(admin, "admin_profile", fail)
    result = trainer.train_and_evaluate(cfg, str(tmp_path))  # resumes at step 2: set-up again
    assert result["step"] == 3 and not result["already_done"] and read_omegas(path) == omegas


@pytest.mark.parametrize(
    "overrides",
    [
        # The rows with their own parameters or norms as the layers of one mixed stack (one
        # compile, for CI time), with RMSNorm and QK-norm. Admin trains in the profile test;
        # deepnorm_alpha/_beta are deepnorm's parameters at other values.
        {
            "model.placement": "deepnorm,sandwich,rezero,post,olmo2,lns,dyt",
            "model.num_layers": 7,
            "model.norm": "rmsnorm",
            "model.qk_norm": True,
        },
        {"model.placement": "pre", "model.dlcl": True},
    ],
    ids=["every-row-rmsnorm-qk_norm", "pre-dlcl"],
)
def test_every_placement_trains_on_8_devices(data_dir, tmp_path, overrides):
    """A few steps of the real trainer on the 2x2x2 mesh: finite losses, and every parameter
    (ReZero's alpha and DLCL's weights included) has moved from its initial value."""
    from ln_jax.task import make_task
    from ln_jax.train import steps, trainer
    from tests.test_trainer import tiny_config, train_losses

    cfg = tiny_config(data_dir, total_steps=4, eval_every=0, **{"optim.peak_lr": 1e-3, **overrides})
    last = {}
    keep_last = lambda step, run: last.update(params=run.state["params"], mesh=run.mesh)
    trainer.train_and_evaluate(cfg, str(tmp_path), hooks=[keep_last])
    losses = train_losses(tmp_path)
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses.values())
    # The same initialiser on the same mesh: compiled once, by the trainer (sharding's cache).
    initial = steps.init_state(make_task(cfg), last["mesh"]).state["params"]
    before = dict(nnx.to_flat_state(initial))
    after = dict(nnx.to_flat_state(last["params"]))
    assert set(after) == set(before)
    unchanged = [
        "/".join(map(str, path))
        for path, var in before.items()
        if np.array_equal(np.asarray(var[...]), np.asarray(after[path][...]))
    ]
    assert not unchanged, unchanged


def test_monitor_entropy_sees_the_qk_norm():
    """The monitor's entropy is the attention module's own: with qk_norm q, k are normalised."""
    from ln_jax.train import monitor

    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, placement="pre", qk_norm=True)
    model = randomize(build(cfg, seed=2), scale=1.0)
    ids, seg, mask, _ = inputs()
    hidden, rec = model.bert(ids, seg, mask, record=True)
    stats = monitor.forward_stats(rec, hidden, model.bert.encoder, mask, encoder_view(cfg))
    p, h = flat_params(model), cfg.head_dim
    expected = []
    for layer in range(2):
        pre = f"bert.encoder.layers.{layer}.attention.branch."
        x = np.asarray(rec["attention/pre_norm_out"][layer], np.float64)
        total = count = 0.0
        for b in range(x.shape[0]):
            t = int(mask[b].sum())
            q, k = (
                reference.norm(
                    p,
                    pre + name + "_norm",
                    np.einsum("td,dnh->tnh", x[b, :t], p[pre + name + ".kernel"])
                    + p[pre + name + ".bias"],
                    cfg,
                )
                for name in ("query", "key")
            )
            logits = np.einsum("tnh,snh->nts", q, k) / np.sqrt(h)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            total += -(w * np.log(w)).sum(-1).mean(0).sum()
            count += t
        expected.append(total / count)
    np.testing.assert_allclose(stats["attention_entropy"], expected, rtol=1e-4)


def test_placement_rule_checks_its_fields():
    with pytest.raises(ValueError, match="pre_norm_scale scales the pre-norm"):
        PlacementRule(pre_norm_scale="inv_sqrt_depth")
    with pytest.raises(ValueError, match="valid names: inv_sqrt_depth, none"):
        PlacementRule(pre_norm=True, pre_norm_scale="sqrt")


def test_dyt_initialisation_and_formula():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, placement="dyt")
    encoder = build(cfg).bert.encoder
    norm = encoder.layers[1].ffn.pre_norm
    assert isinstance(norm, DyT) and isinstance(encoder.final_norm, DyT)
    np.testing.assert_array_equal(norm.alpha[...], [0.5])  # Zhu et al.'s alpha0
    np.testing.assert_array_equal(norm.scale[...], np.ones(12))
    np.testing.assert_array_equal(norm.bias[...], np.zeros(12))
    x = np.random.default_rng(0).normal(0.0, 3.0, (4, 12)).astype(np.float32)
    np.testing.assert_allclose(norm(x), np.tanh(0.5 * x), rtol=1e-6)
    assert encoder.layers[0].attention.post_norm is None


def test_bert_scaled_init_keeps_berts_std_relative_to_width():
    # d = 64: sigma = 0.02 * sqrt(768 / 64) = 0.0693; truncated at 2 sigma, the std is 0.88 sigma.
    d, sigma = 64, 0.02 * math.sqrt(768 / 64)
    base = dict(size="custom", vocab_size=50, hidden_size=d, num_heads=4, mlp_dim=128, num_layers=1)
    model = build(ln_jax.ModelConfig(**base, init="bert_scaled"))
    ffn = model.bert.encoder.layers[0].ffn.branch
    for w in (ffn.wi.kernel[...], model.bert.embeddings.word[...]):
        w = np.asarray(w)
        assert w.std() == pytest.approx(0.8796 * sigma, rel=0.05)
        assert np.abs(w).max() <= 2 * sigma + 1e-6
    # At BERT-base's width it is BERT's initialiser: init_std itself.
    wide = ln_jax.ModelConfig(**dict(base, hidden_size=768, num_heads=12), init="bert_scaled")
    assert bert_std(wide) == pytest.approx(0.02) and bert_std(wide.replace(init="xavier")) is None


def test_each_norm_decomposes_itself_as_the_residual_analysis_needs():
    """norm(x) = f(x) + b with f additive over parts of x (the statistics of x held fixed)."""
    from ln_jax import sharding

    with sharding.use_mesh(sharding.single_device_mesh()):
        _check_decompositions()


def _check_decompositions():
    from ln_jax.nn.norms import LayerNorm

    rng = np.random.default_rng(0)
    x = jax.numpy.asarray(rng.normal(size=(3, 5, 8)), jax.numpy.float32)
    part = jax.numpy.asarray(rng.normal(size=(3, 5, 8)), jax.numpy.float32)
    for norm in (
        LayerNorm(8, eps=1e-6, dtype=jax.numpy.float32),
        RMSNorm(8, eps=1e-6, dtype=jax.numpy.float32),
        DyT(8, dtype=jax.numpy.float32),
    ):
        norm.scale[...] = jax.numpy.linspace(0.5, 1.5, 8)
        if hasattr(norm, "bias"):
            norm.bias[...] = jax.numpy.linspace(-0.2, 0.2, 8)
        f, b = norm.decompose(x)
        np.testing.assert_allclose(f(x) + b, norm(x), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(f(part) + f(x - part), f(x), atol=1e-5, rtol=1e-5)
