"""Shared fixtures of the data tests: one prepared corpus and tokenizer per test session.

Test modules load them as a plugin, `pytest_plugins = ("tests.data_fixtures",)` (tests/conftest.py
belongs to the rest of the project). Helpers are fixtures too (`make_config`, `text_maker`), so
that no test module imports this file before pytest does. The expensive parts are memoised
once per process.
"""

from __future__ import annotations

import atexit
import functools
import random
import shutil
import tempfile

import pytest

from ln_jax.data import sources
from ln_jax.data.bert import examples as pretraining
from ln_jax.data.config import DataConfig
from ln_jax.data.tokenizer import Tokenizer, get_tokenizer

# The default size: on this corpus a unigram model of 8000 trains faster (~1 s) than of 1000.
TEST_VOCAB = 8000


@functools.cache
def _prepared_dir() -> str:
    # One prepared corpus for the whole session: generating it parses the stdlib (seconds).
    path = tempfile.mkdtemp(prefix="ln_jax_data_tests_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    sources.open_source("ln_jax_pydocs", data_dir=path)
    return path


@functools.cache
def _tokenizer(path: str) -> Tokenizer:
    return get_tokenizer(test_config(path))


@functools.cache
def _train_corpus(path: str) -> pretraining.TokenizedCorpus:
    from ln_jax.data.bert.pipeline import tokenized_corpus

    source = sources.open_source("ln_jax_pydocs", data_dir=path)
    return tokenized_corpus(source, "train", _tokenizer(path))


def test_config(data_dir: str, **overrides) -> DataConfig:
    """The tests' DataConfig: the embedded corpus, the default unigram vocabulary, batch 8."""
    base = dict(data_dir=data_dir, vocab_size=TEST_VOCAB, global_batch_size=8)
    return DataConfig(**(base | overrides))


test_config.__test__ = False  # a helper, not a test


@pytest.fixture
def make_config(data_dir):
    """`make_config(**overrides)` -> the tests' DataConfig over the shared prepared corpus."""
    return functools.partial(test_config, data_dir)


@pytest.fixture
def text_maker():
    """`text_maker(seed, sentences)` -> made-up English text."""
    return synthetic_text


@pytest.fixture(scope="session")
def data_dir() -> str:
    """TFDS data dir holding the prepared `ln_jax_pydocs` (shared; do not write into it)."""
    return _prepared_dir()


@pytest.fixture
def tokenizer(data_dir) -> Tokenizer:
    """The unigram tokenizer (vocab TEST_VOCAB) trained on the corpus's train split."""
    return _tokenizer(data_dir)


@pytest.fixture
def train_corpus(data_dir) -> pretraining.TokenizedCorpus:
    """The tokenised train split."""
    return _train_corpus(data_dir)


def synthetic_text(seed: int, sentences: int) -> str:
    """Made-up English sentences (for `.txt` folders): nothing copied from anywhere."""
    rng = random.Random(seed)
    subjects = ["The gardener", "A small robot", "Our neighbour", "The old clock", "Every river"]
    verbs = ["watches", "repairs", "remembers", "follows", "paints"]
    objects = ["the quiet harbour", "a yellow kite", "the morning train", "seven lanterns"]
    tails = ["before dawn", "with great care", "in the rain", "without a word"]
    out = []
    for _ in range(sentences):
        parts = (rng.choice(subjects), rng.choice(verbs), rng.choice(objects), rng.choice(tails))
        out.append(" ".join(parts) + ".")
    return " ".join(out)
