"""Ahead-of-time compile check: per-device memory from abstract, sharded state (8 CPU devices)."""

import dataclasses
import os
import subprocess
import sys

import jax
import pytest

from configs import bert_preln
from ln_jax import sharding
from ln_jax.config.run import TrainConfig
from ln_jax.task import make_task
from ln_jax.train import steps
from ln_jax.xla import aot, compile_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One layer, short sequences, no dropout: every compile in this file takes a few seconds.
SMALL = {
    "num_layers": 1,
    "vocab_size": 512,
    "max_position_embeddings": 32,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}


def small_config(batch: int = 16) -> TrainConfig:
    c = bert_preln.get_config("tiny")
    c.model.update(SMALL)
    c.data.vocab_size = SMALL["vocab_size"]
    c.data.max_seq_length, c.bert.max_predictions_per_seq = 32, 4
    c.data.global_batch_size = batch
    return TrainConfig.from_mapping(c.to_dict())


@pytest.fixture(scope="module")
def report_222():
    return aot.compile_report(small_config(), (2, 2, 2))


def test_report_on_a_2x2x2_mesh_has_positive_bytes(report_222):
    r = report_222
    assert r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2} and r["num_devices"] == 8
    for key in ("params_bytes", "opt_state_bytes", "batch_bytes", "temp_bytes", "total_bytes"):
        assert r[key] > 0, key
    assert r["flops_per_step"] > 0
    # Adam's two moments mirror the parameters, sharded alike.
    assert r["opt_state_bytes"] == pytest.approx(2 * r["params_bytes"], rel=0.01)
    # XLA's argument bytes are the state and the batch we built (plus two scalars).
    state_and_batch = r["params_bytes"] + r["opt_state_bytes"] + r["batch_bytes"]
    assert r["argument_bytes"] == pytest.approx(state_and_batch, rel=0.01)
    assert r["total_bytes"] >= r["argument_bytes"]


def test_verdict_and_table(report_222):
    ok, line = aot.fits(report_222, 80.0)
    assert ok and line.startswith("fits")
    ok, line = aot.fits(report_222, 1e-6)
    assert not ok and "WILL NOT FIT" in line
    table = aot.format_report(report_222)
    assert "optimizer state" in table and "FLOPs per step" in table


def test_fsdp_divides_the_parameters_per_device():
    cfg = small_config()
    replicated = steps.abstract_state(make_task(cfg), aot.resolve_mesh((8, 1, 1), cfg))
    full = aot.tree_bytes_per_device(replicated.state["params"])
    assert full == 4 * replicated.num_params  # fsdp=1: every device holds every parameter
    fsdp = aot.compile_report(cfg, (1, 8, 1))
    assert 1 / 8 <= fsdp["params_bytes"] / full <= 1 / 8 * 1.05 + 0.01
    # XLA's own figure for the compiled step's inputs agrees.
    state = fsdp["params_bytes"] + fsdp["opt_state_bytes"] + fsdp["batch_bytes"]
    assert fsdp["argument_bytes"] == pytest.approx(state, rel=0.01)


def test_mesh_not_matching_the_devices_is_a_clear_error():
    with pytest.raises(ValueError, match="needs 4 devices"):
        aot.compile_report(small_config(), (2, 2, 1))


def test_cli_reports_will_not_fit_and_exits_1():
    cmd = [
        sys.executable,
        "-m",
        "ln_jax.compile_check",
        "--config=configs/bert_preln.py:tiny",
        "--config.model.num_layers=1",
        "--config.model.hidden_dropout=0",
        "--config.model.attention_dropout=0",
        "--mesh=1,1,1",
        "--device_memory_gib=0.0001",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "WILL NOT FIT" in out.stdout
    assert "optimizer state" in out.stdout


def test_device_count_comes_from_the_flags():
    assert compile_check.requested_devices(["--num_devices=4", "--mesh=8,1,1"]) == 4
    assert compile_check.requested_devices(["--mesh", "4,2,1"]) == 8
    assert compile_check.requested_devices(["--mesh=-1,2,1"]) is None
    assert compile_check.parse_mesh("4x2x1") == (4, 2, 1)
    with pytest.raises(ValueError, match="three sizes"):
        compile_check.parse_mesh("4,2")


def test_auto_accumulation_picks_what_fits_then_grows_while_the_compile_is_over():
    """`accumulation.fit`, the procedure of the trainer and of compile_check: the probe's
    estimate picks 4; a step whose temporaries do not shrink k-fold is compiled again at 8."""
    from ln_jax.train import accumulation

    gib = aot.GIB
    budget = int(0.8 * 4 * gib)  # 80% of 4 GiB

    def run(shrinks: float, batch: int = 64) -> tuple[int, list[int]]:
        tried = []

        def compile_at(k: int) -> tuple[int, int]:  # 1 GiB state + 8 GiB temp at once
            tried.append(k)
            return gib, int(8 * gib / k**shrinks)

        return accumulation.fit(batch, 4, budget, compile_at), tried

    assert run(shrinks=1.0) == (4, [1, 4])  # 1 + 8/4 <= 3.2
    assert run(shrinks=0.8) == (8, [1, 4, 8])  # 1 + 8/4^0.8 = 3.64 over, 1 + 8/8^0.8 = 2.52
    assert run(shrinks=0.0) == (16, [1, 4, 8, 16])  # 64 rows over 4 devices: at most 16
    assert run(shrinks=0.0, batch=16) == (4, [1, 4])
    assert accumulation.fit(16, 4, 80 * gib, lambda k: (gib, 8 * gib)) == 1
    assert accumulation.fit(16, 4, None, lambda k: (gib, 8 * gib)) == 1


def test_auto_accumulation_says_its_choice_in_units_that_show_it(caplog):
    """A split batch is a warning and a choice of one micro-batch a note; sizes under a GiB in
    MiB (a test's budget of 41 MiB read "0.0 GiB of the 0.0 GiB")."""
    import logging

    from ln_jax.train import accumulation

    mib = 2**20
    with caplog.at_level(logging.INFO, logger="ln_jax.train.accumulation"):
        assert accumulation.fit(16, 1, 41 * mib, lambda k: (17 * mib, 105 * mib // k)) == 8
        assert accumulation.fit(16, 1, 3 * 2**30, lambda k: (17 * mib, 105 * mib // k)) == 1
    split, one = caplog.records[0], caplog.records[-1]
    assert split.levelno == logging.WARNING and one.levelno == logging.INFO
    assert "needs 122.0 MiB per device" in split.getMessage()
    assert "using 8 micro-batch(es), estimated 30.1 MiB of the 41.0 MiB" in split.getMessage()
    assert "of the 3.0 GiB it may use" in one.getMessage()


def test_accumulated_micro_batches_hold_one_micro_batch_of_activations():
    """The micro-batches run one after another, so 2 x 8 rows a device need the temporaries
    of 4 x 8, not nearly those of 16 at once. The first micro-batch used to run before a scan
    over the others: at accum=2 that scan has one trip, XLA inlined it and overlapped the two
    (here 98 MiB against 66; BERT-base on a v5e, compiled by libtpu: 2 x 128 needed about
    what 256 did)."""

    def temp(batch: int, accum: int) -> int:
        c = bert_preln.get_config("tiny")
        c.model.dtype = "bfloat16"
        c.data.global_batch_size, c.grad_accum_steps = batch, accum
        cfg = TrainConfig.from_mapping(c.to_dict())
        return aot.compile_report(cfg, (1, 8, 1))["temp_bytes"]

    two, four = temp(128, 2), temp(256, 4)
    assert two <= 1.05 * four, (two, four)


def test_the_check_grows_the_accumulation_while_its_compile_is_over_the_budget(monkeypatch):
    """As the trainer does: the one-micro-batch estimate picks 2, the compile at 2 needs more
    than 80% of the device, so the check compiles at 4 and reports that."""
    gib = aot.GIB
    totals = {1: (41, 40), 2: (31, 30), 4: (16, 15)}  # accumulation: (total, temp) in GiB
    compiled: list[int] = []

    def fake(cfg, task, mesh, options):
        compiled.append(cfg.grad_accum_steps)
        total, temp = totals[cfg.grad_accum_steps]
        return {"grad_accum_steps": cfg.grad_accum_steps, "total_bytes": total * gib,
                "temp_bytes": temp * gib}  # fmt: skip

    monkeypatch.setattr(aot, "_compile_report", fake)
    cfg = dataclasses.replace(small_config(), grad_accum_steps=0)
    report = aot.compile_report(cfg, (2, 2, 2), device_memory_gib=30.0)
    assert compiled == [1, 2, 4] and report["grad_accum_steps"] == 4
    assert report["grad_accum_auto"]


def test_ahead_of_time_shardings_are_the_trainers():
    """The abstract state the check compiles has exactly the shardings of the state a run
    creates, leaf by leaf, and the compiled step takes them as its inputs."""
    cfg = small_config()
    mesh = sharding.make_mesh(2, 2, 2)
    task = make_task(cfg)
    abstract = steps.abstract_state(task, mesh)
    concrete = steps.init_state(task, mesh)
    flat = lambda tree: jax.tree_util.tree_flatten_with_path(tree)[0]
    pairs = list(zip(flat(abstract.state), flat(concrete.state), strict=True))
    assert len(pairs) > 10
    for (path_a, a), (path_c, c) in pairs:
        assert path_a == path_c and a.shape == c.shape and a.dtype == c.dtype, path_a
        assert a.sharding == c.sharding, (path_a, a.sharding, c.sharding)
    # At least one parameter really is split three ways (data is not a parameter axis).
    specs = {tuple(a.sharding.spec) for _, a in flat(abstract.state["params"])}
    assert any("tensor" in str(s) and "fsdp" in str(s) for s in specs), specs
    lowered, _ = aot.lower_train_step(cfg, task, mesh)
    compiled_in = jax.tree.leaves(lowered.compile().input_shardings[0][0])
    for sh, (_, c) in zip(compiled_in, flat(concrete.state), strict=True):
        assert sh.is_equivalent_to(c.sharding, c.ndim)


def test_the_command_run_in_process_leaves_absl_logging_as_it_found_it(capsys, monkeypatch):
    """compile_check quiets absl (JAX's backend lines) only while it runs: a later run in the
    same process (the tests run many) still gets orbax's INFO lines in its train.log."""
    import logging

    absl_logger = logging.getLogger("absl")
    absl_logger.setLevel(logging.INFO)
    try:
        # a mesh the 8 devices cannot hold (-1: no fake-device request, XLA_FLAGS untouched)
        monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
        argv = ["--config=configs/bert_preln.py:tiny", "--mesh=-1,3,1"]
        assert compile_check.COMMAND.run(compile_check._main, argv) == 2
        assert absl_logger.level == logging.INFO
    finally:
        absl_logger.setLevel(logging.NOTSET)
    assert "3" in capsys.readouterr().err


def test_another_command_s_config_is_named_as_such(capsys):
    """configs/glue.py is finetune.py's: given here, most of its top-level fields are not
    TrainConfig's, and the error says whose config it is, not only that 'attention_dropout'
    is unknown; a misspelt field keeps its own error."""
    assert compile_check.COMMAND.run(compile_check._main, ["--config=configs/glue.py"]) == 2
    err = capsys.readouterr().err
    assert "--config=configs/glue.py is not a config of python -m ln_jax.compile_check" in err
    assert "finetune.py configs/glue.py" in err and "--config=configs/bert_preln.py:tiny" in err
    argv = ["--config=configs/bert_preln.py:tiny", "--config.modle.size=tiny"]
    assert compile_check.COMMAND.run(compile_check._main, argv) == 2
    assert "unknown config field 'modle'. Did you mean 'model'?" in capsys.readouterr().err
