"""BERT pretraining examples (Devlin et al., 2019), built a whole batch at a time in numpy.

The pipeline has two stages:

1. Once per (corpus, split, seed): the *pair index* (`ln_jax.data.bert.pairs`): every example as
   token ranges of the flat token array (sentence pairs with NSP labels, or packed full
   sentences), built vectorised and cached on disk.
2. At read time, for a batch of (example index, epoch): `[CLS] A [SEP] B [SEP]`, segment ids,
   padding and the MLM masks (15%, 80/10/10, optionally whole words), all as [batch, T]
   array operations. Every random number is a function of (seed, stream, epoch, example
   index, position) (`ln_jax.data.keyed_random`): the masks differ every epoch, a rerun
   reproduces them exactly, and an example is the same whichever batch, host or worker
   process builds it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ln_jax.data import keyed_random
from ln_jax.data.bert import pairs as pairs_lib
from ln_jax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

_ENCODE_CHUNK = 4096  # sentences per sentencepiece call: amortises the Python overhead
_NOT_MASKABLE = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)
# Random keys hold the position in their low bits, so that no two positions tie.
_POSITION_BITS = np.uint64(16)


# --------------------------------------------------------------------------------------------
# Tokenised corpus
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """All sentences of a split, tokenised once and concatenated.

    Attributes:
      tokens: [N] token ids of every sentence, in document order (uint16 or int32).
      sent_starts: int64 [S + 1]; sentence s is tokens[sent_starts[s]:sent_starts[s + 1]].
      doc_starts: int64 [D + 1]; document d is sentences doc_starts[d]:doc_starts[d + 1].
      folder: where the corpus was loaded from (it pickles as this path), or None.
    """

    tokens: np.ndarray
    sent_starts: np.ndarray
    doc_starts: np.ndarray
    folder: str | None = dataclasses.field(default=None, compare=False)

    def __reduce__(self):
        # Worker processes receive the corpus by pickle: a cached one travels as its path.
        if self.folder is not None:
            return load_corpus, (self.folder,)
        return TokenizedCorpus, (self.tokens, self.sent_starts, self.doc_starts)

    @property
    def num_docs(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sent_starts) - 1

    def doc_sentences(self, d: int) -> list[np.ndarray]:
        """Token arrays of document d's sentences (tests, inspection)."""
        s0, s1 = self.doc_starts[d], self.doc_starts[d + 1]
        return [self.tokens[self.sent_starts[s] : self.sent_starts[s + 1]] for s in range(s0, s1)]


def tokenize_documents(
    documents: Iterable[list[str]], encode: Callable[[list[str]], list[np.ndarray]], vocab_size: int
) -> TokenizedCorpus:
    """Tokenises documents (lists of sentences); empty sentences and documents are dropped.

    Args:
      documents: each a list of sentence strings.
      encode: texts -> token-id arrays (e.g. `Tokenizer.encode`).
      vocab_size: chooses uint16 storage when every id fits.
    """
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    pieces, sent_lens, doc_lens, pending, pending_docs = [], [], [], [], []

    def flush():
        encoded = iter(encode(pending)) if pending else iter(())
        for n in pending_docs:
            kept = [ids for ids in (next(encoded) for _ in range(n)) if len(ids)]
            if kept:
                pieces.extend(ids.astype(dtype) for ids in kept)
                sent_lens.extend(len(ids) for ids in kept)
                doc_lens.append(len(kept))
        pending.clear()
        pending_docs.clear()

    for doc in documents:
        pending.extend(doc)
        pending_docs.append(len(doc))
        if len(pending) >= _ENCODE_CHUNK:
            flush()
    flush()
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    return TokenizedCorpus(tokens, _offsets(np.asarray(sent_lens)), _offsets(np.asarray(doc_lens)))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


_CORPUS_ARRAYS = ("tokens", "sent_starts", "doc_starts")


def save_corpus(corpus: TokenizedCorpus, folder: str | os.PathLike) -> None:
    """Writes a corpus as .npy files, atomically (`pairs.save_arrays`)."""
    pairs_lib.save_arrays(folder, {name: getattr(corpus, name) for name in _CORPUS_ARRAYS})


def load_corpus(folder: str | os.PathLike) -> TokenizedCorpus:
    """Reads a saved corpus; token ids are memory-mapped (large corpora stay on disk)."""
    folder = pathlib.Path(folder)
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    starts = [np.load(folder / f"{name}.npy") for name in _CORPUS_ARRAYS[1:]]
    return TokenizedCorpus(tokens, *starts, folder=str(folder))


# --------------------------------------------------------------------------------------------
# Masked LM, a batch at a time
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """How tokens are masked.

    Attributes:
      vocab_size: V; random replacements are drawn from the non-special ids [NUM_SPECIAL, V).
      word_start: bool [V], True where a piece starts a word (whole-word masking).
      max_predictions: P, masked positions per example at most.
      masked_lm_prob: fraction of an example's tokens to predict.
      whole_word: mask all pieces of a word together.
    """

    vocab_size: int
    word_start: np.ndarray
    max_predictions: int = 20
    masked_lm_prob: float = 0.15
    whole_word: bool = False


def _selection_keys(keys: np.ndarray, maskable: np.ndarray) -> np.ndarray:
    """Random sort keys uint64 [B, T], distinct within a row; unmaskable positions last."""
    t = np.arange(maskable.shape[1], dtype=np.uint64)
    bits = keyed_random.random_bits(keys[:, None], t[None, :])
    sort_keys = (bits >> _POSITION_BITS << _POSITION_BITS) | t
    sort_keys[~maskable] = np.iinfo(np.uint64).max
    return sort_keys


def _choose_tokens(sort_keys: np.ndarray, n: np.ndarray) -> np.ndarray:
    """BERT's choice: a uniformly random n[b] of row b's maskable positions; bool [B, T]."""
    p = min(int(n.max(initial=0)), sort_keys.shape[1])
    if p == 0:
        return np.zeros(sort_keys.shape, bool)
    smallest = np.sort(np.partition(sort_keys, p - 1, axis=1)[:, :p], axis=1)
    threshold = smallest[np.arange(len(n)), np.maximum(n, 1) - 1]
    return (sort_keys <= threshold[:, None]) & (n > 0)[:, None]


def _word_groups(ids: np.ndarray, maskable: np.ndarray, word_start: np.ndarray):
    """Maskable positions grouped into words: a piece without "▁" continues the previous one.

    Returns:
      group int64 [B, T] (the word's number within its row, valid where maskable), is_first
      bool [B, T] (the word's first piece) and length int64 [B, T] (pieces of word g at [b, g]).
    """
    prev = np.zeros_like(maskable)
    prev[:, 1:] = maskable[:, :-1]
    is_first = maskable & (word_start[ids] | ~prev)  # an unmaskable token also ends a word
    group = np.cumsum(is_first, axis=1) - 1
    rows, cols = np.nonzero(maskable)
    flat = rows * maskable.shape[1] + group[rows, cols]
    length = np.bincount(flat, minlength=maskable.size).reshape(maskable.shape)
    return np.maximum(group, 0), is_first, length


def _choose_words(ids, maskable, n, sort_keys, word_start) -> np.ndarray:
    """Whole-word masking as BERT: words in random order, each taken if it fits whole in the
    n[b] left (a word that does not fit is skipped, later ones may still fit); bool [B, T]."""
    group, is_first, length = _word_groups(ids, maskable, word_start)
    word_keys = np.full(ids.shape, np.iinfo(np.uint64).max, np.uint64)
    rows, cols = np.nonzero(is_first)
    word_keys[rows, group[rows, cols]] = sort_keys[rows, cols]
    order = np.argsort(word_keys, axis=1)
    lengths = np.take_along_axis(length, order, axis=1)
    taken, count = np.zeros(ids.shape, bool), np.zeros(len(ids), np.int64)
    num_words = is_first.sum(axis=1)
    for r in range(int(num_words.max(initial=0))):  # greedy over the shuffled words
        fits = (lengths[:, r] > 0) & (count + lengths[:, r] <= n)
        count += np.where(fits, lengths[:, r], 0)
        taken[:, r] = fits
        if ((count >= n) | (num_words <= r + 1)).all():
            break
    word_taken = np.zeros(ids.shape, bool)
    np.put_along_axis(word_taken, order, taken, axis=1)
    return maskable & np.take_along_axis(word_taken, group, axis=1)


def mask_batch(
    ids: np.ndarray, lengths: np.ndarray, spec: MaskingSpec, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Masked LM for a batch: 15% of tokens, 80% -> [MASK], 10% -> random id, 10% unchanged.

    As BERT: n = min(P, max(1, round(length * masked_lm_prob)), maskable tokens) positions per
    example (the length counts special tokens), chosen uniformly among the tokens other than
    [PAD] [CLS] [SEP] [MASK] (or as whole words).

    Args:
      ids: int32 [B, T] token ids, padded after `lengths`.
      lengths: int [B] real tokens per row (special tokens included).
      spec: masking parameters.
      keys: uint64 [B] one random key per example (`keyed_random.derive_key`).

    Returns:
      input_ids int32 [B, T] (masked); masked_positions int32 [B, P] (ascending), masked_ids
      int32 [B, P] (the original ids) and masked_weights float32 [B, P]; padding slots are
      0, 0, 0.0.
    """
    batch, length = ids.shape
    maskable = np.ones(spec.vocab_size, bool)
    maskable[list(_NOT_MASKABLE)] = False
    maskable = maskable[ids] & (np.arange(length) < np.asarray(lengths)[:, None])
    # np.rint rounds half to even, as Python's round in BERT's code.
    n = np.rint(np.asarray(lengths) * spec.masked_lm_prob).astype(np.int64)
    n = np.minimum(np.minimum(np.maximum(n, 1), spec.max_predictions), maskable.sum(axis=1))
    sort_keys = _selection_keys(keys, maskable)
    if spec.whole_word:
        chosen = _choose_words(ids, maskable, n, sort_keys, spec.word_start)
    else:
        chosen = _choose_tokens(sort_keys, n)
    return _replace(ids, chosen, spec, keys)


def _replace(ids, chosen, spec, keys) -> tuple[np.ndarray, ...]:
    """80/10/10 replacement at the chosen positions bool [B, T], and the [B, P] targets."""
    rows, cols = np.nonzero(chosen)  # row-major: ascending positions within each row
    slot = (np.cumsum(chosen, axis=1) - 1)[rows, cols]
    length, p = ids.shape[1], spec.max_predictions
    # Counters T.. and 2T.. : other draws than the selection's (counters 0..T-1).
    coin = keyed_random.uniform(keys[rows], cols + length)
    draw = keyed_random.uniform(keys[rows], cols + 2 * length)
    random_ids = NUM_SPECIAL + (draw * (spec.vocab_size - NUM_SPECIAL)).astype(np.int64)
    original = ids[rows, cols]
    out = ids.copy()
    out[rows, cols] = np.where(coin < 0.8, MASK_ID, np.where(coin < 0.9, random_ids, original))
    positions = np.zeros((len(ids), p), np.int32)
    masked_ids = np.zeros((len(ids), p), np.int32)
    weights = np.zeros((len(ids), p), np.float32)
    positions[rows, slot], masked_ids[rows, slot], weights[rows, slot] = cols, original, 1.0
    return out, positions, masked_ids, weights


# --------------------------------------------------------------------------------------------
# Layout, a batch at a time
# --------------------------------------------------------------------------------------------


def layout_pairs(tokens, a_start, a_end, b_start, b_end, max_seq_length: int):
    """`[CLS] A [SEP] B [SEP]` padded to T, for a batch of token ranges (int [B] each).

    Returns:
      input_ids int32 [B, T], segment_ids int32 [B, T] (0 for [CLS] A [SEP], 1 for B [SEP])
      and lengths int64 [B] (real tokens).
    """
    t = np.arange(max_seq_length)
    la, lb = (a_end - a_start)[:, None], (b_end - b_start)[:, None]
    lengths = la + lb + 3
    if (lengths > max_seq_length).any():
        raise ValueError(f"an example of {lengths.max()} tokens exceeds T={max_seq_length}")
    in_a, in_b = (t >= 1) & (t <= la), (t >= la + 2) & (t < lengths - 1)
    src = np.where(in_a, a_start[:, None] + t - 1, np.where(in_b, b_start[:, None] + t - la - 2, 0))
    ids = np.where(in_a | in_b, np.take(tokens, src), PAD_ID).astype(np.int32)
    rows = np.arange(len(ids))
    ids[:, 0] = CLS_ID
    ids[rows, la[:, 0] + 1] = SEP_ID
    ids[rows, lengths[:, 0] - 1] = SEP_ID
    segments = ((t >= la + 2) & (t < lengths)).astype(np.int32)
    return ids, segments, lengths[:, 0]


def layout_packed(tokens, a_start, a_end, doc_token_starts, max_seq_length: int):
    """`[CLS] S1 S2 [SEP] S3 ... [SEP]` padded to T: one token range per row (int [B] each),
    with a [SEP] before every document that starts inside it.

    Args:
      doc_token_starts: int64 [D], the first token of each document.

    Returns:
      input_ids int32 [B, T], segment_ids int32 [B, T] (all 0), lengths int64 [B].
    """
    t = np.arange(max_seq_length)
    la = (a_end - a_start)[:, None]
    inside = t < la
    src = np.where(inside, a_start[:, None] + t, a_start[:, None])
    # Document starts in (a_start, token]: the [SEP]s placed before the token.
    first_doc = np.searchsorted(doc_token_starts, a_start, "right")
    seps = np.searchsorted(doc_token_starts, src, "right") - first_doc[:, None]
    lengths = la[:, 0] + 2 + np.where(la[:, 0] > 0, seps[np.arange(len(la)), la[:, 0] - 1], 0)
    if (lengths > max_seq_length).any():
        raise ValueError(f"an example of {lengths.max()} tokens exceeds T={max_seq_length}")
    ids = np.where(t < lengths[:, None], SEP_ID, PAD_ID).astype(np.int32)
    ids[:, 0] = CLS_ID
    rows, cols = np.nonzero(inside)
    ids[rows, 1 + cols + seps[rows, cols]] = np.take(tokens, src[rows, cols])
    return ids, np.zeros_like(ids), lengths


# --------------------------------------------------------------------------------------------
# Examples of a split
# --------------------------------------------------------------------------------------------


class PretrainingExamples:
    """Random-access BERT examples of one corpus: `batch(indices, epochs)` -> dict of arrays.

    Shapes (B = len(indices), T = max_seq_length, P = spec.max_predictions): input_ids,
    segment_ids, attention_mask int32 [B, T]; masked_positions, masked_ids int32 [B, P];
    masked_weights float32 [B, P]; nsp_label int32 [B]. `example(index, epoch)` is one row.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        spec: MaskingSpec,
        *,
        max_seq_length: int = 128,
        short_seq_prob: float = 0.1,
        nsp: bool = True,
        seed: int = 0,
        stream: int = 0,
        pairs: pairs_lib.PairIndex | None = None,
    ):
        """Builds the pair index unless given one (`ln_jax.data.bert.pipeline` caches it).

        Args:
          corpus: the tokenised split.
          spec: masking parameters.
          max_seq_length: T.
          short_seq_prob: probability of a shorter target length per document.
          nsp: sentence pairs with NSP labels; False = packed full sentences.
          seed: seed of the pair index and of the masks.
          stream: which dataset of a mix this is, so mixed datasets get distinct masks.
          pairs: the pair index of exactly these arguments; None = build it here.
        """
        if corpus.num_docs == 0:
            raise ValueError("the corpus split has no documents with text")
        self.corpus, self.spec, self.nsp = corpus, spec, nsp
        self.max_seq_length, self.seed, self.stream = max_seq_length, seed, stream
        if pairs is None:
            pairs = pairs_lib.build_pair_index(
                corpus, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, nsp=nsp,
                seed=seed,
            )  # fmt: skip
        self.pairs = pairs
        self._doc_token_starts = np.asarray(corpus.sent_starts)[np.asarray(corpus.doc_starts)[:-1]]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.example(index, 0)

    def keys(self, indices: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        """uint64 [B]: the random key of each (example, epoch), whatever else is in the batch."""
        return keyed_random.derive_key(self.seed, self.stream, epochs, indices)

    def segments(self, index: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Token ids of A and B (B None without NSP) and the document-boundary positions in A."""
        p, tokens = self.pairs, self.corpus.tokens
        a0, a1 = int(p.a_start[index]), int(p.a_end[index])
        a = np.asarray(tokens[a0:a1], dtype=np.int32)
        if self.nsp:
            b = np.asarray(tokens[int(p.b_start[index]) : int(p.b_end[index])], dtype=np.int32)
            return a, b, None
        lo, hi = np.searchsorted(self._doc_token_starts, [a0 + 1, a1])
        return a, None, self._doc_token_starts[lo:hi] - a0

    def batch(self, indices, epochs) -> dict[str, np.ndarray]:
        """Examples `indices` (int [B]) with the masks of `epochs` (int [B] or a scalar)."""
        indices = np.asarray(indices, np.int64)
        epochs = np.broadcast_to(np.asarray(epochs, np.int64), indices.shape)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"example indices {indices.min()}..{indices.max()} of {len(self)}")
        p, tokens, length = self.pairs, self.corpus.tokens, self.max_seq_length
        a0, a1 = np.asarray(p.a_start[indices]), np.asarray(p.a_end[indices])
        if self.nsp:
            b0, b1 = np.asarray(p.b_start[indices]), np.asarray(p.b_end[indices])
            ids, segment_ids, lengths = layout_pairs(tokens, a0, a1, b0, b1, length)
            nsp_label = np.asarray(p.nsp_label[indices], np.int32)
        else:
            ids, segment_ids, lengths = layout_packed(
                tokens, a0, a1, self._doc_token_starts, length
            )
            nsp_label = np.zeros(len(indices), np.int32)
        input_ids, positions, masked_ids, weights = mask_batch(
            ids, lengths, self.spec, self.keys(indices, epochs)
        )
        return {
            "input_ids": input_ids,
            "segment_ids": segment_ids,
            "attention_mask": (np.arange(length) < lengths[:, None]).astype(np.int32),
            "masked_positions": positions,
            "masked_ids": masked_ids,
            "masked_weights": weights,
            "nsp_label": nsp_label,
        }

    def example(self, index: int, epoch: int = 0) -> dict[str, np.ndarray]:
        """Example `index` with the masks of `epoch` (one row of `batch`)."""
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        return {k: v[0] for k, v in self.batch([index], [epoch]).items()}


def masking_spec(tokenizer: Any, examples: Any) -> MaskingSpec:
    """The MaskingSpec of a Tokenizer and a `PretrainingOptions` (BERT's section "bert")."""
    return MaskingSpec(
        vocab_size=tokenizer.vocab_size,
        word_start=tokenizer.word_start,
        max_predictions=examples.max_predictions_per_seq,
        masked_lm_prob=examples.masked_lm_prob,
        whole_word=examples.whole_word_masking,
    )
