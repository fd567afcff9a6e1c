"""Multi-host for real on one machine: two JAX processes on localhost against one with 8 devices.

Two processes, each with 4 fake CPU devices, join one 8-device system (`jax.distributed` with
gloo CPU collectives) through the real `train.py` CLI and train `configs/bert_preln.py:tiny` for
a few steps on a 2x2x2 (data, fsdp, tensor) mesh, each process loading only its half of every
global batch. A single process with 8 devices trains the same config. Both must log the same
losses, and the two halves must be exactly the rows of the single process's batches.

The processes run as subprocesses of tests/multihost_worker.py (which runs `train.py` and
records the rows each process loads); all three run at the same time to save wall-clock time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from ln_jax.data import sources
from ln_jax.data.loader import tokenized_corpus

pytest_plugins = ("tests.data_fixtures",)  # fixtures: data_dir, tokenizer, make_config
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "multihost_worker.py")
TIMEOUT_S = 360
STEPS = 4
BATCH = 8


def _free_port() -> int:
    try:
        import portpicker

        return portpicker.pick_unused_port()
    except ImportError:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def _prepare(data_dir: str, tokenizer, cfg) -> None:
    """Caches the token ids of both splits beside the data, as the tokenizer already is.

    The runs find them there instead of building them at the same time (they would race).
    """
    assert cfg.vocab_size == 8000  # the tokenizer of the `:tiny` config
    source = sources.open_source(cfg.dataset, data_dir=data_dir)
    for split in (cfg.train_split, cfg.eval_split):
        tokenized_corpus(source, split, tokenizer)


def _train_flags(data_dir: str, workdir: str) -> list[str]:
    return [
        "--config=" + os.path.join(REPO, "configs", "bert_preln.py") + ":tiny",
        f"--config.total_steps={STEPS}",
        "--config.log_every=1",
        "--config.eval_every=0",  # one evaluation, at the end
        "--config.eval_batches=1",
        "--config.checkpoint_every=0",  # one checkpoint, at the end
        f"--config.data.data_dir={data_dir}",
        f"--config.data.global_batch_size={BATCH}",
        "--config.mesh.data=2",
        "--config.mesh.fsdp=2",
        "--config.mesh.tensor=2",
        f"--workdir={workdir}",
    ]


class _Proc:
    def __init__(self, name: str, devices: int, train_flags: list[str], logdir, evidence: str):
        self.name = name
        self.log_path = logdir / f"{name}.log"
        env = dict(os.environ)
        env.update(
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        cmd = [sys.executable, WORKER, f"--devices={devices}", f"--evidence={evidence}"]
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.popen = subprocess.Popen(
            [*cmd, "--", *train_flags],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def close(self) -> None:
        self._log.close()

    def tail(self, chars: int = 4000) -> str:
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        return f"----- {self.name} (exit {self.popen.returncode}) -----\n{text[-chars:]}"


def _wait_all(procs: list[_Proc], timeout_s: float) -> None:
    """Waits for every process; on a timeout or a failure kills the rest and shows the logs."""
    deadline = time.monotonic() + timeout_s
    failed = None
    try:
        while failed is None and any(p.popen.poll() is None for p in procs):
            if time.monotonic() > deadline:
                failed = f"timed out after {timeout_s:.0f} s"
            elif any(p.popen.returncode not in (None, 0) for p in procs):
                failed = "a process failed"  # its peer may wait for it forever
            else:
                time.sleep(0.5)
        if failed is None and any(p.popen.returncode != 0 for p in procs):
            failed = "a process failed"
    finally:  # also when the test itself is interrupted
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
            p.close()
    if failed:
        pytest.fail(f"{failed}:\n" + "\n".join(p.tail() for p in procs))


def _metrics(workdir) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"train": [], "eval": []}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            out[record["split"]].append(record)
    return out


def _evidence(path) -> dict:
    with open(path) as f:
        return json.load(f)


def test_two_processes_match_one_process_with_8_devices(tmp_path, data_dir, tokenizer, make_config):
    _prepare(data_dir, tokenizer, make_config())
    two, one = tmp_path / "two_processes", tmp_path / "one_process"
    address = f"127.0.0.1:{_free_port()}"
    procs = [
        _Proc(
            f"process{i}",
            4,
            [
                *_train_flags(data_dir, str(two)),
                f"--coordinator_address={address}",
                "--num_processes=2",
                f"--process_id={i}",
            ],
            tmp_path,
            str(tmp_path / f"evidence_two_{i}.json"),
        )
        for i in range(2)
    ]
    procs.append(
        _Proc(
            "single",
            8,
            _train_flags(data_dir, str(one)),
            tmp_path,
            str(tmp_path / "evidence_single.json"),
        )
    )
    _wait_all(procs, TIMEOUT_S)
    logs = "\n".join(p.tail(1500) for p in procs)

    # Same steps, same losses (process 0 alone writes metrics.jsonl: no duplicated records).
    m2, m1 = _metrics(two), _metrics(one)
    steps = list(range(1, STEPS + 1))
    assert [r["step"] for r in m2["train"]] == steps, logs
    assert [r["step"] for r in m1["train"]] == steps, logs
    for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
        np.testing.assert_allclose(
            [r[key] for r in m2["train"]],
            [r[key] for r in m1["train"]],
            rtol=1e-5,
            err_msg=f"train {key}: two processes x 4 devices vs one process x 8 devices",
        )
    assert [r["step"] for r in m2["eval"]] == [r["step"] for r in m1["eval"]] == [STEPS]
    np.testing.assert_allclose(m2["eval"][0]["loss"], m1["eval"][0]["loss"], rtol=1e-5)

    # Each process of the pair was one of 2 with 4 of the 8 devices and loaded only its half of
    # every global batch: rows [4p, 4p+4), held by its own 4 devices only (2 rows per device,
    # each on a data x fsdp position and replicated over tensor).
    ev = [_evidence(tmp_path / f"evidence_two_{i}.json") for i in range(2)]
    single = _evidence(tmp_path / "evidence_single.json")
    for name, e in (("process0", ev[0]), ("process1", ev[1]), ("single", single)):
        print(f"{name}: {e['wall_s']:.0f} s wall, {e['cpu_s']:.0f} s CPU")
    for i, e in enumerate(ev):
        assert (e["process_index"], e["process_count"]) == (i, 2)
        assert (e["device_count"], e["local_device_count"]) == (8, 4)
        train = [b for b in e["batches"] if b["split"] == "train"]
        assert len(train) == STEPS
        half = BATCH // 2
        for b in e["batches"]:
            assert set(b["local_rows"].values()) == {half}, b["local_rows"]
            assert b["global_rows"] == BATCH
            start = i * half
            assert b["addressable_rows"] == [[start, start + 2], [start + 2, start + 4]]
            assert b["shards_all_local"] and not b["fully_addressable"]
            assert len(b["shard_devices"]) == 4
    assert (single["process_count"], single["device_count"]) == (1, 8)
    assert all(set(b["local_rows"].values()) == {BATCH} for b in single["batches"])
    assert sum(b["split"] == "train" for b in single["batches"]) == STEPS

    # Together the two halves are exactly the global batches of the single process (same order,
    # nothing loaded twice), for training and for evaluation.
    assert len(ev[0]["batches"]) == len(ev[1]["batches"]) == len(single["batches"])
    for b0, b1, b in zip(ev[0]["batches"], ev[1]["batches"], single["batches"], strict=True):
        assert b0["split"] == b1["split"] == b["split"]
        assert b0["row_digests"] + b1["row_digests"] == b["row_digests"]
        assert not set(b0["row_digests"]) & set(b1["row_digests"])
