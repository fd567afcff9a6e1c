"""A trained translation model from a `train.py` workdir (its checkpoints, optionally
averaged) or a local HuggingFace Marian folder (`hf:PATH`): `load_translator`.

Used by `python -m ln_jax.translate` and by the translation task's warm start
(`translation.init_from`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ln_jax.validate import Fix, UserError

HF_PREFIX = "hf:"
DEFAULT_DATASET = "ln_jax_gettext/de-en"


class TranslateError(UserError):
    """What the user asked cannot be translated (the message says why and what to do)."""


def check_source(workdir: str, step: int | None = None, average_last: int = 1) -> dict | None:
    """What `load_translator` checks before it loads anything (a command calls it before it
    reads its input, so that a wrong source is said first): the run's recorded config values,
    or None for "hf:PATH" (an existing folder, without --step / --average_last).

    Raises:
      TranslateError: no such folder, no run, not a translation run, or options for a workdir.
    """
    if workdir.startswith(HF_PREFIX):
        path = workdir[len(HF_PREFIX) :]
        if step is not None or average_last != 1:
            raise TranslateError("--step and --average_last apply to workdirs, not hf:PATH.")
        if not os.path.isdir(path):
            raise TranslateError(
                f"hf:{path}: no such folder; give a local HuggingFace Marian folder."
            )
        return None
    from ln_jax.train import run_identity

    values = run_identity.read_config(workdir)
    if values is None:
        raise TranslateError(f"{workdir} holds no run (no config.json); give a training workdir.")
    if values.get("task") != "translation":
        raise TranslateError(
            f"{workdir} is a {values.get('task', 'bert_pretraining')!r} run, not a translation "
            "run; give the workdir of python train.py --config=configs/mt.py."
        )
    return values


def load_translator(workdir: str, step: int | None = None, average_last: int = 1):
    """(Translator with the run's parameters, the run's TrainConfig, the saved steps used).

    The parameters are those of checkpoint `step` (None = the latest), or the average of the
    last `average_last` checkpoints up to it. `workdir` "hf:PATH" loads a HuggingFace Marian
    folder instead (`hf_translator`; steps [] used).
    """
    values = check_source(workdir, step, average_last)
    if values is None:
        return (*hf_translator(workdir[len(HF_PREFIX) :]), [])
    from ln_jax import sharding
    from ln_jax.config.load import build_config
    from ln_jax.task import make_task
    from ln_jax.train import steps
    from ln_jax.train.checkpoint import Checkpointer

    values = {**values, "mesh": {"data": -1, "fsdp": 1, "tensor": 1}}
    cfg = build_config(values)
    mesh = sharding.make_mesh(-1, 1, 1)
    target = steps.abstract_state(make_task(cfg), mesh)
    ckpt = Checkpointer(f"{workdir}/checkpoints", cfg.checkpoint)
    try:
        chosen = _steps_to_average(ckpt, step, average_last, workdir, cfg.checkpoint.keep)
        trees = [ckpt.restore_step(s, target.state)["params"] for s in chosen]
    finally:
        ckpt.close()
    params = jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)
    model = nnx.merge(target.graphdef, params, _materialise(target.rest))
    return model, cfg, chosen


def hf_translator(path: str, dataset: str = DEFAULT_DATASET):
    """(Translator, TrainConfig) of a HuggingFace Marian folder: its shape, ids and vocabulary
    (`data.tokenizer_model=hf:PATH`), reading `dataset`; every other field the defaults."""
    from ln_jax import sharding
    from ln_jax.config.load import build_config
    from ln_jax.models.translation import convert

    if not os.path.isdir(path):
        raise TranslateError(f"hf:{path}: no such folder; give a local HuggingFace Marian folder.")
    try:
        model_cfg, options = convert.marian_config(convert.read_hf_config(path))
        source = HF_PREFIX + path
        cfg = build_config({
            "task": "translation",
            "model": dataclasses.asdict(model_cfg),
            "translation": options,
            "data": {"dataset": dataset, "tokenizer_model": source,
                     "vocab_size": model_cfg.vocab_size},
        })  # fmt: skip
        model = convert.load_marian(path, mesh=sharding.make_mesh(-1, 1, 1))
    except convert.MarianError as err:
        raise TranslateError(str(err)) from None
    return model, cfg


def _materialise(rest: Any) -> Any:
    """Non-parameter state (none for the Translator) as arrays, not shapes."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rest)


def _steps_to_average(ckpt, step: int | None, n: int, workdir: str, keep: int) -> list[int]:
    """The last `n` saved steps up to `step` (None = the latest).

    Raises:
      TranslateError: no checkpoint, no checkpoint `step`, or fewer than `n` (saying how many
        there are, that the run keeps its last `keep`, and the --average_last that works).
    """
    saved = sorted(ckpt.manager.all_steps())
    if not saved:
        raise TranslateError(f"{workdir} has no checkpoint yet; train it first.")
    last = saved[-1] if step is None else step
    if last not in saved:
        raise TranslateError(f"no checkpoint {last} in {workdir}: the saved steps are {saved}.")
    upto = [s for s in saved if s <= last]
    if n < 1:
        raise TranslateError(f"--average_last={n}: give a number of checkpoints >= 1.")
    if n > len(upto):
        raise TranslateError(
            f"--average_last={n}: {workdir} holds {len(upto)} checkpoints up to step {last} "
            f"({', '.join(map(str, upto))}; the run keeps its last {keep}, checkpoint.keep): "
            f"average at most {len(upto)}, or train with --config.checkpoint.keep={n} (and "
            "--config.checkpoint_every) to keep more.",
            fix=Fix(set={"--average_last": str(len(upto))}),
        )
    return upto[-n:]
