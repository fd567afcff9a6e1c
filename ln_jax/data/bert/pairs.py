"""The pair index: every example of a split as token ranges, built vectorised, cached on disk.

With NSP, documents of sentences become sentence pairs as in BERT's `create_pretraining_data`
(target length `max_seq_length - 3`, with probability `short_seq_prob` a random shorter one; a
chunk of sentences split at a random point into A and B; with probability 0.5 B comes from a
random other document; truncation of the longer side from a random end). A and B are each a run
of consecutive sentences, so an example is two token ranges of the flat token array. Without
NSP, consecutive whole sentences are packed to length across documents (RoBERTa's
FULL-SENTENCES), one token range per example.

Both are built with numpy over all documents at once: the NSP loop advances every unfinished
document by one chunk per pass (passes = the most pairs any document yields), and packing
computes where an example starting at each sentence ends, then follows that chain. The index is
saved as .npy files and memory-mapped on later starts (`save_pair_index`, `load_pair_index`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Any

import numpy as np

# Bump when the construction changes: cached indexes of another version are rebuilt.
PAIR_INDEX_VERSION = 1
_ARRAYS = ("a_start", "a_end", "b_start", "b_end", "nsp_label")


@dataclasses.dataclass(frozen=True, eq=False)
class PairIndex:
    """Examples as token ranges of `TokenizedCorpus.tokens`, E examples.

    Segment A is tokens[a_start:a_end], segment B tokens[b_start:b_end] (empty without NSP).

    Attributes:
      a_start, a_end, b_start, b_end: int64 [E].
      nsp_label: int8 [E]; 0 = B follows A, 1 = B is random.
      folder: where the arrays are memory-mapped from (pickles as this path), or None.
    """

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    nsp_label: np.ndarray
    folder: str | None = None

    def __len__(self) -> int:
        return len(self.a_start)

    def __reduce__(self):
        # Worker processes receive the index by pickle: a cached one travels as its path.
        if self.folder is not None:
            return load_pair_index, (self.folder,)
        return PairIndex, tuple(getattr(self, name) for name in _ARRAYS)

    def equals(self, other: PairIndex) -> bool:
        """True when both hold the same ranges and labels."""
        return all(np.array_equal(getattr(self, n), getattr(other, n)) for n in _ARRAYS)


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 0x9A15, 2])))


# --------------------------------------------------------------------------------------------
# NSP sentence pairs
# --------------------------------------------------------------------------------------------


def truncation(la, lb, max_tokens: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Tokens BERT's pair truncation removes: (A front, A back, B front, B back), int64 [E] each.

    BERT removes one token at a time from the longer segment (B on a tie), from the front or
    the back with equal probability, until the pair fits. That equals: take the excess from the
    longer side until both are equal, then alternate starting with B; the front/back choices
    are binomial.

    Args:
      la, lb: int [E] segment lengths.
      max_tokens: the most tokens A and B may keep together.
      rng: source of the front/back choices.
    """
    la, lb = np.asarray(la, np.int64), np.asarray(lb, np.int64)
    excess = np.maximum(la + lb - max_tokens, 0)
    first = np.minimum(excess, np.abs(la - lb))
    rest = excess - first
    cut_a = np.where(la > lb, first, 0) + rest // 2
    cut_b = np.where(lb >= la, first, 0) + rest - rest // 2
    front_a, front_b = rng.binomial(cut_a, 0.5), rng.binomial(cut_b, 0.5)
    return front_a, cut_a - front_a, front_b, cut_b - front_b


def _random_b(corpus, docs, target_b, rng) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges of sentences from a random other document, each >= `target_b` [k] long."""
    starts, doc_starts, num_docs = corpus.sent_starts, corpus.doc_starts, corpus.num_docs
    other = rng.integers(max(num_docs - 1, 1), size=len(docs))
    other += (num_docs > 1) & (other >= docs)  # uniform over the other documents
    s0, s1 = doc_starts[other], doc_starts[other + 1]
    first = s0 + (rng.random(len(docs)) * (s1 - s0)).astype(np.int64)
    # First sentence end at or beyond the target (BERT: add sentences until long enough).
    last = np.searchsorted(starts, starts[first] + target_b, "left") - 1
    last = np.clip(last, first, s1 - 1)
    return starts[first], starts[last + 1]


def _chunk_pairs(corpus, docs, chunk, target, rng) -> tuple[np.ndarray, ...]:
    """One pair from the chunk starting at sentence `chunk` of each document in `docs` [k].

    Two deviations keep the next-sentence label a fair coin on corpora of short documents
    (docstrings), where BERT's rule "a one-sentence chunk always gets a random B" gave 60%
    random-next labels: a chunk closes only once it holds two sentences, and the one-sentence
    chunk left at a document's end pairs with its predecessor when the coin says "next".

    Returns:
      (a_start, a_end, b_start, b_end, is_random, next_chunk), each [k]; next_chunk is the
      sentence where the document's next chunk starts (the unused sentences of a chunk whose
      B was random start it).
    """
    starts, doc_starts = corpus.sent_starts, corpus.doc_starts
    s0, s1 = doc_starts[docs], doc_starts[docs + 1]
    # The chunk ends at the first sentence that brings it to the target, with >= 2 sentences.
    end = np.searchsorted(starts, starts[chunk] + target, "left") - 1
    end = np.minimum(np.maximum(end, chunk + 1), s1 - 1)
    n = end - chunk + 1
    is_random = (rng.random(len(docs)) < 0.5) | (s1 - s0 == 1)
    with_prev = (n == 1) & ~is_random  # the document's last sentence, after its predecessor
    split = chunk + 1 + (rng.random(len(docs)) * np.maximum(n - 1, 0)).astype(np.int64)
    a_first, a_stop = np.where(with_prev, end - 1, chunk), np.where(with_prev, end, split)
    a0, a1 = starts[a_first], starts[a_stop]
    b0, b1 = starts[a_stop], starts[end + 1]
    rand = np.flatnonzero(is_random)
    b0[rand], b1[rand] = _random_b(corpus, docs[rand], target[rand] - (a1 - a0)[rand], rng)
    return a0, a1, b0, b1, is_random, np.where(is_random, a_stop, end + 1)


def nsp_pairs(corpus, *, max_seq_length: int, short_seq_prob: float, seed: int) -> PairIndex:
    """Sentence pairs with next-sentence labels for every document, in document order.

    Args:
      corpus: a `TokenizedCorpus`.
      max_seq_length: T; a pair keeps at most T - 3 tokens.
      short_seq_prob: probability that a document uses a random target length in [2, T - 3].
      seed: seed of every random choice.
    """
    rng, max_tokens = _rng(seed), max_seq_length - 3
    num_docs = corpus.num_docs
    target = np.full(num_docs, max_tokens, np.int64)
    short = np.flatnonzero(rng.random(num_docs) < short_seq_prob)
    target[short] = rng.integers(2, max_tokens + 1, size=len(short))
    docs, chunk = np.arange(num_docs), corpus.doc_starts[:-1].astype(np.int64)
    parts: list[tuple[np.ndarray, ...]] = []
    while len(docs):
        a0, a1, b0, b1, is_random, chunk = _chunk_pairs(corpus, docs, chunk, target[docs], rng)
        fa, ba, fb, bb = truncation(a1 - a0, b1 - b0, max_tokens, rng)
        parts.append((docs, a0 + fa, a1 - ba, b0 + fb, b1 - bb, is_random))
        alive = chunk < corpus.doc_starts[docs + 1]
        docs, chunk = docs[alive], chunk[alive]
    if not parts:
        return PairIndex(*(np.zeros(0, np.int64) for _ in range(4)), np.zeros(0, np.int8))
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    # Document order; within a document the passes come in order (a stable sort keeps it).
    order = np.argsort(cols[0], kind="stable")
    a_start, a_end, b_start, b_end, labels = (c[order] for c in cols[1:])
    return PairIndex(a_start, a_end, b_start, b_end, labels.astype(np.int8))


# --------------------------------------------------------------------------------------------
# Packed full sentences (no NSP)
# --------------------------------------------------------------------------------------------


def _pack_ends(corpus, room: int) -> tuple[np.ndarray, np.ndarray]:
    """For an example starting at each sentence s: the sentence where the next one starts, and
    its cost (tokens + document-boundary [SEP]s), int64 [S] each."""
    starts, num = corpus.sent_starts.astype(np.int64), corpus.num_sentences
    doc_first = np.zeros(num + 1, np.int64)
    doc_first[corpus.doc_starts[:-1]] = 1
    seps_before = np.concatenate([[0], np.cumsum(doc_first)])  # first sentences below index k
    # cost(s, e) = G[e] - G0[s] for sentences s..e-1 (a [SEP] before each inner document).
    g = starts + seps_before[: num + 1]
    g0 = starts[:num] + seps_before[1 : num + 1]
    s = np.arange(num)
    end = np.searchsorted(g, g0 + room, "right") - 1
    end = np.minimum(np.maximum(end, s + 1), num)
    return end, g[end] - g0


def packed_sentences(corpus, *, max_seq_length: int) -> PairIndex:
    """RoBERTa FULL-SENTENCES: consecutive whole sentences packed up to `max_seq_length`.

    Packs cross document boundaries, where the example gets an extra [SEP]. A sentence longer
    than the room left starts the next example; one longer than a whole example is cut to fit.
    """
    room = max_seq_length - 2  # [CLS] ... [SEP]
    end, cost = _pack_ends(corpus, room)
    chain, s, nxt = [], 0, memoryview(end)
    while s < len(end):  # the greedy chain from sentence 0: one cheap step per example
        chain.append(s)
        s = nxt[s]
    first = np.asarray(chain, np.int64)
    starts = corpus.sent_starts.astype(np.int64)
    a_start = starts[first]
    a_end = starts[end[first]] - np.maximum(cost[first] - room, 0)
    zeros = np.zeros_like(a_start)
    return PairIndex(a_start, a_end, zeros, zeros.copy(), np.zeros(len(first), np.int8))


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------


def build_pair_index(corpus, *, max_seq_length: int, short_seq_prob: float, nsp: bool, seed: int):
    """The split's pair index: NSP pairs, or packed sentences when `nsp` is False."""
    if nsp:
        return nsp_pairs(
            corpus, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, seed=seed
        )
    return packed_sentences(corpus, max_seq_length=max_seq_length)


def save_arrays(
    folder: str | os.PathLike, arrays: dict[str, np.ndarray], texts: dict[str, str] | None = None
) -> None:
    """Writes `name.npy` per array (and text files) into `folder` atomically: a temporary
    folder renamed into place; if another process finished first, its copy is kept."""
    folder = pathlib.Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    for name, array in arrays.items():
        np.save(tmp / f"{name}.npy", array)
    for name, text in (texts or {}).items():
        (tmp / name).write_text(text)
    try:
        os.replace(tmp, folder)
    except OSError:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


def save_pair_index(pairs: PairIndex, folder: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Writes the arrays and `meta.json` atomically (`save_arrays`)."""
    meta_text = json.dumps({**meta, "examples": len(pairs)}, sort_keys=True)
    arrays = {name: getattr(pairs, name) for name in _ARRAYS}
    save_arrays(folder, arrays, {"meta.json": meta_text})


def load_pair_index(folder: str | os.PathLike) -> PairIndex:
    """Memory-maps a saved pair index (nothing is read until examples are)."""
    folder = pathlib.Path(folder)
    arrays = [np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS]
    return PairIndex(*arrays, folder=str(folder))


def is_saved(folder: str | os.PathLike) -> bool:
    """True when `folder` holds a complete pair index (the rename makes it all-or-nothing)."""
    return (pathlib.Path(folder) / "meta.json").is_file()
