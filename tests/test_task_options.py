"""Each family's own config section (`Task.options_section` / `options_class`, ln_jax/task.py)
and what was written before it, when the task's fields were one untyped `task_options` dict and
BERT's segment table and NSP head were `model.type_vocab_size` / `model.nsp_head`: an old
workdir's config.json reads, resumes and loads as a new one; `--config.task_options.FIELD` and
`--config.model.nsp_head` are one line naming the new flag (exit 2); old study results still
read."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import pytest

from ln_jax.config.load import build_config, config_from_command_line, load_config, override
from ln_jax.experiments import mt_grids, runner
from ln_jax.models.bert.finetune.options import GlueOptions
from ln_jax.models.bert.options import BertOptions
from ln_jax.models.translation.options import TranslationOptions
from ln_jax.task import make_options, moved_options
from ln_jax.train import run_identity
from ln_jax.validate import FAMILY_FIELDS, ConfigError

REPO = pathlib.Path(__file__).resolve().parents[1]
# The gate study's attempt-3 runs (issue 64) as they were recorded to step 2,000, with
# `task_options` (their config.json is rewritten as the runs go on, in the new format).
OLD_RUNS = REPO / "docs/results/studies/mt_gate/attempt3-fairseq-lr5e-4-w500"
OLD_CONFIG = "config_to_step_2000.json"
MT_TINY = "--config=configs/mt.py:tiny"
BERT_TINY = "--config=configs/bert_preln.py:tiny"
# (shared section, field, the family's section it moved to on 2026-12-06)
MOVED = [(shared, f, family) for shared, fs in FAMILY_FIELDS.items() for f, family in fs.items()]
TINY = {"bert": BERT_TINY, "translation": MT_TINY}  # a config of each family
STUDY = ["--config=configs/study_mt.py:gate", "--config.model.init=fairseq"]


def old_workdir(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    workdir = tmp_path / name
    workdir.mkdir()
    shutil.copy(OLD_RUNS / name / OLD_CONFIG, workdir / "config.json")
    return workdir


@pytest.mark.parametrize("name", ["L6-post_warmup-s0", "L6-pre_warmup-s0"])
def test_an_old_workdir_s_config_reads_as_the_new_format_and_resumes(tmp_path, name):
    workdir = old_workdir(tmp_path, name)
    raw = json.loads((workdir / "config.json").read_text())
    assert "task_options" in raw and "translation" not in raw
    assert {"type_vocab_size", "nsp_head"} <= set(raw["model"])  # BERT's, then in `model`
    assert {"nsp", "max_tokens"} <= set(raw["data"])  # BERT's and translation's, in `data`
    new_format = {k: v for k, v in raw.items() if k != "task_options"}
    new_format["translation"] = {**raw["task_options"], "max_tokens": raw["data"]["max_tokens"]}
    for shared, fields in FAMILY_FIELDS.items():
        new_format[shared] = {k: v for k, v in raw[shared].items() if k not in fields}
    old = run_identity.read_config(str(workdir))
    assert old == new_format  # moved silently into the family's section
    cfg = build_config(old)
    assert cfg == build_config(new_format)
    assert isinstance(cfg.options, TranslationOptions) and cfg.options.decoder_layers == 6
    assert run_identity.as_dict(cfg) == new_format  # written back as it was read
    # The study's own command (`python -m ln_jax.experiments mt_depth --config=... --lrs=5e-4
    # --warmup_steps=500 --config.model.init=fairseq`) makes the same config: no change at all.
    base, _ = config_from_command_line(STUDY)
    arm = name.split("-")[1]
    (spec,) = mt_grids.mt_depth_grid([6], [arm], [0], 5e-4, 500)
    assert spec.name == name and spec.overrides["translation.decoder_layers"] == 6
    ran = runner.run_config(base, spec, "studies/mt_gate_fairseq")
    assert run_identity.differences(old, run_identity.as_dict(ran)) == []
    assert run_identity.check_resume(old, run_identity.as_dict(ran), 620, str(workdir)) == []


def test_translate_and_warm_starts_read_an_old_workdir(tmp_path):
    from ln_jax.models.translation import load

    workdir = old_workdir(tmp_path, "L6-pre_warmup-s0")
    values = load.check_source(str(workdir), None, 1)
    assert "task_options" not in values and values["translation"]["eval_beam"] == 1


def test_task_options_on_the_command_line_names_the_new_flag():
    with pytest.raises(ConfigError) as err:
        config_from_command_line([MT_TINY, "--config.task_options.eval_beam=4"])
    assert str(err.value) == (
        "config field task_options.eval_beam moved: use --config.translation.eval_beam"
    )
    assert err.value.fix.rename == {
        "--config.task_options.eval_beam": "--config.translation.eval_beam"
    }
    values, _ = config_from_command_line([MT_TINY, "--config.translation.eval_beam=4"])
    assert build_config(values).options.eval_beam == 4
    bert_tiny = "--config=configs/bert_preln.py:tiny"
    with pytest.raises(ConfigError, match="is gone: .* section bert .* no 'foo'; remove it"):
        config_from_command_line([bert_tiny, "--config.task_options.foo=1"])


def test_the_train_command_exits_2_with_one_line(capsys):
    import train
    from ln_jax import console

    argv = [MT_TINY, "--config.task_options.max_source_length=16"]

    def body(inv):
        return console.run_reporting_errors(lambda: inv.call(lambda: inv.config() and 0))

    assert train.COMMAND.run(body, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --config.translation.max_source_length" in err, err


def test_a_config_file_with_task_options_is_refused(tmp_path):
    for n, body in enumerate(["c.task_options.eval_beam = 2", "c.task_options = {'eval_beam': 2}"]):
        path = tmp_path / f"old_{n}.py"
        path.write_text(
            "from configs import mt\n\n\ndef get_config(variant=None):\n"
            f"    c = mt.get_config('tiny')\n    {body}\n    return c\n"
        )
        with pytest.raises(ConfigError, match="task_options.*moved.*translation"):
            build_config(config_from_command_line([f"--config={path}"])[0])


def test_each_family_s_section_is_typed_and_checked():
    values = load_config("configs/mt.py:tiny")
    assert "translation" in values and "task_options" not in values
    with pytest.raises(ConfigError, match="unknown translation field 'eval_bem'.*'eval_beam'"):
        build_config(override(values, {}) | {"translation": {"eval_bem": 2}})
    glue = {"glue_task": "mrpc", "init_from": "w", "init_step": 3, "classifier_dropout": 0.1,
            "max_train_examples": None, "max_eval_examples": 8}  # fmt: skip
    moved = moved_options({"task": "glue_classification", "task_options": glue})
    assert moved == {"task": "glue_classification", "glue": glue}
    assert make_options("glue_classification", moved["glue"]) == GlueOptions(**glue)
    assert moved_options({"task_options": {}}) == {}  # BERT pretraining had {}
    assert make_options("bert_pretraining", None) == BertOptions()
    bert = build_config(load_config("configs/bert_preln.py:tiny"))
    assert bert.options == BertOptions() and not {"options", "task_options"} & set(bert.to_dict())
    assert bert.to_dict()["bert"] == {
        **{"max_predictions_per_seq": 20, "masked_lm_prob": 0.15, "short_seq_prob": 0.1},
        **{"whole_word_masking": False, "nsp": True, "type_vocab_size": 2, "nsp_head": True},
    }
    defaults = {f.name: f.default for f in dataclasses.fields(TranslationOptions)}
    assert defaults["eval_beam"] == 1 and defaults["skip_padding"] == "auto"


def test_an_old_study_result_still_reads(tmp_path):
    (spec,) = mt_grids.mt_depth_grid([6], ["pre_warmup"], [0], 5e-4, 500)
    old = {**spec.to_dict(), "bleu_curve": [[100, 1.0, 5.0]], "final_eval_mlm_loss": 4.0}
    old["overrides"] = {
        ("task_options.decoder_layers" if k == "translation.decoder_layers" else k): v
        for k, v in spec.overrides.items()
    }
    path = pathlib.Path(runner.result_path(str(tmp_path), spec))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    stored = runner.load_result(str(tmp_path), spec)
    assert stored["overrides"] == spec.overrides and stored["final_nll"] == 4.0


def test_a_checkpoint_s_old_config_reads_into_the_section(tmp_path):
    """The config saved in a checkpoint (what analysis and a workdir without config.json read)."""
    import jax.numpy as jnp

    from ln_jax.config.run import CheckpointConfig
    from ln_jax.train.checkpoint import Checkpointer

    raw = json.loads((OLD_RUNS / "L6-post_warmup-s0" / OLD_CONFIG).read_text())
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), CheckpointConfig(async_save=False))
    try:
        ckpt.save(1, {"params": {"w": jnp.zeros(2)}}, {}, raw)
        ckpt.wait()
        restored = ckpt.restore_config(1)
    finally:
        ckpt.close()
    assert "task_options" not in restored and "max_tokens" not in restored["data"]
    assert restored["translation"] == {**raw["task_options"], "max_tokens": 2048}
    assert build_config(restored).options.decoder_layers == 6


def test_help_lists_the_family_s_section_under_its_name():
    from ln_jax.cli.help import config_fields

    values, _ = config_from_command_line([MT_TINY])
    rows = [row.split("=")[0].strip() for row in config_fields(build_config(values))]
    assert "translation.eval_beam" in rows and not any(r.startswith("options") for r in rows)
    bert, _ = config_from_command_line(["--config=configs/bert_preln.py:tiny"])
    rows = [row.split("=")[0].strip() for row in config_fields(build_config(bert))]
    assert "bert.nsp_head" in rows and not any("options" in row for row in rows)


def test_an_old_pretraining_workdir_still_starts_a_fine_tuning(tmp_path):
    """BERT pretraining recorded `"task_options": {}`; fine-tuning's init_from reads it."""
    from ln_jax.models.bert.finetune import pretrained

    values, _ = config_from_command_line(["--config=configs/bert_preln.py:tiny"])
    new = run_identity.as_dict(build_config(values))
    run_identity.record_config(str(tmp_path), {**new, "task_options": {}})
    assert run_identity.read_config(str(tmp_path)) == new
    assert pretrained._workdir_config(str(tmp_path)) == build_config(values)


def _before_the_family_sections(new: dict) -> dict:
    """A config.json as ln_jax wrote it before 2026-12-06: the family fields in `model` and
    `data` (a translation run's with BERT's defaults, a BERT run's with max_tokens 4096), no
    section `bert`, translation's without `max_tokens` (and `task_options` {}, as pretraining
    recorded it before 2026-12-05)."""
    bert, translation = new.get("bert", dataclasses.asdict(BertOptions())), new.get("translation")
    old = {k: v for k, v in new.items() if k != "bert"}
    old["model"] = {**new["model"], **{f: bert[f] for f in FAMILY_FIELDS["model"]}}
    tokens = translation["max_tokens"] if translation else 4096
    old["data"] = {**new["data"], **{f: bert[f] for f in FAMILY_FIELDS["data"] if f in bert},
                   "max_tokens": tokens}  # fmt: skip
    if translation:
        old["translation"] = {k: v for k, v in translation.items() if k != "max_tokens"}
    return {**old, "task_options": {}}


def test_an_old_bert_workdir_reads_its_fields_into_the_bert_section_and_resumes(tmp_path):
    values, _ = config_from_command_line(
        [BERT_TINY, "--config.bert.nsp_head=false", "--config.bert.max_predictions_per_seq=7"]
    )
    cfg = build_config(values)
    new = run_identity.as_dict(cfg)
    assert new["bert"] == {**dataclasses.asdict(BertOptions()), "nsp_head": False,
                           "max_predictions_per_seq": 7}  # fmt: skip
    for shared, fields in FAMILY_FIELDS.items():
        assert not set(fields) & set(new[shared])
    written = _before_the_family_sections(new)
    assert written["model"]["nsp_head"] is False and written["data"]["max_predictions_per_seq"] == 7
    run_identity.record_config(str(tmp_path), written)
    old = run_identity.read_config(str(tmp_path))
    assert old == new  # the run resumes: nothing differs
    assert run_identity.check_resume(old, new, 10, str(tmp_path)) == []
    assert build_config(old).options == BertOptions(nsp_head=False, max_predictions_per_seq=7)


def test_an_old_translation_or_fine_tuning_config_drops_or_keeps_bert_s_fields():
    mt = run_identity.as_dict(build_config(load_config("configs/mt.py:tiny")))
    assert "bert" not in mt and mt["translation"]["max_tokens"] == 1024
    old = _before_the_family_sections(mt)
    assert old["data"]["max_tokens"] == 1024 and "nsp" in old["data"]
    assert moved_options(old) == mt  # max_tokens into "translation", BERT's dropped
    glue = {"task": "glue_classification", "model": {"hidden_size": 8, "type_vocab_size": 3,
            "nsp_head": True}, "glue": {"glue_task": "mrpc"},
            "data": {"max_seq_length": 64, "nsp": True, "max_tokens": 4096}}  # fmt: skip
    moved = moved_options(glue)
    assert moved["model"] == {"hidden_size": 8}  # the classifier has no NSP head to build
    assert moved["glue"] == {"glue_task": "mrpc", "type_vocab_size": 3}
    assert moved["data"] == {"max_seq_length": 64}  # GLUE makes no pretraining examples


@pytest.mark.parametrize("shared, field, family", MOVED)
def test_a_family_s_old_flags_name_the_new_ones(shared, field, family, capsys):
    import train
    from ln_jax import console

    mine, other = TINY[family], next(c for f, c in TINY.items() if f != family)
    old = f"{shared}.{field}"
    with pytest.raises(ConfigError) as err:
        config_from_command_line([mine, f"--config.{old}=1"])
    assert str(err.value) == (
        f"config field {old} moved: use --config.{family}.{field} (c.{family}.{field} in a "
        "config file)"
    )
    assert err.value.fix.rename == {f"--config.{old}": f"--config.{family}.{field}"}
    owner = {"bert": "BERT's", "translation": "translation's"}[family]
    with pytest.raises(ConfigError, match=f"{old} is gone: it is {owner} own"):
        config_from_command_line([other, f"--config.{old}=1"])
    with pytest.raises(ConfigError, match=f"{old} moved: use --config.{family}.{field}"):
        values = load_config(mine.split("=", 1)[1])
        build_config({**values, shared: {**values[shared], field: 1}})  # a config file's

    def body(inv):
        return console.run_reporting_errors(lambda: inv.call(lambda: inv.config() and 0))

    assert train.COMMAND.run(body, [other, f"--config.{old}=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{old} is gone" in err, err
