"""The one-call GPU study scripts (bench/gpu/gpu_mt_warmup.sh, bench/gpu/gpu_bert_xiong.sh,
bench/gpu/gpu_mt_fig2.sh, bench/gpu/gpu_mt_liu_depth.sh) share their command line
(bench/gpu/gpu_common.sh): help, a wrong argument, the missing prepared data; bench/gpu/gpu_call.sh
too. Their CPU modes run in tests/test_gpu_call.py."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPTS = {"gpu_mt_warmup.sh": "gettext_de_en", "gpu_bert_xiong.sh": "sitedocs",
           "gpu_mt_fig2.sh": "gettext_de_en", "gpu_mt_liu_depth.sh": "gettext_de_en"}  # fmt: skip


def _run(script: str, *args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", os.path.join(cwd, "bench", "gpu", script), *args],
        capture_output=True, text=True, timeout=60, cwd=cwd,
    )  # fmt: skip


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_prints_the_header_and_exits_0(script):
    run = _run(script, "--help")
    assert run.returncode == 0
    assert run.stdout.startswith("# ") and "--prepare" in run.stdout
    assert "set -uo" not in run.stdout  # the header only, not the code


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_an_unknown_argument_is_a_one_line_error(script):
    run = _run(script, "--steps=5", "--bogus")
    assert run.returncode == 2
    assert run.stderr.strip() == f"{script}: unknown argument --bogus; see --help"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_without_prepared_data_it_names_the_prepare_command(script, tmp_path):
    copy = tmp_path / "repo"
    (copy / "bench" / "gpu").mkdir(parents=True)
    for name in (script, "gpu_common.sh"):
        shutil.copy(os.path.join(ROOT, "bench", "gpu", name), copy / "bench" / "gpu" / name)
    run = _run(script, f"--out={tmp_path / 'out'}", cwd=str(copy))
    assert run.returncode == 2
    assert f"run bench/gpu/{script} --prepare here first" in run.stderr
    assert SCRIPTS[script] in run.stderr
    assert not (tmp_path / "out").exists()  # nothing started


def test_only_the_scripts_with_a_cpu_mode_take_cpu():
    run = _run("gpu_mt_warmup.sh", "--cpu")
    assert run.returncode == 2
    assert run.stderr.strip() == "gpu_mt_warmup.sh: unknown argument --cpu; see --help"


def test_the_call_checks_its_arguments_and_the_prepared_data(tmp_path):
    run = _run("gpu_call.sh", "--help")
    assert run.returncode == 0 and "--suite_budget" in run.stdout and "set -uo" not in run.stdout
    run = _run("gpu_call.sh", "--bogus")
    assert run.returncode == 2
    assert run.stderr.strip() == "gpu_call.sh: unknown argument --bogus; see --help"
    copy = tmp_path / "repo"
    (copy / "bench" / "gpu").mkdir(parents=True)
    gpu_call = ("bench", "gpu", "gpu_call.sh")
    shutil.copy(os.path.join(ROOT, *gpu_call), copy.joinpath(*gpu_call))
    run = _run("gpu_call.sh", f"--out={tmp_path / 'out'}", cwd=str(copy))
    assert run.returncode == 2 and "bench/gpu/gpu_mt_warmup.sh --prepare here first" in run.stderr
    assert not (tmp_path / "out").exists()
