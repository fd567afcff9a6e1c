"""BERT pretraining examples (Devlin et al., 2019), pure numpy and randomly accessible.

The pipeline has two stages:

1. Once per (corpus, split, seed): the *pair structure*. Documents of sentences become
   sentence pairs as in BERT's `create_pretraining_data` (target length `max_seq_length - 3`,
   with probability `short_seq_prob` a random shorter one; a chunk of sentences split at a
   random point into A and B; with probability 0.5 B comes from a random other document;
   truncation of the longer side from a random end). Because A and B are each a run of
   consecutive sentences, an example is just two token ranges of the flat token array.
   Without NSP, consecutive full sentences are packed to length across documents
   (RoBERTa's FULL-SENTENCES), one token range per example.
2. At read time: `[CLS] A [SEP] B [SEP]`, segment ids, padding and the MLM masks, seeded by
   (seed, stream, epoch, example index) through Philox, so the masks differ every epoch yet a
   rerun reproduces them exactly.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ln_jax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

_ENCODE_CHUNK = 4096  # sentences per sentencepiece call: amortises the Python overhead
_NOT_MASKABLE = np.array([PAD_ID, CLS_ID, SEP_ID, MASK_ID])


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
    """

    tokens: np.ndarray
    sent_starts: np.ndarray
    doc_starts: np.ndarray

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
    """Writes a corpus as .npy files, atomically (a temporary folder renamed into place)."""
    folder = pathlib.Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    for name in _CORPUS_ARRAYS:
        np.save(tmp / f"{name}.npy", getattr(corpus, name))
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished first: keep its copy
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


def load_corpus(folder: str | os.PathLike) -> TokenizedCorpus:
    """Reads a saved corpus; token ids are memory-mapped (large corpora stay on disk)."""
    folder = pathlib.Path(folder)
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    starts = [np.load(folder / f"{name}.npy") for name in _CORPUS_ARRAYS[1:]]
    return TokenizedCorpus(tokens, *starts)


# --------------------------------------------------------------------------------------------
# Pair structure
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairIndex:
    """Examples as token ranges of `TokenizedCorpus.tokens` (int64 [E] each).

    Segment A is tokens[a_start:a_end], segment B tokens[b_start:b_end] (empty without NSP).
    `nsp_label` int8 [E]: 0 = B follows A, 1 = B is random.
    """

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    nsp_label: np.ndarray

    def __len__(self) -> int:
        return len(self.a_start)

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int, int, int]]) -> PairIndex:
        arr = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
        return cls(*(arr[:, i] for i in range(4)), arr[:, 4].astype(np.int8))


def truncation(la: int, lb: int, max_tokens: int, rng: np.random.Generator) -> tuple[int, ...]:
    """Tokens BERT's pair truncation removes: (A front, A back, B front, B back).

    BERT removes one token at a time from the longer segment (B on a tie), from the front or
    the back with equal probability, until the pair fits. That equals: take the excess from the
    longer side until both are equal, then alternate starting with B; the front/back choices
    are binomial.
    """
    excess = la + lb - max_tokens
    if excess <= 0:
        return (0, 0, 0, 0)
    first = min(excess, abs(la - lb))
    rest = excess - first
    cut_a = (first if la > lb else 0) + rest // 2
    cut_b = (first if lb >= la else 0) + rest - rest // 2
    front_a, front_b = rng.binomial(cut_a, 0.5), rng.binomial(cut_b, 0.5)
    return (int(front_a), int(cut_a - front_a), int(front_b), int(cut_b - front_b))


def _random_b(corpus, d, target_b, rng) -> tuple[int, int]:
    """Token range of sentences from a random other document, at least `target_b` long."""
    num_docs = corpus.num_docs
    other = int(rng.integers(num_docs - 1)) if num_docs > 1 else 0
    other += int(num_docs > 1 and other >= d)  # uniform over the other documents
    s0, s1 = int(corpus.doc_starts[other]), int(corpus.doc_starts[other + 1])
    first = int(rng.integers(s0, s1))
    starts = corpus.sent_starts
    # First sentence end at or beyond the target (BERT: add sentences until long enough).
    last = int(np.searchsorted(starts[first + 1 : s1 + 1] - starts[first], target_b)) + first
    return int(starts[first]), int(starts[min(last, s1 - 1) + 1])


def _doc_pairs(corpus, d, rng, max_num_tokens, short_seq_prob, rows) -> None:
    """Appends the sentence pairs of document d (BERT's create_instances_from_document).

    Two deviations keep the next-sentence label a fair coin on corpora of short documents
    (docstrings), where BERT's rule "a one-sentence chunk always gets a random B" gave 60%
    random-next labels: a chunk closes only once it holds two sentences, and the one-sentence
    chunk left at a document's end pairs with its predecessor when the coin says "next".
    """
    starts, lens = corpus.sent_starts, np.diff(corpus.sent_starts)
    s0, s1 = int(corpus.doc_starts[d]), int(corpus.doc_starts[d + 1])
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    i, chunk_start, chunk_len = s0, s0, 0
    while i < s1:
        chunk_len += int(lens[i])
        n = i - chunk_start + 1
        if i == s1 - 1 or (chunk_len >= target and n >= 2):
            is_random = rng.random() < 0.5 or s1 - s0 == 1
            if n == 1 and not is_random:  # the document's last sentence, after its predecessor
                a_begin, a_end = i - 1, i
            else:
                a_begin, a_end = (
                    chunk_start,
                    chunk_start + (int(rng.integers(1, n)) if n > 1 else 1),
                )
            a = (int(starts[a_begin]), int(starts[a_end]))
            if is_random:
                b = _random_b(corpus, d, target - (a[1] - a[0]), rng)
                i = a_end - 1  # the chunk's unused sentences start the next chunk
            else:
                b = (int(starts[a_end]), int(starts[i + 1]))
            fa, ba, fb, bb = truncation(a[1] - a[0], b[1] - b[0], max_num_tokens, rng)
            rows.append((a[0] + fa, a[1] - ba, b[0] + fb, b[1] - bb, int(is_random)))
            chunk_start, chunk_len = i + 1, 0
        i += 1


def nsp_pairs(
    corpus: TokenizedCorpus, *, max_seq_length: int, short_seq_prob: float, seed: int
) -> PairIndex:
    """Sentence pairs with next-sentence labels for every document of the corpus."""
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 0x9A15])))
    rows: list[tuple[int, int, int, int, int]] = []
    for d in range(corpus.num_docs):
        _doc_pairs(corpus, d, rng, max_seq_length - 3, short_seq_prob, rows)
    return PairIndex.from_rows(rows)


def packed_sentences(corpus: TokenizedCorpus, *, max_seq_length: int) -> PairIndex:
    """RoBERTa FULL-SENTENCES: consecutive whole sentences packed up to `max_seq_length`.

    Packs cross document boundaries, where the example gets an extra [SEP]. A sentence longer
    than the room left is cut to fit.
    """
    room = max_seq_length - 2  # [CLS] ... [SEP]
    starts = corpus.sent_starts
    doc_first = np.zeros(corpus.num_sentences + 1, dtype=bool)
    doc_first[corpus.doc_starts[:-1]] = True
    rows, begin, used = [], int(starts[0]), 0
    for s in range(corpus.num_sentences):
        n = int(starts[s + 1] - starts[s])
        extra = int(doc_first[s] and used > 0)  # [SEP] between documents
        if used and used + extra + n > room:
            rows.append((begin, int(starts[s]), 0, 0, 0))
            begin, used, extra = int(starts[s]), 0, 0
        used += extra + n
        if used >= room:  # a sentence that alone overflows is truncated
            rows.append((begin, int(starts[s + 1]) - (used - room), 0, 0, 0))
            begin, used = int(starts[s + 1]), 0
    if used:
        rows.append((begin, int(starts[-1]), 0, 0, 0))
    return PairIndex.from_rows(rows)


# --------------------------------------------------------------------------------------------
# Read time: layout and masking
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


def _word_groups(ids: np.ndarray, candidates: np.ndarray, word_start: np.ndarray) -> list:
    """Candidate positions grouped into words: a piece without "▁" continues the previous one."""
    starts = word_start[ids[candidates]]
    starts[1:] |= np.diff(candidates) != 1  # a non-candidate in between also ends a word
    starts[0] = True
    return np.split(candidates, np.flatnonzero(starts)[1:])


def _choose_positions(ids, candidates, n, spec, rng) -> np.ndarray:
    """BERT's choice: shuffle candidates (words under whole-word masking), take up to n."""
    if not spec.whole_word:
        return np.sort(rng.permutation(candidates)[:n])
    chosen, count = [], 0
    groups = _word_groups(ids, candidates, spec.word_start)
    for g in rng.permutation(len(groups)):
        if count >= n:
            break
        if count + len(groups[g]) > n:
            continue  # a word that does not fit whole is skipped, as in BERT
        chosen.append(groups[g])
        count += len(groups[g])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def mask_tokens(
    ids: np.ndarray, length: int, spec: MaskingSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Masked LM: 15% of tokens, 80% -> [MASK], 10% -> random id, 10% unchanged.

    Args:
      ids: int32 [T] token ids, padded after `length`.
      length: number of real tokens (special tokens included).
      spec: masking parameters.
      rng: random source for this example.

    Returns:
      input_ids int32 [T] (masked), masked_positions int32 [P], masked_ids int32 [P] (the
      original ids) and masked_weights float32 [P]; padding rows are 0, 0, 0.0.
    """
    real = ids[:length]
    candidates = np.flatnonzero(~np.isin(real, _NOT_MASKABLE))
    # Python's round, as BERT: the target counts all tokens, specials included.
    n = min(spec.max_predictions, max(1, round(length * spec.masked_lm_prob)), len(candidates))
    pos = _choose_positions(ids, candidates, n, spec, rng)
    k, p = len(pos), spec.max_predictions
    out = ids.copy()
    u = rng.random(k)
    replace = rng.integers(NUM_SPECIAL, spec.vocab_size, size=k)
    out[pos] = np.where(u < 0.8, MASK_ID, np.where(u < 0.9, replace, ids[pos]))
    positions, masked_ids = np.zeros(p, np.int32), np.zeros(p, np.int32)
    weights = np.zeros(p, np.float32)
    positions[:k], masked_ids[:k], weights[:k] = pos, ids[pos], 1.0
    return out, positions, masked_ids, weights


def layout(
    a: np.ndarray, b: np.ndarray | None, max_seq_length: int, doc_seps: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """`[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]`) padded to T.

    Args:
      a: segment A token ids; b: segment B or None (no-NSP mode).
      max_seq_length: T.
      doc_seps: positions in `a` before which a document-boundary [SEP] goes (no-NSP mode).

    Returns:
      input_ids int32 [T], segment_ids int32 [T] (0 for [CLS] A [SEP], 1 for B [SEP]) and the
      number of real tokens.
    """
    if doc_seps is not None and len(doc_seps):
        a = np.insert(a.astype(np.int32), doc_seps, SEP_ID)
    parts = [[CLS_ID], a, [SEP_ID]] + ([b, [SEP_ID]] if b is not None else [])
    real = np.concatenate(parts).astype(np.int32)
    length = len(real)
    if length > max_seq_length:
        raise ValueError(f"example of {length} tokens exceeds max_seq_length={max_seq_length}")
    ids = np.zeros(max_seq_length, np.int32)
    ids[:length] = real
    segments = np.zeros(max_seq_length, np.int32)
    if b is not None:
        segments[len(a) + 2 : length] = 1
    return ids, segments, length


class PretrainingExamples:
    """Random-access BERT examples of one corpus: `example(index, epoch)` -> dict of arrays.

    Shapes (T = max_seq_length, P = spec.max_predictions): input_ids, segment_ids,
    attention_mask int32 [T]; masked_positions, masked_ids int32 [P]; masked_weights float32 [P];
    nsp_label int32 [].
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
    ):
        """Builds the pair structure (the costly part, once).

        Args:
          corpus: the tokenised split.
          spec: masking parameters.
          max_seq_length: T.
          short_seq_prob: probability of a shorter target length per document.
          nsp: sentence pairs with NSP labels; False = packed full sentences.
          seed: seed of the pair structure and of the masks.
          stream: which dataset of a mix this is, so mixed datasets get distinct masks.
        """
        if corpus.num_docs == 0:
            raise ValueError("the corpus split has no documents with text")
        self.corpus, self.spec, self.nsp = corpus, spec, nsp
        self.max_seq_length, self.seed, self.stream = max_seq_length, seed, stream
        if nsp:
            self.pairs = nsp_pairs(
                corpus, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, seed=seed
            )
        else:
            self.pairs = packed_sentences(corpus, max_seq_length=max_seq_length)
        self._doc_token_starts = corpus.sent_starts[corpus.doc_starts[:-1]]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.example(index, 0)

    def rng(self, index: int, epoch: int) -> np.random.Generator:
        """The example's random source: a Philox stream keyed by (seed, stream, epoch, index)."""
        key = np.random.SeedSequence([self.seed, self.stream, epoch, index])
        return np.random.Generator(np.random.Philox(key))

    def segments(self, index: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Token ids of A and B (B None without NSP) and the document-boundary positions in A."""
        p, tokens = self.pairs, self.corpus.tokens
        a0, a1 = int(p.a_start[index]), int(p.a_end[index])
        a = np.asarray(tokens[a0:a1], dtype=np.int32)
        if self.nsp:
            return a, np.asarray(tokens[p.b_start[index] : p.b_end[index]], dtype=np.int32), None
        lo, hi = np.searchsorted(self._doc_token_starts, [a0 + 1, a1])
        return a, None, self._doc_token_starts[lo:hi] - a0

    def example(self, index: int, epoch: int = 0) -> dict[str, np.ndarray]:
        """Example `index` with the masks of `epoch`."""
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        a, b, seps = self.segments(index)
        ids, segment_ids, length = layout(a, b, self.max_seq_length, seps)
        input_ids, positions, masked_ids, weights = mask_tokens(
            ids, length, self.spec, self.rng(index, epoch)
        )
        return {
            "input_ids": input_ids,
            "segment_ids": segment_ids,
            "attention_mask": (np.arange(self.max_seq_length) < length).astype(np.int32),
            "masked_positions": positions,
            "masked_ids": masked_ids,
            "masked_weights": weights,
            "nsp_label": np.asarray(self.pairs.nsp_label[index] if self.nsp else 0, np.int32),
        }


def masking_spec(tokenizer: Any, cfg: Any) -> MaskingSpec:
    """The MaskingSpec of a Tokenizer and a DataConfig."""
    return MaskingSpec(
        vocab_size=tokenizer.vocab_size,
        word_start=tokenizer.word_start,
        max_predictions=cfg.max_predictions_per_seq,
        masked_lm_prob=cfg.masked_lm_prob,
        whole_word=cfg.whole_word_masking,
    )
