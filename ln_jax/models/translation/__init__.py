"""Machine translation: the encoder-decoder family (`model`), its own settings (`options`) and
greedy/beam search with the incremental decoder (`search`)."""
