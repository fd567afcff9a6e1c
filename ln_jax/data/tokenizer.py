"""A sentencepiece tokenizer with BERT's special tokens: train, cache, load; plus a CLI.

Ids 0-4 are `[PAD] [UNK] [CLS] [SEP] [MASK]`. A trained model is cached beside the prepared
data of the corpus it was trained on, keyed by corpus, version, model type and vocabulary size
(`<data_dir>/ln_jax_pydocs/1.0.0/spm_unigram_8000.model`), so reruns reuse it. Model paths and
the data dir may be URLs (gs://...): they are read and written through `etils.epath`.

CLI:
  python -m ln_jax.data.tokenizer train [--dataset ln_jax_pydocs] [--vocab_size 8000]
      [--type unigram|bpe] [--data_dir DIR] [--output FILE.model]
  python -m ln_jax.data.tokenizer encode --model FILE.model "Some text."
  python -m ln_jax.data.tokenizer info --model FILE.model
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from etils import epath

from ln_jax import paths
from ln_jax.validate import ConfigError, Fix

SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
NUM_SPECIAL = len(SPECIAL_PIECES)
WORD_START = "\u2581"  # sentencepiece's "▁": the piece begins a new word

# Sentencepiece trains on a uniform (seeded) sample of this many sentences of a larger corpus,
# ~11 MB of docstring text: ln_jax_sitedocs's 264k train sentences took 58 s of CPU at 2000
# pieces, a 100k sample 24 s; the embedded corpus (16k sentences) is used whole.
MAX_TRAINING_SENTENCES = 100_000

_TOO_LARGE = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


class Tokenizer:
    """A sentencepiece model whose ids 0-4 are BERT's special tokens.

    Attributes:
      vocab_size: V, number of ids (special tokens included).
      word_start: bool [V]; True where a piece starts a word (whole-word masking).
      fingerprint: md5 of the serialised model (cache keys of tokenised corpora).
      path: file the model came from, if any.
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID
    num_special = NUM_SPECIAL

    def __init__(self, model_proto: bytes, path: str | os.PathLike | None = None):
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.path = None if path is None else paths.as_path(path)
        self.vocab_size = self.sp.get_piece_size()
        self.fingerprint = hashlib.md5(model_proto).hexdigest()
        _check_specials(self.sp, path)
        pieces = [self.sp.id_to_piece(i) for i in range(self.vocab_size)]
        self.word_start = np.array([p.startswith(WORD_START) for p in pieces], dtype=bool)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = paths.as_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"sentencepiece model {str(path)!r} does not exist")
        return cls(path.read_bytes(), path)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text: a list of int32 [n_i] arrays (no special tokens added)."""
        return [np.asarray(ids, dtype=np.int32) for ids in self.sp.encode(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids; special tokens are dropped by sentencepiece."""
        return self.sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)


def _check_specials(sp: spm.SentencePieceProcessor, path: Any) -> None:
    found = [sp.id_to_piece(i) for i in range(min(NUM_SPECIAL, sp.get_piece_size()))]
    if tuple(found) != SPECIAL_PIECES or not sp.is_control(MASK_ID):
        raise ConfigError(
            f"sentencepiece model {path or '<bytes>'} has ids 0-4 = {found}; ln_jax needs "
            f"{list(SPECIAL_PIECES)} ([MASK] a control symbol). Train one with "
            "`python -m ln_jax.data.tokenizer train` or with pad_id=0, unk_id=1, bos_id=2, "
            "eos_id=3, pad/unk/bos/eos_piece=[PAD]/[UNK]/[CLS]/[SEP], control_symbols=[MASK]."
        )


# BERT's special pieces: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3 (sentencepiece's pad/unk/bos/eos
# slots) and [MASK] 4.
BERT_SPECIALS = {
    "pad_id": PAD_ID,
    "unk_id": UNK_ID,
    "bos_id": CLS_ID,
    "eos_id": SEP_ID,
    "pad_piece": "[PAD]",
    "unk_piece": "[UNK]",
    "bos_piece": "[CLS]",
    "eos_piece": "[SEP]",
    "control_symbols": ["[MASK]"],
}


def train_sentencepiece(
    sentences: Iterable[str],
    *,
    vocab_size: int,
    model_type: str = "unigram",
    corpus_name: str = "corpus",
    specials: dict | None = None,
) -> bytes:
    """Trains a sentencepiece model; returns the serialised model. `specials`: sentencepiece's
    special-token settings (default BERT's, `BERT_SPECIALS`; translation: PAD 0, UNK 1, BOS 2,
    EOS 3). Every character seen is kept, from a uniform sample of larger corpora, on one
    thread (the model differs with the thread count; one thread is reproducible).

    Raises:
      ConfigError: if the corpus cannot support `vocab_size` pieces, naming a size that fits.
    """
    sentences = iter(sentences)
    seen = []  # up to the first sentence with text, given to sentencepiece as they came
    while not (seen and seen[-1].strip()):
        following = next(sentences, None)
        if following is None:  # sentencepiece's own error is a 70-line INTERNAL traceback
            raise ConfigError(
                f"corpus {corpus_name!r} holds no text to train the tokenizer on: give a "
                "dataset with text in its training split."
            )
        seen.append(following)
    sentences = itertools.chain(seen, sentences)
    writer = io.BytesIO()
    spm.set_random_generator_seed(0)  # sentence sampling of large corpora, reproducibly
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=writer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=1,
            minloglevel=2,
            **(BERT_SPECIALS if specials is None else specials),
        )
    except RuntimeError as e:
        match = _TOO_LARGE.search(str(e))
        if not match:
            raise
        most = match.group(2)
        raise ConfigError(
            f"data.vocab_size={vocab_size} is too large for corpus {corpus_name!r}: "
            f"sentencepiece ({model_type}) can make at most {most} pieces from it. Set "
            f"--config.data.vocab_size={most} (or less), or use a larger corpus.",
            fix=Fix(set={"--config.data.vocab_size": most}),
        ) from e
    return writer.getvalue()


def cache_path(
    cache_dir: str | os.PathLike, vocab_size: int, model_type: str, split: str = "train"
) -> epath.Path:
    """Where the tokenizer trained on a corpus's `split` is cached (the corpus's folder)."""
    tag = "" if split == "train" else "_" + hashlib.md5(split.encode()).hexdigest()[:8]
    return paths.as_path(cache_dir) / f"spm_{model_type}_{vocab_size}{tag}.model"


def corpus_cache_dir(cfg: Any, sources: Sequence[Any]) -> epath.Path:
    """Folder for a corpus's tokenizer: the dataset's folder, or for a mix a shared folder."""
    if len(sources) == 1:
        return sources[0][0].dataset_dir
    from ln_jax.data.sources import default_data_dir

    spec = ",".join(f"{s.key}:{w:.6g}" for s, w in sources)
    digest = hashlib.md5(spec.encode()).hexdigest()[:12]
    return paths.as_path(default_data_dir(cfg.data_dir)) / "ln_jax_mixes" / digest


def get_tokenizer(cfg: Any, sources: Sequence[Any] | None = None) -> Tokenizer:
    """The tokenizer of a DataConfig: the user's model, the cached one, or a newly trained one.

    Args:
      cfg: a DataConfig.
      sources: `sources.open_sources(cfg)` if already opened.
    """
    if cfg.tokenizer_model:
        return Tokenizer.load(cfg.tokenizer_model)
    from ln_jax.data import sources as sources_lib

    sources = sources_lib.open_sources(cfg) if sources is None else sources
    folder = corpus_cache_dir(cfg, sources)
    path = cache_path(folder, cfg.vocab_size, cfg.tokenizer_type, cfg.train_split)
    if path.is_file():
        return Tokenizer.load(path)
    proto = train_sentencepiece(
        _training_sentences(cfg, sources),
        vocab_size=cfg.vocab_size,
        model_type=cfg.tokenizer_type,
        corpus_name=_describe(cfg),
    )
    # Concurrent runs (or hosts on a shared disk) must never read a half-written model.
    paths.write_atomic(path, proto)
    return Tokenizer(proto, path)


def _describe(cfg: Any) -> str:
    return f"{cfg.dataset} ({cfg.train_split})" if isinstance(cfg.dataset, str) else "mix"


def _training_sentences(cfg: Any, sources: Sequence[Any]) -> Iterable[str]:
    """Sentences of the training split; each source gets documents by its mix weight."""
    for source, weight in sources:
        budget = max(1, int(cfg.tokenizer_max_documents * weight))
        for doc in source.documents(cfg.train_split, max_documents=budget):
            yield from doc


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ln_jax.data.tokenizer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train (or find cached) the tokenizer of a corpus")
    train.add_argument("--dataset", default="ln_jax_pydocs")
    train.add_argument("--data_dir", default=None)
    train.add_argument("--train_split", default="train")
    train.add_argument("--text_feature", default="text")
    train.add_argument("--vocab_size", type=int, default=8000)
    train.add_argument(
        "--type", dest="tokenizer_type", choices=("unigram", "bpe"), default="unigram"
    )
    train.add_argument("--output", default=None, help="also copy the model to this file")
    for name in ("encode", "info"):
        p = sub.add_parser(name, help=f"{name} with a model")
        p.add_argument("--model", required=True)
        if name == "encode":
            p.add_argument("text", nargs="+")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.command == "train":
        from ln_jax.data.config import DataConfig

        fields = ("dataset", "data_dir", "train_split", "text_feature", "vocab_size")
        cfg = DataConfig(**{k: getattr(args, k) for k in (*fields, "tokenizer_type")})
        tok = get_tokenizer(cfg)
        print(f"{tok.path}  (vocab {tok.vocab_size}, md5 {tok.fingerprint})")
        if args.output:
            paths.write_atomic(args.output, tok.path.read_bytes())
            print(f"copied to {args.output}")
        return 0
    tok = Tokenizer.load(args.model)
    if args.command == "encode":
        for text in args.text:
            ids = tok.encode([text])[0]
            print(" ".join(map(str, ids)))
            print(" ".join(tok.id_to_piece(i) for i in ids))
        return 0
    specials = ", ".join(f"{p}={i}" for i, p in enumerate(SPECIAL_PIECES))
    print(f"{tok.path}: vocab {tok.vocab_size}, {specials}, md5 {tok.fingerprint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
