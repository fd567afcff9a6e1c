"""What a run shows (issue 32, items 4 and 5): safe fields change on resume without
`--accept_changes`, a fix comes with the whole command, failure paths print a few lines (the
noise goes to train.log), progress lines and the final eval say what they measured, and every
kind of metrics.jsonl record is documented.

The terminal checks run `train.py` in subprocesses (tests/run_output_worker.py simulates a full
disk and tensorstore's failed reads) on one tiny workdir of this module: 4 runs in all.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ln_jax import console
from ln_jax.config.run import TrainConfig
from ln_jax.train import checkpoint, loop, run_identity, trainer
from ln_jax.train.metrics import GridClock, Progress, Scope
from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("run_output_worker.py")
TINY = "configs/bert_preln.py:tiny"
MAX_LINES = 5  # terminal lines of a failure path besides the progress lines


def run_train(mode: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """train.py through the worker (`mode`: plain, full_disk, stray_reads), on one device."""
    env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
    env.pop("LN_JAX_TRACEBACK", None)
    cmd = [sys.executable, str(WORKER), mode, *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {shlex.join(args)}\n{out.stdout}\n{out.stderr}")
    return out


def terminal(out: subprocess.CompletedProcess) -> list[str]:
    """The lines a user sees, progress lines (`step N/M | ...`) left out."""
    lines = (out.stdout + out.stderr).splitlines()
    return [line for line in lines if not re.match(r"(.* \| )?step +\d+/\d+ \|", line)]


def train_args(data_dir: Path, workdir: Path, *more: str) -> list[str]:
    return [
        f"--config={TINY}",
        f"--config.data.data_dir={data_dir}",
        "--config.total_steps=4",
        "--config.checkpoint_every=1",
        f"--workdir={workdir}",
        *more,
    ]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(data dir, workdir, output) of a first run on a fresh data dir: the local corpus is
    prepared there, 4 steps, a checkpoint at every step, monitoring at steps 1 and 4."""
    base = tmp_path_factory.mktemp("run_output")
    data_dir, workdir = base / "tfds", base / "run"
    out = run_train("plain", *train_args(data_dir, workdir))
    assert out.returncode == 0, out.stderr[-3000:]
    return data_dir, workdir, out


# --------------------------------------------------------------------------- resume


def test_every_field_named_safe_is_a_field_of_the_config():
    import dataclasses

    from ln_jax.models.translation.options import TranslationOptions

    fields = set(run_identity.flatten(run_identity.as_dict(TrainConfig())))
    fields |= {f"translation.{f.name}" for f in dataclasses.fields(TranslationOptions)}
    named = run_identity.FREE_FIELDS | run_identity.CONSENT_FIELDS | run_identity.SCHEDULE_FIELDS
    assert named <= fields, named - fields
    for section in run_identity.FREE_SECTIONS:
        assert any(f.startswith(section) for f in fields), section
    kinds = {f: run_identity.kind_of(f) for f in fields}
    assert kinds["checkpoint.fallback"] == kinds["monitor.collapse"] == "free"
    assert kinds["log_every"] == kinds["eval_every"] == kinds["checkpoint_every"] == "free"
    assert kinds["mesh.data"] == kinds["total_steps"] == "consent"
    assert kinds["seed"] == kinds["model.placement"] == kinds["optim.peak_lr"] == "unsafe"


def _config(**changes) -> dict:
    flat = run_identity.flatten(run_identity.as_dict(TrainConfig()))
    flat.update(changes)
    nested: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


def test_free_changes_resume_consent_ones_ask_and_unsafe_ones_need_a_new_workdir(tmp_path):
    old = _config()
    free = _config(**{"checkpoint.fallback": True, "monitor.collapse": 0.5, "log_every": 3})
    notes = run_identity.check_resume(old, free, 8, str(tmp_path))
    defaults = TrainConfig()
    assert notes == [
        "checkpoint.fallback: False -> True",
        f"log_every: {defaults.log_every} -> 3",
        f"monitor.collapse: {defaults.monitor.collapse} -> 0.5",
    ]
    consent = _config(**{"checkpoint.fallback": True, "mesh.data": 2})
    with pytest.raises(run_identity.RunMismatchError, match="adding --accept_changes") as err:
        run_identity.check_resume(old, consent, 8, str(tmp_path))
    assert err.value.fix.set == {"--accept_changes": "True"}
    assert run_identity.check_resume(old, consent, 8, str(tmp_path), accept_changes=True)
    (tmp_path.parent / f"{tmp_path.name}_2").mkdir()  # taken: the next free name is offered
    unsafe = _config(**{"checkpoint.fallback": True, "seed": 3})
    for accept in (False, True):
        with pytest.raises(run_identity.RunMismatchError, match="seed cannot change") as err:
            run_identity.check_resume(old, unsafe, 8, str(tmp_path), accept_changes=accept)
        assert err.value.fix.set == {"--workdir": f"{tmp_path}_3"}


def test_a_family_names_its_own_free_fields(tmp_path):
    """translation.skip_padding is free because the translation family's options class says
    so (`FREE_ON_RESUME`), not because the resume table names it: a translation run resumes
    across it, while its other fields stay unsafe."""
    from ln_jax.models.translation.options import TranslationOptions
    from ln_jax.task import free_fields

    assert free_fields("translation") == {"translation.skip_padding"}
    assert free_fields("bert_pretraining") == frozenset()
    assert not any(f.startswith("translation.") for f in run_identity.FREE_FIELDS)
    section = run_identity.as_dict(TranslationOptions(skip_padding="on"))
    old = {**_config(task="translation"), "translation": section}
    new = {**old, "translation": {**section, "skip_padding": "off"}}
    notes = run_identity.check_resume(old, new, 8, str(tmp_path))
    assert notes == ["translation.skip_padding: 'on' -> 'off'"]
    smoothed = {**old, "translation": {**section, "label_smoothing": 0.2}}
    with pytest.raises(run_identity.RunMismatchError, match="label_smoothing cannot change"):
        run_identity.check_resume(old, smoothed, 8, str(tmp_path), accept_changes=True)


def test_a_tpu_run_begun_with_rbg_bits_resumes_with_consent(tmp_path):
    """On a TPU "auto" dropout bits were rbg before 2026-11-28 and are hash since: such a run
    resumes with --accept_changes (masks of the same distribution from then on), not only in
    a new workdir."""
    old, new = _config(dropout_rng="rbg"), _config(dropout_rng="hash")
    with pytest.raises(run_identity.RunMismatchError, match="'rbg' -> 'hash'. If these"):
        run_identity.check_resume(old, new, 8, str(tmp_path))
    notes = run_identity.check_resume(old, new, 8, str(tmp_path), accept_changes=True)
    assert notes == ["dropout_rng: 'rbg' -> 'hash'"]


def test_a_field_added_since_the_run_shows_as_unset():
    old = run_identity.as_dict(TrainConfig())
    del old["monitor"]["window"]
    (change,) = run_identity.differences(old, run_identity.as_dict(TrainConfig()))
    assert str(change) == "monitor.window: (unset) -> 20" and change.kind == "free"


def test_a_run_recorded_before_a_consent_field_existed_resumes_at_its_old_value():
    # model.activation_layout was added after runs were recorded; they had XLA's layout.
    old = run_identity.as_dict(TrainConfig())
    del old["model"]["activation_layout"]
    assert run_identity.differences(old, run_identity.as_dict(TrainConfig())) == []
    pinned = run_identity.as_dict(TrainConfig())
    pinned["model"]["activation_layout"] = "row_major"
    (change,) = run_identity.differences(old, pinned)
    assert str(change) == "model.activation_layout: 'xla' -> 'row_major'"
    assert change.kind == "consent"


# --------------------------------------------------------------------------- the terminal


def test_a_first_run_prepares_the_corpus_quietly_and_its_eta_skips_compilation(first_run):
    data_dir, workdir, out = first_run
    shown = out.stdout + out.stderr
    for noise in ("Downloading", "dataset_info.json", "Generating", "Shuffling", "prepared to"):
        assert noise not in shown, noise
    assert f"INFO preparing ln_jax_pydocs in {data_dir}" in shown
    assert "Downloading and preparing" in (workdir / "train.log").read_text()
    # where the start went, in the log file only: "set up in 3.8 s: devices 0.0 s, data ..."
    (setup,) = re.findall(r"set up in ([\d.]+) s: devices ([\d.]+) s, data pipelines ([\d.]+) s"
                          r", state ([\d.]+) s"
                          r", waiting for the compiles ([\d.]+) s \(train [\d.]+ s then measured",
                          (workdir / "train.log").read_text())  # fmt: skip
    assert float(setup[0]) == pytest.approx(sum(float(x) for x in setup[1:]), abs=0.15)
    assert "set up in" not in shown
    # and within the data pipelines, in the log file only
    log = (workdir / "train.log").read_text()
    for split in ("train", "eval"):
        assert re.search(rf"data pipeline {split}: data and tokenizer [\d.]+ s, token ids and "
                         r"pair index [\d.]+ s, loader [\d.]+ s", log), split  # fmt: skip
    assert "data pipeline" not in shown
    lines = out.stdout.splitlines()
    # Both programs (step 1 measured, step 2 plain) were compiled at set-up: neither step
    # says it compiled, and step 2 has a rate.
    step1 = next(line for line in lines if line.startswith("step 1/4"))
    step2 = next(line for line in lines if line.startswith("step 2/4"))
    assert "first step" in step1 and "compilation" not in step1
    assert "steps/s" in step2 and "compilation" not in step2
    assert "final eval at step 4:" in out.stdout


def test_every_split_written_is_documented(first_run):
    _, workdir, _ = first_run
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    written = {r["split"] for r in records}
    assert {"train", "eval", "monitor"} <= written
    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage.split("### metrics.jsonl", 1)[1].split("\n#", 1)[0]
    documented = re.findall(r"^\| `([a-z_/<>]+)` \|", section, re.MULTILINE)
    patterns = [re.compile(re.sub(r"<\w+>", r"\\w+", d) + "$") for d in documented]
    assert {"train", "eval", "monitor", "warning/<rule>", "note/<rule>", "result"} <= set(
        documented
    )
    for split in written | {"warning/grad_jump", "note/collapse", "result"}:
        assert any(p.match(split) for p in patterns), f"split {split!r} is not documented"


def test_a_corrupt_checkpoint_gives_the_command_that_resumes_and_it_resumes_quietly(first_run):
    data_dir, run, _ = first_run
    workdir = run.parent / "corrupt"
    os.system(f"cp -r {shlex.quote(str(run))} {shlex.quote(str(workdir))}")
    (workdir / "train.log").unlink()
    os.system(f"rm -r {shlex.quote(str(workdir / 'checkpoints' / '4'))}")
    for f in (workdir / "checkpoints" / "3" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    args = train_args(data_dir, workdir)
    refused = run_train("stray_reads", *args)
    assert refused.returncode == 2
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert f"cannot restore checkpoint {workdir / 'checkpoints' / '3'}" in error
    assert "pybind11" not in error and "tensorstore_spec" not in error
    command = shlex.split(error.split(" Run: ", 1)[1])
    assert command == ["python", "train.py", *args, "--config.checkpoint.fallback=True"]
    resumed = run_train("stray_reads", *command[2:])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    shown = terminal(resumed)
    assert len(shown) <= MAX_LINES + 3, shown  # + the three lines of the fallback itself
    assert not any("Exception ignored" in line or "pybind11" in line for line in shown), shown
    fallback = "continuing", "checkpoint.fallback: False -> True"
    assert any(all(part in line for part in fallback) for line in shown), shown
    assert any("moved unrestorable checkpoint 3 aside" in line for line in shown)
    log = (workdir / "train.log").read_text()
    assert log.count("ignored after a failed checkpoint read") >= checkpoint_stray_reads() // 2
    assert (workdir / "checkpoints" / "corrupt_3").is_dir()


def checkpoint_stray_reads() -> int:
    from tests import run_output_worker

    return run_output_worker.STRAY


def test_a_full_disk_is_a_few_lines_ending_with_the_error(first_run, tmp_path):
    data_dir, _, _ = first_run
    out = run_train("full_disk", *train_args(data_dir, tmp_path / "full"))
    assert out.returncode == 2
    shown = terminal(out)
    assert len(shown) <= MAX_LINES, shown
    assert shown[-1].startswith("error: cannot save checkpoint") and "No space left" in shown[-1]
    assert "Traceback" not in out.stderr
    assert "No space left on device" in (tmp_path / "full" / "train.log").read_text()


def test_orbax_records_go_to_the_file_and_others_show_one_line(tmp_path, capsys):
    log_file = tmp_path / "train.log"
    console.configure_logging(str(log_file))
    try:
        noisy = logging.LogRecord(
            "absl",
            logging.ERROR,
            "/x/site-packages/orbax/a.py",
            1,
            "save failed\nTraceback ...",
            None,
            None,
        )
        other = logging.LogRecord(
            "jax",
            logging.WARNING,
            "/x/site-packages/jax/b.py",
            1,
            "first line\nsecond line",
            None,
            None,
        )
        for record in (noisy, other):
            logging.getLogger(record.name).handle(record)
    finally:
        console.close_logging()
    assert capsys.readouterr().err == "WARNING first line (more in the log file)\n"
    assert "save failed" in log_file.read_text() and "second line" in log_file.read_text()


def test_a_library_logging_after_the_command_ends_prints_nothing(capsys):
    """What a library thread logs after `close_logging` (orbax's, after a failed save: CI saw
    "INFO:absl:..." and a traceback under a full disk's one-line error) reaches no terminal:
    a module-level `logging` call finds a handler on the root and installs no stderr one."""
    console.configure_logging()
    console.close_logging()
    try:
        logging.error("late: a background thread's error")
        logging.getLogger("absl").info("late: orbax's throughput")
        assert not [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    finally:
        for handler in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(handler)
    assert "late" not in capsys.readouterr().err


# --------------------------------------------------------------------------- messages


def test_a_tensorstore_cause_keeps_its_message_without_the_spec():
    err = ValueError('DATA_LOSS: Error reading "w/.zarray": bad' + _spec())
    assert checkpoint._cause(err) == 'ValueError: DATA_LOSS: Error reading "w/.zarray": bad'
    cut = ValueError(
        "NOT_FOUND: missing <bound method pybind11_x.f of <T at 0x1>> [tensorstore_spec='{"
    )
    assert checkpoint._cause(cut) == "ValueError: NOT_FOUND: missing <...>"


def _spec() -> str:
    from tests.run_output_worker import SPEC

    return SPEC


def test_the_nan_stop_gives_the_fix_that_goes_on_and_that_fix_is_free(tmp_path):
    run = SimpleNamespace(
        state={"halted": True, "nonfinite_step": 7}, cfg=SimpleNamespace(checkpoint_every=5)
    )
    ckpt = SimpleNamespace(wait=lambda: None, latest_step=lambda: 5, directory=tmp_path)
    with pytest.raises(trainer.NonFiniteError, match="at step 7") as err:
        loop._check_finite(run, ckpt)
    assert "the checkpoint of step 5 is kept" in str(err.value)
    assert err.value.fix.set == {"--config.nan_policy": "skip"}
    assert run_identity.kind_of("nan_policy") == "free"  # so that command resumes as it is


def test_the_final_eval_names_the_step_it_evaluated():
    stopped = {"step": 31, "eval": {"step": 30, "time": 1.0, "loss": 2.5}, "preempted": "SIGTERM"}
    assert loop.eval_line(stopped) == (
        "last eval at step 30 (training stopped at step 31): loss=2.5000"
    )
    done = {"step": 40, "eval": {"step": 40, "time": 1.0, "loss": 2.25}}
    assert loop.eval_line(done) == "final eval at step 40: loss=2.2500"
    assert loop.eval_line({"step": 3, "eval": {}}) is None


# --------------------------------------------------------------------------- progress


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_comes_from_steady_windows_only():
    clock = FakeClock()
    progress = Progress(100, 256, stream=None, enabled=False, clock=clock)
    lines = []

    def window(step, seconds, disturb=None):
        if disturb:
            progress.disturb(disturb)
        clock.now += seconds
        rates = progress.rates(step)
        lines.append(progress.line(step, *rates, loss=1.0))

    window(1, 30.0)  # compilation of the first program
    window(2, 25.0, "compilation")  # the second program: no ETA yet
    window(3, 0.5)
    window(4, 0.5)
    window(5, 40.0, "evaluation")  # the ETA keeps the steady steps' pace
    window(6, 0.6)
    assert "first step 30.0 s" in lines[0] and "compilation" not in lines[0]  # compiled ahead
    assert "1 step in 25.0 s (compilation included)" in lines[1] and "ETA" not in lines[1]
    assert lines[2].endswith("ETA 0:00:48")  # 97 x 0.5 s
    assert "1 step in 40.0 s (evaluation included)" in lines[4]
    assert lines[4].endswith("ETA 0:00:47")  # 95 x 0.5 s: the eval window is left out
    assert lines[5].endswith("ETA 0:00:47")  # median of 0.5, 0.5, 0.6


def test_a_grid_run_shows_its_place_the_whole_grid_eta_and_the_last_eval():
    clock = GridClock(runs=3)
    assert clock.after(10.0) is None  # no run started
    with clock.timing():
        clock.started -= 20.0  # 20 s into the first run
        assert clock.after(10.0) == pytest.approx(2 * 30.0, rel=0.01)
    clock.durations[-1] = 50.0
    with clock.timing():
        assert clock.after(5.0) == pytest.approx(50.0)  # one run left after this one
    progress = Progress(
        48, 2048, enabled=False, scope=Scope("lr0.0005 seed 1 (run 2/3)", clock.after)
    )
    progress.evaluated(16, {"score": 0.5715, "loss": 0.69})
    line = progress.line(20, 2.0, 4096.0, 0.69)
    assert line.startswith("lr0.0005 seed 1 (run 2/3) | step 20/48 |")
    assert line.endswith("| eval score 0.5715 (step 16)")


def test_progress_line_without_a_scope_is_unchanged():
    line = Progress(1000, 256, start_step=10, enabled=False).line(12, 4.0, 1024.0, 9.4)
    assert line.startswith("step   12/1000 |") and line.endswith("ETA 0:04:07")
