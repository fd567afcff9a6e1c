"""Datasets prepared in the wrong file format, and the preparation ln_jax suggests (issue 17,
item 6): nothing waits hours to fail."""

from __future__ import annotations

import json
import types

import pytest
import tensorflow_datasets as tfds

from ln_jax.data import sources

pytest_plugins = ("tests.data_fixtures",)


def _set_formats(builder_dir, file_format: str, alternatives: list[str]) -> None:
    path = builder_dir / "dataset_info.json"
    info = json.loads(path.read_text())
    info["fileFormat"], info["alternativeFileFormats"] = file_format, alternatives
    path.write_text(json.dumps(info))


def test_a_dataset_prepared_as_tfrecord_is_an_error_at_open_naming_the_conversion(
    tmp_path, text_maker
):
    """Writing TFRecord needs TensorFlow, which is not installed: the dataset is prepared as
    array_record (a `textdir:` corpus) and its prepared info then says TFRecord, which is what
    `tfds build` without --file_format writes. It is opened by its TFDS name, as Wikipedia is."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(3):
        (texts / f"{i}.txt").write_text(text_maker(i, 12))
    data_dir = tmp_path / "tfds"
    prepared = sources.open_source(f"textdir:{texts}", data_dir=str(data_dir)).builder
    name = f"{prepared.name}/{prepared.builder_config.name}"
    version_dir = data_dir / name / "1.0.0"
    _set_formats(version_dir, "tfrecord", [])
    with pytest.raises(sources.DatasetFormatError) as err:
        sources.open_source(name, data_dir=str(data_dir))
    message = str(err.value)
    assert f"dataset {name!r} is prepared in {version_dir} as tfrecord" in message
    assert (
        f"tfds convert_format --dataset_version_dir={version_dir} --out_file_format=array_record"
        in message
    )
    assert f"tfds build {name} --data_dir=NEW_DIR --file_format=array_record" in message
    with pytest.raises(NotImplementedError):  # what TFDS itself would raise at the first read
        tfds.builder(name, data_dir=str(data_dir)).as_data_source("train")
    # What the conversion leaves in the info (array_record as an alternative) opens and reads.
    _set_formats(version_dir, "tfrecord", ["array_record"])
    source = sources.open_source(name, data_dir=str(data_dir))
    assert source.num_documents("train") == prepared.info.splits["train"].num_examples


def test_the_suggested_and_the_automatic_preparation_write_array_record(monkeypatch, tmp_path):
    calls = []
    builder = types.SimpleNamespace(
        data_dir=str(tmp_path / "wikipedia"),
        is_prepared=lambda: bool(calls),
        download_and_prepare=lambda **kwargs: calls.append(kwargs),
        info=types.SimpleNamespace(
            available_file_formats=lambda: {tfds.core.FileFormat.ARRAY_RECORD}
        ),
    )
    monkeypatch.setattr(sources, "_tfds_builder", lambda name, root: builder)
    monkeypatch.setattr(sources, "_needs_beam", lambda builder: True)
    name = "wikipedia/20230601.en"
    with pytest.raises(sources.DatasetNotPreparedError) as err:
        sources.open_source(name, data_dir=str(tmp_path))
    message = str(err.value)
    assert f"tfds build {name} --data_dir={tmp_path} --file_format=array_record" in message
    assert "download_and_prepare(file_format='array_record')" in message
    assert "pip install apache-beam" in message
    sources.open_source(name, data_dir=str(tmp_path), download=True)
    assert calls == [{"file_format": "array_record"}]
