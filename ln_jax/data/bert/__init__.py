"""BERT's data: how its pretraining examples are made (masks, sentence pairs: `examples`,
`pairs`, their options `options`), its pretraining pipeline (`pipeline.make_pipeline`) and the
GLUE / offline pair tasks it is fine-tuned on (`glue`). What every family shares (sources,
tokenizer, the example stream, global batches) is `ln_jax.data`'s.
"""
