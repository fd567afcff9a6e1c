"""Translation vocabularies: one joint sentencepiece model over both sides, or synthetic symbols.

Every translation tokenizer has ids PAD 0, UNK 1, BOS 2, EOS 3 (`ln_jax.models.translation.
options` fixes them), `encode(str) -> list[int]` (no BOS/EOS added), `decode(ids) -> str`
(stops at the first EOS, drops PAD and BOS), `vocab_size` and `fingerprint`.

The joint sentencepiece model (`data.tokenizer_type` unigram or BPE, `data.vocab_size` pieces)
is trained on both sides of the training split and cached in the dataset's folder as
`spm_joint_<type>_<vocab>.model`, like the pretraining tokenizer; `data.tokenizer_model` gives
one of the user's own (it must have those four ids), or "hf:PATH" a HuggingFace Marian folder's
vocabulary (`ln_jax.data.translation.marian_vocab`, with its own special ids).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ln_jax import paths
from ln_jax.validate import ConfigError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
# Sentencepiece trains on a uniform sample of this many sentences of a larger corpus.
MAX_TRAINING_SENTENCES = 1_000_000
_TOO_LARGE = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


def specials(tokenizer: Any) -> tuple[int, int, int]:
    """A translation tokenizer's (pad, bos, eos) ids."""
    return (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)


def _until_eos(ids: Iterable[int]) -> list[int]:
    """The ids before the first EOS, without PAD and BOS."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


class SymbolTokenizer:
    """The synthetic vocabulary: ids 0-3 special, id 4 + k = symbol `w<k>`; words are
    space-separated symbols (an unknown word is UNK, decoded as `<unk>`).

    Attributes:
      vocab_size: 4 + number of symbols.
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, num_symbols: int):
        self.num_symbols = num_symbols
        self.vocab_size = len(SPECIAL_PIECES) + num_symbols
        self.fingerprint = f"symbols{num_symbols}"
        self._ids = {f"w{k}": len(SPECIAL_PIECES) + k for k in range(num_symbols)}

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(w, UNK_ID) for w in text.split()]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        words = []
        for i in _until_eos(ids):
            k = i - len(SPECIAL_PIECES)
            words.append(f"w{k}" if 0 <= k < self.num_symbols else SPECIAL_PIECES[UNK_ID])
        return " ".join(words)


class JointTokenizer:
    """A sentencepiece model with ids PAD 0, UNK 1, BOS 2, EOS 3, shared by both languages.

    Attributes:
      vocab_size: V, pieces including the four special ones.
      fingerprint: md5 of the serialised model (cache keys of token ids).
      path: the model file, if any.
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes, path: Any = None):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.path = None if path is None else paths.as_path(path)
        self.vocab_size = self.sp.get_piece_size()
        self.fingerprint = hashlib.md5(model_proto).hexdigest()
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ConfigError(
                f"sentencepiece model {path or '<bytes>'} has pad/unk/bos/eos ids {ids}; "
                "translation needs 0/1/2/3: train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3 "
                "or leave data.tokenizer_model unset to train one."
            )

    @classmethod
    def load(cls, path: Any) -> JointTokenizer:
        path = paths.as_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"sentencepiece model {str(path)!r} does not exist")
        return cls(path.read_bytes(), path)

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode(_until_eos(ids))


def train_joint_sentencepiece(
    sentences: Iterable[str], *, vocab_size: int, model_type: str, corpus_name: str
) -> bytes:
    """Trains one sentencepiece model on `sentences` (both languages) with PAD 0, UNK 1, BOS 2,
    EOS 3; returns its bytes.

    Raises:
      ConfigError: if the corpus cannot support `vocab_size` pieces, naming a size that fits.
    """
    from ln_jax.data.tokenizer import train_sentencepiece

    specials = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    return train_sentencepiece(
        sentences,
        vocab_size=vocab_size,
        model_type=model_type,
        corpus_name=corpus_name,
        specials=specials,
    )


def both_sides(pairs: Sequence[tuple[str, str]], max_pairs: int) -> Iterator[str]:
    """Source and target of at most `max_pairs` pairs, evenly strided over the split."""
    stride = max(1, -(-len(pairs) // max_pairs))
    for src, tgt in pairs[::stride]:
        yield src
        yield tgt


def translation_tokenizer(cfg: Any, source: Any, train_pairs: Sequence[tuple[str, str]] | None):
    """The tokenizer of a parallel source: symbols (synthetic), the user's model, the cached
    joint model, or a newly trained one (written atomically beside the data).

    Args:
      cfg: a DataConfig (vocab_size, tokenizer_type, tokenizer_model, tokenizer_max_documents).
      source: a `parallel.ParallelSource`.
      train_pairs: the training pairs if already read (None = read them if needed).
    """
    if source.synthetic:
        return SymbolTokenizer(source.metadata["symbols"])
    if cfg.tokenizer_model and cfg.tokenizer_model.startswith("hf:"):
        from ln_jax.data.translation.marian_vocab import MarianVocab

        return MarianVocab(cfg.tokenizer_model[len("hf:") :])
    if cfg.tokenizer_model:
        return JointTokenizer.load(cfg.tokenizer_model)
    path = source.cache_dir / f"spm_joint_{cfg.tokenizer_type}_{cfg.vocab_size}.model"
    if path.is_file():
        return JointTokenizer.load(path)
    pairs = source.pairs(cfg.train_split) if train_pairs is None else train_pairs
    proto = train_joint_sentencepiece(
        both_sides(pairs, cfg.tokenizer_max_documents),
        vocab_size=cfg.vocab_size,
        model_type=cfg.tokenizer_type,
        corpus_name=f"{source.name} ({cfg.train_split})",
    )
    paths.write_atomic(path, proto)
    return JointTokenizer(proto, path)
