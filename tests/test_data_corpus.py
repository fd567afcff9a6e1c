"""Corpora: the embedded CPython-docs builder, .txt folders, sentence splits, missing datasets."""

from __future__ import annotations

import os
import time

import pytest
import tensorflow_datasets as tfds

from ln_jax.data import corpus, sources

pytest_plugins = ("tests.data_fixtures",)  # fixtures: data_dir, text_maker


def _records(data_dir, split):
    ds = tfds.data_source("ln_jax_pydocs", data_dir=data_dir, split=split, download=False)
    return [ds[i] for i in range(len(ds))]


def test_builder_prepares_and_reads_back(data_dir):
    builder = corpus.pydocs_builder(data_dir)
    assert builder.is_prepared()
    assert builder.info.version == "1.0.0"
    files = sorted(os.listdir(builder.data_dir))
    assert any(f.startswith("ln_jax_pydocs-train.array_record") for f in files), files
    train = _records(data_dir, "train")
    assert len(train) > 1000  # thousands of docstrings and help topics
    texts = [r["text"].decode() for r in train]
    chars = sum(map(len, texts))
    assert 1_000_000 < chars < 4_000_000  # "about 2 MB of text"
    assert all(len(t.split("\n")) >= corpus.MIN_DOC_SENTENCES for t in texts)
    assert not any(line.lstrip().startswith(">>>") for t in texts for line in t.split("\n"))
    ids = [r["doc_id"].decode() for r in train]
    assert len(set(ids)) == len(ids)
    assert any(i.startswith("topics/") for i in ids) and any(i.startswith("stdlib/") for i in ids)


def test_prepared_data_is_reused(data_dir):
    builder = corpus.pydocs_builder(data_dir)
    folder = builder.data_dir
    before = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in os.listdir(folder)}
    start = time.perf_counter()
    sources.open_source("ln_jax_pydocs", data_dir=data_dir)
    assert time.perf_counter() - start < 2.0  # nothing is regenerated
    after = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in before}
    assert after == before


def test_train_and_validation_are_disjoint_199_to_1(data_dir):
    train = {r["doc_id"].decode() for r in _records(data_dir, "train")}
    valid = {r["doc_id"].decode() for r in _records(data_dir, "validation")}
    assert valid and not train & valid
    assert all(corpus.is_validation(k) for k in valid)
    assert not any(corpus.is_validation(k) for k in train)
    share = len(valid) / (len(train) + len(valid))
    assert 0.001 < share < 0.015, share  # 1 in 200 expected


def test_generation_is_deterministic():
    first = list(corpus.topic_documents())
    assert first == list(corpus.topic_documents())
    files = corpus.stdlib_files()
    assert files == sorted(files) and files
    assert not any("test" in p.parts or "idlelib" in p.parts for p in files)


def test_split_sentences():
    text = (
        "The parser reads one line at a time. It keeps state, e.g. the current indent!\n"
        "Does it stop at the end? Yes.\n\n"
        ">>> print('code is dropped')\n"
        "code is dropped\n\n"
        "A second paragraph starts here. It ends here."
    )
    assert corpus.split_sentences(text) == [
        "The parser reads one line at a time.",
        "It keeps state, e.g. the current indent!",
        "Does it stop at the end?",
        "Yes.",
        "A second paragraph starts here.",
        "It ends here.",
    ]
    assert corpus.split_sentences("x = [1, 2, 3]; y = {'a': 4}") == []  # code is not prose


def test_textdir_builder(tmp_path, text_maker):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(4):
        (folder / f"doc{i}.txt").write_text(text_maker(i, 12))
    tfds_dir = str(tmp_path / "tfds")
    source = sources.open_source(f"textdir:{folder}", data_dir=tfds_dir)
    train = list(source.documents("train"))
    valid = list(source.documents("validation"))
    assert len(train) + len(valid) == 4 and len(valid) >= 1
    assert all(len(doc) == 12 and doc[0].endswith(".") for doc in train + valid)
    assert source.cache_dir.is_relative_to(tfds_dir)
    # Editing the folder gives a new config, hence a fresh build instead of stale data.
    name = corpus.textdir_config(folder).name
    (folder / "doc4.txt").write_text(text_maker(9, 3))
    assert corpus.textdir_config(folder).name != name
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt files"):
        corpus.textdir_config(tmp_path / "empty")


def test_unknown_dataset_error_names_dataset_dir_and_closest_names(tmp_path):
    with pytest.raises(sources.UnknownDatasetError) as err:
        sources.open_source("no_such_corpus_xyz", data_dir=str(tmp_path))
    msg = str(err.value)
    assert "unknown data.dataset 'no_such_corpus_xyz'" in msg
    assert str(tmp_path / "no_such_corpus_xyz") in msg  # where it looked
    assert "tfds build" not in msg and "did you mean" not in msg  # nothing close, no command
    assert err.value.fix is None
    with pytest.raises(sources.UnknownDatasetError) as err:
        sources.open_source("ln_jax_pydoc", data_dir=str(tmp_path))
    msg = str(err.value)
    assert "did you mean 'ln_jax_pydocs'" in msg and "tfds build" not in msg
    assert err.value.fix.set == {"--config.data.dataset": "ln_jax_pydocs"}
    assert isinstance(err.value, FileNotFoundError)  # what callers catching it expect


def test_unprepared_wikipedia_error_is_fast_and_says_how(tmp_path):
    start = time.perf_counter()
    with pytest.raises(sources.DatasetNotPreparedError) as err:
        sources.open_source("wikipedia/20230601.en", data_dir=str(tmp_path))
    assert time.perf_counter() - start < 30  # no network attempt, no hang
    msg = str(err.value)
    assert "'wikipedia/20230601.en' is not prepared" in msg
    assert str(tmp_path / "wikipedia" / "20230601.en") in msg
    assert "tfds build wikipedia/20230601.en" in msg and "apache-beam" in msg
    assert isinstance(err.value, FileNotFoundError)


def test_unknown_split_error(data_dir):
    source = sources.open_source("ln_jax_pydocs", data_dir=data_dir)
    with pytest.raises(ValueError, match="no split 'dev'.*train, validation"):
        source.data_source("dev")
