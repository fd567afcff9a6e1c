"""Tests for ln_jax.train.optim: schedules against their formulas, masking, clipping, configs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ln_jax.config.optim import OptimConfig
from ln_jax.train.optim import (
    clip_by_global_norm,
    decay_mask,
    global_norm,
    grouped_norm,
    make_optimizer,
    make_schedule,
)

P, E, T = 1e-3, 1e-5, 1000
STEPS = [0, 1, 2, 7, 99, 100, 101, 250, 499, 500, 501, 999, 1000, 1001, 5000]


def _check(cfg, formula):
    sched = make_schedule(cfg)
    jitted = jax.jit(sched)
    for t in STEPS:
        want = formula(t)
        np.testing.assert_allclose(float(sched(t)), want, rtol=1e-5, atol=1e-12, err_msg=f"t={t}")
        np.testing.assert_allclose(float(jitted(jnp.int32(t))), want, rtol=1e-5, atol=1e-12)


def test_linear_decay():
    cfg = OptimConfig(schedule="linear_decay", peak_lr=P, end_lr=E, total_steps=T)
    _check(cfg, lambda t: P + (E - P) * min(t, T) / T)
    sched = make_schedule(cfg)
    assert float(sched(0)) == pytest.approx(P)
    assert float(sched(T)) == pytest.approx(E)
    assert float(sched(10 * T)) == pytest.approx(E)


@pytest.mark.parametrize("w", [0, 1, 100, T])
def test_warmup_linear_decay(w):
    cfg = OptimConfig(
        schedule="warmup_linear_decay", peak_lr=P, end_lr=E, warmup_steps=w, total_steps=T
    )

    def formula(t):
        if t < w:
            return P * t / w
        return P + (E - P) * min((t - w) / max(T - w, 1), 1.0)

    _check(cfg, formula)
    sched = make_schedule(cfg)
    assert float(sched(w)) == pytest.approx(P)
    assert float(sched(T + 1)) == pytest.approx(E)
    if w == 0:
        assert float(sched(0)) == pytest.approx(P)
    else:
        assert float(sched(0)) == 0.0


@pytest.mark.parametrize("w", [0, 1, 100, 900])
def test_warmup_cosine_is_optax_s_from_zero(w):
    """The warm-up of the other schedules, then a half cosine from P down to E at T: optax's
    warmup_cosine_decay_schedule (an independent implementation), and E after T."""
    cfg = OptimConfig(schedule="warmup_cosine", peak_lr=P, end_lr=E, warmup_steps=w, total_steps=T)
    ref = optax.warmup_cosine_decay_schedule(0.0, P, w, T, end_value=E)
    steps = np.array([0, 1, w // 2, w, w + 1, (w + T) // 2, T - 1, T, T + 1, 10 * T])
    got = np.asarray(make_schedule(cfg)(steps))
    want = np.asarray([P if (w == 0 and t == 0) else ref(t) for t in steps])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-10)  # float32 ramps round apart
    assert got[steps.tolist().index((w + T) // 2)] == pytest.approx((P + E) / 2, rel=0.02)
    assert got[-1] == pytest.approx(E) and got[3] == pytest.approx(P)


@pytest.mark.parametrize("w", [0, 1, 100, 4000])
def test_warmup_rsqrt(w):
    cfg = OptimConfig(schedule="warmup_rsqrt", peak_lr=P, warmup_steps=w, total_steps=10_000)

    def formula(t):
        if t < w:
            return P * t / w
        s = max(w, 1)
        return P * math.sqrt(s / max(t, s))

    _check(cfg, formula)
    sched = make_schedule(cfg)
    assert float(sched(w)) == pytest.approx(P)
    assert float(sched(4 * max(w, 1))) == pytest.approx(P / 2)
    assert np.isfinite(float(sched(0)))


@pytest.mark.parametrize("d,f", [(0, 1.0), (0, 0.5), (100, 0.1), (500, 1.0)])
def test_decay_rsqrt(d, f):
    cfg = OptimConfig(schedule="decay_rsqrt", peak_lr=P, decay_step=d, decay_factor=f)

    def formula(t):
        if t < d:
            return P
        s = max(d, 1)
        return P * f * math.sqrt(s / max(t, s))

    _check(cfg, formula)
    sched = make_schedule(cfg)
    assert float(sched(d)) == pytest.approx(P * f)
    assert float(sched(4 * max(d, 1))) == pytest.approx(P * f / 2)


def test_decay_rsqrt_with_warmup():
    cfg = OptimConfig(
        schedule="decay_rsqrt", peak_lr=P, warmup_steps=100, decay_step=500, decay_factor=0.1
    )
    _check(cfg, lambda t: P * min(t / 100, 1) if t < 500 else P * 0.1 * math.sqrt(500 / t))


@pytest.mark.parametrize("w", [0, 100])
def test_constant(w):
    cfg = OptimConfig(schedule="constant", peak_lr=P, warmup_steps=w, total_steps=T)
    _check(cfg, lambda t: P * (min(t / w, 1.0) if w else 1.0))


def _nnx_params():
    class Tiny(nnx.Module):
        def __init__(self, rngs):
            self.ln = nnx.LayerNorm(4, rngs=rngs)
            self.lin = nnx.Linear(4, 3, rngs=rngs)

    model = Tiny(nnx.Rngs(0))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    # Non-trivial LN params, so "unchanged" is not vacuous.
    return jax.tree.map(lambda x: x + 0.5, params)


def _dict_params():
    return {
        "emb": jnp.full((5, 4), 2.0),
        "block": {"w": jnp.ones((4, 4)), "b": jnp.ones(4), "ln": {"scale": jnp.ones(4)}},
        "alpha": jnp.ones(()),
    }


@pytest.mark.parametrize("make_params", [_dict_params, _nnx_params], ids=["dict", "nnx"])
def test_adamw_decay_masks_vectors(make_params):
    params = make_params()
    lr, wd = 1e-2, 0.1
    cfg = OptimConfig(optimizer="adamw", schedule="constant", peak_lr=lr, weight_decay=wd)
    tx = make_optimizer(cfg, params)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, state, params)
    new = optax.apply_updates(params, updates)
    n_mat = n_vec = 0
    leaves = zip(*(jax.tree.leaves(x) for x in (params, updates, new)), strict=True)
    for p, u, n in leaves:
        if p.ndim >= 2:
            # Compare the update itself: new - p loses digits to float32 cancellation.
            np.testing.assert_allclose(u, -lr * wd * p, rtol=1e-6)
            assert not np.array_equal(n, p)
            n_mat += 1
        else:
            np.testing.assert_array_equal(n, p)
            n_vec += 1
    assert n_mat >= 1 and n_vec >= 2


def test_decay_mask_nnx_structure():
    params = _nnx_params()
    mask = decay_mask(params)
    assert jax.tree.structure(mask) == jax.tree.structure(params)
    assert bool(mask["lin"]["kernel"].get_value())
    assert not bool(mask["ln"]["scale"].get_value()) and not bool(mask["lin"]["bias"].get_value())


def test_decay_mask_of_the_bert_model_ignores_the_scan_axis_and_skips_biases():
    """The same parameters are decayed with and without scan_layers (stacked norm scales are
    [L, d] but still norm scales), and the 2-D attention biases [heads, head_dim] are not."""
    import ln_jax
    from ln_jax.config.run import ModelConfig

    cfg = ModelConfig(vocab_size=64, hidden_size=16, num_heads=2, mlp_dim=32, num_layers=2)
    masks = {}
    for scan in (False, True):
        model = ln_jax.create_model(cfg.replace(scan_layers=scan), seed=0)
        params = nnx.split(model, nnx.Param, ...)[1]
        flat = jax.tree_util.tree_leaves_with_path(decay_mask(params))
        # Layer i of the list is "layers/i/..."; the stacked tree holds all layers in one leaf.
        masks[scan] = {
            jax.tree_util.keystr(p).replace("['layers'][0]", "['layers']"): bool(m)
            for p, m in flat
            if "['layers'][1]" not in jax.tree_util.keystr(p)
        }
    assert masks[False] == masks[True]
    decayed = {k for k, m in masks[True].items() if m}
    layer = "['bert']['encoder']['layers']"
    assert f"{layer}['attention']['branch']['query']['kernel'].value" in decayed
    assert f"{layer}['ffn']['branch']['wi']['kernel'].value" in decayed
    assert "['bert']['embeddings']['word'].value" in decayed
    for name in ("['attention']['branch']['query']['bias']", "['ffn']['pre_norm']['scale']"):
        key = f"{layer}{name}.value"
        assert key in masks[True] and not masks[True][key]
    assert not any(k.endswith(("['bias'].value", "['scale'].value")) for k in decayed)


def test_decay_mask_skips_dlcl_combination_weights():
    """DLCL's [L, L] layer weights are a mixing matrix (rows sum to 1): not decayed, while the
    kernels beside them are."""
    import ln_jax
    from ln_jax.config.run import ModelConfig

    cfg = ModelConfig(
        vocab_size=64, hidden_size=16, num_heads=2, mlp_dim=32, num_layers=3, dlcl=True
    )
    model = ln_jax.create_model(cfg.replace(placement="pre", scan_layers=False), seed=0)
    params = nnx.split(model, nnx.Param, ...)[1]
    flat = {
        jax.tree_util.keystr(p): bool(m)
        for p, m in jax.tree_util.tree_leaves_with_path(decay_mask(params))
    }
    dlcl = [k for k in flat if "['dlcl']['weights']" in k]
    assert len(dlcl) == 1 and not flat[dlcl[0]]
    assert params["bert"]["encoder"]["dlcl"]["weights"][...].shape == (3, 3)
    assert flat["['bert']['encoder']['layers'][0]['ffn']['branch']['wi']['kernel'].value"]


def test_adamw_inside_nnx_optimizer():
    """nnx.Optimizer inits with Param nodes but updates with pure arrays: two of its updates
    equal AdamW computed by hand (clipping, bias-corrected moments, decay on the kernel only)."""
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    model.bias[...] = jnp.array([0.5, -1.0, 2.0])  # non-zero, so that decaying it would show
    lr, wd, b1, b2, eps, clip = 1e-2, 0.1, 0.9, 0.98, 1e-6, 1.0
    cfg = OptimConfig(
        optimizer="adamw",
        schedule="constant",
        peak_lr=lr,
        weight_decay=wd,
        b1=b1,
        b2=b2,
        eps=eps,
        clip_norm=clip,
    )
    opt = nnx.Optimizer(model, make_optimizer(cfg, nnx.state(model, nnx.Param)), wrt=nnx.Param)
    params = {k: np.asarray(getattr(model, k)[...], np.float64) for k in ("kernel", "bias")}
    decays = {"kernel": 1.0, "bias": 0.0}  # 1-D parameters are masked off
    mu = {k: np.zeros_like(v) for k, v in params.items()}
    nu = {k: np.zeros_like(v) for k, v in params.items()}
    inputs = [jnp.ones((2, 4)), jnp.arange(8.0).reshape(2, 4) / 4.0 - 1.0]
    for t, x in enumerate(inputs, start=1):
        grads = nnx.grad(lambda m, x=x: jnp.sum(m(x) ** 2))(model)
        g = {k: np.asarray(grads[k][...], np.float64) for k in params}
        norm = np.sqrt(sum(np.sum(v**2) for v in g.values()))
        assert norm > clip  # clipping is exercised
        g = {k: v * clip / norm for k, v in g.items()}
        for k in params:
            mu[k] = b1 * mu[k] + (1 - b1) * g[k]
            nu[k] = b2 * nu[k] + (1 - b2) * g[k] ** 2
            adam = (mu[k] / (1 - b1**t)) / (np.sqrt(nu[k] / (1 - b2**t)) + eps)
            params[k] = params[k] - lr * (adam + decays[k] * wd * params[k])
        opt.update(model, grads)
        for k in params:
            np.testing.assert_allclose(getattr(model, k)[...], params[k], rtol=1e-5, atol=1e-7)
    assert int(opt.step[...]) == 2


def test_clip_by_global_norm():
    grads = {"a": jnp.full((10, 10), 10.0), "b": jnp.zeros(3)}  # norm 100
    assert float(global_norm(grads)) == pytest.approx(100.0)
    lr = 0.5
    cfg = OptimConfig(optimizer="sgd", momentum=0.0, schedule="constant", peak_lr=lr, clip_norm=1.0)
    tx = make_optimizer(cfg, grads)
    updates, _ = tx.update(grads, tx.init(grads), grads)
    assert float(global_norm(updates)) == pytest.approx(lr * 1.0, rel=1e-5)
    # Direction is preserved: clipping only rescales.
    np.testing.assert_allclose(updates["a"], -lr * grads["a"] / 100.0, rtol=1e-5)


def test_the_clip_is_optax_s_with_its_state():
    """Same arithmetic and the same (empty) state as optax's, so checkpoints written before
    restore and a CPU run's values are unchanged bit for bit."""
    grads = {"a": jnp.linspace(-3.0, 7.0, 12).reshape(3, 4), "b": jnp.arange(5.0)}
    ours, theirs = clip_by_global_norm(1.0), optax.clip_by_global_norm(1.0)
    assert jax.tree.structure(ours.init(grads)) == jax.tree.structure(theirs.init(grads))
    for scale in (0.01, 1.0, 100.0):  # below, near and above the threshold
        g = jax.tree.map(lambda x, s=scale: x * s, grads)
        mine, _ = ours.update(g, ours.init(g))
        want, _ = theirs.update(g, theirs.init(g))
        for k in g:
            np.testing.assert_array_equal(mine[k], want[k])


@pytest.fixture(scope="module")
def tiny_bert_params_on_eight_devices():
    """BERT-tiny's parameters (nnx.Params with logical axes) sharded on data=2, fsdp=2,
    tensor=2."""
    from configs import bert_preln
    from ln_jax import sharding
    from ln_jax.config.run import TrainConfig
    from ln_jax.task import make_task
    from ln_jax.train import steps

    c = bert_preln.get_config("tiny")
    c.data.max_seq_length, c.data.global_batch_size, c.grad_accum_steps = 32, 8, 1
    task = make_task(TrainConfig.from_mapping(c.to_dict()))
    return steps.init_state(task, sharding.make_mesh(2, 2, 2))


def test_the_grouped_norm_is_the_norm_one_reduction_a_group_and_moves_no_parameter(
    tiny_bert_params_on_eight_devices,
):
    """The GPU's gradient norm stacks the parameters of one shape and logical axes: 48
    BERT-tiny parameters are 15 reductions, the value is optax's, and on a sharded mesh the
    stacking moves nothing (grouping by shape alone would stack an ('embed',) vector with an
    ('embed_proj',) one: measured, 6 all-gathers and 5 collective-permutes)."""
    params = tiny_bert_params_on_eight_devices.state["params"]
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    groups = {(v.get_value().shape, v.get_metadata()["out_sharding"]) for v in variables}
    assert (len(variables), len(groups)) == (48, 15)
    # Both norms compiled: eagerly they are ~150 programs on 8 devices, each a rendezvous.
    compiled = jax.jit(grouped_norm).lower(params).compile()
    np.testing.assert_allclose(compiled(params), jax.jit(optax.tree.norm)(params), rtol=1e-6)
    jaxpr = jax.make_jaxpr(grouped_norm)(params)
    assert sum(e.primitive.name == "reduce_sum" for e in jaxpr.eqns) == len(groups)
    hlo = compiled.as_text()
    for op in ("all-gather", "all-to-all", "collective-permute"):
        assert f"{op}(" not in hlo and f"{op}-start(" not in hlo, op
    assert "all-reduce" in hlo  # the sharded sums, as optax's norm has them


def test_the_norm_of_plain_arrays_is_optax_s_leaf_by_leaf():
    """Arrays without logical axes may lie in any sharding: each is its own group, summed in
    optax's order (equal bit for bit); on the CPU `global_norm` is optax's."""
    tree = {"a": jnp.linspace(-1.0, 2.0, 64), "b": jnp.linspace(3.0, -4.0, 64), "c": jnp.ones(7)}
    assert grouped_norm(tree) == optax.tree.norm(tree)
    assert global_norm(tree) == optax.tree.norm(tree)
    assert (
        sum(e.primitive.name == "reduce_sum" for e in jax.make_jaxpr(grouped_norm)(tree).eqns) == 3
    )


@pytest.mark.parametrize("clip", [0, None])
def test_no_clipping(clip):
    grads = {"a": jnp.full((10, 10), 10.0)}
    cfg = OptimConfig(
        optimizer="sgd", momentum=0.0, schedule="constant", peak_lr=0.5, clip_norm=clip
    )
    tx = make_optimizer(cfg, grads)
    updates, _ = tx.update(grads, tx.init(grads), grads)
    assert float(global_norm(updates)) == pytest.approx(50.0, rel=1e-5)


@pytest.mark.parametrize(
    "opt,momentum", [("radam", 0.9), ("sgd", 0.9), ("sgd", 0.0), ("adam", 0.9), ("adamw", 0.9)]
)
def test_step_lowers_quadratic(opt, momentum):
    target = jnp.arange(6.0).reshape(2, 3)
    params = {"w": jnp.zeros((2, 3)), "b": jnp.ones(3)}
    loss = lambda p: jnp.sum((p["w"] - target) ** 2) + jnp.sum(p["b"] ** 2)
    cfg = OptimConfig(optimizer=opt, momentum=momentum, schedule="constant", peak_lr=1e-2)
    tx = make_optimizer(cfg, params)
    state = tx.init(params)
    before = float(loss(params))
    for _ in range(3):
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
    assert float(loss(params)) < before


def test_bad_names_list_valid_options():
    with pytest.raises(ValueError, match=r"optimizer.*'adam', 'adamw', 'radam', 'sgd'"):
        OptimConfig(optimizer="adamx")
    with pytest.raises(ValueError, match=r"schedule.*'decay_rsqrt'.*'constant'"):
        OptimConfig(schedule="cosine")


def test_misspelt_key_names_closest():
    with pytest.raises(ValueError, match="Did you mean 'warmup_steps'"):
        OptimConfig.from_mapping({"warmup_step": 10})
    with pytest.raises(ValueError, match="Did you mean 'peak_lr'"):
        OptimConfig.from_mapping({"peak_lrr": 1e-3})
    with pytest.raises(ValueError, match="Did you mean 'peak_lr'"):  # another trainer's name
        OptimConfig.from_mapping({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="Did you mean 'b2'"):
        OptimConfig.from_mapping({"adam_beta2": 0.98})
    with pytest.raises(ValueError, match="Valid: optimizer, peak_lr"):
        OptimConfig.from_mapping({"zzzzzz": 1})
    cfg = OptimConfig.from_mapping({"optimizer": "adam", "b2": 0.98, "peak_lr": 5e-4})
    assert (cfg.optimizer, cfg.b2, cfg.peak_lr) == ("adam", 0.98, 5e-4)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 20_000, "total_steps": 10_000}, "warmup_steps"),
        ({"schedule": "warmup_rsqrt", "warmup_steps": 11, "total_steps": 10}, "warmup_steps"),
        ({"schedule": "linear_decay", "warmup_steps": 10}, "warmup_steps"),
        ({"peak_lr": 0.0}, "peak_lr"),
        ({"peak_lr": -1e-3}, "peak_lr"),
        ({"decay_factor": 0.0}, "decay_factor"),
        ({"total_steps": 0}, "total_steps"),
    ],
)
def test_invalid_values_name_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        OptimConfig(**kwargs)


def test_config_is_frozen_and_warmup_zero_valid():
    cfg = OptimConfig(warmup_steps=0)
    with pytest.raises(AttributeError):
        cfg.peak_lr = 1.0  # type: ignore[misc]
