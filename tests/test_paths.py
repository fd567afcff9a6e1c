"""Workdirs, logs, metrics and tokenizers on gs:// (issue 17, item 4), on a fake GCS.

The fake stands in for the network services only, so that a `gs://bucket/...` URL takes the
code path it takes on a Cloud TPU VM without TensorFlow: `etils.epath` -> its fsspec backend ->
the fsspec filesystem registered for `gs`/`gcs` (gcsfs there; here `FakeGCS`, a folder under
tmp). Orbax reaches GCS in two more ways, replaced likewise: TensorStore's `gcs` kvstore (here
the `file` driver on the same folder) and google-cloud-storage's bucket metadata (here a bucket
without hierarchical namespace). A TFDS dataset in a bucket is opened through epath too, but its
records are read by array_record's C++ reader, which goes to the network for gs:// itself: the
reader is opened on the fake's folder instead (`array_record_data_source._create_reader`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
import re
import shutil
import signal
import types

import numpy as np
import pytest
from array_record.python import array_record_data_source
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils

from ln_jax import console, paths, sharding
from ln_jax.data import sources
from ln_jax.data import tokenizer as tk
from ln_jax.data.bert import pipeline as loader
from ln_jax.data.bert.options import PretrainingOptions
from ln_jax.train import run_identity, trainer
from tests.test_trainer import read_metrics, tiny_config

pytest_plugins = ("tests.data_fixtures",)
BUCKET = "ln-jax-test-bucket"
fsspec_registry = importlib.import_module("fsspec.registry")  # `fsspec.registry` is a view
ONE_SLASH = re.compile(r"gs:/[^/]")  # what pathlib makes of gs://


class FakeGCS(DirFileSystem):
    """gs://BUCKET/key -> ROOT/BUCKET/key on the local disk."""

    protocol = ("gs", "gcs")
    cachable = False  # each test has its own root
    root = ""

    def __init__(self, **storage_options):
        del storage_options  # gcsfs's options (finalize_on_close, ...)
        super().__init__(path=self.root, fs=LocalFileSystem())


class DefaultCredentialsError(Exception):
    """What google-auth raises when no credentials are found (google.auth is not installed
    here; the name and message are the same)."""


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
    """The local folder that holds the fake GCS's buckets; the working directory is moved to
    an empty folder, so a local folder named after a URL would show."""
    root = tmp_path / "gcs"
    root.mkdir()
    monkeypatch.setattr(FakeGCS, "root", str(root))
    for protocol in FakeGCS.protocol:
        monkeypatch.setitem(fsspec_registry._registry, protocol, FakeGCS)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()  # epath caches filesystems

    def kvstore(path: str) -> dict:
        return {"driver": "file", "path": str(root / path.removeprefix("gs://"))}

    monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", kvstore)
    no_hns = types.SimpleNamespace(hierarchical_namespace_enabled=False)
    monkeypatch.setattr(gcs_utils, "get_bucket", lambda name: no_hns)
    monkeypatch.setattr(paths, "missing_packages", lambda path: [])
    monkeypatch.setattr(paths, "credentials_problem", lambda path: None)
    open_reader = array_record_data_source._create_reader

    def reader_on_the_fake(filename, options: str):  # array_record reads gs:// in C++
        local = os.fspath(filename)
        if local.startswith(("gs://", "gcs://")):
            local = str(root / local.split("://", 1)[1])
        return open_reader(local, options)

    monkeypatch.setattr(array_record_data_source, "_create_reader", reader_on_the_fake)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield root
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    assert not os.listdir(cwd), f"local files named after a URL: {os.listdir(cwd)}"
    assert not [p for p in root.rglob("*") if "gs:" in p.name]


def _no_mangled_url(text: str) -> None:
    assert not ONE_SLASH.search(text), ONE_SLASH.search(text)


@pytest.fixture
def file_log():
    """Restores the root logger's handlers after a test that configures train.log."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    yield
    console.close_logging()
    for handler in saved:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_run_in_a_gs_workdir_writes_everything_there_and_resumes(data_dir, fake_gcs, file_log):
    workdir = f"gs://{BUCKET}/runs/tiny"
    cfg = tiny_config(data_dir, total_steps=6, checkpoint_every=2)  # compiled by other tests
    run_identity.prepare_workdir(workdir)  # what train.py does before logging to the workdir
    console.configure_logging(f"{workdir}/train.log")

    def preempt_at_3(step, run):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer saves step 3 and stops

    first = trainer.train_and_evaluate(cfg, workdir, hooks=[preempt_at_3])
    assert first["preempted"] and first["step"] == 3
    second = trainer.train_and_evaluate(cfg, workdir)
    console.close_logging()  # train.log's last upload
    assert second["step"] == 6 and not second["preempted"]

    local = fake_gcs / BUCKET / "runs" / "tiny"
    assert run_identity.read_config(workdir)["total_steps"] == 6
    assert json.loads((local / "config.json").read_text()) == run_identity.as_dict(cfg)
    train_steps = [r["step"] for r in read_metrics(local) if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5, 6]  # steps 1-3 kept across the resume, each once
    checkpoints = sorted(int(p.name) for p in (local / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints == [3, 4, 6]  # checkpoint.keep = 3
    assert len(list((local / "tensorboard").glob("events.out.tfevents*"))) == 1
    log_text = (local / "train.log").read_text()
    assert f"resumed from step 3 in {workdir}" in log_text
    assert f"{workdir}/checkpoints" in log_text  # orbax's own log lines name the URL
    _no_mangled_url(log_text)
    assert trainer.train_and_evaluate(cfg, workdir)["already_done"]


def test_gs_workdir_without_credentials_fails_in_one_line_before_compiling(
    data_dir, fake_gcs, monkeypatch, capsys, file_log
):
    console.configure_logging()  # train.py's console: other libraries' warnings show

    def no_credentials(*args, **kwargs):
        logging.getLogger("gcsfs").error("_request non-retriable exception: ...")  # as gcsfs
        raise DefaultCredentialsError(
            "Your default credentials were not found. To set up Application Default "
            "Credentials, see https://cloud.google.com/docs/authentication/external/set-up-adc"
        )

    monkeypatch.setattr(FakeGCS, "makedirs", no_credentials)
    monkeypatch.setattr(FakeGCS, "open", no_credentials)
    monkeypatch.setattr(trainer, "setup", lambda cfg: pytest.fail("compiled before the check"))
    workdir = f"gs://{BUCKET}/runs/nocreds"
    cfg = tiny_config(data_dir, total_steps=2)
    status = console.run_reporting_errors(lambda: trainer.train_and_evaluate(cfg, workdir))
    err = capsys.readouterr().err
    assert status == console.EXIT_USER_ERROR and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot write to workdir '{workdir}' (DefaultCredentialsError")
    assert "gcloud auth application-default login" in err and "service account" in err

    # Where google-auth is installed, missing credentials are found before any request.
    monkeypatch.setattr(paths, "credentials_problem", lambda path: "DefaultCredentialsError: x")
    with pytest.raises(run_identity.WorkdirError, match="no Google Cloud credentials"):
        run_identity.prepare_workdir(workdir)


def test_gs_workdir_names_the_packages_it_needs(monkeypatch):
    monkeypatch.setattr(paths, "_importable", lambda module: False)
    assert paths.missing_packages("gs://b/run") == ["gcsfs", "google-cloud-storage"]
    assert paths.missing_packages("/tmp/run") == []
    with pytest.raises(run_identity.WorkdirError, match="pip install gcsfs google-cloud-storage"):
        run_identity.prepare_workdir("gs://b/run")


def test_tokenizer_models_and_data_dirs_keep_their_urls(tokenizer, fake_gcs):
    url = f"gs://{BUCKET}/models/spm.model"
    paths.write_atomic(url, tokenizer.path.read_bytes())
    loaded = tk.Tokenizer.load(url)
    assert loaded.fingerprint == tokenizer.fingerprint and str(loaded.path) == url
    assert (fake_gcs / BUCKET / "models" / "spm.model").is_file()
    cached = tk.cache_path(f"gs://{BUCKET}/tfds/ln_jax_pydocs/1.0.0", 8000, "unigram")
    assert str(cached) == f"gs://{BUCKET}/tfds/ln_jax_pydocs/1.0.0/spm_unigram_8000.model"
    from ln_jax.data.sources import default_data_dir

    assert default_data_dir(f"gs://{BUCKET}/tfds") == f"gs://{BUCKET}/tfds"


def test_a_gs_data_dir_gives_the_local_batches_with_caches_on_the_host(
    data_dir, make_config, tokenizer, fake_gcs, tmp_path, monkeypatch
):
    """Data dir gs://BUCKET/tfds: the tokenizer is read from the bucket, the token ids and
    pair indexes are cached in ~/.cache/ln_jax/<hash>/ (nothing in the bucket), every process
    builds its own pair index, and the batches equal those of the same data on a local disk."""
    caches = shutil.ignore_patterns("tokens-*", "pairs-*")  # the bucket starts without caches
    shutil.copytree(data_dir, fake_gcs / BUCKET / "tfds", ignore=caches)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(sources.CACHE_DIR_ENV, raising=False)
    url = f"gs://{BUCKET}/tfds"
    in_bucket = functools.partial(dataclasses.replace, data_dir=url)
    mesh = sharding.make_mesh(2, 2, 2)

    remote, tok = loader.make_pipeline(in_bucket(make_config()), seed=0, mesh=mesh)
    assert str(tok.path).startswith(f"{url}/") and tok.fingerprint == tokenizer.fingerprint
    local, _ = loader.make_pipeline(make_config(), seed=0, mesh=mesh)
    for a, b in zip([next(remote) for _ in range(2)], [next(local) for _ in range(2)], strict=True):
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)

    cached = [p for p in fake_gcs.rglob("*") if p.name.startswith(("tokens-", "pairs-"))]
    assert not cached, cached
    (folder,) = (tmp_path / "home" / ".cache" / "ln_jax").iterdir()
    assert sorted(p.name.split("-")[0] for p in folder.iterdir()) == ["pairs", "tokens"]
    source = sources.open_source("ln_jax_pydocs", data_dir=url)
    assert source.per_host_cache and str(source.cache_dir) == str(folder)
    assert str(source.dataset_dir).startswith(f"{url}/")

    # A process other than 0 builds its own pair index: process 0's would never reach it.
    cfg = in_bucket(make_config(prepare_timeout_s=0))
    corpora, tok = loader._corpora(cfg, "train")
    examples = PretrainingOptions()
    loader._components(cfg, examples, "train", 7, corpora, tok, builder=False)  # no CacheWaitError
    assert len(list(folder.glob("pairs-*"))) == 2

    # The cache folder: DataConfig.cache_dir, else $LN_JAX_CACHE_DIR, else ~/.cache/ln_jax.
    monkeypatch.setenv(sources.CACHE_DIR_ENV, str(tmp_path / "env"))
    assert sources.local_cache_root() == tmp_path / "env"
    assert sources.local_cache_root(str(tmp_path / "cfg")) == tmp_path / "cfg"
    moved = sources.open_source("ln_jax_pydocs", data_dir=url, cache_dir=str(tmp_path / "cfg"))
    assert str(moved.cache_dir) == str(tmp_path / "cfg" / folder.name)
    with pytest.raises(sources.ConfigError, match="memory-mapped"):
        sources.local_cache_root(f"gs://{BUCKET}/cache")
    assert str(sources.open_source("ln_jax_pydocs", data_dir=data_dir).cache_dir).startswith(
        data_dir
    )  # a local data dir keeps its caches beside the data


def test_staged_files_upload_periodically_and_on_close(fake_gcs, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(paths.time, "monotonic", lambda: clock[0])
    staging = paths.Staging(f"gs://{BUCKET}/run", sync_secs=30)
    remote = fake_gcs / BUCKET / "run" / "metrics.jsonl"
    local = staging.fetch("metrics.jsonl")
    local.write_text("a\n")
    staging.sync()
    assert not remote.exists()  # not due yet
    clock[0] = 31.0
    staging.sync()
    assert remote.read_text() == "a\n"
    with open(local, "a") as f:
        f.write("b\n")
    staging.close()
    assert remote.read_text() == "a\nb\n" and not local.exists()
    again = paths.Staging(f"gs://{BUCKET}/run")  # a resumed writer appends to what is there
    assert again.fetch("metrics.jsonl").read_text() == "a\nb\n"
    again.close()
