"""Multi-host for real on one machine: two JAX processes on localhost against one with 8 devices.

Two processes, each with 4 fake CPU devices, join one 8-device system (`jax.distributed` with
gloo CPU collectives) through the real `train.py` CLI and train `configs/bert_preln.py:tiny` for
a few steps on a 2x2x2 (data, fsdp, tensor) mesh, each process loading only its half of every
global batch. One of the two is sent SIGTERM (a preemption notice for one host): both must stop
after the same step, save it and exit 0, and the resumed job must go on from there. A single
process with 8 devices trains the same config. Both must log the same losses, and the two halves
must be exactly the rows of the single process's batches.

The processes run as subprocesses of tests/multihost_worker.py (which runs `train.py` and
records the rows each process loads); the first pair and the single process run at the same
time to save wall-clock time.
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
from ln_jax.data.bert.pipeline import tokenized_corpus
from tests.xla_env import xla_flags

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
        "--config.monitor.every=0",  # tests/test_monitor.py measures
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
    def __init__(
        self,
        name: str,
        devices: int,
        train_flags: list[str],
        logdir,
        evidence: str,
        worker_flags: list[str] = (),
    ):
        self.name = name
        self.log_path = logdir / f"{name}.log"
        env = dict(os.environ)
        env.update(
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            XLA_FLAGS=xla_flags(devices),
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        cmd = [
            sys.executable,
            WORKER,
            f"--devices={devices}",
            f"--evidence={evidence}",
            *worker_flags,
        ]
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


def _pair(tmp_path, data_dir, workdir, launch: str, sigterm_at: int | None = None) -> list[_Proc]:
    """The two processes of a job (4 devices each); process 1 is SIGTERMed after `sigterm_at`."""
    address = f"127.0.0.1:{_free_port()}"
    return [
        _Proc(
            f"{launch}_process{i}",
            4,
            [
                *_train_flags(data_dir, str(workdir)),
                f"--coordinator_address={address}",
                "--num_processes=2",
                f"--process_id={i}",
            ],
            tmp_path,
            str(tmp_path / f"evidence_{launch}_{i}.json"),
            [f"--sigterm_at_step={sigterm_at}"] if i == 1 and sigterm_at else [],
        )
        for i in range(2)
    ]


def test_two_processes_preempted_and_resumed_match_one_process(
    tmp_path, data_dir, tokenizer, make_config, cpu_to_itself
):
    """Two processes x 4 devices, one of them preempted (SIGTERM) after step 1 and the job
    resumed, against one process x 8 devices: the same losses, each process loading only its
    half of every global batch, and together exactly the single process's batches."""
    _prepare(data_dir, tokenizer, make_config())
    two, one = tmp_path / "two_processes", tmp_path / "one_process"
    single = _Proc("single", 8, _train_flags(data_dir, str(one)), tmp_path,
                   str(tmp_path / "evidence_single.json"))  # fmt: skip
    first = _pair(tmp_path, data_dir, two, "first", sigterm_at=1)
    _wait_all([*first, single], TIMEOUT_S)  # both processes exit 0 after saving

    # SIGTERM reached one process; both stopped after the same step and saved it.
    saved = [int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(saved) == 1 and 1 <= saved[0] < STEPS, saved
    stop = saved[0]
    for proc in first:
        assert f"SIGTERM: saved step {stop}" in proc.tail(), proc.tail()
    second = _pair(tmp_path, data_dir, two, "second")
    _wait_all(second, TIMEOUT_S)
    logs = "\n".join(p.tail(1500) for p in [*first, *second, single])

    # Same steps, same losses (process 0 alone writes metrics.jsonl: each step once).
    m2, m1 = _metrics(two), _metrics(one)
    steps = list(range(1, STEPS + 1))
    assert [r["step"] for r in m2["train"]] == steps, logs
    assert [r["step"] for r in m1["train"]] == steps, logs
    for key in ("loss", "mlm_loss", "nsp_loss", "grad_norm"):
        np.testing.assert_allclose(
            [r[key] for r in m2["train"]],
            [r[key] for r in m1["train"]],
            rtol=1e-5,
            err_msg=f"train {key}: two processes x 4 devices (preempted) vs one x 8 devices",
        )
    assert [r["step"] for r in m2["eval"]] == [r["step"] for r in m1["eval"]] == [STEPS]
    np.testing.assert_allclose(m2["eval"][0]["loss"], m1["eval"][0]["loss"], rtol=1e-5)

    # Each process of the pair was one of 2 with 4 of the 8 devices and loaded only its half of
    # every global batch: rows [4p, 4p+4), held by its own 4 devices only (2 rows per device,
    # each on a data x fsdp position and replicated over tensor).
    ref = _evidence(tmp_path / "evidence_single.json")
    assert (ref["process_count"], ref["device_count"]) == (1, 8)
    assert all(set(b["local_rows"].values()) == {BATCH} for b in ref["batches"])
    ref_train = [b for b in ref["batches"] if b["split"] == "train"][:STEPS]
    ref_eval = [b for b in ref["batches"] if b["split"] == "eval"]
    half = BATCH // 2
    for i in range(2):
        ev = [_evidence(tmp_path / f"evidence_{launch}_{i}.json") for launch in ("first", "second")]
        for e in ev:
            assert (e["process_index"], e["process_count"]) == (i, 2)
            assert (e["device_count"], e["local_device_count"]) == (8, 4)
            for b in e["batches"]:
                assert set(b["local_rows"].values()) == {half}, b["local_rows"]
                assert b["global_rows"] == BATCH
                start = i * half
                assert b["addressable_rows"] == [[start, start + 2], [start + 2, start + 4]]
                assert b["shards_all_local"] and not b["fully_addressable"]
                assert len(b["shard_devices"]) == 4
        # Before and after the preemption, this process's rows are its half of the single
        # process's batches, in order: the data resumed exactly where the checkpoint left it.
        train = [b for b in ev[0]["batches"] if b["split"] == "train"][:stop] + [
            b for b in ev[1]["batches"] if b["split"] == "train"
        ][: STEPS - stop]
        evals = [b for b in ev[1]["batches"] if b["split"] == "eval"]
        for mine, whole in zip([*train, *evals], [*ref_train, *ref_eval], strict=True):
            assert mine["row_digests"] == whole["row_digests"][i * half : (i + 1) * half]
