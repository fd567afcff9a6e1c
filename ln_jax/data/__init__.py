"""Data: what every family reads (sources, corpora, the sentencepiece tokenizer, the example
stream, global batches over a mesh) and, in a package per family, what each makes of it.

  ln_jax.data            config.py (DataConfig: the text, tokenizer, batch size and loading
                         every family shares), sources.py / corpus.py / sitedocs.py (TFDS and
                         the embedded corpora), tokenizer.py (sentencepiece), keyed_random.py,
                         stream.py (the endless keyed stream of a mix), host_iterator.py (grain
                         reading, worker processes, the checkpointable state), batches.py
                         (which rows a process loads, global jax.Arrays, device prefetch)
  ln_jax.data.bert       options.py (PretrainingOptions: BERT's section "bert", its data half),
                         examples.py (MLM/NSP examples a batch at a time), pairs.py (the pair
                         index), pipeline.py (BERT pretraining's pipeline), glue.py (GLUE and the
                         offline pair task of fine-tuning)
  ln_jax.data.translation  parallel.py / gettext.py (parallel text), joint_tokenizer.py /
                         marian_vocab.py (its tokenizers), batches.py (token-budget batches)

Entry points:
  make_pipeline(cfg, examples=, split=, seed=, mesh=)
      -> (iterator of global jax.Array batches, tokenizer)  (`examples`: PretrainingOptions)
  make_host_pipeline(cfg, examples=, split=, seed=, process_index=, process_count=)
      -> (numpy, tokenizer)
  make_translation_pipeline(cfg, split=, seed=, mesh=, max_tokens=, max_source_length=,
      max_target_length=) -> (translation batches, tokenizer)

The names below load their module on first use (PEP 562), so that `ln_jax.data.config` (the
typed `DataConfig`, imported by `ln_jax.config.run`) stays cheap to import: TFDS, grain and
sentencepiece load only when data is really read. Reading a corpus (`open_source`,
`make_pipeline`) imports `ln_jax.data.corpus` and `ln_jax.data.sitedocs`, which register the TFDS
builders `ln_jax_pydocs`, `ln_jax_textdir` and `ln_jax_sitedocs`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "config": ("DataConfig", "parse_dataset"),
    "corpus": ("LnJaxPydocs", "LnJaxTextdir", "split_sentences"),
    "batches": ("GlobalBatchIterator", "check_global_batch", "host_rows"),
    "host_iterator": ("HostBatchIterator",),
    "bert.options": ("PretrainingOptions",),
    "bert.examples": ("PretrainingExamples",),
    "bert.pipeline": ("EvalBatches", "make_host_pipeline", "make_pipeline"),
    "translation.gettext": ("LnJaxGettext",),
    "translation.joint_tokenizer": ("JointTokenizer", "SymbolTokenizer"),
    "translation.parallel": ("ParallelDataError", "ParallelSource", "open_parallel"),
    "sitedocs": ("LnJaxSitedocs",),
    "sources": ("DatasetNotPreparedError", "open_source"),
    "translation.batches": (
        "TranslationBatchIterator",
        "TranslationEvalBatches",
        "make_host_translation_pipeline",
        "make_translation_pipeline",
    ),
    "tokenizer": (
        "CLS_ID",
        "MASK_ID",
        "PAD_ID",
        "SEP_ID",
        "UNK_ID",
        "Tokenizer",
        "get_tokenizer",
        "train_sentencepiece",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ln_jax.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ln_jax.data.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
