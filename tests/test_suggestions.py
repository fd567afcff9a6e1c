"""Every "Did you mean" / "Run:" that the commands' error paths print, on the tiny configs, is
a command that then runs: each suggested command is executed as far as its own command goes
before training (the config, the checks `train.py` makes before it creates anything, and the
step that had failed: the dataset, the tokenizer, the workdir's run), and must not fail with
another error. Issue 65 found suggestions that led to the next error: `configs/glue.py` for
train.py, TFDS's `math_dataset` (not prepared here), a flag given twice.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable
from typing import Any

import pytest

import finetune
import train
from ln_jax import console
from ln_jax.cli import command as cli
from ln_jax.config import load as config_front
from ln_jax.data.translation import joint_tokenizer, parallel
from ln_jax.train import run_identity
from ln_jax.xla import compile_check

TINY = "--config=configs/bert_preln.py:tiny"
MT_TINY = "--config=configs/mt.py:tiny"
COMMANDS = {
    "python train.py": train.COMMAND,
    "python finetune.py": finetune.COMMAND,
    "python -m ln_jax.compile_check": compile_check.COMMAND,
}
WORKDIR = "/tmp/ln_jax_suggestions_run"  # only named: check_resume reads no file


def config_and_preflight(inv: cli.Invocation) -> Any:
    """What train.py does before it creates anything; translation opens its dataset too."""
    cfg = inv.config()
    if inv.command is train.COMMAND:
        train._preflight(cfg)
        if cfg.task == "translation" and not cfg.data.dataset.startswith("ln_jax_gettext"):
            parallel.open_parallel(cfg.data)
    return cfg


def tokenizer_too(inv: cli.Invocation) -> None:
    """...and the translation tokenizer (where a vocabulary too large for the corpus fails)."""
    cfg = config_and_preflight(inv)
    source = parallel.open_parallel(cfg.data)
    joint_tokenizer.translation_tokenizer(cfg.data, source, None)


def resumes_the_old_run(inv: cli.Invocation) -> None:
    """...and the trainer's check of the workdir's run (a tiny run of 120 steps at step 120)."""
    cfg = config_and_preflight(inv)
    workdir = inv.command.flags["workdir"].value
    old = _old_run() if workdir == WORKDIR else None  # a new workdir holds no run
    accept = inv.command.flags["accept_changes"].value
    run_identity.check_resume(old, run_identity.as_dict(cfg), 120, workdir, accept)


def run(command: cli.Command, argv: list[str], stage: Callable, capsys) -> tuple[int, str]:
    """(exit status, stderr) of `command` on `argv` as far as `stage` goes."""

    def body(inv):
        def stages() -> int:
            stage(inv)
            return 0

        return console.run_reporting_errors(lambda: inv.call(stages))

    code = command.run(body, argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """paralleltext files of 40 short pairs: sentencepiece makes few pieces from them."""
    folder = tmp_path_factory.mktemp("corpus")
    for split in ("train", "valid", "test"):
        (folder / f"c.{split}.src").write_text("".join(f"satz {i}\n" for i in range(40)))
        (folder / f"c.{split}.tgt").write_text("".join(f"line {i}\n" for i in range(40)))
    return f"paralleltext:{folder / 'c'}"


CASES = [
    # (command, argv, stage); every one must print "Run: <command that runs>"
    ("python train.py", ["--config=configs/bert_prelm.py:tiny"], config_and_preflight),
    ("python train.py", ["--config=configs/glu.py"], config_and_preflight),
    ("python train.py", ["--config=configs/glue.py:offline"], config_and_preflight),
    ("python train.py", ["--workdir=/tmp/w"], config_and_preflight),
    ("python train.py", [TINY, "--config.modle.norm=rmsnorm"], config_and_preflight),
    ("python train.py", [TINY, "--config.model.placement=postt"], config_and_preflight),
    ("python train.py", [TINY, "--config.model.norm=rmsnrom"], config_and_preflight),
    ("python train.py", [TINY, "--config.model.placement=mixln"], config_and_preflight),
    ("python train.py", [TINY, "--config.optim.schedule=linear_decay",
                         "--config.optim.warmup_steps=9"], config_and_preflight),
    ("python train.py", [TINY, "--config.data.dataset=ln_jax_pydoc"], config_and_preflight),
    ("python train.py", [TINY, "--config.optim.peak_lr=1e-4", "--lr=1e-3"], config_and_preflight),
    ("python train.py", [TINY, "--workdr=/tmp/w"], config_and_preflight),
    ("python train.py", [MT_TINY, "--config.data.dataset=synthetic:cpy"], config_and_preflight),
    ("python train.py", [MT_TINY, "--config.task_options.eval_beam=2"], config_and_preflight),
    ("python train.py", [MT_TINY, "--config.data.dataset={corpus}",
                         "--config.data.vocab_size=5000"], tokenizer_too),
    ("python train.py", [TINY, f"--workdir={WORKDIR}", "--config.total_steps=240"],
     resumes_the_old_run),
    ("python train.py", [TINY, f"--workdir={WORKDIR}", "--config.model.placement=post"],
     resumes_the_old_run),
    ("python finetune.py", ["--config=configs/glu.py:mrpc"], config_and_preflight),
    ("python finetune.py", [TINY], config_and_preflight),
    ("python -m ln_jax.compile_check", [TINY, "--num_device=2"], config_and_preflight),
    ("python -m ln_jax.compile_check", ["--config=configs/bert_prelm.py"], config_and_preflight),
]  # fmt: skip


@pytest.mark.parametrize("prog, argv, stage", CASES, ids=lambda v: " ".join(v)[:60] if
                         isinstance(v, list) else None)  # fmt: skip
def test_every_suggested_command_runs(prog, argv, stage, corpus, capsys):
    command = COMMANDS[prog]
    argv = [a.format(corpus=corpus) for a in argv]
    code, err = run(command, argv, stage, capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert " Run: " in err, err  # a suggestion the user can paste
    suggested = shlex.split(err.rsplit(" Run: ", 1)[1])
    assert " ".join(suggested[: len(prog.split())]) == prog, err
    fixed = suggested[len(prog.split()) :]
    assert len({a.partition("=")[0] for a in fixed}) == len(fixed), fixed  # no flag twice
    code, err = run(command, fixed, stage, capsys)
    assert code == 0, f"{shlex.join(suggested)}\n{err}"


@functools.cache
def _old_run() -> dict[str, Any]:
    """The config of the run the workdir holds: BERT-tiny as the preset has it."""
    values, _ = config_front.config_from_command_line([TINY])  # the command's flags untouched
    return run_identity.as_dict(config_front.build_config(values))


def test_a_preset_s_warm_up_is_a_fraction_of_the_steps_given(capsys):
    """`configs/mt.py:tiny --config.total_steps=5` was refused: the warm-up was 10% of the
    preset's 300 steps. It is 10% of the run given, unless the warm-up itself is given."""
    code, err = run(train.COMMAND, [MT_TINY, "--config.total_steps=5"], _warmup_is(1), capsys)
    assert code == 0, err
    argv = [MT_TINY, "--config.total_steps=50", "--config.optim.warmup_steps=7"]
    assert run(train.COMMAND, argv, _warmup_is(7), capsys)[0] == 0
    assert run(train.COMMAND, [MT_TINY], _warmup_is(30), capsys)[0] == 0  # the preset's own
    argv = ["--config=configs/bert_postln.py:tiny", "--config.total_steps=1000"]
    assert run(train.COMMAND, argv, _warmup_is(10), capsys)[0] == 0  # Post-LN's 1%


def _warmup_is(steps: int) -> Callable:
    def stage(inv):
        assert config_and_preflight(inv).optim.warmup_steps == steps

    return stage


def test_the_command_that_trains_a_finished_run_longer_runs(capsys):
    inv = cli.Invocation(train.COMMAND, [TINY, f"--workdir={WORKDIR}", "--config.total_steps=120"])
    inv.parse()
    line = train.nothing_to_train(inv, inv.config(), WORKDIR, 120)
    suggested = shlex.split(line.split("add --accept_changes: ")[1].split(";")[0])
    assert suggested[:2] == ["python", "train.py"] and "--config.total_steps=240" in suggested
    code, err = run(train.COMMAND, suggested[2:], resumes_the_old_run, capsys)
    assert code == 0, err
