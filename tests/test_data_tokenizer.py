"""Tokenizer: BERT special ids, round trips, the cache, user models, errors and the CLI."""

from __future__ import annotations

import io
import os
import re
import time

import numpy as np
import pytest
import sentencepiece as spm

from ln_jax.data import sources
from ln_jax.data import tokenizer as tk
from ln_jax.data.tokenizer import Tokenizer
from ln_jax.validate import ConfigError, Fix

pytest_plugins = ("tests.data_fixtures",)  # fixtures: data_dir, tokenizer, make_config


@pytest.fixture
def tok(tokenizer):  # shorter name
    return tokenizer


def _corpus_dir(data_dir):
    return sources.open_source("ln_jax_pydocs", data_dir=data_dir).cache_dir


def _validation_sentences(data_dir):
    source = sources.open_source("ln_jax_pydocs", data_dir=data_dir)
    return [s for doc in source.documents("validation") for s in doc]


def test_special_token_ids(tok):
    assert [tok.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.sp.is_control(4) and tok.sp.is_control(2) and tok.sp.is_control(3)
    assert tok.vocab_size == 8000
    # Text never encodes to a control id: "[MASK]" typed in text is not the mask token.
    ids = np.concatenate(tok.encode(["Replace [MASK] by a word.", "[CLS] and [SEP] too."]))
    assert not np.isin(ids, [0, 2, 3, 4]).any()


def test_round_trip(tok, data_dir):
    sentences = _validation_sentences(data_dir)
    assert len(sentences) >= 20
    encoded = tok.encode(sentences)
    assert all(ids.dtype == np.int32 and len(ids) for ids in encoded)
    plain = [s for s in sentences if s.isascii() and "  " not in s]
    assert len(plain) >= 0.8 * len(sentences)
    for text, ids in zip(sentences, encoded, strict=True):
        if text in plain:
            assert tok.decode(ids) == text
    assert tok.word_start[tok.encode(["hello"])[0][0]]  # the first piece of a word has "▁"


def test_cache_is_keyed_and_reused(tok, data_dir, make_config):
    cfg = make_config()
    path = tk.cache_path(_corpus_dir(data_dir), 8000, "unigram")
    assert tok.path == path and path.is_file()
    assert path.name == "spm_unigram_8000.model" and path.parent.name == "1.0.0"
    mtime = os.stat(path).st_mtime_ns
    start = time.perf_counter()
    again = tk.get_tokenizer(cfg)
    assert time.perf_counter() - start < 1.0
    assert again.fingerprint == tok.fingerprint and os.stat(path).st_mtime_ns == mtime
    split_key = tk.cache_path(path.parent, 8000, "unigram", "train[:50%]")
    assert split_key != path and split_key.name.startswith("spm_unigram_8000_")


def test_bpe_model_is_cached_separately(make_config):
    bpe = tk.get_tokenizer(make_config(tokenizer_type="bpe", vocab_size=1000))
    assert bpe.path.name == "spm_bpe_1000.model" and bpe.vocab_size == 1000
    assert bpe.sp.id_to_piece(4) == "[MASK]"
    text = "The value of the option is returned."
    assert bpe.decode(bpe.encode([text])[0]) == text


def test_oversized_vocabulary_is_a_clear_error(data_dir, make_config):
    with pytest.raises(ValueError) as err:
        tk.get_tokenizer(make_config(tokenizer_type="bpe", vocab_size=500_000))
    msg = str(err.value)
    assert "vocab_size=500000" in msg and "ln_jax_pydocs" in msg
    fits = int(re.search(r"Set --config\.data\.vocab_size=(\d+) \(or less\)", msg).group(1))
    assert 1000 < fits < 500_000
    assert err.value.fix == Fix(set={"--config.data.vocab_size": str(fits)})  # the field's flag
    assert not list(_corpus_dir(data_dir).glob("spm_bpe_500000*"))


def test_a_corpus_without_text_is_one_line_before_sentencepiece():
    """sentencepiece's own error for no sentences (or only empty ones) is a 73-line INTERNAL
    traceback."""
    for sentences in ([], ["", "  "]):
        with pytest.raises(ConfigError, match="corpus 'empty' holds no text to train"):
            tk.train_sentencepiece(iter(sentences), vocab_size=100, corpus_name="empty")


def test_user_supplied_model(tok, tmp_path, make_config):
    path = tmp_path / "mine.model"
    path.write_bytes(tok.sp.serialized_model_proto())
    loaded = tk.get_tokenizer(make_config(tokenizer_model=str(path)))
    assert loaded.path == path and loaded.fingerprint == tok.fingerprint
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tk.get_tokenizer(make_config(tokenizer_model=str(tmp_path / "missing.model")))


def test_model_without_bert_specials_is_rejected(tmp_path):
    writer = io.BytesIO()
    words = [f"word{i} and more words number {i * 7}" for i in range(200)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(words), model_writer=writer, vocab_size=60, minloglevel=2
    )  # sentencepiece's own defaults: <unk>=0, <s>=1, </s>=2
    with pytest.raises(ValueError, match=r"needs \['\[PAD\]', '\[UNK\]'"):
        Tokenizer(writer.getvalue(), "default.model")


def test_cli(tok, data_dir, tmp_path, capsys):
    out = tmp_path / "copy.model"
    argv = ["train", "--data_dir", data_dir, "--vocab_size", "8000", "--output", str(out)]
    assert tk.main(argv) == 0
    assert out.read_bytes() == tok.sp.serialized_model_proto()
    assert tk.main(["encode", "--model", str(out), "Return the value."]) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[-2] == " ".join(map(str, tok.encode(["Return the value."])[0]))
    assert lines[-1].startswith("\u2581Return")
    assert tk.main(["info", "--model", str(out)]) == 0
    assert "[MASK]=4" in capsys.readouterr().out
