"""The one config front: every typed field declared in configs/common.py, one override
function, and the same `--config` / `--config.SECTION.FIELD=VALUE` handling in every command."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import train
from configs import common
from ln_jax.analysis import cli as analysis_cli
from ln_jax.config import load as config_front
from ln_jax.config import run as config_lib
from ln_jax.config.load import build_config, override
from ln_jax.models.bert.options import BertOptions
from ln_jax.validate import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {
    "model": config_lib.ModelConfig,
    "optim": config_lib.OptimConfig,
    "data": config_lib.DataConfig,
    "mesh": config_lib.MeshConfig,
    "checkpoint": config_lib.CheckpointConfig,
}


# TrainConfig's field of the task's own section: declared by the family's config under the
# section's name (configs/mt.py's `c.translation`); common.py's task, BERT pretraining, has
# its section "bert".
FAMILY = "options"
BERT = {"bert": BertOptions}


def typed_fields() -> list[str]:
    """Every dotted field of TrainConfig and its sections, from the dataclasses themselves."""
    names = []
    for f in dataclasses.fields(config_lib.TrainConfig):
        if f.name == FAMILY:
            names += [f"bert.{g.name}" for g in dataclasses.fields(BertOptions)]
            continue
        if f.name in SECTIONS:
            names += [f"{f.name}.{g.name}" for g in dataclasses.fields(SECTIONS[f.name])]
        else:
            names.append(f.name)
    return names


def test_every_typed_field_is_declared_with_a_comment_in_common():
    declared = common.base_config().to_dict()
    source = (ROOT / "configs" / "common.py").read_text().splitlines()
    for dotted in typed_fields():
        section, _, leaf = dotted.rpartition(".")
        node = declared[section] if section else declared
        assert leaf in node, f"configs/common.py does not declare {dotted}"
        assignment = f"c.{dotted} = "
        lines = [i for i, line in enumerate(source) if line.strip().startswith(assignment)]
        assert lines, f"no `{assignment}...` line for {dotted}"
        i = lines[0]
        commented = "#" in source[i] or source[i - 1].strip().startswith("#")
        assert commented, f"{dotted} has no comment in configs/common.py"
    typed = {f.name for f in dataclasses.fields(config_lib.TrainConfig)} - {FAMILY}
    assert set(declared) == typed | set(BERT)


def test_a_family_s_config_declares_its_whole_section():
    from configs import mt
    from ln_jax.models.translation.options import TranslationOptions

    declared = mt.get_config("tiny").to_dict()
    assert set(declared) - set(common.base_config().to_dict()) == {"translation"}
    assert set(declared["translation"]) == {f.name for f in dataclasses.fields(TranslationOptions)}


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def test_one_source_of_defaults_common_departs_only_where_the_recipe_says():
    """configs/common.py = the typed configs' defaults, except its declared RECIPE."""
    declared = common.base_config().to_dict()
    sections = {**SECTIONS, "monitor": config_lib.MonitorConfig, **BERT}
    departures = {}
    for name in [f.name for f in dataclasses.fields(config_lib.TrainConfig)] + list(BERT):
        f = {g.name: g for g in dataclasses.fields(config_lib.TrainConfig)}.get(name)
        if name == FAMILY:
            continue
        if name in sections:
            pairs = [
                (f"{name}.{g.name}", declared[name][g.name], _default(g))
                for g in dataclasses.fields(sections[name])
            ]
        else:
            pairs = [(name, declared[name], _default(f))]
        for dotted, value, default in pairs:
            if value is None or isinstance(value, dict):  # "from size" placeholders; options
                continue
            value = tuple(value) if isinstance(value, list) else value
            if value != default:
                departures[dotted] = value
    assert departures == common.RECIPE


def test_the_section_classes_are_the_real_types():
    hints = {f.name: f.type for f in dataclasses.fields(config_lib.TrainConfig)}
    assert hints["optim"] in ("OptimConfig", config_lib.OptimConfig)
    assert hints["data"] in ("DataConfig", config_lib.DataConfig)
    cfg = config_lib.TrainConfig()
    assert isinstance(cfg.optim, config_lib.OptimConfig)
    assert isinstance(cfg.data, config_lib.DataConfig)


def test_no_import_cycle_between_the_typed_configs():
    for name in ("ln_jax.train.optim", "ln_jax.data.config"):
        source = Path(importlib.import_module(name).__file__).read_text()
        assert (
            "from ln_jax.config.run import" not in source
            and "import ln_jax.config.run" not in source
        )


def test_override_parses_text_as_the_field_type():
    base = common.base_config()
    values = override(
        base,
        {
            "model.norm": "rmsnorm",
            "model.dlcl": "false",
            "model.num_layers": "3",  # a placeholder(int): read as a literal
            "optim.peak_lr": "1e-3",
            "optim.warmup_steps": "7",
            "checkpoint.async_save": "False",
            "eval_batches": "None",
            "model.placement": "post*1,pre*2",
        },
    )
    cfg = build_config(values)
    assert cfg.model.norm == "rmsnorm" and cfg.model.num_layers == 3
    assert cfg.optim.peak_lr == 1e-3 and isinstance(cfg.optim.peak_lr, float)
    assert cfg.optim.warmup_steps == 7 and cfg.checkpoint.async_save is False
    assert cfg.eval_batches is None
    assert cfg.model.layer_placements == ("post", "pre", "pre")
    assert base.model.norm == "layernorm"  # the input is not modified


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.placment": "post"}, "Did you mean 'model.placement'"),
        ({"optim.peak_lrr": "1"}, "Did you mean 'optim.peak_lr'"),
        ({"totl_steps": "3"}, "Did you mean 'total_steps'"),
        ({"model": "x"}, "model is a section, not a field"),
        ({"seed.x": "1"}, "config.seed is a field, not a section"),
        ({"total_steps": "many"}, r"total_steps='many': give a int"),
        ({"optim.peak_lr": "fast"}, r"peak_lr='fast': give a float"),
        # a field that also takes "auto" is parsed when the typed config is built
        ({"model.scan_layers": "maybe"}, "scan_layers='maybe': give True or False, or auto"),
    ],
)
def test_override_names_the_bad_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(override(common.base_config(), overrides))


@pytest.mark.parametrize(
    "given, meant",
    [
        # declared in another section: spelling distance pointed at total_steps, and the
        # command line's fix set it
        ("warmup_steps", ["optim.warmup_steps"]),
        ("model.max_seq_length", ["data.max_seq_length"]),
        # another trainer's name: the nearest spelling was data.eval_batch_size, or none
        ("data.batch_size", ["data.global_batch_size"]),
        ("lr", ["optim.peak_lr"]),
        ("optim.learning_rate", ["optim.peak_lr"]),
        ("num_train_steps", ["total_steps"]),
        ("model.n_layers", ["model.num_layers"]),
        ("model.dropout", ["model.hidden_dropout", "model.attention_dropout"]),
        # spelt nearly the same, in its section or, for a section, beside it
        ("model.placment", ["model.placement"]),
        ("model.placements", ["model.placement"]),
        ("model.hidden_dropuot", ["model.hidden_dropout"]),
        ("model.warmup_step", ["optim.warmup_steps"]),  # nearly, in another section
        ("modle.placement", ["model"]),
        ("zzz", []),
    ],
)
def test_an_unknown_field_names_what_it_likely_means(given, meant):
    with pytest.raises(ConfigError) as err:
        override(common.base_config(), {given: "1"})
    message = str(err.value)
    if meant:
        assert f" Did you mean {' or '.join(repr(m) for m in meant)}?" in message
    else:
        assert "Did you mean" not in message
    fix = err.value.fix
    if len(meant) == 1:  # the command line's fix renames the argument to the one meant
        fixed = {"modle.placement": "model.placement"}.get(given, meant[0])
        assert fix.rename == {f"--config.{given}": f"--config.{fixed}"}
    else:
        assert fix is None


@pytest.mark.parametrize(
    "given, meant",
    [
        ("lr", "learning_rates"),
        ("batch_size", "batch_sizes"),
        ("num_train_epochs", "epochs"),
        ("adam_beta2", "optim.b2"),  # in finetune.py's config too (before 2026-12-05: b2)
        ("seq_len", "max_seq_length"),
    ],
)
def test_finetune_config_names_what_an_unknown_field_likely_means(given, meant):
    with pytest.raises(ConfigError, match=f"Did you mean {meant!r}[?]") as err:
        override(config_front.load_config("configs/glue.py"), {given: "1"})
    assert err.value.fix.rename == {f"--config.{given}": f"--config.{meant}"}


def test_every_alias_names_a_declared_field():
    """An alias's fields exist in the shipped configs (a renamed field breaks this)."""
    from ln_jax import validate

    declared = set()
    for spec in ("configs/bert_preln.py:tiny", "configs/mt.py:small", "configs/glue.py"):
        declared |= set(validate.leaves(config_front.load_config(spec)))
    missing = {a: f for a, fs in validate.ALIASES.items() for f in fs if f not in declared}
    assert not missing
    assert not set(validate.ALIASES) & {d.rsplit(".", 1)[-1] for d in declared}


@pytest.mark.parametrize(
    "field, typo, closest",
    [
        ("model.size", "tinny", "tiny"),
        ("model.norm", "rmsnrom", "rmsnorm"),
        ("model.admin_omega", "closed_from", "closed_form"),
        ("model.activation", "gleu", "gelu"),
        ("model.init", "xavir", "xavier"),
        ("model.dtype", "bfloat61", "bfloat16"),
        ("model.attention_impl", "cudn", "cudnn"),
        ("model.remat", "dot", "dots"),
        ("nan_policy", "skp", "skip"),
        ("dropout_rng", "threfry", "threefry"),
    ],
)
def test_a_mistyped_choice_names_the_field_as_typed_and_gives_the_whole_command(
    field, typo, closest
):
    from ln_jax.cli import command as cli

    with pytest.raises(ConfigError) as err:
        build_config(override(common.base_config(), {field: typo}))
    message = str(err.value)
    assert message.startswith(f"unknown {field} {typo!r}; valid names: "), message
    assert f"did you mean {closest!r}" in message, message  # the closest first
    argv = ["--config=configs/bert_preln.py:tiny", f"--config.{field}={typo}"]
    assert cli.fixed_command("python train.py", argv, err.value.fix) == (
        f"python train.py --config=configs/bert_preln.py:tiny --config.{field}={closest}"
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.vocab_size", "3", "data.vocab_size=3 must be >= 6: set --config.data.vocab_size."),
        ("data.eval_num_batches", "0", "data.eval_num_batches=0 must be >= 1 or None: set "),
        ("bert.masked_lm_prob", "1.5", "bert.masked_lm_prob=1.5 must be in [0, 1]: set "),
        ("data.device_prefetch", "-1", "data.device_prefetch=-1 must be >= 0 or None: set "),
        ("data.tokenizer_type", "bpee", "unknown data.tokenizer_type 'bpee'; valid names: bpe"),
        ("data.dataset", " , ", "data.dataset=' , ' names no dataset: set --config.data."),
        ("data.dataset", "a:0.5,b:-1", "data.dataset entry 'b':-1.0 needs a name and a weight"),
    ],
)
def test_data_errors_name_fields_as_the_user_types_them(field, value, message):
    with pytest.raises(ConfigError) as err:
        build_config(override(common.base_config(), {field: value}))
    assert message in str(err.value), str(err.value)
    assert "DataConfig" not in str(err.value)
    with pytest.raises(TypeError) as err:
        config_lib.DataConfig(max_seq_length="128")
    assert str(err.value) == (
        "data.max_seq_length must be int, got '128': set --config.data.max_seq_length."
    )


def test_parse_command_line_takes_only_the_config_arguments():
    line = config_front.parse_command_line(
        ["--out=x", "--config", "a.py:tiny", "--config.seed=3", "--config.model.norm", "rmsnorm"]
    )
    assert line.spec == "a.py:tiny"
    assert line.overrides == {"seed": "3", "model.norm": "rmsnorm"}
    assert line.rest == ["--out=x"]


def test_a_config_resolves_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = config_front.load_config("configs/bert_postln.py:mini")
    assert values["model"]["placement"] == "post" and values["model"]["size"] == "mini"
    with pytest.raises(ConfigError, match="no such file"):
        config_front.load_config("configs/nope.py")
    with pytest.raises(ConfigError, match="unknown config variant 'huge'"):
        config_front.load_config("configs/bert_preln.py:huge")


ARGV = [
    "--config=configs/bert_preln.py:tiny",
    "--config.model.norm=rmsnorm",
    "--config.model.admin_omega=closed_form",
    "--config.optim.b2=0.98",
    "--config.data.eval_num_batches=3",
]


def _command_configs(argv):
    """The typed config each of the four command lines builds from `argv`."""
    from ln_jax.xla import compile_check

    experiments = importlib.import_module("ln_jax.experiments.__main__")
    built = {
        "train.py": build_config(train.command_config(argv)[0]),
        "compile_check": build_config(compile_check.command_config(argv)[0]),
        "experiments": build_config(experiments.command_config(["depth", *argv])[0]),
        "analysis": analysis_cli.command_config(["depth", *argv])[0],
    }
    return built


def test_every_command_line_takes_the_same_overrides():
    for name, cfg in _command_configs(ARGV).items():
        assert cfg.model.norm == "rmsnorm", name
        assert cfg.model.admin_omega == "closed_form", name
        assert cfg.optim.b2 == 0.98, name
        assert cfg.data.eval_num_batches == 3, name


@pytest.mark.parametrize(
    "command",
    [
        ["train.py"],
        ["-m", "ln_jax.compile_check"],
        ["-m", "ln_jax.experiments", "depth", "--out=/nonexistent"],
        ["-m", "ln_jax.analysis", "depth", "--out=/nonexistent"],
    ],
)
def test_every_command_line_rejects_a_misspelt_override_alike(command):
    proc = subprocess.run(
        [sys.executable, *command, "--config=configs/bert_preln.py:tiny", "--config.model.nrom=x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: unknown config field 'model.nrom'. Did you mean 'model.norm'?")


def test_mixln_is_rejected_inside_a_per_layer_list():
    with pytest.raises(ValueError, match="'mixln' names the whole stack's rule"):
        config_lib.model_config("tiny", placement="post,mixln")
    with pytest.raises(ValueError, match="'mixln' names the whole stack's rule"):
        config_lib.model_config("tiny", num_layers=3, placement="mixln*2,pre")
    mixed = config_lib.model_config("tiny", num_layers=8, placement="mixln")
    assert mixed.layer_placements == ("post",) * 2 + ("pre",) * 6


def test_a_finetune_config_error_keeps_its_fix_of_the_command_line():
    from ln_jax.cli import command as cli
    from ln_jax.models.bert.finetune.config import build_finetune_config
    from ln_jax.validate import Fix

    with pytest.raises(ConfigError, match="unknown task 'mrcp'") as err:
        build_finetune_config({"task": "mrcp"})
    assert err.value.fix == Fix(set={"--config.task": "mrpc"})
    argv = ["--config=configs/glue.py", "--config.task=mrcp"]
    assert cli.fixed_command("python finetune.py", argv, err.value.fix) == (
        "python finetune.py --config=configs/glue.py --config.task=mrpc"
    )
