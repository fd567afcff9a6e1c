"""Pretraining data: TFDS corpora, a sentencepiece tokenizer, BERT examples, a grain loader.

Entry points:
  make_pipeline(cfg, split=, seed=, mesh=)  -> (iterator of global jax.Array batches, tokenizer)
  make_host_pipeline(cfg, split=, seed=, process_index=, process_count=) -> (numpy, tokenizer)

Importing this package registers the TFDS builders `ln_jax_pydocs` and `ln_jax_textdir`.
"""

from ln_jax.data.config import DataConfig, parse_dataset
from ln_jax.data.corpus import LnJaxPydocs, LnJaxTextdir, split_sentences
from ln_jax.data.loader import (
    EvalBatches,
    GlobalBatchIterator,
    HostBatchIterator,
    check_global_batch,
    host_rows,
    make_host_pipeline,
    make_pipeline,
)
from ln_jax.data.pretraining import PretrainingExamples
from ln_jax.data.sources import DatasetNotPreparedError, open_source
from ln_jax.data.tokenizer import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    UNK_ID,
    Tokenizer,
    get_tokenizer,
    train_sentencepiece,
)

__all__ = [
    "CLS_ID",
    "MASK_ID",
    "PAD_ID",
    "SEP_ID",
    "UNK_ID",
    "DataConfig",
    "DatasetNotPreparedError",
    "EvalBatches",
    "GlobalBatchIterator",
    "HostBatchIterator",
    "LnJaxPydocs",
    "LnJaxTextdir",
    "PretrainingExamples",
    "Tokenizer",
    "check_global_batch",
    "get_tokenizer",
    "host_rows",
    "make_host_pipeline",
    "make_pipeline",
    "open_source",
    "parse_dataset",
    "split_sentences",
    "train_sentencepiece",
]
