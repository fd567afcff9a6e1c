"""Models: Table 1 against a NumPy reference, padding, heads, scan/remat, errors, intermediates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ln_jax
from ln_jax.nn.stack import layer_state
from tests import reference

# Odd sizes so that a transposed or mis-split axis cannot go unnoticed.
ODD = dict(
    size="custom",
    vocab_size=23,
    hidden_size=12,
    num_heads=3,
    mlp_dim=20,
    max_position_embeddings=16,
    layer_norm_eps=1e-6,
)


def flat_params(model) -> dict[str, np.ndarray]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {".".join(map(str, k)): np.asarray(v[...], np.float64) for k, v in flat}


def build(cfg, seed: int = 0, options=None) -> ln_jax.BertForPreTraining:
    """`ln_jax.create_model(cfg, seed=seed)`'s model, initialised eagerly (op by op).

    create_model compiles one initialiser program per config (2-3 s on 2 cores, each config
    anew); eagerly, each op compiles once per shape for every config of a test file
    (`tests/test_placements.py::test_matches_numpy_reference`, 18 configs: 48 -> 12 s). The
    values come from the same random streams; tests of create_model itself use it.
    """
    with nnx.use_eager_sharding(False):
        return ln_jax.BertForPreTraining(cfg, rngs=nnx.Rngs(params=seed), options=options)


def randomize(model, seed=0, scale=0.3):
    """Gives every parameter (LN scales and biases too) random values so no bug hides."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, new))
    return model


def batch(rng, b=3, t=9, p=4, vocab=23, pad_from=(9, 6, 4)):
    ids = rng.integers(5, vocab, (b, t)).astype(np.int32)
    mask = (np.arange(t)[None] < np.array(pad_from)[:, None]).astype(np.int32)
    ids = ids * mask
    segments = (np.arange(t)[None] >= 3).astype(np.int32).repeat(b, 0) * mask
    positions = np.stack([rng.choice(n, p, replace=n < p) for n in pad_from]).astype(np.int32)
    return ids, segments, mask, positions


@pytest.mark.parametrize("placement", ["post", "pre"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_numpy_reference(placement, num_layers, activation):
    cfg = ln_jax.ModelConfig(
        **ODD, num_layers=num_layers, placement=placement, activation=activation
    )
    model = randomize(build(cfg, seed=1))
    ids, seg, mask, pos = batch(np.random.default_rng(0))
    out = model(ids, seg, mask, pos, record=True)
    ref_seq, ref_mlm, ref_nsp = reference.bert_forward(flat_params(model), cfg, ids, seg, mask, pos)
    real = mask.astype(bool)
    seq = out["intermediates"]["final_norm_out" if placement == "pre" else "layer_in"]
    if placement == "post":  # the output of the last layer is its ffn sub-layer's output
        seq = out["intermediates"]["ffn/output"][-1]
    np.testing.assert_allclose(np.asarray(seq)[real], ref_seq[real], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(out["mlm_logits"], ref_mlm, atol=5e-5, rtol=1e-4)
    np.testing.assert_allclose(out["nsp_logits"], ref_nsp, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_padding_does_not_change_real_positions(placement):
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, placement=placement)
    model = randomize(build(cfg))
    rng = np.random.default_rng(1)
    ids, seg, mask, _ = batch(rng, pad_from=(9, 5, 2))
    pos = np.zeros((3, 2), np.int32)
    hidden, _ = model.bert(ids, seg, mask)
    # Other token ids under the padding, and three extra padded positions.
    ids2 = np.where(mask > 0, ids, rng.integers(5, 23, ids.shape)).astype(np.int32)
    pad = lambda a: np.pad(a, ((0, 0), (0, 3)))
    hidden2, _ = model.bert(pad(ids2), pad(seg), pad(mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(hidden2)[:, :9][real], np.asarray(hidden)[real], atol=1e-5
    )
    assert model(ids, seg, mask, pos)["mlm_logits"].shape == (3, 2, 23)


def test_mlm_logits_only_at_given_positions():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=1)
    model = randomize(build(cfg))
    ids, seg, mask, _ = batch(np.random.default_rng(2))
    all_pos = np.tile(np.arange(9, dtype=np.int32), (3, 1))
    full = np.asarray(model(ids, seg, mask, all_pos)["mlm_logits"])
    pos = np.array([[4, 0], [1, 3], [2, 2]], np.int32)
    some = np.asarray(model(ids, seg, mask, pos)["mlm_logits"])
    assert some.shape == (3, 2, 23)
    np.testing.assert_allclose(some, np.take_along_axis(full, pos[..., None], 1), atol=1e-5)


@pytest.mark.parametrize("placement", ["post", "lns"])  # lns: the depth is scanned data
def test_scan_matches_loop_and_layers_stay_addressable(placement):
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement=placement)
    loop = randomize(build(cfg))
    scan = build(cfg.replace(scan_layers=True))
    layers = [nnx.to_pure_dict(nnx.state(layer, nnx.Param)) for layer in loop.bert.encoder.layers]
    scan_state = nnx.state(scan.bert.encoder.layers, nnx.Param)
    nnx.replace_by_pure_dict(scan_state, jax.tree.map(lambda *xs: jnp.stack(xs), *layers))
    nnx.update(scan.bert.encoder.layers, scan_state)
    rest = nnx.state(loop, nnx.Param)
    del rest["bert"]["encoder"]["layers"]  # the final norm (lns has one) is copied as is
    nnx.update(scan, rest)
    ids, seg, mask, pos = batch(np.random.default_rng(3))
    key = jax.random.key(7)
    a = loop(ids, seg, mask, pos, record=True)
    b = scan(ids, seg, mask, pos, record=True)
    np.testing.assert_allclose(a["mlm_logits"], b["mlm_logits"], atol=1e-5)
    for name in a["intermediates"]:
        np.testing.assert_allclose(a["intermediates"][name], b["intermediates"][name], atol=1e-5)
    assert b["intermediates"]["ffn/branch_out"].shape == (3, 3, 9, 12)
    w_loop = layer_state(loop.bert.encoder, 1)["ffn"]["branch"]["wo"]["kernel"][...]
    w_scan = layer_state(scan.bert.encoder, 1)["ffn"]["branch"]["wo"]["kernel"][...]
    np.testing.assert_array_equal(w_loop, w_scan)
    # Dropout streams differ by construction between the two layouts, but each is reproducible.
    d1 = scan(ids, seg, mask, pos, dropout_key=key)["mlm_logits"]
    d2 = scan(ids, seg, mask, pos, dropout_key=key)["mlm_logits"]
    np.testing.assert_array_equal(d1, d2)


def test_scan_unroll_changes_the_program_not_the_values():
    """Unrolled (2 of 3: a remainder; 3: straight-line code, no loop left) gives the values of
    the loop: outputs with dropout, intermediates and gradients, for a depth-dependent rule."""
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement="lns", scan_layers=True)
    ids, seg, mask, pos = batch(np.random.default_rng(4))
    key = jax.random.key(5)
    params = nnx.state(randomize(build(cfg)), nnx.Param)
    runs, loops = {}, {}
    for unroll in (1, 2, 3):
        model = build(cfg.replace(scan_unroll=unroll))
        nnx.update(model, params)
        graphdef, state = nnx.split(model)

        def out(s, graphdef=graphdef):
            return nnx.merge(graphdef, s)(ids, seg, mask, pos, dropout_key=key, record=True)

        loops[unroll] = jax.jit(out).lower(state).as_text().count("stablehlo.while")
        runs[unroll] = (out(state), _grads(model, ids, seg, mask, pos, key))
    assert loops[2] == loops[1] == loops[3] + 1, loops  # the others: dropout's random bits
    for unroll in (2, 3):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
            runs[1],
            runs[unroll],
        )


def test_scan_unroll_needs_scanned_layers():
    with pytest.raises(ValueError, match="scan_unroll=4.*scan_layers=True"):
        ln_jax.ModelConfig(**ODD, num_layers=4, scan_unroll=4)
    with pytest.raises(ValueError, match="scan_unroll=0"):
        ln_jax.ModelConfig(**ODD, num_layers=4, scan_layers=True, scan_unroll=0)


def _grads(model, ids, seg, mask, pos, key):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        m = nnx.merge(graphdef, p, rest)
        return jnp.mean(m(ids, seg, mask, pos, dropout_key=key)["mlm_logits"] ** 2)

    return jax.jit(jax.grad(loss))(params)  # remat acts under jit, where programs are built


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_gradients(scan, remat):
    """With dropout on hidden states and attention probabilities: the recomputed forward
    draws the same masks."""
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, scan_layers=scan, attention_dropout=0.3)
    ids, seg, mask, pos = batch(np.random.default_rng(4))
    key = jax.random.key(3)
    plain = _grads(build(cfg, seed=5), ids, seg, mask, pos, key)
    remat = _grads(build(cfg.replace(remat=remat), seed=5), ids, seg, mask, pos, key)
    for x, y in zip(jax.tree.leaves(plain), jax.tree.leaves(remat), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_remat_dots_keeps_the_attention_output_not_its_probabilities(impl):
    """remat="dots" saves the projections' outputs and the attention's output (with the fused
    kernel's log-sum-exp): the backward recomputes the probabilities [B, N, T, S] but not the
    attention, so the fused kernel's forward does not run twice (an H200's compile of BERT-base:
    36 -> 24 attention kernels a step) nor XLA's probabilities-times-values matmul (libtpu,
    v6e-1: 17.791 -> 17.695 TFLOP a step)."""
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    ids, seg, mask, pos = batch(np.random.default_rng(4))
    key = jax.random.key(3)

    def saved(remat: str) -> list[str]:
        cfg = ln_jax.ModelConfig(
            **ODD, num_layers=2, attention_dropout=0.3, remat=remat, attention_impl=impl
        )
        graphdef, params, rest = nnx.split(build(cfg, seed=5), nnx.Param, ...)

        def loss(p):
            m = nnx.merge(graphdef, p, rest)
            return jnp.mean(m(ids, seg, mask, pos, dropout_key=key)["mlm_logits"] ** 2)

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(loss, params)
        return out.getvalue().splitlines()

    dots = saved("dots")
    named = [line.split(" from ")[0] for line in dots if "'attention_residuals'" in line]
    # per layer: XLA's output [3, 9, 3, 4]; the kernel's padded output and log-sum-exp
    want = ["f32[3,9,3,4]"] * 2 if impl == "xla" else ["f32[3,16,3,16]", "f32[3,3,16]"] * 2
    assert [n.split()[0] for n in named] == want, named
    assert not any(line.startswith("f32[3,3,9,9]") for line in dots)  # no probabilities
    assert not any("'attention_residuals'" in line for line in saved("full"))


def test_remat_dots_saves_what_cudnn_s_attention_forward_computes():
    """cuDNN's attention (jax.nn) keeps its residuals inside its own VJP, where no checkpoint
    name reaches; "dots" saves its forward primitive's outputs by name (compiled for an H200
    with the cuDNN library: 36 -> 24 attention kernels a step, as Pallas). The names are
    JAX's: this fails if they change."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    from ln_jax.nn import stack

    policy = stack._REMAT_POLICIES["dots"]
    forward = [cudnn._dot_product_attention_fwd_p, cudnn._dot_product_attention_fwd_p_wrapper]
    assert [p.name for p in forward] == list(stack.CUDNN_ATTENTION_FORWARD)
    assert all(policy(p) for p in forward)
    assert not policy(cudnn._dot_product_attention_bwd_p)
    assert not policy(jax.lax.exp_p)  # the probabilities' exponentials are recomputed


def test_dropout_is_driven_by_the_key():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, hidden_dropout=0.3, attention_dropout=0.3)
    model = build(cfg)
    ids, seg, mask, pos = batch(np.random.default_rng(5))
    run = lambda key: np.asarray(model(ids, seg, mask, pos, dropout_key=key)["mlm_logits"])
    np.testing.assert_array_equal(run(None), run(None))
    np.testing.assert_array_equal(run(jax.random.key(1)), run(jax.random.key(1)))
    assert not np.allclose(run(jax.random.key(1)), run(jax.random.key(2)))
    assert not np.allclose(run(jax.random.key(1)), run(None))


def test_bf16_dropout_scales_kept_entries_by_exactly_one_over_keep_probability():
    """Kept entries are x / 0.9 rounded once: dividing by bf16(0.9) = 0.8984 made them 0.18%
    too large (1.1131 x). The gradient applies the same mask and scale."""
    from ln_jax.nn import layers

    x = jax.random.normal(jax.random.key(1), (512, 512)).astype(jnp.bfloat16)
    key = jax.random.key(0)
    y = np.asarray(layers.dropout(x, 0.1, key), np.float64)
    xf, kept = np.asarray(x, np.float64), y != 0
    assert abs(kept.mean() - 0.9) < 0.005
    ratio = np.abs(y[kept]).sum() / np.abs(xf[kept]).sum()
    assert abs(ratio - 1 / 0.9) < 2e-4, ratio
    weights = jnp.asarray(np.random.default_rng(2).normal(size=x.shape), jnp.float32)
    loss = lambda x: (layers.dropout(x, 0.1, key).astype(jnp.float32) * weights).sum()  # noqa: E731
    grad = np.asarray(jax.grad(loss)(x), np.float64)
    expected = np.where(kept, np.asarray(weights, np.float64) / 0.9, 0.0)
    np.testing.assert_allclose(grad, expected, rtol=2**-7, atol=0)  # two bf16 roundings


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_intermediates_are_consistent(placement):
    cfg = ln_jax.ModelConfig(**ODD, num_layers=3, placement=placement)
    model = randomize(build(cfg))
    ids, seg, mask, pos = batch(np.random.default_rng(6))
    rec = {
        k: np.asarray(v)
        for k, v in model(ids, seg, mask, pos, record=True)["intermediates"].items()
    }
    # The output of layer l is the input of layer l+1.
    np.testing.assert_allclose(rec["ffn/output"][:-1], rec["layer_in"][1:], atol=1e-6)
    norm = f"ffn/{placement}_norm"
    assert rec[f"{norm}_in"].shape == rec[f"{norm}_out"].shape == (3, 3, 9, 12)
    if placement == "post":  # x^{post,5} = x^{post,3} + F(x^{post,3}) (no dropout here)
        np.testing.assert_allclose(
            rec["ffn/post_norm_in"], rec["attention/output"] + rec["ffn/branch_out"], atol=1e-5
        )
    else:  # the Pre-LN residual stream: x_{l+1} = x^{pre,3} + F(LN(x^{pre,3}))
        np.testing.assert_allclose(
            rec["ffn/output"], rec["attention/output"] + rec["ffn/branch_out"], atol=1e-5
        )
        assert "final_norm_out" in rec and "post_norm_in" not in " ".join(rec)


def test_xavier_and_bert_initialisers():
    d = 64
    base = dict(size="custom", vocab_size=50, hidden_size=d, num_heads=4, mlp_dim=128, num_layers=1)
    xav = build(ln_jax.ModelConfig(**base, init="xavier"))
    bert = build(ln_jax.ModelConfig(**base, init="bert"))
    q = lambda m: np.asarray(m.bert.encoder.layers[0].attention.branch.query.kernel[...])
    assert abs(q(xav).var() * d - 1.0) < 0.15  # Xavier on a d x d map: Var = 1/d
    assert abs(q(bert).std() - 0.02 * 0.88) < 0.002  # truncated at 2 sigma: std ~0.88 sigma
    assert np.abs(q(bert)).max() <= 0.04 + 1e-6
    emb = np.asarray(xav.bert.embeddings.word[...])
    assert abs(emb.std() * np.sqrt(d) - 1.0) < 0.1


def test_bfloat16_compute_keeps_float32_params_and_logits():
    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, dtype="bfloat16")
    model = build(cfg)
    ids, seg, mask, pos = batch(np.random.default_rng(7))
    out = model(ids, seg, mask, pos, record=True)
    assert out["mlm_logits"].dtype == jnp.float32 and out["nsp_logits"].dtype == jnp.float32
    assert out["intermediates"]["ffn/branch_out"].dtype == jnp.bfloat16
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    ref = build(cfg.replace(dtype="float32"))(ids, seg, mask, pos)["mlm_logits"]
    np.testing.assert_allclose(out["mlm_logits"], ref, atol=0.1)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("placement", "postln", "valid names: admin, deepnorm, deepnorm_alpha, deepnorm_beta, dyt"),
        ("activation", "swish", "valid names: gelu, gelu_tanh, relu"),
        ("size", "huge", "valid names: base, custom, large, mini, tiny"),
        ("num_heads", 5, "hidden_size=128 is not divisible by model.num_heads=5"),
        ("hidden_dropout", 1.5, "hidden_dropout=1.5"),
    ],
)
def test_bad_config_errors_name_the_problem(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ln_jax.ModelConfig.from_mapping({"size": "tiny", field: value})


def test_misspelt_model_field_names_the_closest():
    with pytest.raises(ValueError, match="Did you mean 'placement'"):
        ln_jax.ModelConfig.from_mapping({"placment": "pre"})


def test_named_sizes():
    for name, shape in {
        "tiny": (2, 128, 2, 512),
        "mini": (4, 256, 4, 1024),
        "base": (12, 768, 12, 3072),
        "large": (24, 1024, 16, 4096),
    }.items():
        cfg = ln_jax.model_config(name)
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.mlp_dim) == shape
    assert ln_jax.model_config("base").max_position_embeddings == 512
    assert ln_jax.model_config("mini", num_layers=7).num_layers == 7


@pytest.mark.parametrize("which", ["layernorm", "rmsnorm"])
def test_closed_form_norm_backward_matches_autodiff(which):
    """norms.normalize / rms_normalize: hand-written VJPs equal autodiff of their forward."""
    from ln_jax.nn import layers, norms

    eps = 1e-12 if which == "layernorm" else 1e-6
    fn = norms.normalize if which == "layernorm" else norms.rms_normalize

    def plain(x):
        if which == "layernorm":
            c = x - x.mean(-1, keepdims=True)
            return c * jax.lax.rsqrt(jnp.square(c).mean(-1, keepdims=True) + eps)
        return x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps)

    kx, kg = jax.random.split(jax.random.key(0))
    x = 3.0 * jax.random.normal(kx, (4, 5, 32)) + 1.5
    g = jax.random.normal(kg, x.shape)
    y, vjp = jax.vjp(lambda v: fn(v, eps), x)
    y_ref, vjp_ref = jax.vjp(plain, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vjp(g)[0], vjp_ref(g)[0], rtol=1e-4, atol=1e-5)
    # Not trivially zero: a nonzero cotangent gives a nonzero input gradient.
    assert float(jnp.abs(vjp(g)[0]).max()) > 0.1
    # Forward mode: refused by the custom VJP, available inside autodiff_normalization().
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(lambda v: fn(v, eps), (x,), (g,))
    with layers.autodiff_normalization():
        _, tangent = jax.jvp(lambda v: fn(v, eps), (x,), (g,))
        closed_form_inside = jax.vjp(lambda v: fn(v, eps), x)[1](g)[0]
    _, tangent_ref = jax.jvp(plain, (x,), (g,))
    np.testing.assert_allclose(tangent, tangent_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(closed_form_inside, vjp_ref(g)[0], rtol=1e-4, atol=1e-5)
    y_again, vjp_again = jax.vjp(lambda v: fn(v, eps), x)  # outside again: the custom VJP
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(lambda v: fn(v, eps), (x,), (g,))


def test_layer_norm_closed_form_gradients_match_autodiff():
    """norms.layer_norm: its hand-written backward gives the input's, the scale's and the
    bias's gradients of autodiff of normalize(x) * scale + bias; the row statistics reach it
    through an optimisation barrier (XLA then reads them instead of re-deriving the mean)."""
    from ln_jax.nn import norms

    kx, kg, ks = jax.random.split(jax.random.key(1), 3)
    x = 3.0 * jax.random.normal(kx, (4, 5, 32)) + 1.5
    g = jax.random.normal(kg, x.shape)
    scale, bias = 1.0 + 0.3 * jax.random.normal(ks, (32,)), jnp.linspace(-1.0, 1.0, 32)

    def plain(x, scale, bias):
        c = x - x.mean(-1, keepdims=True)
        return c * jax.lax.rsqrt(jnp.square(c).mean(-1, keepdims=True) + 1e-12) * scale + bias

    ours = lambda x, s, b: norms.layer_norm(x, s, b, 1e-12)  # noqa: E731
    y, vjp = jax.vjp(ours, x, scale, bias)
    y_ref, vjp_ref = jax.vjp(plain, x, scale, bias)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(vjp(g), vjp_ref(g), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert float(jnp.abs(want).max()) > 0.1
    backward = str(jax.make_jaxpr(lambda *a: jax.vjp(ours, *a)[1](g))(x, scale, bias))
    assert "optimization_barrier" in backward


@pytest.mark.parametrize("offset", [0.0, 1.5, 300.0])
def test_one_pass_row_moments_equal_the_two_pass_form(offset, monkeypatch):
    """`norms.row_moments` on a GPU is Welford's one pass: its mean and variance, their
    gradients and forward-mode tangents equal the two-pass form's, also on rows whose mean is
    100 standard deviations from zero; a LayerNorm on it keeps its closed-form gradients. On
    this CPU row_moments is the two-pass form, bit for bit."""
    from ln_jax.nn import norms

    kx, kg, kt = jax.random.split(jax.random.key(2), 3)
    x = offset + 3.0 * jax.random.normal(kx, (4, 5, 768))
    one, two = norms._one_pass_moments, norms._two_pass_moments
    x64 = np.asarray(x, np.float64)
    mean64 = x64.mean(-1, keepdims=True)
    var64 = np.square(x64 - mean64).mean(-1, keepdims=True)
    # float32 rounding only: this CPU reduces each row in one sequence (a GPU in a tree), so
    # the running mean's error grows with the row's magnitude; mean(x^2) - mean(x)^2 would
    # be 2e-3 off the variance at the 300 offset.
    mean, var = one(x)
    assert np.abs(mean - mean64).max() < 2e-6 * (offset + 12.0)
    assert np.abs(var / var64 - 1.0).max() < 2e-5
    for a, b in zip(norms.row_moments(x), two(x), strict=True):
        assert np.array_equal(a, b)
    cot = tuple(jax.random.normal(k, (4, 5, 1)) for k in jax.random.split(kg))
    for a, b in zip(jax.vjp(one, x)[1](cot), jax.vjp(two, x)[1](cot), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    t = jax.random.normal(kt, x.shape)
    for a, b in zip(jax.jvp(one, (x,), (t,))[1], jax.jvp(two, (x,), (t,))[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)

    scale, bias = 1.0 + 0.1 * jax.random.normal(kt, (768,)), jnp.linspace(-1.0, 1.0, 768)
    g = jax.random.normal(kg, x.shape)
    ln = lambda x, s, b: norms.layer_norm(x, s, b, 1e-12)  # noqa: E731
    y_two, vjp_two = jax.vjp(ln, x, scale, bias)
    monkeypatch.setattr(norms, "row_moments", one)  # as a GPU's trace takes it
    y_one, vjp_one = jax.vjp(ln, x, scale, bias)
    tol = 1e-4 * (1.0 + offset / 100.0)  # the mean's error over the spread, 3
    np.testing.assert_allclose(y_one, y_two, rtol=tol, atol=tol)
    for a, b in zip(vjp_one(g), vjp_two(g), strict=True):
        np.testing.assert_allclose(a, b, rtol=10 * tol, atol=10 * tol)


def test_one_pass_logsumexp_equals_jax_s():
    """`layers.logsumexp` on a GPU is one pass (a running maximum and a rescaled sum): its
    values, gradients and forward-mode tangents equal `jax.nn.logsumexp`'s, with the MLM
    head's masked padding rows (-1e9) and a row half -inf; on this CPU it is jax's, bit for
    bit."""
    from ln_jax.nn import layers

    kx, kg, kt = jax.random.split(jax.random.key(3), 3)
    x = 4.0 * jax.random.normal(kx, (3, 5, 1000)) + 20.0
    x = x.at[..., 900:].set(-1e9).at[0, 0, :500].set(-jnp.inf)
    one = layers._one_pass_logsumexp
    ref = lambda v: jax.nn.logsumexp(v, axis=-1)  # noqa: E731
    np.testing.assert_allclose(one(x), ref(x), rtol=1e-6)
    assert np.array_equal(layers.logsumexp(x), ref(x))
    g = jax.random.normal(kg, x.shape[:-1])
    np.testing.assert_allclose(
        jax.vjp(one, x)[1](g)[0], jax.vjp(ref, x)[1](g)[0], rtol=1e-5, atol=1e-6
    )
    t = jax.random.normal(kt, x.shape)
    np.testing.assert_allclose(jax.jvp(one, (x,), (t,))[1], jax.jvp(ref, (x,), (t,))[1], rtol=1e-5)
    assert float(jnp.abs(jax.vjp(ref, x)[1](g)[0]).max()) > 0.1  # the comparison is not 0 = 0


def test_hessian_through_closed_form_norms_equals_autodiff():
    """jax.hessian (forward over reverse) differentiates the closed-form backward itself; it
    equals the Hessian of the plain formula (`autodiff_normalization`) through a whole model."""
    from ln_jax.nn import layers

    cfg = ln_jax.ModelConfig(**ODD, num_layers=2, placement="pre")
    model = build(cfg, seed=0)
    ids, seg, mask, pos = batch(np.random.default_rng(0))
    graphdef, state = nnx.split(model)
    is_target = lambda path: (
        "'embeddings'" in str(path) and "'norm'" in str(path) and "'scale'" in str(path)
    )

    def loss(s):  # the model with its embedding LayerNorm's scale replaced by `s` [embed]
        swap = lambda path, x: s if is_target(path) else x
        m = nnx.merge(graphdef, jax.tree_util.tree_map_with_path(swap, state))
        return m(ids, seg, mask, pos)["mlm_logits"].astype(jnp.float32).std()

    s0 = model.bert.embeddings.norm.scale[...] * 1.3
    # Jitted: one program each instead of thousands of op-by-op dispatches of forward-over-reverse.
    h = jax.jit(jax.hessian(loss))(s0)  # every later LayerNorm's input depends on s
    with layers.autodiff_normalization():  # read while tracing: inside the context
        h_ref = jax.jit(jax.hessian(loss))(s0)
    assert h.shape == (s0.size, s0.size) and float(jnp.abs(h_ref).max()) > 1e-4
    np.testing.assert_allclose(h, h_ref, rtol=1e-3, atol=1e-6 * float(jnp.abs(h_ref).max()))
    np.testing.assert_allclose(h, h.T, rtol=1e-3, atol=1e-6)
