"""HuggingFace Marian <-> ln_jax's translation model: a randomly initialised `MarianMTModel`
(Post-LN, sinusoidal positions, shared embeddings, swish, Marian's special ids) imported into
ln_jax gives the same logits and the same greedy and beam-4 outputs as its `generate`; its
vocabulary (vocab.json + source/target.spm) tokenises as `MarianTokenizer` does; `hf:PATH`
translates from the command line and starts a training run."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from ln_jax import sharding
from ln_jax.data.translation.marian_vocab import MarianVocab
from ln_jax.models.translation import convert
from ln_jax.models.translation.search import Search, translate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORDS_DE = tuple("der die das haus katze hund ist klein gross rot blau und nicht sehr alt".split())  # noqa: SIM905
WORDS_EN = tuple("the a house cat dog is small big red blue and not very old new".split())  # noqa: SIM905


def _sentences(words, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(n)]


def _spm(path, sentences: list[str], vocab: int) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(path),
        vocab_size=vocab,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    shutil.move(f"{path}.model", path)


def _vocab(folder) -> dict[str, int]:
    """Marian's layout: </s> 0, <unk> 1, the pieces of both models, <pad> last."""
    import sentencepiece as spm

    pieces = ["</s>", "<unk>"]
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(folder / name))
        for i in range(sp.get_piece_size()):
            p = sp.id_to_piece(i)
            if p not in pieces and p not in ("<s>", "<unk>", "</s>"):
                pieces.append(p)
    pieces.append("<pad>")
    return {p: i for i, p in enumerate(pieces)}


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """(folder, torch model, transformers MarianTokenizer) of a random sharp Marian model."""
    folder = tmp_path_factory.mktemp("opus-mt-toy")
    _spm(folder / "source.spm", _sentences(WORDS_DE, 300, 0), 40)
    _spm(folder / "target.spm", _sentences(WORDS_EN, 300, 1), 40)
    vocab = _vocab(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    v = len(vocab)
    config = transformers.MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=32, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=v - 1, eos_token_id=0,
        decoder_start_token_id=v - 1, activation_function="swish", scale_embedding=True,
        dropout=0.0, init_std=0.3,  # sharp: different sources, lengths and beams differ
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.1)
    model.save_pretrained(folder)
    tok = transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    )
    return folder, model, tok


@pytest.fixture
def one_device():
    with sharding.use_mesh(sharding.single_device_mesh()):
        yield


def _load(folder, **fields):
    return convert.load_marian(folder, mesh=sharding.single_device_mesh(), **fields)


def _batch(v: int, b: int = 4, s: int = 9, seed: int = 0):
    """Sources with EOS (0) and Marian's right padding (v - 1), lengths 9, 5, 9, 7."""
    rng = np.random.default_rng(seed)
    src = rng.integers(2, v - 1, (b, s))
    lengths = np.array([s, 5, s, 7])[:b]
    mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int64)
    src = np.where(mask == 1, src, v - 1)
    src[np.arange(b), lengths - 1] = 0
    return src, mask


@pytest.mark.parametrize("scan", [False, True])
def test_imported_marian_gives_the_same_logits(one_device, marian, scan):
    folder, hf, _ = marian
    v = hf.config.vocab_size
    src, mask = _batch(v)
    tgt = np.random.default_rng(1).integers(1, v - 1, (4, 6))
    tgt[:, 0] = v - 1  # the decoder starts with pad
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(tgt),
        ).logits.numpy()
    model = _load(folder, scan_layers=scan, vocab_multiple=64)
    out = model(jnp.asarray(src, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(tgt))
    logits = np.asarray(out["logits"])
    assert logits.shape[-1] > v  # the padded vocabulary rows ...
    assert (logits[..., v:] < -1e8).all()  # ... are masked
    np.testing.assert_allclose(logits[..., :v], ref, atol=1e-5, rtol=1e-5)
    assert np.abs(ref).max() > 1.0  # a test that could fail: large, varied logits


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_outputs_equal_hf_generate(one_device, marian, beam):
    folder, hf, _ = marian
    v, n = hf.config.vocab_size, 12
    src, mask = _batch(v, seed=3)
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.tensor(src),
            attention_mask=torch.tensor(mask),
            num_beams=beam,
            max_length=n + 1,  # HF counts the start token
            do_sample=False,
            early_stopping=True,  # fairseq's / ln_jax's stop="first"
            length_penalty=1.0,
            bad_words_ids=[[v - 1]],  # opus-mt's configs never generate pad
        ).numpy()[:, 1:]
    search = Search(beam=beam, max_length=n, max_len_a=0, max_len_b=n, stop="first",
                    greedy=beam == 1)  # fmt: skip
    ours = np.asarray(
        translate(_load(folder), jnp.asarray(src), jnp.asarray(mask), search)["tokens"]
    )
    for row_hf, row in zip(ref, ours, strict=True):
        end = list(row).index(0) + 1
        assert list(row_hf[:end]) == list(row[:end])
        assert all(t == v - 1 for t in row_hf[end:])  # HF pads after EOS too
    assert len({tuple(r) for r in ours}) > 1  # the sources give different outputs


def test_beam_4_differs_from_greedy_on_this_model(one_device, marian):
    """So the beam parity above is not greedy parity twice."""
    folder, hf, _ = marian
    src, mask = _batch(hf.config.vocab_size, seed=3)
    model = _load(folder)
    runs = [
        np.asarray(translate(model, jnp.asarray(src), jnp.asarray(mask), s)["tokens"])
        for s in (Search(beam=1, max_length=12, greedy=True, max_len_a=0, max_len_b=12),
                  Search(beam=4, max_length=12, stop="first", max_len_a=0, max_len_b=12))
    ]  # fmt: skip
    assert not np.array_equal(*runs)


def test_the_vocabulary_tokenises_as_marian_tokenizer(marian):
    folder, _, tok = marian
    vocab = MarianVocab(folder)
    texts = _sentences(WORDS_DE, 5, 7) + ["das haus zebra", ">>en<< der hund"]
    targets = _sentences(WORDS_EN, 5, 8)
    for text in texts:
        assert vocab.encode(text) + [vocab.eos_id] == tok(text)["input_ids"]
    for text in targets:
        ids = tok(text_target=text)["input_ids"]
        assert vocab.encode_target(text) + [vocab.eos_id] == ids
        assert vocab.decode(ids) == tok.decode(ids, skip_special_tokens=True)
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (len(vocab.vocab) - 1,) * 2 + (0,)


def test_translate_command_with_hf_path_matches_hf_generate(marian, tmp_path, monkeypatch, capsys):
    """`python -m ln_jax.translate --workdir=hf:PATH --input=-`: each sentence as HF's greedy
    `generate` + `decode` with the same per-sentence limit (1.2 x source + 10)."""
    import io

    from ln_jax.models.translation import translate as cmd

    folder, hf, tok = marian
    lines = _sentences(WORDS_DE, 3, 11)
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(s + "\n" for s in lines)))
    assert cmd.main([f"--workdir=hf:{folder}", "--input=-", "--beam=1"]) == 0
    ours = capsys.readouterr().out.splitlines()
    expected = []
    for line in lines:
        ids = tok(line, return_tensors="pt")
        limit = int(1.2 * ids["input_ids"].shape[1] + 10)
        with torch.no_grad():
            out = hf.generate(**ids, num_beams=1, max_new_tokens=limit, do_sample=False,
                              bad_words_ids=[[hf.config.pad_token_id]])  # fmt: skip
        expected.append(tok.decode(out[0], skip_special_tokens=True))
    assert ours == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--workdir=hf:/nonexistent/opus"], "no such folder"),
        (["--workdir=hf:{folder}", "--average_last=2"], "apply to workdirs"),
    ],
)
def test_hf_path_errors_are_one_line(marian, capsys, args, expected):
    from ln_jax.models.translation import translate as cmd

    folder = marian[0]
    assert cmd.main([a.format(folder=folder) for a in args] + ["--input=-"]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err


def test_init_from_hf_starts_training_from_the_marian_parameters(one_device, marian, tmp_path):
    """`--config=configs/mt.py:hf:PATH`: the task's `initialize` puts Marian's parameters into
    the run's model (so its first loss is the pretrained model's), and refuses a config of
    another shape with the command that works."""
    from flax import nnx

    from configs import mt
    from ln_jax.config.load import build_config
    from ln_jax.models.translation.task import Translation
    from ln_jax.validate import ConfigError

    folder = marian[0]
    cfg = build_config(mt.get_config(f"hf:{folder}").to_dict())
    task = Translation(cfg)
    model = task.build(nnx.Rngs(params=5))
    assert task.initialize(model)
    want = nnx.to_flat_state(nnx.state(_load(folder), nnx.Param))
    got = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, var in want:
        np.testing.assert_array_equal(np.asarray(got[path].get_value()), var.get_value())
    small = build_config(
        {**mt.get_config("tiny").to_dict(), "translation": {"init_from": f"hf:{folder}"}}
    )
    tiny_task = Translation(small)
    with pytest.raises(ConfigError, match=r"configs/mt.py:hf:"):
        tiny_task.initialize(tiny_task.build(nnx.Rngs(params=0)))
