"""BERT examples: layout, segment ids, NSP balance, masking statistics, reproducible masks."""

from __future__ import annotations

import numpy as np
import pytest

from ln_jax.data import pretraining as pt
from ln_jax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

pytest_plugins = ("tests.data_fixtures",)  # fixtures: tokenizer, train_corpus, make_config

T, P = 128, 20


def _examples(corpus, tok, cfg, **kw) -> pt.PretrainingExamples:
    args = dict(max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob, nsp=cfg.nsp)
    return pt.PretrainingExamples(corpus, pt.masking_spec(tok, cfg), **(args | kw))


@pytest.fixture
def nsp_examples(train_corpus, tokenizer, make_config):
    return _examples(train_corpus, tokenizer, make_config(), seed=0)


def _unmasked(ex: dict) -> np.ndarray:
    ids = ex["input_ids"].copy()
    real = ex["masked_weights"] > 0
    ids[ex["masked_positions"][real]] = ex["masked_ids"][real]
    return ids


def test_shapes_and_dtypes(nsp_examples):
    ex = nsp_examples.example(0, 0)
    want = {
        "input_ids": ((T,), np.int32),
        "segment_ids": ((T,), np.int32),
        "attention_mask": ((T,), np.int32),
        "masked_positions": ((P,), np.int32),
        "masked_ids": ((P,), np.int32),
        "masked_weights": ((P,), np.float32),
        "nsp_label": ((), np.int32),
    }
    assert {k: (v.shape, v.dtype) for k, v in ex.items()} == want


def test_cls_a_sep_b_sep_layout_and_segment_ids(nsp_examples):
    for i in range(0, len(nsp_examples), 97):
        a, b, _ = nsp_examples.segments(i)
        ex = nsp_examples.example(i, 0)
        n = len(a) + len(b) + 3
        assert 3 < n <= T and len(a) >= 1 and len(b) >= 1
        ids = _unmasked(ex)
        np.testing.assert_array_equal(ids[:n], np.concatenate([[CLS_ID], a, [SEP_ID], b, [SEP_ID]]))
        assert (ids[n:] == PAD_ID).all()
        want_segments = np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1), np.zeros(T - n)]
        np.testing.assert_array_equal(ex["segment_ids"], want_segments)
        np.testing.assert_array_equal(ex["attention_mask"], np.arange(T) < n)


def test_next_sentence_pairs_are_true_or_random(nsp_examples, train_corpus):
    pairs = nsp_examples.pairs
    doc_of_token = np.searchsorted(
        train_corpus.sent_starts[train_corpus.doc_starts],
        np.arange(len(train_corpus.tokens)),
        "right",
    )
    same_doc = doc_of_token[pairs.a_start] == doc_of_token[pairs.b_start]
    follows = pairs.b_start >= pairs.a_end
    is_next = pairs.nsp_label == 0
    assert (same_doc & follows)[is_next].all()
    assert not same_doc[~is_next].any()  # random B comes from another document
    assert (pairs.a_end - pairs.a_start + pairs.b_end - pairs.b_start <= T - 3).all()


def test_nsp_label_is_about_half(nsp_examples):
    labels = nsp_examples.pairs.nsp_label
    assert len(labels) > 3000
    assert abs(labels.mean() - 0.5) < 0.03, labels.mean()


def test_short_sequences_appear(nsp_examples):
    lengths = np.array([nsp_examples.example(i)["attention_mask"].sum() for i in range(1000)])
    assert (lengths == T).mean() > 0.05  # full-length pairs
    assert (lengths < T // 2).mean() > 0.05  # short targets and short documents


def _masking_stats(examples, count, epoch=0):
    n_real = n_masked = n_mask_tok = n_same = n_random = 0
    for i in range(count):
        ex = examples.example(i, epoch)
        orig, real = _unmasked(ex), ex["masked_weights"] > 0
        pos = ex["masked_positions"][real]
        assert (np.diff(pos) > 0).all()
        assert not np.isin(orig[pos], [PAD_ID, CLS_ID, SEP_ID]).any()
        assert (ex["masked_positions"][~real] == 0).all() and (ex["masked_ids"][~real] == 0).all()
        new = ex["input_ids"][pos]
        assert (new[(new != MASK_ID) & (new != orig[pos])] >= NUM_SPECIAL).all()
        n_real += ex["attention_mask"].sum()
        n_masked += real.sum()
        n_mask_tok += (new == MASK_ID).sum()
        n_same += (new == orig[pos]).sum()
        n_random += ((new != MASK_ID) & (new != orig[pos])).sum()
    return n_real, n_masked, n_mask_tok / n_masked, n_same / n_masked, n_random / n_masked


def test_masking_statistics(nsp_examples):
    n_real, n_masked, mask, same, rand = _masking_stats(nsp_examples, 400)
    assert n_real >= 10_000 and n_masked >= 1500
    assert abs(n_masked / n_real - 0.15) < 0.01
    assert abs(mask - 0.8) < 0.03
    assert abs(same - 0.1) < 0.025  # (a random id equal to the original is rare)
    assert abs(rand - 0.1) < 0.025


def test_max_predictions_caps_masks(train_corpus, tokenizer, make_config):
    cfg = make_config(max_predictions_per_seq=5)
    ex = _examples(train_corpus, tokenizer, cfg, seed=0)
    weights = np.stack([ex.example(i)["masked_weights"] for i in range(200)])
    assert weights.shape == (200, 5) and weights.sum(1).max() == 5


def test_same_seed_same_examples_new_epoch_new_masks(
    train_corpus, tokenizer, make_config, nsp_examples
):
    again = _examples(train_corpus, tokenizer, make_config(), seed=0)
    other_seed = _examples(train_corpus, tokenizer, make_config(), seed=1)
    assert len(again) == len(nsp_examples)
    changed = 0
    for i in range(0, 200, 7):
        first, second = nsp_examples.example(i, 3), again.example(i, 3)
        for key in first:
            np.testing.assert_array_equal(first[key], second[key])
        later = nsp_examples.example(i, 4)
        np.testing.assert_array_equal(_unmasked(later), _unmasked(first))  # same pair
        changed += not np.array_equal(later["masked_positions"], first["masked_positions"])
    assert changed >= 25  # of 29: masks differ between epochs
    starts = nsp_examples.pairs.a_start
    assert not np.array_equal(other_seed.pairs.a_start[:100], starts[:100])


def test_whole_word_masking(train_corpus, tokenizer, make_config):
    ex = _examples(train_corpus, tokenizer, make_config(whole_word_masking=True), seed=0)
    ws = tokenizer.word_start
    n_real = n_masked = 0
    for i in range(300):
        item = ex.example(i)
        ids, real = _unmasked(item), item["masked_weights"] > 0
        n = int(item["attention_mask"].sum())
        masked = np.zeros(T, bool)
        masked[item["masked_positions"][real]] = True
        maskable = ~np.isin(ids, [PAD_ID, CLS_ID, SEP_ID]) & (np.arange(T) < n)
        continues = maskable[1:] & maskable[:-1] & ~ws[ids[1:]]  # piece j+1 continues word of j
        assert (masked[1:][continues] == masked[:-1][continues]).all()
        n_real, n_masked = n_real + n, n_masked + real.sum()
    assert 0.12 < n_masked / n_real <= 0.151


def test_packed_full_sentences_without_nsp(train_corpus, tokenizer, make_config):
    cfg = make_config(nsp=False)
    ex = _examples(train_corpus, tokenizer, cfg, seed=0)
    doc_token_starts = train_corpus.sent_starts[train_corpus.doc_starts[:-1]]
    fill = []
    for i in range(0, len(ex), 13):
        item = ex.example(i, 0)
        ids, n = _unmasked(item), int(item["attention_mask"].sum())
        a0, a1 = ex.pairs.a_start[i], ex.pairs.a_end[i]
        inner = ((doc_token_starts > a0) & (doc_token_starts < a1)).sum()
        assert ids[0] == CLS_ID and ids[n - 1] == SEP_ID and n <= T
        assert (ids[:n] == SEP_ID).sum() == 1 + inner  # one [SEP] per document boundary
        assert n == a1 - a0 + 2 + inner
        assert (item["segment_ids"] == 0).all() and item["nsp_label"] == 0
        fill.append(n / T)
    assert np.mean(fill) > 0.8
    # Every token of the split is in exactly one example (apart from cut long sentences).
    covered = (ex.pairs.a_end - ex.pairs.a_start).sum()
    assert covered > 0.97 * len(train_corpus.tokens)


def _truncate_one_at_a_time(la, lb, max_tokens):
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncation_matches_bert_loop():
    rng = np.random.default_rng(0)
    for la, lb, m in rng.integers(1, 300, size=(500, 3)):
        fa, ba, fb, bb = pt.truncation(int(la), int(lb), int(m) + 2, rng)
        assert min(fa, ba, fb, bb) >= 0
        assert (la - fa - ba, lb - fb - bb) == _truncate_one_at_a_time(la, lb, m + 2)
