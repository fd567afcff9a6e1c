"""HuggingFace interop: `ln_jax.models.bert.convert` against `transformers.BertForPreTraining`
(torch, CPU).

Odd sizes (vocab 97, width 36, 3 heads of 12, FFN 52, 40 positions) make transposes and head
splits that are wrong fail loudly. HF initialises biases to 0 and LayerNorms to (1, 0), which
would hide swapped or dropped parameters, so every parameter is randomised here.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

import ln_jax
from ln_jax import sharding
from ln_jax.models.bert import convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=1e-4)
SIZES = dict(
    vocab_size=97,
    hidden_size=36,
    num_attention_heads=3,
    intermediate_size=52,
    max_position_embeddings=40,
    type_vocab_size=3,  # not BERT's 2: BERT's own field (its section "bert") follows the checkpoint
)


def hf_config(num_layers: int = 2, act: str = "gelu") -> transformers.BertConfig:
    return transformers.BertConfig(num_hidden_layers=num_layers, hidden_act=act, **SIZES)


def randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random, LayerNorm scales around 1; eval mode (no dropout)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(0.0, 0.2)
            if "LayerNorm.weight" in name:
                p.add_(1.0)
    return module.eval()


def ln_config(**overrides) -> ln_jax.ModelConfig:
    return convert.config_from_hf(hf_config()).replace(**overrides)


def make_inputs() -> dict[str, np.ndarray]:
    """Batch 3, length 11: mixed segments, the middle row padded after 7 tokens."""
    rng = np.random.default_rng(0)
    mask = np.ones((3, 11), np.int64)
    mask[1, 7:] = 0
    segments = np.zeros((3, 11), np.int64)
    segments[:, 6:] = 1
    segments[2, 4:] = 1
    segments[1, 8:] = 2  # the checkpoint's third segment row
    positions = np.array([[1, 5, 10], [0, 3, 6], [2, 4, 9]], np.int64)
    ids = rng.integers(0, SIZES["vocab_size"], (3, 11))
    return dict(ids=ids, segments=segments, mask=mask, positions=positions)


INPUTS = make_inputs()


def hf_logits(model, x=INPUTS) -> tuple[np.ndarray, np.ndarray]:
    """(MLM logits at the masked positions [B, P, V], NSP logits [B, 2]) of an HF model."""
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(x["ids"]),
            token_type_ids=torch.tensor(x["segments"]),
            attention_mask=torch.tensor(x["mask"]),
        )
    mlm = np.take_along_axis(out.prediction_logits.numpy(), x["positions"][..., None], axis=1)
    return mlm, out.seq_relationship_logits.numpy()


@nnx.jit
def _forward(model, *args):
    return model(*args)


def ln_logits(model, x=INPUTS) -> tuple[np.ndarray, np.ndarray]:
    args = (jnp.asarray(x[k], jnp.int32) for k in ("ids", "segments", "mask", "positions"))
    out = _forward(model, *args)
    return np.asarray(out["mlm_logits"]), np.asarray(out["nsp_logits"])


def assert_logits_close(got, want) -> None:
    for g, w, name in zip(got, want, ("mlm", "nsp"), strict=True):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, err_msg=name, **TOL)


def params_of(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def save_checkpoint(model, root) -> tuple:
    """(model, a save_pretrained safetensors dir, a dir holding a torch.save'd .bin)."""
    st_dir, bin_dir = root / "safetensors", root / "bin"
    model.save_pretrained(st_dir, safe_serialization=True)
    bin_dir.mkdir()
    torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
    (bin_dir / "config.json").write_text((st_dir / "config.json").read_text())
    return model, st_dir, bin_dir


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory):
    model = randomise(transformers.BertForPreTraining(hf_config(2, "gelu")), seed=1)
    return save_checkpoint(model, tmp_path_factory.mktemp("two_layers"))


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    model = randomise(transformers.BertForPreTraining(hf_config(1, "gelu_new")), seed=2)
    return save_checkpoint(model, tmp_path_factory.mktemp("one_layer"))


@pytest.fixture(params=["two_layers", "one_layer"])
def checkpoint(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_loaded_model_matches_hf_logits(checkpoint, fmt):
    hf, st_dir, bin_dir = checkpoint
    model = convert.load_hf_bert(st_dir if fmt == "safetensors" else bin_dir)
    assert model.cfg.placement == "post" and model.cfg.num_layers == hf.config.num_hidden_layers
    assert_logits_close(ln_logits(model), hf_logits(hf))


def test_scan_layers_load_matches(checkpoint):
    hf, st_dir, _ = checkpoint
    model = convert.load_hf_bert(st_dir, scan_layers=True)
    assert model.cfg.scan_layers
    query = model.bert.encoder.layers.attention.branch.query.kernel
    assert query.shape == (hf.config.num_hidden_layers, 36, 3, 12)
    assert_logits_close(ln_logits(model), hf_logits(hf))


def test_single_weights_file_with_explicit_config(two_layers, tmp_path):
    hf, _, bin_dir = two_layers
    file = tmp_path / "weights.pt"
    file.write_bytes((bin_dir / "pytorch_model.bin").read_bytes())
    model = convert.load_hf_bert(file, config=hf.config.to_dict())
    assert_logits_close(ln_logits(model), hf_logits(hf))


def test_export_loads_in_transformers(checkpoint, tmp_path):
    hf, st_dir, _ = checkpoint
    model = convert.load_hf_bert(st_dir)
    convert.export_hf_bert(model, tmp_path / "out")
    back, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    assert not any(info.values()), info  # no missing / unexpected / mismatched keys
    assert back.config.hidden_act == hf.config.hidden_act
    assert_logits_close(hf_logits(back.eval()), hf_logits(hf))
    assert_logits_close(hf_logits(back), ln_logits(model))


@pytest.mark.parametrize("scan", [False, True])
def test_state_dict_round_trip_is_exact(two_layers, tmp_path, scan):
    model = convert.load_hf_bert(two_layers[1], scan_layers=scan)
    save_file(convert.to_hf_state_dict(model), str(tmp_path / "model.safetensors"))
    back = convert.load_hf_bert(tmp_path / "model.safetensors", config=model.cfg)
    want, got = params_of(model), params_of(back)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))


def test_scanned_model_exports_like_list_model(two_layers):
    listed = convert.to_hf_state_dict(convert.load_hf_bert(two_layers[1]))
    scanned = convert.to_hf_state_dict(convert.load_hf_bert(two_layers[1], scan_layers=True))
    assert listed.keys() == scanned.keys()
    for key in listed:
        np.testing.assert_array_equal(listed[key], scanned[key], err_msg=key)


def test_tied_state_dict_loads_strictly_into_torch(two_layers):
    hf, st_dir, _ = two_layers
    ours = convert.to_hf_state_dict(convert.load_hf_bert(st_dir), tied=True)
    theirs = hf.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value.numpy(), err_msg=key)
    fresh = transformers.BertForPreTraining(hf.config)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=True)


def test_load_on_a_mesh_places_each_parameter_in_its_sharding(one_layer):
    hf, st_dir, _ = one_layer  # one layer: creating the sharded model compiles faster
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    model = convert.load_hf_bert(st_dir, mesh=mesh)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        where = var.get_value().sharding
        assert isinstance(where, jax.sharding.NamedSharding) and where.mesh == mesh, path
    wi = model.bert.encoder.layers[0].ffn.branch.wi.kernel.get_value()
    assert wi.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    # Batch 3 does not split over data x fsdp, so run outside the mesh's activation rules.
    assert_logits_close(ln_logits(model), hf_logits(hf))


def hf_hidden(model, x=INPUTS) -> np.ndarray:
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(x["ids"]),
            token_type_ids=torch.tensor(x["segments"]),
            attention_mask=torch.tensor(x["mask"]),
        ).last_hidden_state.numpy()


def ln_hidden(encoder, x=INPUTS) -> np.ndarray:
    hidden, _ = _forward(
        encoder, *(jnp.asarray(x[k], jnp.int32) for k in ("ids", "segments", "mask"))
    )
    return np.asarray(hidden)


def test_bare_bert_model_checkpoint_loads_as_encoder(tmp_path):
    hf = randomise(transformers.BertModel(hf_config()), seed=2)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    keys = convert.load_hf_state_dict(tmp_path).keys()
    assert "bert.embeddings.word_embeddings.weight" in keys  # bare keys get the prefix
    with pytest.raises(
        ValueError, match=r"missing keys \['cls\.predictions\.bias'.*load_hf_encoder"
    ):
        convert.load_hf_bert(tmp_path)
    encoder = convert.load_hf_encoder(tmp_path)
    assert isinstance(encoder, ln_jax.BertEncoder)
    np.testing.assert_allclose(ln_hidden(encoder), hf_hidden(hf), **TOL)


def test_encoder_from_pretraining_checkpoint_ignores_heads(two_layers):
    hf, st_dir, _ = two_layers
    encoder = convert.load_hf_encoder(st_dir, scan_layers=True)
    np.testing.assert_allclose(ln_hidden(encoder), hf_hidden(hf.bert), **TOL)


def test_sharded_safetensors_index(two_layers, state_dict, tmp_path):
    keys = sorted(state_dict)
    halves = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, part in halves.items():
        save_file({k: state_dict[k] for k in part}, str(tmp_path / name), metadata={"format": "pt"})
    index = {"weight_map": {k: name for name, part in halves.items() for k in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = convert.load_hf_state_dict(tmp_path)
    assert loaded.keys() == state_dict.keys()
    for key in keys:
        np.testing.assert_array_equal(loaded[key], state_dict[key], err_msg=key)


# ---------------------------------------------------------------------------------------------
# Configuration


def test_config_from_hf_maps_every_field():
    cfg = convert.config_from_hf(
        {**hf_config().to_dict(), "layer_norm_eps": 1e-6, "hidden_dropout_prob": 0.2}
    )
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.mlp_dim) == (
        97,
        36,
        2,
        3,
        52,
    )
    assert cfg.max_position_embeddings == 40
    options = convert.options_from_hf(hf_config())
    assert (options.type_vocab_size, options.nsp_head) == (3, True)
    assert convert.config_to_hf(cfg, options)["type_vocab_size"] == 3
    assert convert.options_from_hf({}).type_vocab_size == 2  # BertConfig's default
    assert (cfg.placement, cfg.size, cfg.activation) == ("post", "custom", "gelu")
    assert (cfg.layer_norm_eps, cfg.hidden_dropout, cfg.attention_dropout) == (1e-6, 0.2, 0.1)
    for act, want in [
        ("relu", "relu"),
        ("gelu_new", "gelu_tanh"),
        ("gelu_pytorch_tanh", "gelu_tanh"),
    ]:
        assert convert.config_from_hf(hf_config(act=act)).activation == want
    assert convert.config_from_hf(convert.config_to_hf(cfg)) == cfg
    base = convert.config_from_hf({})  # absent fields: BertConfig's defaults (BERT-base)
    assert (base.num_layers, base.hidden_size, base.num_heads, base.vocab_size) == (
        12,
        768,
        12,
        30522,
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "mish"}, "hidden_act 'mish'"),
        ({"position_embedding_type": "relative_key"}, "absolute positions"),
        ({"model_type": "roberta"}, "only 'bert'"),
    ],
)
def test_config_from_hf_rejects_what_ln_jax_lacks(change, message):
    with pytest.raises(ValueError, match=message):
        convert.config_from_hf({**hf_config().to_dict(), **change})


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.fixture(scope="module")
def state_dict(two_layers) -> dict[str, np.ndarray]:
    return convert.load_hf_state_dict(two_layers[1])


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*does not exist.*model\.safetensors"):
        convert.load_hf_bert(tmp_path / "nowhere", config=ln_config())
    with pytest.raises(FileNotFoundError, match=r"no HuggingFace checkpoint.*pytorch_model\.bin"):
        convert.load_hf_state_dict(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        convert.load_hf_bert(tmp_path)


def _save(tmp_path, arrays) -> str:
    path = str(tmp_path / "model.safetensors")
    save_file(arrays, path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config().to_dict()))
    return path


def test_missing_and_unexpected_keys_are_listed(tmp_path, state_dict):
    arrays = dict(state_dict)
    del arrays["bert.encoder.layer.1.output.dense.bias"]
    arrays["bert.encoder.layer.2.output.dense.bias"] = np.zeros(36, np.float32)
    arrays["bert.embeddings.position_ids"] = np.arange(40)[None]  # an old buffer: ignored
    with pytest.raises(ValueError) as err:
        convert.load_hf_bert(_save(tmp_path, arrays))
    assert "missing keys ['bert.encoder.layer.1.output.dense.bias']" in str(err.value)
    assert "unexpected keys ['bert.encoder.layer.2.output.dense.bias']" in str(err.value)


def test_wrong_shape_names_key_and_both_shapes(tmp_path, state_dict):
    arrays = {**state_dict, "bert.encoder.layer.0.intermediate.dense.weight": np.zeros((53, 36))}
    with pytest.raises(
        ValueError, match=r"layer\.0\.intermediate\.dense\.weight.*\(53, 36\).*\(52, 36\)"
    ):
        convert.load_hf_bert(_save(tmp_path, {k: v.astype(np.float32) for k, v in arrays.items()}))


def test_untied_decoder_is_refused(tmp_path, state_dict):
    arrays = {**state_dict, "cls.predictions.decoder.weight": np.ones((97, 36), np.float32)}
    with pytest.raises(ValueError, match="untied decoder"):
        convert.load_hf_bert(_save(tmp_path, arrays))


def test_non_post_placement_is_refused(tmp_path, state_dict):
    path = _save(tmp_path, state_dict)
    with pytest.raises(ValueError, match="HuggingFace BERT is Post-LN"):
        convert.load_hf_bert(path, config=ln_config(placement="pre"))
    cfg = ln_config(placement="pre")
    abstract = nnx.merge(
        *sharding.abstract_sharded(lambda: ln_jax.BertForPreTraining(cfg, rngs=nnx.Rngs(0)), None)
    )
    with pytest.raises(ValueError, match="only placement='post'"):
        convert.to_hf_state_dict(abstract)


def test_unknown_file_format(tmp_path):
    (tmp_path / "weights.npz").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        convert.load_hf_state_dict(tmp_path / "weights.npz")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"placement": "olmo2"}, "only placement='post'"),
        ({"placement": "post*1,olmo2*1"}, "only placement='post'"),
        ({"qk_norm": True}, "no query/key norms"),
    ],
)
def test_issue_22_layouts_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        convert.config_to_hf(ln_jax.model_config("tiny", **{"placement": "post", **change}))
