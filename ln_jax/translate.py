"""Translating with a trained translation run: a library call and a command.

  python -m ln_jax.translate --workdir=workdirs/mt_small                 # validation BLEU
  python -m ln_jax.translate --workdir=W --split=test --beam=5 --lenpen=1.2 --average_last=5
  echo "Datei nicht gefunden" | python -m ln_jax.translate --workdir=W --input=-
  python -m ln_jax.translate --workdir=hf:opus-mt-de-en --max_sentences=500   # a Marian folder

Without `--input` it translates the run's own validation (or `--split=test`) sources and scores
them with sacrebleu against the references (`--tokenize`: 13a, intl, none for the papers'
tokenised BLEU, ...), printing the score and sacrebleu's signature; `--output` writes the
hypotheses one per line. `--average_last=N` averages the parameters of the last N checkpoints
(as the papers report). `--workdir=hf:PATH` translates with a local HuggingFace Marian folder
(its parameters, vocabulary and special ids; `ln_jax.models.translation.convert`), scoring
`--dataset` (default the offline `ln_jax_gettext/de-en`). Errors (a workdir that is not a
translation run, a beam wider than the vocabulary, a source longer than the positions allow) are
one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.validate import UserError

SPLITS = {"validation": "eval_split", "test": "test"}
HF_PREFIX = "hf:"
DEFAULT_DATASET = "ln_jax_gettext/de-en"


class TranslateError(UserError):
    """What the user asked cannot be translated (the message says why and what to do)."""


def load_translator(workdir: str, step: int | None = None, average_last: int = 1):
    """(Translator with the run's parameters, the run's TrainConfig, the saved steps used).

    The parameters are those of checkpoint `step` (None = the latest), or the average of the
    last `average_last` checkpoints up to it. `workdir` "hf:PATH" loads a HuggingFace Marian
    folder instead (`hf_translator`; steps [] used).
    """
    if workdir.startswith(HF_PREFIX):
        if step is not None or average_last != 1:
            raise TranslateError("--step and --average_last apply to workdirs, not hf:PATH.")
        return (*hf_translator(workdir[len(HF_PREFIX) :]), [])
    from ln_jax import sharding
    from ln_jax.config_front import build_config
    from ln_jax.train import run_identity, steps
    from ln_jax.train.checkpoint import Checkpointer

    values = run_identity.read_config(workdir)
    if values is None:
        raise TranslateError(f"{workdir} holds no run (no config.json); give a training workdir.")
    if values.get("task") != "translation":
        raise TranslateError(
            f"{workdir} is a {values.get('task', 'bert_pretraining')!r} run, not a translation "
            "run; give the workdir of python train.py --config=configs/mt.py."
        )
    values = {**values, "mesh": {"data": -1, "fsdp": 1, "tensor": 1}}
    cfg = build_config(values)
    mesh = sharding.make_mesh(-1, 1, 1)
    target = steps.abstract_state(cfg, mesh)
    ckpt = Checkpointer(f"{workdir}/checkpoints", cfg.checkpoint)
    try:
        chosen = _steps_to_average(ckpt, step, average_last, workdir)
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
    from ln_jax.config_front import build_config
    from ln_jax.models.translation import convert

    if not os.path.isdir(path):
        raise TranslateError(f"hf:{path}: no such folder; give a local HuggingFace Marian folder.")
    try:
        model_cfg, options = convert.marian_config(convert.read_hf_config(path))
        source = HF_PREFIX + path
        cfg = build_config({
            "task": "translation",
            "model": dataclasses.asdict(model_cfg),
            "task_options": options,
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


def _steps_to_average(ckpt, step: int | None, n: int, workdir: str) -> list[int]:
    saved = sorted(ckpt.manager.all_steps())
    if not saved:
        raise TranslateError(f"{workdir} has no checkpoint yet; train it first.")
    last = saved[-1] if step is None else step
    if last not in saved:
        raise TranslateError(f"no checkpoint {last} in {workdir}: the saved steps are {saved}.")
    upto = [s for s in saved if s <= last]
    if n < 1 or n > len(upto):
        raise TranslateError(
            f"--average_last={n}: {workdir} holds {len(upto)} checkpoints up to step {last}."
        )
    return upto[-n:]


def translate_sentences(model, cfg, tokenizer, sources: Sequence[str], search, batch: int = 64):
    """The hypotheses (detokenised strings) of `sources`, in order."""
    from ln_jax import sharding
    from ln_jax.models.translation.options import TranslationOptions
    from ln_jax.models.translation.search import translate

    options = TranslationOptions.from_mapping(cfg.task_options, cfg.model)
    search.check(cfg.model.vocab_size)
    ids = [tokenizer.encode(s) + [options.eos_id] for s in sources]
    longest = max((len(i) for i in ids), default=0)
    limit = cfg.model.max_position_embeddings
    if longest > limit:
        raise TranslateError(
            f"a source has {longest} tokens with EOS, more than the model's {limit} positions; "
            "split long sentences."
        )
    width = max(options.max_source_length, longest)
    mesh = _mesh_of(model)
    where = sharding.batch_sharding(mesh)
    out = []
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        src, mask = _padded_rows(chunk, width, options.pad_id, sharding.batch_divisor(mesh))
        with sharding.use_mesh(mesh):  # rows sharded over data x fsdp, as training's batches
            result = translate(
                model, jax.device_put(src, where), jax.device_put(mask, where), search
            )
        tokens = np.asarray(result["tokens"])[: len(chunk)]
        out += [tokenizer.decode([int(t) for t in row]) for row in tokens]
    return out


def _mesh_of(model) -> jax.sharding.Mesh:
    """The mesh the model's parameters live on."""
    leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
    return leaf.sharding.mesh


def _padded_rows(chunk, width: int, pad: int, multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, mask) [rows, width], rows a multiple of `multiple` (extra rows repeat the first
    source; their outputs are dropped)."""
    rows = -(-len(chunk) // multiple) * multiple
    src = np.full((rows, width), pad, np.int32)
    mask = np.zeros((rows, width), np.int32)
    for row in range(rows):
        seq = chunk[row] if row < len(chunk) else chunk[0]
        src[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    return src, mask


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ln_jax.translate",
        description="Translate with a trained translation run (configs/mt.py) and score BLEU.",
    )
    p.add_argument(
        "--workdir",
        required=True,
        help="the run's workdir (python train.py ...), or hf:PATH (a HuggingFace Marian folder)",
    )
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    p.add_argument("--average_last", type=int, default=1, help="average the last N checkpoints")
    p.add_argument("--input", help="a file of source lines, or - for stdin (default: --split)")
    p.add_argument("--split", default="validation", choices=sorted(SPLITS), help="scored split")
    p.add_argument(
        "--dataset",
        help="score this data.dataset (default: the run's; hf: " + DEFAULT_DATASET + ")",
    )
    p.add_argument("--max_sentences", type=int, help="only the split's first N sentences")
    p.add_argument("--output", help="write the hypotheses here, one per line")
    p.add_argument("--beam", type=int, default=5, help="beam size (1 = greedy)")
    p.add_argument("--lenpen", type=float, default=1.0, help="fairseq's length penalty")
    p.add_argument("--alpha", type=float, help="GNMT's length penalty instead of --lenpen")
    p.add_argument("--max_len_a", type=float, default=1.2, help="max length = a * src + b")
    p.add_argument("--max_len_b", type=int, default=10, help="max length = a * src + b")
    p.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer (none, 13a, intl, ...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from ln_jax.data.translation import load_split
    from ln_jax.models.translation.search import Search
    from ln_jax.models.translation.task import bleu

    model, cfg, used = load_translator(args.workdir, args.step, args.average_last)
    search = Search(
        beam=args.beam,
        max_length=cfg.model.max_position_embeddings,  # the longest output the positions allow
        lenpen=args.lenpen,
        alpha=args.alpha,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        greedy=args.beam == 1,
    )
    data_cfg = cfg.data
    if args.dataset:
        data_cfg = dataclasses.replace(data_cfg, dataset=args.dataset)
    if args.input is None and args.split == "test":
        data_cfg = dataclasses.replace(data_cfg, eval_split="test")
    hf_vocab = (data_cfg.tokenizer_model or "").startswith(HF_PREFIX)
    if args.input is not None and hf_vocab:  # the folder's vocabulary: no dataset to open
        from ln_jax.data.marian_vocab import MarianVocab

        tokenizer, split = MarianVocab(data_cfg.tokenizer_model[len(HF_PREFIX) :]), None
    else:
        split = load_split(data_cfg, "eval")
        tokenizer = split.tokenizer
    sources, refs = _sources(args, split)
    hyps = translate_sentences(model, cfg, tokenizer, sources, search)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
    if refs is None:
        if not args.output:
            sys.stdout.writelines(h + "\n" for h in hyps)
        return 0
    score, signature = bleu(hyps, refs, args.tokenize)
    print(f"BLEU {score:.2f} on {len(hyps)} sentences, checkpoints {used} ({signature})")
    return 0


def _sources(args, split) -> tuple[list[str], list[str] | None]:
    if args.input is None:
        pairs = split.pairs[: args.max_sentences]
        return [s for s, _ in pairs], [t for _, t in pairs]
    stream = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")  # noqa: SIM115
    with stream:
        return [line.rstrip("\n") for line in stream], None


if __name__ == "__main__":
    sys.exit(main())
