"""Workdirs, logs, metrics and tokenizers on gs:// (issue 17, item 4), on a fake GCS.

The fake stands in for the network services only, so that a `gs://bucket/...` URL takes the
code path it takes on a Cloud TPU VM without TensorFlow: `etils.epath` -> its fsspec backend ->
the fsspec filesystem registered for `gs`/`gcs` (gcsfs there; here `FakeGCS`, a folder under
tmp). Orbax reaches GCS in two more ways, replaced likewise: TensorStore's `gcs` kvstore (here
the `file` driver on the same folder) and google-cloud-storage's bucket metadata (here a bucket
without hierarchical namespace).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import signal
import types

import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils

from ln_jax import console, paths, run_identity, trainer
from ln_jax.data import tokenizer as tk
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
