"""ln_jax.analysis: the papers' measurements at initialisation, their plots, the CLI, errors.

Small widths and few seeds keep the file within a couple of minutes on two CPU cores; the
thresholds were set from measurements at these sizes with a margin.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from flax import nnx

import ln_jax
from ln_jax import analysis
from ln_jax.analysis import cli, gradients, models, plots
from ln_jax.analysis.settings import Arm, Settings, analysis_config, arm_model
from ln_jax.config.run import CheckpointConfig
from ln_jax.nn import admin
from ln_jax.nn.stack import layer_state
from ln_jax.train import optim
from ln_jax.train.checkpoint import Checkpointer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "bert_preln.py") + ":tiny"

# Theory setting: d = 32 (one head, 32 x 32 matrices), 8 sequences of 16 Gaussian vectors.
THEORY = {
    "model.hidden_size": 32,
    "model.scan_layers": True,
    "data.global_batch_size": 8,
    "data.max_seq_length": 16,
}
# A small BERT on random tokens: d = 32, 2 heads, vocabulary 256.
SMALL_BERT = {
    "model.hidden_size": 32,
    "model.num_heads": 2,
    "model.mlp_dim": 64,
    "data.vocab_size": 256,
    "data.global_batch_size": 4,
    "data.max_seq_length": 16,
    "bert.max_predictions_per_seq": 3,
}


def theory_settings(seeds=8, batches=1) -> Settings:
    return Settings(analysis_config(overrides=THEORY), range(seeds), batches, "theory")


def bert_settings(seeds=3, batches=1, **kwargs) -> Settings:
    cfg = analysis_config(overrides=SMALL_BERT)
    return Settings(cfg, range(seeds), batches, "bert", "random", **kwargs)


def mean(result, *keys):
    node = result["results"]
    for key in keys:
        node = node[key]
    return np.asarray(node["mean"], float)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")  # the figures the tests draw to read back


def halved(result):
    """A copy of `result` with every measured mean halved: another input to plot."""

    def walk(node):
        if not isinstance(node, dict):
            return node
        return {
            k: (np.array(v, float) / 2).tolist() if k == "mean" else walk(v)
            for k, v in node.items()
        }

    return {**result, "results": walk(result["results"])}


def assert_png_of(plot, result, tmp_path):
    """`plot(result, path)` writes a PNG and returns its path; the same result gives the same
    image, another one (means halved) a different image."""
    inputs = (result, result, halved(result))
    images = [
        Path(plot(r, str(tmp_path / f"plot{i}.png"))).read_bytes() for i, r in enumerate(inputs)
    ]
    assert images[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert images[0] == images[1] and images[0] != images[2]


def errorbars(ax):
    """label -> (x, y, half-height of the error bar) of each errorbar drawn on `ax`."""
    drawn = {}
    for bars in ax.containers:
        line, _, (vertical,) = bars.lines
        half = [(seg[1][1] - seg[0][1]) / 2 for seg in vertical.get_segments()]
        drawn[bars.get_label()] = (line.get_xdata(), line.get_ydata(), np.array(half))
    return drawn


def assert_errorbar(drawn, x, mean, std):
    np.testing.assert_array_equal(drawn[0], x)
    np.testing.assert_allclose(drawn[1], np.asarray(mean, float), rtol=1e-6)
    np.testing.assert_allclose(drawn[2], np.asarray(std, float), rtol=1e-6, atol=1e-12)


def assert_by_depth(ax, results):
    """`ax` shows each arm's mean +- std against the depth, and nothing else."""
    drawn = errorbars(ax)
    assert set(drawn) == set(results)
    for label, by_depth in results.items():
        depths = sorted(by_depth, key=int)
        mean = [by_depth[n]["mean"] for n in depths]
        std = [by_depth[n]["std"] for n in depths]
        assert_errorbar(drawn[label], [int(n) for n in depths], mean, std)


def line_labelled(ax, label):
    (line,) = [x for x in ax.lines if x.get_label() == label]
    return line


# --------------------------------------------------------------------------- Xiong et al.


@pytest.fixture(scope="module")
def lemma2_theory():
    return analysis.lemma2(theory_settings(seeds=6), num_layers=6, setting_names=("theory",))


def test_lemma2_post_ln_is_one_and_a_half_d(lemma2_theory):
    d = 32
    post = lemma2_theory["results"]["theory"]["post"]["post5"]
    m, s = np.asarray(post["mean"]), np.asarray(post["std"])
    standard_error = s / np.sqrt(6)
    # Lemma 2: E||x^{post,5}_l||^2 = 1.5 d for every layer, within sampling error.
    assert np.all(np.abs(m - 1.5 * d) <= 4 * standard_error + 0.03 * d), (m / d, s / d)
    assert abs(m.mean() / d - 1.5) < 0.06


def test_lemma2_pre_ln_lies_in_its_interval(lemma2_theory):
    res = lemma2_theory["results"]["theory"]
    stream = np.asarray(res["pre"]["stream"]["mean"])
    lower = np.asarray(res["prediction"]["stream_lower"])
    upper = np.asarray(res["prediction"]["stream_upper"])
    assert stream[0] == pytest.approx(32, rel=0.05)  # the N(0, I) input
    assert np.all((stream[1:] >= lower[1:]) & (stream[1:] <= upper[1:])), stream / 32
    assert np.all(np.diff(stream) > 0)


def test_depth_post_ln_flat_pre_ln_shrinks(tmp_path):
    result = analysis.grad_norm_by_depth(theory_settings(), num_layers=(6, 14))
    post, pre = result["results"]["post"], result["results"]["pre"]
    post_ratio = post["14"]["mean"] / post["6"]["mean"]
    pre_ratio = pre["14"]["mean"] / pre["6"]["mean"]
    # Theorem 1: Post-LN independent of L; Pre-LN ~ 1/sqrt(L) (sqrt(6/14) = 0.65).
    assert 0.7 <= post_ratio <= 1.4, post_ratio
    assert pre_ratio < 0.85, pre_ratio
    assert result["config"]["setting"] == "theory" and result["config"]["seeds"] == list(range(8))
    (ax,) = plots.depth_figure(result).axes
    assert_by_depth(ax, result["results"])
    guide = line_labelled(ax, r"pre: $\propto 1/\sqrt{L}$")  # 1/sqrt(L) from Pre-LN at L = 6
    np.testing.assert_allclose(guide.get_ydata(), pre["6"]["mean"] * np.sqrt([1, 6 / 14]))
    assert_png_of(analysis.plot_depth, result, tmp_path)


LAYER_NORMS = ("mean_of_norm", "norm_of_mean")


def test_layers_and_plot(tmp_path):
    settings = theory_settings(seeds=1, batches=3)
    result = analysis.grad_norm_by_layer(settings, ("post",), num_layers=3, train_steps=2)
    for stage in ("init", "after_warmup"):
        for matrix in ("W1", "W2"):
            of_norms, of_mean = (mean(result, "post", stage, q, matrix) for q in LAYER_NORMS)
            assert of_norms.shape == of_mean.shape == (3,) and np.all(of_mean > 0)
            # Jensen: E||g|| >= ||E g||, strictly for batches whose gradients differ.
            assert np.all(of_norms > of_mean * (1 + 1e-3)), (of_norms, of_mean)
    assert result["config"]["optimizer"]["warmup_steps"] == 2
    assert result["config"]["batches_per_model"] == 3
    assert "encoder only" in result["architecture"]
    assert_layer_norms_of_batches(settings, result["results"]["post"]["init"])
    fig = plots.layers_figure(result)
    labels = {"init": "post, init", "after_warmup": "post, 2 warm-up steps"}
    panels = [(q, m) for q in LAYER_NORMS for m in ("W1", "W2")]
    for ax, (quantity, matrix) in zip(fig.axes, panels, strict=True):
        drawn = errorbars(ax)
        assert set(drawn) == set(labels.values())
        assert "encoder only" in ax.get_title()
        for stage, label in labels.items():
            node = result["results"]["post"][stage][quantity][matrix]
            assert_errorbar(drawn[label], [1, 2, 3], node["mean"], node["std"])
    assert_png_of(analysis.plot_layers, result, tmp_path)


def assert_layer_norms_of_batches(settings, init):
    """The scanned norms of one model against its gradients taken batch by batch; with one
    batch, E||g|| = ||E g||."""
    arm = Arm("post", arm_model(settings, "post", 3), settings.config.data)
    batches = models.take_batches(settings, arm, settings.batches)
    ((_, model),) = models.instances(settings, arm, batches[0])
    task = models.arm_task(settings, arm)
    grad_fn = models.jit_model_fn(functools.partial(gradients._ffn_grads, task))
    grads = [[np.asarray(g, np.float64) for g in grad_fn(model, b)] for b in batches]
    flat = lambda g: g.reshape(3, -1)  # [layers, d * mlp]
    for k, matrix in enumerate(("W1", "W2")):
        norms = np.mean([np.linalg.norm(flat(g[k]), axis=1) for g in grads], axis=0)
        of_mean = np.linalg.norm(flat(np.mean([g[k] for g in grads], axis=0)), axis=1)
        np.testing.assert_allclose(init["mean_of_norm"][matrix]["mean"], norms, rtol=1e-4)
        np.testing.assert_allclose(init["norm_of_mean"][matrix]["mean"], of_mean, rtol=1e-4)
    one = gradients.stack_batches(batches[:1])
    moments = functools.partial(gradients._ffn_grad_moments, task)
    per_batch, of_mean = models.jit_model_fn(moments)(model, one)
    np.testing.assert_allclose(per_batch[0], of_mean, rtol=1e-6)


def test_lemma2_plot(lemma2_theory, tmp_path):
    res, d = lemma2_theory["results"]["theory"], 32
    (ax,) = plots.lemma2_figure(lemma2_theory).axes
    drawn = errorbars(ax)
    post, pre = drawn.pop("post: $x^{post,5}_l$"), drawn.pop("pre: residual stream $x_l$")
    assert not drawn
    # Post-LN: x^{post,5}_l for l = 1..6; Pre-LN (no post-norm): the stream for l = 0..6.
    post5, stream = res["post"]["post5"], res["pre"]["stream"]
    assert_errorbar(post, range(1, 7), _over(post5["mean"], d), _over(post5["std"], d))
    assert_errorbar(pre, range(7), _over(stream["mean"], d), _over(stream["std"], d))
    (band,) = [c for c in ax.collections if c.get_label() == "pre: Lemma 2 interval"]
    corners = band.get_paths()[0].vertices
    for layer in range(7):
        ys = corners[corners[:, 0] == layer, 1]
        assert ys.min() == pytest.approx(res["prediction"]["stream_lower"][layer] / d)
        assert ys.max() == pytest.approx(res["prediction"]["stream_upper"][layer] / d)
    assert list(line_labelled(ax, "post: Lemma 2, 1.5").get_ydata()) == [1.5, 1.5]
    assert_png_of(analysis.plot_lemma2, lemma2_theory, tmp_path)


def _over(values, d):
    return np.asarray(values, float) / d


# --------------------------------------------------------------------------- Liu et al.


def test_output_change_post_ln_largest(tmp_path):
    result = analysis.output_change(bert_settings(seeds=3, batches=2), num_layers=(8,))
    post, pre, admin = (mean(result, p, "8") for p in ("post", "pre", "admin"))
    assert post > 1.3 * pre and post > 1.3 * admin, (post, pre, admin)
    assert result["config"]["init"] == "xavier"
    assert_by_depth(plots.output_change_figure(result).axes[0], result["results"])
    assert_png_of(analysis.plot_output_change, result, tmp_path)


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory):
    """A saved run (parameters shifted from their initialisation, as training would)."""
    workdir = tmp_path_factory.mktemp("run")
    cfg = analysis_config(overrides={**SMALL_BERT, "model.placement": "post"})
    task = models.analysis_task(cfg, theory=False)
    model = models.fresh_model(task, 0, batch={})  # what trainer.init_state builds
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    opt_state = optim.make_optimizer(cfg.optim, params).init(params)
    state = {
        "params": params,
        "opt_state": opt_state,
        "step": 7,
        "halted": False,
        "nonfinite_step": 0,
    }
    state = jax.tree.map(jnp.asarray, state)
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(async_save=False))
    config = json.loads(json.dumps(cfg.to_dict(), default=str))
    ckpt.save(7, state, {}, config)
    ckpt.close()
    return str(workdir), nnx.merge(graphdef, params, rest)


def test_dependency_at_init_and_for_a_checkpoint(checkpoint_run, tmp_path):
    workdir, saved = checkpoint_run
    settings = bert_settings(seeds=2, batches=2, checkpoint=workdir)
    result = analysis.layer_dependency(settings, ("post", "pre"), num_layers=3)
    for label, n_sub in (("post", 6), ("pre", 6), ("checkpoint", 4)):
        arm = result["results"][label]
        share = np.asarray(arm["share"]["mean"])
        assert share.shape == (n_sub, n_sub + 1)
        assert arm["reconstruction_error"] < 1e-4  # the decomposition is exact
        assert np.all(share >= 0) and np.all(share.sum(1) < 1.5)  # 1 if uncorrelated
        assert np.all(np.triu(share, 2) == 0)
    assert result["results"]["checkpoint"]["share"]["std_over"] == "batches"
    info = result["config"]["checkpoint_arm"]
    assert (info["step"], info["placement"], info["num_layers"]) == (7, "post", 2)
    loaded = analysis.load_checkpoint(workdir)[1]
    kernel = lambda m: np.asarray(layer_state(m.bert.encoder, 1)["ffn"]["branch"]["wo"]["kernel"])
    np.testing.assert_array_equal(kernel(loaded), kernel(saved))
    fig = plots.dependency_figure(result)
    assert len(fig.axes) == 4  # three heatmaps and their shared colour bar
    titles = ["post", "pre", "trained (post)"]
    for ax, title, arm in zip(fig.axes, titles, result["results"].values(), strict=False):
        assert ax.get_title() == title
        share = np.asarray(arm["share"]["mean"])
        shown = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
        drawn = np.tril(np.ones_like(share), k=1) > 0  # output i depends on branches j <= i + 1
        np.testing.assert_allclose(shown[drawn], share[drawn], rtol=1e-6)
        assert np.all(np.isnan(shown[~drawn]))
    assert_png_of(analysis.plot_dependency, result, tmp_path)


def test_stacked_fresh_models_and_admin_profile_match_ln_jax():
    settings = bert_settings()
    cfg = arm_model(settings, "admin", 3)
    assert cfg.scan_layers  # the analysis stacks the layers of a list-initialised model
    arm = Arm("admin", cfg, settings.config.data)
    batch = models.take_batches(settings, arm, 1)[0]
    model = models.fresh_model(models.arm_task(settings, arm), 4, batch)
    with nnx.use_eager_sharding(False):  # what create_model(cfg, seed=4) builds, uncompiled
        reference = ln_jax.BertForPreTraining(cfg.replace(scan_layers=False), rngs=nnx.Rngs(4))
    omegas = admin.admin_profile(reference, batch, None)
    np.testing.assert_allclose(admin.get_admin_omega(model)[:, 0], omegas, rtol=1e-5)
    ours, theirs = models.encode(model, batch)[0], models.encode(reference, batch)[0]
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


# --------------------------------------------------------------------------- CLI, errors


def run_cli(args, capsys):
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_writes_json_and_png(tmp_path, capsys):
    overrides = [f"--config.{k}={v}" for k, v in SMALL_BERT.items()]
    args = ["depth", f"--out={tmp_path}", f"--config={CONFIG}", "--num_layers=3"]
    args += ["--placements=pre,post+pre*2"]  # "+" joins a per-layer list inside one arm
    args += ["--seeds=2", "--batches=1", "--data=random", *overrides]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "depth.json").read_text())
    assert set(result["results"]) == {"pre", "post,pre*2"}
    assert set(result["results"]["post,pre*2"]) == {"3"}
    assert result["config"]["model"]["init"] == "xavier"
    assert result["config"]["hidden_size"] == 32
    # The PNG shows the JSON's numbers: it looks like their plot, unlike a plot of others.
    png = matplotlib.image.imread(tmp_path / "depth.png")
    same = matplotlib.image.imread(analysis.plot_depth(result, str(tmp_path / "same.png")))
    other = matplotlib.image.imread(analysis.plot_depth(halved(result), str(tmp_path / "o.png")))
    assert png.shape == same.shape and np.abs(png - same).max() < 0.05
    assert np.abs(png - other).max() > 0.5
    assert "wrote" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["depth", "--placements=post,postln"], "unknown placement 'postln'"),
        (["depth", "--num_layers="], "layer list is empty"),
        (["depth", "--num_layers=6,x"], "give integers"),
        (["layers", "--num_layers=4,6"], "takes one depth"),
        (["lemma2", "--setting=theory,gpt"], "unknown setting 'gpt'"),
        (["dependency", "--checkpoint=/nonexistent/run"], "does not exist"),
        (["depth", "--seeds=ten"], "give a count"),
        (["depth", "--config.model.hidden_sise=64"], "Did you mean 'model.hidden_size'"),
        (["depth", "--bogus=1"], "unknown flag '--bogus'"),
        (["depth", "--seed=3"], "Did you mean --seeds?"),
        (["depth", "--setting=theory", "--checkpoint=/tmp"], "--setting=bert"),
        (["depth", "--config=configs/nothere.py"], "no such file"),
        (["output-change", "--epsilon=0"], "must be > 0"),
    ],
)
def test_cli_errors_are_clear(args, message, tmp_path, capsys):
    args = [args[0], f"--out={tmp_path}", f"--config={CONFIG}", "--data=random", *args[1:]]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())


def test_api_errors():
    with pytest.raises(ValueError, match="no placement given"):
        analysis.grad_norm_by_depth(theory_settings(), placements=(), num_layers=(2,))
    with pytest.raises(ValueError, match="names 3 layers but model.num_layers=2"):
        analysis.grad_norm_by_depth(theory_settings(), ("post*3",), num_layers=(2,))
    with pytest.raises(ValueError, match="admin_omega=closed_form"):
        analysis.output_change(theory_settings(), ("admin",), num_layers=(2,))
    with pytest.raises(ValueError, match="no seeds"):
        Settings(seeds=())


def test_seed_mean_std_reports_the_spread_it_has():
    two_models = analysis.seed_mean_std([[1.0, 3.0], [5.0, 7.0]])
    assert two_models == {
        "mean": 4.0,
        "std": pytest.approx(np.std([2, 6], ddof=1)),
        "std_over": "seeds",
    }
    one_model = analysis.seed_mean_std([[[1.0, 2.0], [3.0, 6.0]]])
    assert one_model["mean"] == [2.0, 4.0] and one_model["std_over"] == "batches"
    assert analysis.seed_mean_std([[2.0]])["std_over"] == "none"
