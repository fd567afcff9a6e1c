"""Translating with a trained translation run: a library call and a command.

  python -m ln_jax.translate --workdir=workdirs/mt_small                 # validation BLEU
  python -m ln_jax.translate --workdir=W --split=test --beam=5 --lenpen=1.2 --average_last=3
  echo "Datei nicht gefunden" | python -m ln_jax.translate --workdir=W --input=-
  python -m ln_jax.translate --workdir=hf:opus-mt-de-en --max_sentences=500   # a Marian folder

Without `--input` it translates the run's own validation (or `--split=test`) sources and scores
them with sacrebleu against the references (`--tokenize`: 13a, intl, none for the papers'
tokenised BLEU, ...), printing the score and sacrebleu's signature; `--output` writes the
hypotheses one per line. `--average_last=N` averages the parameters of the last N checkpoints
(as the papers report; a run keeps its last 3, `checkpoint.keep`). `--workdir=hf:PATH`
translates with a local HuggingFace Marian folder (its parameters, vocabulary and special
ids; `ln_jax.models.translation.convert`), scoring
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

import jax
import numpy as np
from flax import nnx

from ln_jax.models.translation.load import (  # noqa: F401 (TranslateError: the command's)
    DEFAULT_DATASET,
    HF_PREFIX,
    TranslateError,
    check_source,
    hf_translator,
    load_translator,
)
from ln_jax.validate import UserError

SPLITS = {"validation": "eval_split", "test": "test"}
PROG = "python -m ln_jax.translate"


def translate_sentences(model, cfg, tokenizer, sources: Sequence[str], search, batch: int = 64):
    """The hypotheses (detokenised strings) of `sources`, in order."""
    from ln_jax import sharding
    from ln_jax.models.translation.search import translate

    options = cfg.options.resolved(cfg.model)
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
        prog=PROG,
        description=__doc__,  # what it does and examples, as every ln_jax command's --help
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    """The command: translations (or the score) on stdout, a user error in one line (exit 2);
    the terminal shows what `train.py`'s does (`console.configure_logging`: ln_jax's lines and
    other libraries' warnings, not orbax's or TFDS's INFO lines)."""
    from ln_jax import console
    from ln_jax.cli import command as cli

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    console.configure_logging()
    try:
        return _run(args)
    except (UserError, ValueError) as err:
        fixed = cli.fixed_command(PROG, argv, getattr(err, "fix", None))
        print(f"error: {err}" + (f" Run: {fixed}" if fixed else ""), file=sys.stderr)
        return 2
    finally:
        console.close_logging()


def _run(args: argparse.Namespace) -> int:
    from ln_jax.data.translation.batches import load_split
    from ln_jax.models.translation.search import Search
    from ln_jax.models.translation.task import bleu

    check_source(args.workdir, args.step, args.average_last)  # a wrong source is said first,
    given = None if args.input is None else input_lines(args.input)  # then a wrong input
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
        from ln_jax.data.translation.marian_vocab import MarianVocab

        tokenizer, split = MarianVocab(data_cfg.tokenizer_model[len(HF_PREFIX) :]), None
    else:
        split = load_split(data_cfg, "eval")
        tokenizer = split.tokenizer
    sources, refs = (given, None) if given is not None else _split_sources(args, split)
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


def _split_sources(args, split) -> tuple[list[str], list[str]]:
    pairs = split.pairs[: args.max_sentences]
    return [s for s, _ in pairs], [t for _, t in pairs]


def input_lines(path: str) -> list[str]:
    """The source sentences of `--input`: a file's lines, or stdin's for "-", split on "\\n"
    only (`ln_jax.data.translation.parallel.split_lines`).

    Raises:
      TranslateError: no such file.
      ParallelDataError: a line that is not UTF-8 (naming it and the fix).
    """
    from ln_jax.data.translation.parallel import read_lines, split_lines

    if path != "-":
        if not os.path.isfile(path):
            raise TranslateError(
                f"--input={path}: no such file; give a file of source sentences, one a line, "
                "or --input=- for stdin."
            )
        return read_lines(path)
    stdin = sys.stdin
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    fix = "convert the text to UTF-8 first (e.g. pipe it through `iconv -f latin1 -t utf-8`)"
    return split_lines(data, "stdin (--input=-)", fix)


if __name__ == "__main__":
    sys.exit(main())
