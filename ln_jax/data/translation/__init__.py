"""Translation's data: parallel text (`parallel`: TFDS, files, the gettext catalogues of
`gettext`, synthetic tasks), its tokenizers (`joint_tokenizer`, `marian_vocab`) and its
token-budget batches in length buckets (`batches.make_translation_pipeline`). What every family
shares (sources, the sentencepiece trainer, global batches) is `ln_jax.data`'s.
"""
