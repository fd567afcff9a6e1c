"""The unigram plateau: the MLM loss of a model that predicts token frequencies and nothing else.

A masked-LM run first falls to this loss and sits on it before it learns to use context, so a
result means something only when it ends clearly below it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def unigram_cross_entropy(train_tokens: np.ndarray, eval_tokens: np.ndarray, vocab: int) -> float:
    """Cross-entropy (nats/token) of `eval_tokens` under the add-one-smoothed unigram of
    `train_tokens`: -mean_t log p(eval_t), p(v) = (count_train(v) + 1) / (N + vocab).

    Args:
      train_tokens, eval_tokens: [N] and [M] token ids in [0, vocab).
    """
    counts = np.bincount(np.asarray(train_tokens, np.int64), minlength=vocab).astype(np.float64)
    log_p = np.log(counts + 1.0) - np.log(counts.sum() + vocab)
    return float(-log_p[np.asarray(eval_tokens, np.int64)].mean())


def corpus_plateau(data_cfg: Any) -> dict[str, Any]:
    """The unigram plateau of a data config's corpus: train-split frequencies, scored on the
    validation split's tokens (the tokens an MLM run predicts are a uniform sample of them).

    Returns:
      {"unigram_xent": nats, "vocab_size", "train_tokens", "eval_tokens"}.
    """
    from ln_jax.data import sources
    from ln_jax.data.bert import pipeline
    from ln_jax.data.tokenizer import get_tokenizer

    opened = sources.open_sources(data_cfg)
    tokenizer = get_tokenizer(data_cfg, opened)
    train, evals = [], []
    for source, _ in opened:
        train.append(pipeline.tokenized_corpus(source, data_cfg.train_split, tokenizer).tokens)
        evals.append(pipeline.tokenized_corpus(source, data_cfg.eval_split, tokenizer).tokens)
    train_tokens, eval_tokens = np.concatenate(train), np.concatenate(evals)
    vocab = tokenizer.vocab_size
    return {
        "unigram_xent": unigram_cross_entropy(train_tokens, eval_tokens, vocab),
        "vocab_size": int(vocab),
        "train_tokens": int(train_tokens.size),
        "eval_tokens": int(eval_tokens.size),
    }


def translation_plateau(data_cfg: Any) -> dict[str, Any]:
    """The unigram plateau of a translation corpus: the validation NLL per target token (EOS
    included, as the trainer counts it) of a decoder that predicts the training targets' token
    frequencies and reads neither the source nor its own prefix.

    A translation run whose validation NLL stays near it has learnt no more than the target
    language's word frequencies; a decoder that is a language model of the target sits below
    it without reading the source.

    Returns:
      {"unigram_xent": nats, "vocab_size", "train_tokens", "eval_tokens"}.
    """
    from ln_jax.data.translation import batches as translation

    train = translation.load_split(data_cfg, "train")
    evals = translation.load_split(data_cfg, "eval")
    eos = train.tokenizer.eos_id

    def with_eos(encoded: Any) -> np.ndarray:
        return np.concatenate([np.asarray(encoded.tgt), np.full(len(encoded), eos, np.int64)])

    train_tokens, eval_tokens = with_eos(train.encoded), with_eos(evals.encoded)
    vocab = train.tokenizer.vocab_size
    return {
        "unigram_xent": unigram_cross_entropy(train_tokens, eval_tokens, vocab),
        "vocab_size": int(vocab),
        "train_tokens": int(train_tokens.size),
        "eval_tokens": int(eval_tokens.size),
    }
