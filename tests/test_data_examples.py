"""BERT examples: layout, segment ids, NSP pairs and balance, masking statistics (within
binomial bounds), whole words, reproducible keyed masks, the pair index, the keyed shuffle."""

from __future__ import annotations

import numpy as np
import pytest

from ln_jax.data import keyed_random, stream
from ln_jax.data.bert import examples as pt
from ln_jax.data.bert import pairs as pairs_lib
from ln_jax.data.bert.options import PretrainingOptions
from ln_jax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

pytest_plugins = ("tests.data_fixtures",)  # fixtures: tokenizer, train_corpus, make_config

T, P = 128, 20


def _examples(corpus, tok, options: PretrainingOptions, **kw) -> pt.PretrainingExamples:
    args = dict(max_seq_length=T, short_seq_prob=options.short_seq_prob, nsp=options.nsp)
    return pt.PretrainingExamples(corpus, pt.masking_spec(tok, options), **(args | kw))


@pytest.fixture
def nsp_examples(train_corpus, tokenizer):
    return _examples(train_corpus, tokenizer, PretrainingOptions(), seed=0)


def _unmasked(batch: dict) -> np.ndarray:
    """input_ids [B, T] with the masked positions' original ids put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


def _within(observed: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    """Whether a proportion of n Bernoulli(p) draws is within `sigmas` standard errors of p."""
    return abs(observed - p) < sigmas * np.sqrt(p * (1 - p) / n)


def test_shapes_and_dtypes(nsp_examples):
    want = {
        "input_ids": ((T,), np.int32),
        "segment_ids": ((T,), np.int32),
        "attention_mask": ((T,), np.int32),
        "masked_positions": ((P,), np.int32),
        "masked_ids": ((P,), np.int32),
        "masked_weights": ((P,), np.float32),
        "nsp_label": ((), np.int32),
    }
    ex = nsp_examples.example(0, 0)
    assert {k: (np.shape(v), v.dtype) for k, v in ex.items()} == want
    batch = nsp_examples.batch([0, 5, 9], 0)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: ((3, *shape), dtype) for k, (shape, dtype) in want.items()
    }


def test_cls_a_sep_b_sep_layout_and_segment_ids(nsp_examples):
    rows = np.arange(0, len(nsp_examples), 97)
    batch = nsp_examples.batch(rows, 0)
    ids = _unmasked(batch)
    for r, i in enumerate(rows):
        a, b, _ = nsp_examples.segments(i)
        n = len(a) + len(b) + 3
        assert 3 < n <= T and len(a) >= 1 and len(b) >= 1
        np.testing.assert_array_equal(ids[r, :n], np.r_[CLS_ID, a, SEP_ID, b, SEP_ID])
        assert (ids[r, n:] == PAD_ID).all()
        want_segments = np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1), np.zeros(T - n)]
        np.testing.assert_array_equal(batch["segment_ids"][r], want_segments)
        np.testing.assert_array_equal(batch["attention_mask"][r], np.arange(T) < n)


def _doc_of_token(corpus) -> np.ndarray:
    starts = corpus.sent_starts[corpus.doc_starts]
    return np.searchsorted(starts, np.arange(len(corpus.tokens)), "right") - 1


def test_next_sentence_pairs_are_true_or_random(nsp_examples, train_corpus):
    pairs, doc = nsp_examples.pairs, _doc_of_token(train_corpus)
    same_doc = doc[pairs.a_start] == doc[pairs.b_start]
    is_next = pairs.nsp_label == 0
    assert (same_doc & (pairs.b_start >= pairs.a_end))[is_next].all()
    assert not same_doc[~is_next].any()  # random B comes from another document
    assert (pairs.a_end - pairs.a_start + pairs.b_end - pairs.b_start <= T - 3).all()
    assert ((pairs.a_end > pairs.a_start) & (pairs.b_end > pairs.b_start)).all()
    # Every document yields pairs, in document order.
    assert np.array_equal(np.unique(doc[pairs.a_start]), np.arange(train_corpus.num_docs))
    assert (np.diff(doc[pairs.a_start]) >= 0).all()


def test_nsp_label_is_about_half(nsp_examples):
    labels = nsp_examples.pairs.nsp_label
    assert len(labels) > 3000
    assert _within(labels.mean(), 0.5, len(labels)), labels.mean()


def test_short_sequences_appear(nsp_examples):
    lengths = nsp_examples.batch(np.arange(1000), 0)["attention_mask"].sum(axis=1)
    assert (lengths == T).mean() > 0.05  # full-length pairs
    assert (lengths < T // 2).mean() > 0.05  # short targets and short documents


def test_masking_statistics(nsp_examples, tokenizer):
    batch = nsp_examples.batch(np.arange(3000), 0)
    orig, real = _unmasked(batch), batch["masked_weights"] > 0
    rows, slots = np.nonzero(real)
    pos = batch["masked_positions"][rows, slots]
    assert (np.diff(batch["masked_positions"], axis=1)[real[:, 1:]] > 0).all()  # ascending
    assert not np.isin(orig[rows, pos], [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()
    assert (batch["masked_positions"][~real] == 0).all() and (batch["masked_ids"][~real] == 0).all()
    lengths = batch["attention_mask"].sum(axis=1)
    # BERT's count: round(15% of the length), at least 1, at most P.
    want = np.minimum(np.maximum(np.rint(lengths * 0.15), 1), P)
    np.testing.assert_array_equal(real.sum(axis=1), want)
    n_masked = real.sum()
    assert abs(n_masked / lengths.sum() - 0.15) < 0.005 and n_masked > 30_000
    new, old = batch["input_ids"][rows, pos], orig[rows, pos]
    is_mask, same = new == MASK_ID, new == old
    random = ~is_mask & ~same
    assert _within(is_mask.mean(), 0.8, n_masked)
    assert _within(same.mean(), 0.1 + 0.1 / (tokenizer.vocab_size - NUM_SPECIAL), n_masked)
    assert _within(random.mean(), 0.1, n_masked)
    assert (new[random] >= NUM_SPECIAL).all() and (new[random] < tokenizer.vocab_size).all()
    assert len(np.unique(new[random])) > 0.5 * random.sum()  # spread over the vocabulary
    # Positions are uniform among the maskable ones: as often in the first half as in the second.
    half = pos < lengths[rows] / 2
    maskable = (np.arange(T) < lengths[:, None]) & ~np.isin(orig, [CLS_ID, SEP_ID])
    first_half = (maskable & (np.arange(T) < lengths[:, None] / 2)).sum() / maskable.sum()
    assert _within(half.mean(), first_half, n_masked)


def test_max_predictions_caps_masks(train_corpus, tokenizer):
    ex = _examples(train_corpus, tokenizer, PretrainingOptions(max_predictions_per_seq=5), seed=0)
    weights = ex.batch(np.arange(200), 0)["masked_weights"]
    assert weights.shape == (200, 5) and weights.sum(1).max() == 5


def test_an_example_is_the_same_in_any_batch_and_epochs_remask(nsp_examples, train_corpus):
    rows = np.array([7, 3000, 11, 42, 5000])
    batch = nsp_examples.batch(rows, [3, 3, 3, 3, 3])
    for r, i in enumerate(rows):  # the keyed masks do not depend on the batch's other rows
        one = nsp_examples.example(int(i), 3)
        for key in one:
            np.testing.assert_array_equal(batch[key][r], one[key], err_msg=key)
    spec = nsp_examples.spec
    again = pt.PretrainingExamples(train_corpus, spec, seed=0, pairs=nsp_examples.pairs)
    other_seed = pt.PretrainingExamples(train_corpus, spec, seed=1)
    later = nsp_examples.batch(np.arange(200), 4)
    first = again.batch(np.arange(200), 3)
    np.testing.assert_array_equal(_unmasked(later), _unmasked(first))  # same pairs
    changed = (later["masked_positions"] != first["masked_positions"]).any(axis=1)
    assert changed.mean() > 0.9  # masks differ between epochs
    assert not np.array_equal(other_seed.pairs.a_start[:100], nsp_examples.pairs.a_start[:100])


def test_whole_word_masking(train_corpus, tokenizer):
    ex = _examples(train_corpus, tokenizer, PretrainingOptions(whole_word_masking=True), seed=0)
    batch = ex.batch(np.arange(1000), 0)
    ids, real = _unmasked(batch), batch["masked_weights"] > 0
    lengths = batch["attention_mask"].sum(axis=1)
    masked = np.zeros((len(ids), T), bool)
    rows, slots = np.nonzero(real)
    masked[rows, batch["masked_positions"][rows, slots]] = True
    maskable = ~np.isin(ids, [PAD_ID, CLS_ID, SEP_ID]) & (np.arange(T) < lengths[:, None])
    # Piece j + 1 continues the word of piece j: masked together or not at all.
    continues = maskable[:, 1:] & maskable[:, :-1] & ~tokenizer.word_start[ids[:, 1:]]
    assert continues.sum() > 10_000 and (masked[:, 1:] == masked[:, :-1])[continues].all()
    assert (masked[:, 1:] & continues).sum() > 1000  # multi-piece words do get masked
    assert 0.12 < real.sum() / lengths.sum() <= 0.151


def test_packed_full_sentences_without_nsp(train_corpus, tokenizer):
    ex = _examples(train_corpus, tokenizer, PretrainingOptions(nsp=False), seed=0)
    doc_token_starts = train_corpus.sent_starts[train_corpus.doc_starts[:-1]]
    rows = np.arange(0, len(ex), 13)
    batch = ex.batch(rows, 0)
    ids, n = _unmasked(batch), batch["attention_mask"].sum(axis=1)
    for r, i in enumerate(rows):
        a0, a1 = ex.pairs.a_start[i], ex.pairs.a_end[i]
        inner = ((doc_token_starts > a0) & (doc_token_starts < a1)).sum()
        assert ids[r, 0] == CLS_ID and ids[r, n[r] - 1] == SEP_ID and n[r] <= T
        assert (ids[r, : n[r]] == SEP_ID).sum() == 1 + inner  # one [SEP] per document boundary
        assert n[r] == a1 - a0 + 2 + inner
        a, _, seps = ex.segments(i)
        np.testing.assert_array_equal(ids[r, 1 : n[r] - 1], np.insert(a, seps, SEP_ID))
    assert (batch["segment_ids"] == 0).all() and (batch["nsp_label"] == 0).all()
    assert np.mean(n / T) > 0.8
    # Every token of the split is in exactly one example (apart from cut long sentences).
    covered = (ex.pairs.a_end - ex.pairs.a_start).sum()
    assert covered > 0.97 * len(train_corpus.tokens)
    assert (ex.pairs.a_start[1:] >= ex.pairs.a_end[:-1]).all()


def _truncate_one_at_a_time(la, lb, max_tokens):
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncation_matches_bert_loop():
    rng = np.random.default_rng(0)
    la, lb, m = rng.integers(1, 300, size=(3, 500))
    fa, ba, fb, bb = pairs_lib.truncation(la, lb, m + 2, rng)
    assert min(fa.min(), ba.min(), fb.min(), bb.min()) >= 0
    want = [_truncate_one_at_a_time(*args) for args in zip(la, lb, m + 2, strict=True)]
    assert list(zip(la - fa - ba, lb - fb - bb, strict=True)) == want


def test_keyed_permutation_is_a_bijection_per_key():
    # One key computed with Python ints equals the same key computed in an array.
    scalar = keyed_random.derive_key(3, -1, 2**63, 11)
    array = keyed_random.derive_key(np.array([3]), -1, np.array([2**63], np.uint64), [11])
    assert scalar.dtype == np.uint64 and scalar[0] == array[0]
    for n in (1, 2, 3, 17, 1000, 4099):
        perm = keyed_random.permute(np.arange(n), n, keyed_random.derive_key(5, n))
        np.testing.assert_array_equal(np.sort(perm), np.arange(n))
    a, b = (keyed_random.permute(np.arange(1000), 1000, keyed_random.derive_key(k)) for k in (1, 2))
    assert (a != b).mean() > 0.9 and abs(np.corrcoef(a, np.arange(1000))[0, 1]) < 0.15


def test_mix_interleaves_by_weight():
    np.testing.assert_array_equal(stream.mix_counts([0.9, 0.1], period=10), [9, 1])
    np.testing.assert_array_equal(stream.mix_counts([1, 1, 1], period=10).sum(), 10)
    mix = stream.Mix.from_weights([3.0, 1.0])
    dataset, local = mix.locate(np.arange(40_000))
    assert (dataset == 1).mean() == 0.25
    for k in (0, 1):  # each dataset's positions are 0, 1, 2, ... in order
        np.testing.assert_array_equal(local[dataset == k], np.arange((dataset == k).sum()))
    assert np.abs(np.diff(np.flatnonzero(dataset == 1))).max() == 4  # spread evenly
