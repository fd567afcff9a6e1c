"""The one command-line convention (`ln_jax.cli.command`): --help everywhere, user errors in one
line with the whole command that works, typo suggestions, no stub workdir, set-up SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ln_jax
from ln_jax.cli import command as cli
from ln_jax.config.load import build_config, config_from_command_line, load_config, override
from ln_jax.data import sources
from ln_jax.data.config import DataConfig
from ln_jax.data.translation import parallel
from ln_jax.train.preemption import EXIT_SIGTERM, SetupSignals
from ln_jax.train.workdir_stub import no_stub_workdir
from ln_jax.validate import ConfigError, Fix, UserError, check_choice

ROOT = Path(__file__).resolve().parents[1]
TINY = "--config=configs/bert_preln.py:tiny"


def run(args, cwd, timeout=120):
    """`python ARGS` in `cwd` (a script named relative to the checkout)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    script = [str(ROOT / args[0])] if args[0].endswith(".py") else args[:1]
    cmd = [sys.executable, *script, *args[1:]]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


# --------------------------------------------------------------------------- --help


@pytest.mark.parametrize(
    "args, shows",
    [
        (["train.py", "--help"], ["python train.py --config=configs/bert_preln.py:tiny"]),
        (
            ["train.py", "-h", "--config=configs/bert_postln.py:mini", "--config.seed=7"],
            ["model.placement=post", "model.num_layers=4", "seed=7", "values of configs/bert"],
        ),
        (["train.py", "--helpfull"], ["model.placement=pre", "--workdir=DIR"]),
        (["finetune.py", "-h"], ["init_from=None", "python finetune.py --config=configs/glue.py"]),
        (
            ["-m", "ln_jax.compile_check", "--help", TINY],
            [
                "--device_memory_gib=X",
                "python -m ln_jax.compile_check --config=",
                "model.size=tiny",
            ],
        ),
        (["-m", "ln_jax.analysis", "--help"], ["monitor", "model.init=xavier", "output-change"]),
        (["-m", "ln_jax.experiments", "-h"], ["--warmup_steps=", "downstream", "model.placement"]),
    ],
)
def test_every_command_helps_and_exits_0(args, shows, tmp_path):
    proc = run(args, cwd=tmp_path)  # any working directory: the configs resolve from the checkout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python"), proc.stdout[:200]
    assert "config fields" in proc.stdout and "    checkpoint.keep=" in proc.stdout
    for text in shows:
        assert text in proc.stdout, text
    assert not list(tmp_path.iterdir())  # help writes nothing


def test_help_lists_fields_with_their_one_line_meaning():
    lines = cli.Command("python x.py", "X.", cli.train_config_front()).help().splitlines()
    placement = next(line for line in lines if line.strip().startswith("model.placement="))
    assert placement.split("=", 1)[1].startswith("pre ") and "LayerNorm placement" in placement
    fallback = next(line for line in lines if "checkpoint.fallback=False" in line)
    assert "try the previous ones" in fallback or "restored" in fallback
    assert all(len(line) <= 100 for line in lines if line.startswith("    "))
    sections = [
        line.split(":")[0].strip()
        for line in lines
        if line.startswith("  ")
        and ":" in line
        and not line.startswith("   ")
        and line.split(":")[0].strip().isidentifier()
    ]
    assert sections[:7] == ["run", "model", "optim", "data", "mesh", "checkpoint", "monitor"]


def test_help_with_a_config_shows_what_it_resolves_to():
    command = cli.Command("python x.py", "X.", cli.train_config_front())
    text = command.help(["--config=configs/bert_preln.py:tiny", "--config.model.dtype=auto"])
    assert "model.dtype=float32" in text  # "auto" resolved on this CPU
    broken = command.help(["--config=configs/bert_preln.py:tiny", "--config.model.nrom=x"])
    assert "the defaults: unknown config field 'model.nrom'" in broken


# --------------------------------------------------------------------------- flags


def _command():
    command = cli.Command("python -m tool", "Tool.", subcommands={"go": "go", "stop": "stop"})
    flags = {
        "out": command.string("out", None, "where", required=True),
        "n": command.integer("n", 3, "count"),
        "fast": command.boolean("fast", True, "speed"),
        "names": command.strings("names", ["a"], "names"),
        "mode": command.enum("mode", "x", ("x", "y"), "mode"),
    }
    return command, flags


def test_flags_parse_as_absl_did():
    command, flags = _command()
    got = {}
    argv = ["go", "--out", "/o", "--n=5", "--nofast", "--names=p,q", "--mode", "y", TINY]
    assert command.run(lambda inv: got.update(words=inv.words, spec=inv.line.spec) or 0, argv) == 0
    assert got == {"words": ["go"], "spec": "configs/bert_preln.py:tiny"}
    assert [flags[k].value for k in ("out", "n", "fast", "names", "mode")] == [
        "/o",
        5,
        False,
        ["p", "q"],
        "y",
    ]
    assert command.run(lambda inv: 0, ["stop", "--out=/o"]) == 0
    assert (flags["n"].value, flags["fast"].value, flags["names"].value) == (3, True, ["a"])


@pytest.mark.parametrize(
    "argv, message, fixed",
    [
        (
            ["go", "--out=/o", "--nn=2"],
            "unknown flag '--nn'. Did you mean --n?",
            "go --out=/o --n=2",
        ),
        (["stpo", "--out=/o"], "subcommand 'stpo'; did you mean 'stop'?", "stop --out=/o"),
        (["--out=/o"], "no subcommand. Give one of go, stop", None),
        (["go", "--out=/o", "--mode=yy"], "give one of x, y. Did you mean 'y'?", "--mode=y"),
        (["go", "--out=/o", "--n=two"], "--n='two': give an integer.", None),
        (["go"], "needs --out: where", None),
    ],
)
def test_flag_errors_are_one_line_with_the_whole_fixed_command(argv, message, fixed, capsys):
    command, _ = _command()
    assert command.run(lambda inv: 0, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    if fixed:
        assert err.rstrip().endswith(
            f"Run: python -m tool {fixed}" if "--mode" not in fixed else fixed
        ), err
    else:
        assert "Run:" not in err


def test_fixed_command_applies_the_fix_to_the_users_own_arguments():
    argv = ["--workdir", "W", "--config.model.nrom=rmsnorm", "--config.seed", "3"]
    rename = Fix(rename={"--config.model.nrom": "--config.model.norm"})
    assert cli.fixed_command("python train.py", argv, rename) == (
        "python train.py --workdir W --config.model.norm=rmsnorm --config.seed 3"
    )
    setting = Fix(set={"--config.seed": "4", "--config": "configs/bert_preln.py:tiny"})
    assert cli.fixed_command("python train.py", argv, setting) == (
        "python train.py --config=configs/bert_preln.py:tiny --workdir W "
        "--config.model.nrom=rmsnorm --config.seed=4"
    )
    spaced = cli.fixed_command("python train.py", ["--workdir=a b"], Fix(set={"--x": "1"}))
    assert spaced == "python train.py '--workdir=a b' --x=1"  # quoted for a shell
    assert cli.fixed_command("python train.py", argv, Fix(rename={"--gone": "--here"})) is None
    assert cli.fixed_command("python train.py", argv, None) is None


@pytest.mark.parametrize(
    "argv, fix, fixed",
    [
        (["--config.optim.peak_lr=1", "--lr=2"], Fix(rename={"--lr": "--config.optim.peak_lr"}),
         "--config.optim.peak_lr=2"),
        (["--config.seed=1", "--config.seed", "2", "-v"], Fix(set={"--config.seed": "4"}),
         "--config.seed=4 -v"),
        (["--noaccept_changes", "--config.total_steps=5"],
         Fix(set={"--config.total_steps": "10", "--accept_changes": "true"}),
         "--config.total_steps=10 --accept_changes=true"),
        (["--config=a.py", "--config", "b.py:x"], Fix(set={"--config": "c.py"}), "--config=c.py"),
    ],
)  # fmt: skip
def test_a_fixed_command_gives_each_flag_once_with_the_fix_s_value(argv, fix, fixed):
    """A suggested command repeated a flag with two values (the user's and the fix's)."""
    assert cli.fixed_command("p", argv, fix) == f"p {fixed}"


# --------------------------------------------------------------------------- the config front


def test_config_errors_carry_the_fix_of_the_command_line():
    argv = [TINY, "--config.modle.norm=rmsnorm"]
    with pytest.raises(ConfigError, match="Did you mean 'model'") as err:
        config_from_command_line(argv)
    assert cli.fixed_command("python train.py", argv, err.value.fix).endswith(
        "--config.model.norm=rmsnorm"
    )
    with pytest.raises(ConfigError, match="Did you mean 'configs/bert_preln.py'") as err:
        config_from_command_line(["--config=configs/bert_prelm.py:mini"])
    assert err.value.fix == Fix(set={"--config": "configs/bert_preln.py:mini"})


@pytest.mark.parametrize(
    "command, fixed",
    [("train.py", "--config=configs/mt.py:tiny"), ("finetune.py", "--config=configs/glue.py")],
)
def test_a_missing_config_file_suggests_only_the_command_s_own_configs(command, fixed, capsys):
    """train.py was told `Did you mean 'configs/glue.py'?` (finetune.py's config, which it
    then refused); a variant the suggested file lacks is not kept (glue.py has no tiny)."""
    module = __import__(command.removesuffix(".py"))
    assert module.COMMAND.run(module.main, ["--config=configs/glu.py:tiny"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"Run: python {command} {fixed}"), err
    takes = err.split("the shipped ones this command takes: ")[1].split(")")[0].split(", ")
    assert ("configs/glue.py" in takes) == (command == "finetune.py")
    assert "configs/common.py" not in takes
    with pytest.raises(ConfigError, match="give a config") as err:
        config_from_command_line(["--workdir=W"])
    assert err.value.fix == Fix(set={"--config": "configs/bert_preln.py:tiny"})


def test_validation_messages_name_fields_as_the_user_types_them():
    base = load_config("configs/bert_preln.py:tiny")
    cases = {
        "total_steps": ("0", "optim.total_steps=0 must be > 0: set --config.optim.total_steps"),
        "optim.b2": ("1.5", "optim.b2=1.5 must be in [0, 1): set --config.optim.b2."),
        "optim.optimizer": ("adamm", "unknown optim.optimizer 'adamm'"),
        "model.placement": ("postt", "unknown model.placement 'postt'"),
    }
    for field, (value, message) in cases.items():
        with pytest.raises(ConfigError) as err:
            build_config(override(base, {field: value}))
        assert message in str(err.value), str(err.value)
        assert "OptimConfig" not in str(err.value) and "ModelConfig" not in str(err.value)
    with pytest.raises(ConfigError, match="warmup_steps=5000 must be <= optim.total_steps=120"):
        build_config(override(base, {"optim.schedule": "constant", "optim.warmup_steps": "5000"}))
    with pytest.raises(ConfigError) as err:
        build_config(override(base, {"optim.schedule": "linear_decay", "optim.warmup_steps": "9"}))
    assert err.value.fix == Fix(set={"--config.optim.schedule": "warmup_linear_decay"})


def test_mixln_under_four_layers_is_an_error_not_pre_ln_by_another_name():
    with pytest.raises(ConfigError, match="'mixln' on 2 layer\\(s\\) is plain Pre-LN") as err:
        ln_jax.model_config("tiny", placement="mixln")
    assert err.value.fix == Fix(set={"--config.model.placement": "pre"})
    assert ln_jax.model_config("tiny", num_layers=4, placement="mixln").layer_placements == (
        "post",
        "pre",
        "pre",
        "pre",
    )


# --------------------------------------------------------------------------- did you mean


def test_check_choice_suggests_the_closest_names_in_one_place():
    with pytest.raises(ConfigError) as err:
        check_choice("model.norm", "rmsnrom", ("layernorm", "rmsnorm"), config_field="model.norm")
    assert str(err.value) == (
        "unknown model.norm 'rmsnrom'; valid names: layernorm, rmsnorm; did you mean 'rmsnorm'?"
    )
    assert err.value.fix == Fix(set={"--config.model.norm": "rmsnorm"})
    with pytest.raises(ConfigError) as err:
        check_choice("x", "zzz", [str(i) for i in range(50)])
    assert str(err.value) == "unknown x 'zzz'."  # 50 names are not listed, none is close
    # gettext and parallel text use it: one wording, one fix.
    with pytest.raises(ConfigError, match="did you mean 'synthetic:copy'") as err:
        parallel.open_parallel(DataConfig(dataset="synthetic:cpy"))
    assert err.value.fix == Fix(set={"--config.data.dataset": "synthetic:copy"})


def test_a_mistyped_dataset_suggests_only_datasets_that_run_here(tmp_path, caplog):
    """A suggestion is a command that runs: ln_jax's corpora and the TFDS datasets prepared
    in the data dir. A TFDS name that is not prepared is named as such, with no command (it
    was `Run: ... --config.data.dataset=math_dataset`, refused next as not prepared)."""
    with pytest.raises(sources.UnknownDatasetError) as err:
        sources.check_datasets(DataConfig(dataset="wikipeda/20230601.en", data_dir=str(tmp_path)))
    message = str(err.value)
    assert "did you mean" not in message and err.value.fix is None
    assert "TFDS has 'wikipedia', " in message and "not prepared under that data_dir" in message
    assert "\n" not in message and "ln_jax_pydocs" in message and "tfds build" not in message
    data = tmp_path / "prepared"
    (data / "wikipedia" / "20230601.en" / "1.0.0").mkdir(parents=True)
    (data / "wikipedia" / "20230601.en" / "1.0.0" / "dataset_info.json").write_text("{}")
    (data / "wikipedia" / "20230601.en" / "1.0.0" / "w.array_record-00000-of-00001").touch()
    assert sources.prepared_datasets(str(data)) == ["wikipedia/20230601.en"]
    with pytest.raises(sources.UnknownDatasetError) as err:
        sources.check_datasets(DataConfig(dataset="wikipeda/20230601.en", data_dir=str(data)))
    assert "did you mean 'wikipedia/20230601.en'?" in str(err.value)
    assert err.value.fix == Fix(set={"--config.data.dataset": "wikipedia/20230601.en"})
    # A TFDS dataset that is not prepared: its error, without TFDS's warning before it.
    with pytest.raises(sources.DatasetNotPreparedError, match="math_dataset' is not prepared"):
        sources.check_datasets(DataConfig(dataset="math_dataset", data_dir=str(data)))
    assert not [r for r in caplog.records if "Variant folder" in r.getMessage() and
                r.levelno >= logging.WARNING]  # fmt: skip
    with pytest.raises(sources.UnknownDatasetError, match="did you mean 'ln_jax_pydocs'"):
        sources.open_source("ln_jax_pydoc", data_dir=str(tmp_path))
    mix = DataConfig(dataset="ln_jax_pydocs:0.5,wikipeda:0.5", data_dir=str(tmp_path))
    with pytest.raises(sources.UnknownDatasetError) as err:
        sources.check_datasets(mix)
    assert err.value.fix is None  # one entry's fix is not the whole field's value
    with pytest.raises(ConfigError, match="no such folder"):
        sources.check_datasets(DataConfig(dataset=f"textdir:{tmp_path}/none"))
    with pytest.raises(ConfigError, match="holds no .txt files"):
        sources.check_datasets(DataConfig(dataset=f"textdir:{tmp_path}"))
    sources.check_datasets(DataConfig(dataset="ln_jax_pydocs", data_dir=str(tmp_path)))
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]  # checked, nothing prepared


def test_a_user_error_in_train_py_leaves_no_workdir_and_says_the_command(tmp_path):
    proc = run(
        ["train.py", TINY, "--workdir=runs/w", "--config.data.dataset=ln_jax_pydoc"], tmp_path
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown data.dataset 'ln_jax_pydoc'")
    fixed = f"{TINY} --workdir=runs/w --config.data.dataset=ln_jax_pydocs"
    assert lines[0].endswith(f"Run: python train.py {fixed}"), lines[0]
    assert not list(tmp_path.iterdir())


def test_an_error_with_a_fix_that_is_no_user_error_says_the_command_and_keeps_its_status(
    capsys,
):
    from ln_jax import console
    from ln_jax.train.trainer import NonFiniteError

    command = cli.Command("python -m tool", "Tool.")
    nan = NonFiniteError("non-finite loss at step 7.", fix=Fix(set={"--config.nan_policy": "skip"}))

    def body(inv):
        fail = lambda: (_ for _ in ()).throw(nan)
        return console.run_reporting_errors(lambda: inv.call(fail), failures=(NonFiniteError,))

    assert command.run(body, [TINY, "--config.seed=3"]) == 1  # a NaN stop, not a user error
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.rstrip().endswith(
        f"step 7. Run: python -m tool {TINY} --config.seed=3 --config.nan_policy=skip"
    ), err
    plain = RuntimeError("no fix")  # an error without one goes through untouched
    with pytest.raises(RuntimeError) as raised:
        cli.Invocation(command, [TINY]).call(lambda: (_ for _ in ()).throw(plain))
    assert raised.value is plain and str(plain) == "no fix"
    again = NonFiniteError("at step 7.", fix=Fix(set={"--config.nan_policy": "skip"}))
    assert cli.Invocation(command, [TINY]).report(again) == 2
    assert capsys.readouterr().err == (
        f"error: at step 7. Run: python -m tool {TINY} --config.nan_policy=skip\n"
    )


def _report(argv, result, capsys):
    import train

    inv = cli.Invocation(train.COMMAND, argv)
    cfg = load_config("configs/bert_preln.py:tiny")
    train._report(inv, build_config(cfg), "w", {"preempted": None, "already_done": False, **result})
    return capsys.readouterr().out.strip().splitlines()


def test_train_py_names_the_step_its_last_eval_was_of(capsys):
    stopped = {"step": 31, "preempted": "SIGTERM", "eval": {"step": 30, "loss": 6.5}}
    assert _report([TINY], stopped, capsys) == [
        "SIGTERM: saved step 31; run the same command to resume",
        "last eval at step 30 (training stopped at step 31): loss=6.5000",
    ]
    done = {"step": 120, "eval": {"step": 120, "loss": 6.25}}
    assert _report([TINY], done, capsys) == ["final eval at step 120: loss=6.2500"]
    assert _report([TINY], {"step": 3, "eval": {}}, capsys) == []


def test_nothing_to_train_gives_the_whole_command_that_trains_longer(capsys):
    argv = [TINY, "--workdir=w", "--config.total_steps=120"]
    lines = _report(argv, {"step": 120, "already_done": True, "eval": {}}, capsys)
    assert lines == [
        "nothing to train: w already holds step 120 of 120. To train longer, raise "
        "--config.total_steps and add --accept_changes: python train.py "
        f"{TINY} --workdir=w --config.total_steps=240 --accept_changes=true; for a new run, "
        "give a new --workdir."
    ]


# --------------------------------------------------------------------------- stub workdirs


def test_no_stub_workdir_removes_only_what_this_command_created(tmp_path):
    workdir = tmp_path / "workdirs" / "run"

    def stub():
        (workdir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (workdir / "train.log").write_text("set-up logs\n")
        raise ConfigError("bad mesh")

    with pytest.raises(ConfigError), no_stub_workdir(str(workdir)):
        stub()
    assert not (tmp_path / "workdirs").exists()  # the empty parent it created went too
    workdir.mkdir(parents=True)
    with pytest.raises(ConfigError), no_stub_workdir(str(workdir)):
        stub()
    assert (workdir / "train.log").exists()  # it existed: left alone
    other = tmp_path / "other"
    with pytest.raises(RuntimeError), no_stub_workdir(str(other)):
        (other / "checkpoints").mkdir(parents=True)
        raise RuntimeError("a bug: its log is kept for the report")
    assert other.exists()
    kept = tmp_path / "kept"
    with pytest.raises(UserError), no_stub_workdir(str(kept)):
        kept.mkdir()
        (kept / "metrics.jsonl").write_text("{}\n")
        raise UserError("late")
    assert (kept / "metrics.jsonl").exists()  # something of value: left alone


@pytest.mark.parametrize("config", [TINY, "--config=configs/mt.py:tiny"])
def test_a_busy_workdir_is_refused_before_jax_is_imported(config, tmp_path):
    """A second run on a workdir a live process trains (this test's) was refused after 22 s of
    set-up; now before JAX, the data or the model: one line, exit 2, in well under a second."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "train.lock").write_text(str(os.getpid()))
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['train.py', {config!r}, '--workdir={workdir}']\n"
        "try:\n    runpy.run_path('train.py', run_name='__main__')\n"
        "except SystemExit as done:\n    print(done.code, 'jax' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr[-3000:]
    assert out.stderr == (
        f"error: {workdir} is being trained by process {os.getpid()} ({workdir}/train.lock); "
        f"wait for it or stop it. If no process of yours trains it, delete {workdir}/train.lock.\n"
    )
    assert sorted(p.name for p in workdir.iterdir()) == ["train.lock"]


# --------------------------------------------------------------------------- SIGTERM in set-up


def test_a_device_out_of_memory_is_one_line_with_what_to_change(capsys):
    """A real XLA allocation failure (4 TiB on the CPU) becomes one line and exit status 1;
    any other runtime error still shows its traceback (it is a bug)."""
    import jax
    import jax.numpy as jnp

    from ln_jax import console

    huge = lambda: jnp.zeros((2**40,), jnp.float32).block_until_ready()
    assert console.run_reporting_errors(huge) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory")
    assert "--config.grad_accum_steps=0" in err and "--config.model.remat=dots" in err
    bad = lambda: jax.jit(lambda x: x[jnp.int32(0)])(jnp.zeros((0,)))
    with pytest.raises(IndexError):
        console.run_reporting_errors(bad)


def test_set_up_signals_are_installed_then_handed_back():
    before = signal.getsignal(signal.SIGTERM)
    with SetupSignals("loading") as signals:
        assert SetupSignals.active is signals and signal.getsignal(signal.SIGTERM) != before
        assert signals.message().startswith("SIGTERM while loading, before the first step")
    assert signal.getsignal(signal.SIGTERM) is before and SetupSignals.active is None
    with SetupSignals("loading", enabled=False):  # a multi-process job: JAX's business
        assert signal.getsignal(signal.SIGTERM) is before


def test_train_py_sigterm_before_the_first_step_exits_143_with_a_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), TINY, "--workdir=w"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    first = proc.stdout.readline()  # printed once the workdir is set up, before compiling
    assert first.startswith("ln_jax: bert_preln_tiny"), first
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_SIGTERM, err[-2000:]
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "SIGTERM while setting up the run in w, before the first step: nothing was saved"
        )
    )
    assert not (tmp_path / "w").exists()  # the stub it had created is gone


DROPOUTS = "--config.model.hidden_dropout or --config.model.attention_dropout"


@pytest.mark.parametrize(
    "given, meant, fixed",
    [
        (["--total_steps=10"], "--config.total_steps", "--config.total_steps=10"),
        (["--lr", "1e-4"], "--config.optim.peak_lr", "--config.optim.peak_lr"),
        (["--model.placment=x"], "--config.model.placement", "--config.model.placement=x"),
        (["--dropout=0"], DROPOUTS, None),
        (["--workdri=/w"], "--workdir", "--workdir=/w"),  # a flag first
    ],
)
def test_a_config_field_given_as_a_flag_is_pointed_to_its_config_argument(
    given, meant, fixed, capsys
):
    import train

    assert train.COMMAND.run(lambda inv: 0, [TINY, *given]) == 2
    err = capsys.readouterr().err
    flag = given[0].partition("=")[0]
    assert f"unknown flag {flag!r}. Did you mean {meant}? The flags of" in err, err
    if fixed:
        assert f"Run: python train.py {TINY} {fixed}" in err, err
    else:
        assert "Run:" not in err
