"""Translation on the one trainer: a copy task learns to BLEU > 90 in CI time; a 2x2x2 mesh
(parameters split over fsdp and tensor) gives the losses of replicated parameters; SIGTERM and
resume give an uninterrupted run's records; the monitor measures both stacks; the config's
errors."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from ln_jax import sharding
from ln_jax.config.load import build_config, load_config, override
from ln_jax.models.translation import translate as translate_cli
from ln_jax.nn.stack import model_sublayers
from ln_jax.task import make_task
from ln_jax.train import trainer


def mt_config(**extra):
    values = override(
        load_config("configs/mt.py:tiny"),
        {
            "data.dataset": "synthetic:copy",
            "data.vocab_size": 36,  # 4 special ids + 32 symbols
            "translation.max_tokens": 1024,
            "translation.max_source_length": 16,
            "translation.max_target_length": 16,
            "model.placement": "pre",
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
            "optim.peak_lr": 3e-3,
            "optim.warmup_steps": 30,
            "monitor.every": 0,
            "mesh.data": 2,
            "mesh.fsdp": 2,
            "mesh.tensor": 2,
            **extra,
        },
    )
    return build_config(values)


def records(workdir, split="train") -> list[dict]:
    lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """The copy task trained 200 steps (the last 3 checkpoints kept: 100, 150, 200), warmed up
    over 25 steps to 4e-3: BLEU 95.7 (260 steps at 3e-3 gave 98.9 for 1.4x the CPU time; 200
    steps at 3e-3 92.2)."""
    workdir = tmp_path_factory.mktemp("copy")
    fast = {"optim.peak_lr": 4e-3, "optim.warmup_steps": 25}
    cfg = mt_config(total_steps=200, eval_every=200, checkpoint_every=50, log_every=100, **fast)
    return workdir, trainer.train_and_evaluate(cfg, str(workdir))


def test_a_copy_task_learns_to_translate(copy_run):
    _, out = copy_run
    assert out["eval"]["bleu"] > 90.0, out["eval"]  # measured: 95.7
    assert out["eval"]["nll_loss"] < 0.3
    assert out["eval"]["perplexity"] == pytest.approx(2.718281828 ** out["eval"]["nll_loss"])


def test_the_translate_command_scores_and_reads_stdin(copy_run, capsys, monkeypatch):
    workdir, _ = copy_run
    # A library of the stack may have put a handler on the root at INFO (TFDS's lines then
    # reached the terminal as "INFO:absl:..."): the command's terminal is train.py's.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # the test's own handlers come back after it
    monkeypatch.setattr(root, "level", root.level)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    args = [f"--workdir={workdir}", "--beam=3", "--average_last=2", "--max_sentences=48"]
    assert translate_cli.main(args) == 0
    out, err = capsys.readouterr()
    assert "INFO:" not in err  # orbax's restore lines: not on the terminal
    line = out.strip().splitlines()[-1]
    assert line.startswith("BLEU ") and "on 48 sentences" in line
    assert "checkpoints [150, 200]" in line and "tok:13a" in line
    assert float(line.split()[1]) > 90.0, line
    monkeypatch.setattr("sys.stdin", io.StringIO("w5 w9 w7 w30\nw12 w4\n"))
    assert translate_cli.main([f"--workdir={workdir}", "--input=-", "--beam=1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["w5 w9 w7 w30", "w12 w4"]


def test_the_translate_command_errors_are_one_line(copy_run, tmp_path, capsys):
    workdir, _ = copy_run
    assert translate_cli.main([f"--workdir={workdir}", "--beam=99"]) == 2
    assert "wider than the vocabulary (36 tokens)" in capsys.readouterr().err
    assert translate_cli.main([f"--workdir={workdir}", "--average_last=5"]) == 2
    err = capsys.readouterr().err  # how many there are, why, and the command that works
    assert "holds 3 checkpoints up to step 200 (100, 150, 200; the run keeps its last 3" in err
    assert (
        err.rstrip().endswith(
            f"Run: python -m ln_jax.translate --workdir={workdir} --average_last=3"
        )
        and err.count("\n") == 1
    )
    (tmp_path / "config.json").write_text(json.dumps({"task": "bert_pretraining"}))
    assert translate_cli.main([f"--workdir={tmp_path}"]) == 2
    assert "not a translation run" in capsys.readouterr().err


def test_translate_input_that_is_not_utf8_is_one_line_before_any_model_is_loaded(
    tmp_path, capsys, monkeypatch
):
    """Non-UTF-8 bytes on stdin were a 25-line pybind11 error from the tokenizer. The source
    is checked first (cheaply: an existing folder here, nothing loaded), then the input."""
    stdin = io.TextIOWrapper(io.BytesIO(b"Guten Tag\r\nsch\xf6n\n"), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    source = f"--workdir=hf:{tmp_path}"  # a folder without a model: loading it would fail
    assert translate_cli.main([source, "--input=-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: stdin (--input=-), line 2: not UTF-8 (byte 0xf6, byte 4")
    assert "iconv -f latin1 -t utf-8" in err and err.count("\n") == 1
    (tmp_path / "in.txt").write_bytes(b"eins\xa0zwei\n")
    assert translate_cli.main([source, f"--input={tmp_path / 'in.txt'}"]) == 2
    assert f"{tmp_path / 'in.txt'}, line 1: not UTF-8" in capsys.readouterr().err
    assert translate_cli.main([source, "--input=nope.txt"]) == 2
    assert "--input=nope.txt: no such file" in capsys.readouterr().err
    assert translate_cli.main([f"--workdir={tmp_path / 'none'}", "--input=nope.txt"]) == 2
    assert "none holds no run (no config.json)" in capsys.readouterr().err  # the source first
    monkeypatch.setattr("sys.stdin", io.StringIO("eins\u2028zwei\ndrei"))  # one line each
    assert translate_cli.input_lines("-") == ["eins\u2028zwei", "drei"]


def test_scoring_bleu_says_what_it_decodes():
    """The trainer shows it before an evaluation, and its time after (tests/test_trainer.py)."""
    greedy, beam = make_task(mt_config()), make_task(mt_config(**{"translation.eval_beam": 4}))
    assert greedy.eval_description() is None  # before its pipelines: nothing to score yet
    greedy.references = beam.references = ["a reference"] * 256
    assert greedy.eval_description() == "scoring validation BLEU: 256 sentences, greedy decoding"
    assert beam.eval_description().endswith("256 sentences, beam 4 decoding")
    no_bleu = make_task(mt_config(**{"translation.eval_bleu": False}))
    no_bleu.references = greedy.references
    assert no_bleu.eval_description() is None


def test_the_mesh_does_not_change_the_losses_and_resume_is_exact(tmp_path):
    base = dict(total_steps=6, eval_every=6, checkpoint_every=3, log_every=1)
    base["optim.warmup_steps"] = 2
    base["translation.eval_bleu"] = False
    one = mt_config(**base, **{"mesh.data": 8, "mesh.fsdp": 1, "mesh.tensor": 1})  # replicated
    trainer.train_and_evaluate(one, str(tmp_path / "one"))

    def preempt_at_4(step, run):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    sharded = mt_config(**base)
    first = trainer.train_and_evaluate(sharded, str(tmp_path / "cut"), hooks=[preempt_at_4])
    assert first["preempted"] and first["step"] == 4
    trainer.train_and_evaluate(sharded, str(tmp_path / "cut"))
    a = {r["step"]: r["loss"] for r in records(tmp_path / "one")}
    b = {r["step"]: r["loss"] for r in records(tmp_path / "cut")}
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=2e-5), step
    assert a[6] < a[1]


def test_the_monitor_measures_both_stacks(tmp_path):
    cfg = mt_config(
        total_steps=2,
        eval_every=2,
        checkpoint_every=2,
        log_every=1,
        **{"monitor.every": 1, "optim.warmup_steps": 1},
    )
    trainer.train_and_evaluate(cfg, str(tmp_path))
    measured = records(tmp_path, "monitor")[-1]
    for name in (
        "grad_norm/layer_01/encoder/ffn",
        "grad_norm/layer_01/decoder/cross_attention",
        "attention_entropy/layer_00/decoder/self_attention",
        "attention_entropy/layer_00/decoder/cross_attention",
        "attention_entropy/layer_00/encoder",
        "collapse/encoder/output",
        "stream_rms/layer_00/decoder/ffn",
    ):
        assert name in measured and measured[name] > 0, (name, sorted(measured))


def test_translation_settings_are_checked():
    with pytest.raises(Exception, match="translation.positions"):
        mt_config(**{"translation.positions": "rotary"})
    with pytest.raises(Exception, match="exceed model.max_position_embeddings"):
        mt_config(**{"translation.max_source_length": 300})
    task = make_task(mt_config(**{"optim.warmup_steps": 1}))
    assert task.name == "translation" and task.options.decoder_layers == 2
    with sharding.use_mesh(sharding.single_device_mesh()):
        names = [n for n, _ in model_sublayers(task.build(nnx.Rngs(0)))]
    assert names[:2] == ["encoder/layer_00/attention", "encoder/layer_00/ffn"]
    assert names[-3:] == [
        f"decoder/layer_01/{n}" for n in ("self_attention", "cross_attention", "ffn")
    ]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_translate_help_prints_usage_and_examples_and_exits_0(flag, capsys):
    from ln_jax.models.translation import translate as cmd

    with pytest.raises(SystemExit) as exit_:
        cmd.main([flag])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "--workdir" in out and "--average_last" in out and "hf:" in out
    assert "python -m ln_jax.translate --workdir=" in out  # the examples


def test_init_from_a_workdir_starts_from_its_latest_parameters(copy_run):
    """`translation.init_from=WORKDIR`: a fresh model takes the run's last checkpoint's
    parameters (in its own shardings); a workdir of another shape is a one-line ConfigError."""
    from flax import nnx

    from ln_jax import sharding
    from ln_jax.models.translation.load import load_translator
    from ln_jax.validate import ConfigError

    workdir, _ = copy_run
    trained, _, used = load_translator(str(workdir))
    assert used == [200]
    cfg = mt_config(**{"translation.init_from": str(workdir)})
    task = make_task(cfg)
    mesh = sharding.make_mesh(2, 2, 2)
    with sharding.use_mesh(mesh):
        model = task.build(nnx.Rngs(params=7))
        assert task.initialize(model)
    want = dict(nnx.to_flat_state(nnx.state(trained, nnx.Param)))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        np.testing.assert_array_equal(
            np.asarray(var.get_value()), np.asarray(want[path].get_value())
        )
    wider = make_task(mt_config(**{"translation.init_from": str(workdir), "model.mlp_dim": 128}))
    with sharding.use_mesh(mesh), pytest.raises(ConfigError, match="shape"):
        wider.initialize(wider.build(nnx.Rngs(params=0)))
