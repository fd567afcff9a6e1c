"""ln_jax_sitedocs over a small fake site-packages folder: documents, splits, de-duplication,
metadata, the size check, and reading through `tfds.data_source` and the data pipeline."""

from __future__ import annotations

import random

import pytest
import tensorflow_datasets as tfds

from ln_jax.data import corpus, sitedocs, sources
from ln_jax.data.bert.options import PretrainingOptions
from ln_jax.data.bert.pipeline import make_host_pipeline
from ln_jax.data.config import DataConfig

pytest_plugins = ("tests.data_fixtures",)

# Two made-up distributions: "alpha" (with a test folder) and "beta" (vendoring alpha's core).
PACKAGES = {"alpha": "1.2", "beta": "0.3.post1"}
DOCS_PER_MODULE = 12


def docstring(rng: random.Random) -> str:
    """Three made-up sentences about nothing real."""
    nouns = ["buffer", "lantern", "matrix", "harbour", "record", "kite", "ledger", "window"]
    verbs = ["returns", "copies", "sorts", "merges", "reads", "checks", "draws", "keeps"]
    adjs = ["sorted", "empty", "large", "quiet", "yellow", "shared", "final", "spare"]
    return " ".join(
        f"The {rng.choice(adjs)} {rng.choice(nouns)} {rng.choice(verbs)} every "
        f"{rng.choice(adjs)} {rng.choice(nouns)} of the {rng.choice(nouns)} twice."
        for _ in range(3)
    )


def module_source(seed: int) -> str:
    rng = random.Random(seed)
    funcs = "".join(
        f'def f{i}():\n    """{docstring(rng)}"""\n\n\n' for i in range(DOCS_PER_MODULE - 1)
    )
    return f'"""{docstring(rng)}"""\n\n\n{funcs}'


def install(root, name: str, version: str, files: dict[str, str]) -> None:
    """Writes the files and a dist-info folder (METADATA, RECORD) as pip would."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site-packages")
    core = module_source(1)
    rng = random.Random(4)  # one name defined twice (as a property's getter and setter)
    twice = "".join(f'def twice():\n    """{docstring(rng)}"""\n\n\n' for _ in range(2))
    install(
        root,
        "alpha",
        PACKAGES["alpha"],
        {
            "alpha/__init__.py": module_source(0),
            "alpha/core.py": core,
            "alpha/tests/test_core.py": module_source(2),  # tests are skipped
        },
    )
    install(
        root,
        "beta",
        PACKAGES["beta"],
        {"beta/main.py": module_source(3) + twice, "beta/_vendor/alpha/core.py": core},
    )
    return root


@pytest.fixture(scope="module")
def prepared(site, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    config = sitedocs.sitedocs_config([str(site)], stdlib=False, min_text_bytes=0)
    return corpus.prepare(sitedocs.sitedocs_builder(str(data_dir), config)), data_dir


def records(builder, split):
    return [
        {k: v.decode() if isinstance(v, bytes) else v for k, v in r.items()}
        for r in builder.as_data_source(split)
    ]


def test_config_names_the_installed_distributions(site):
    config = sitedocs.sitedocs_config([str(site)], stdlib=False)
    assert {(d.name, d.version) for d in config.distributions} == set(PACKAGES.items())
    (alpha,) = [d for d in config.distributions if d.name == "alpha"]
    assert alpha.files == ("alpha/__init__.py", "alpha/core.py")  # no tests/
    # Another version (or another Python) is another config name: no stale prepared data.
    assert config.name == sitedocs.sitedocs_config([str(site)], stdlib=False).name
    assert config.name != sitedocs.sitedocs_config([str(site)], stdlib=True).name


def test_documents_splits_dedup_and_metadata(prepared):
    builder, _ = prepared
    train, validation = records(builder, "train"), records(builder, "validation")
    keys = [r["doc_id"] for r in train + validation]
    # 3 modules of 12 docstrings each and `twice`; the vendored alpha/core.py is dropped.
    assert len(keys) == len(set(keys)) == 3 * DOCS_PER_MODULE + 2
    assert {"beta/beta/main.py::twice", "beta/beta/main.py::twice#2"} <= set(keys)
    assert {k.split("::")[0] for k in keys} == {
        "alpha/alpha/__init__.py",
        "alpha/alpha/core.py",
        "beta/beta/main.py",
    }
    assert "alpha/alpha/core.py::f0" in keys and "alpha/alpha/core.py::<module>" in keys
    # The modulus is 2 for a corpus this small: each document's split follows its key's hash.
    assert builder.info.metadata["validation_modulus"] == 2
    for split, rows in (("train", train), ("validation", validation)):
        assert rows and all(
            corpus.is_validation(r["doc_id"], 2) == (split != "train") for r in rows
        )
    assert not {r["text"] for r in train} & {r["text"] for r in validation}
    assert all(len(r["text"].split("\n")) == 3 for r in train + validation)  # one sentence a line
    meta = builder.info.metadata
    assert meta["packages"] == PACKAGES and meta["duplicates_dropped"] == DOCS_PER_MODULE
    assert meta["sizes"]["validation"]["documents"] == len(validation)
    assert meta["sizes"]["train"]["words"] == sum(len(r["text"].split()) for r in train)


def test_reads_through_tfds_data_source(prepared):
    builder, data_dir = prepared
    name = f"ln_jax_sitedocs/{builder.builder_config.name}"
    for split in ("train", "validation"):
        source = tfds.data_source(name, split=split, data_dir=str(data_dir))
        assert len(source) == builder.info.splits[split].num_examples > 0
    reread = tfds.builder(name, data_dir=str(data_dir))
    assert reread.info.metadata["packages"] == PACKAGES


def test_loads_through_the_data_pipeline(prepared, monkeypatch):
    builder, data_dir = prepared
    monkeypatch.setattr(sitedocs, "sitedocs_config", lambda: builder.builder_config)
    source = sources.open_source("ln_jax_sitedocs", data_dir=str(data_dir))
    assert source.key.startswith(f"ln_jax_sitedocs-{builder.builder_config.name}-")
    cfg = DataConfig(
        dataset="ln_jax_sitedocs",
        data_dir=str(data_dir),
        vocab_size=50,
        global_batch_size=4,
        max_seq_length=32,
    )
    examples = PretrainingOptions(max_predictions_per_seq=4)
    batches, tokenizer = make_host_pipeline(cfg, examples=examples, split="train", threads=0)
    batch = next(batches)
    assert batch["input_ids"].shape == (4, 32) and tokenizer.vocab_size == 50
    assert (batch["input_ids"][:, 0] == tokenizer.cls_id).all()


def test_too_small_corpus_is_one_clear_error(site, tmp_path):
    config = sitedocs.sitedocs_config([str(site)], stdlib=False)  # needs 20 MB
    with pytest.raises(sitedocs.CorpusTooSmallError, match=r"hold 0\.0 MB .* under the 20 MB"):
        corpus.prepare(sitedocs.sitedocs_builder(str(tmp_path), config))
    assert not sitedocs.sitedocs_builder(str(tmp_path), config).is_prepared()
