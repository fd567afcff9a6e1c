"""ln_jax: LayerNorm placement in Transformers (Post-LN, Pre-LN, ...) in JAX / Flax NNX."""

from ln_jax.bert import BertEncoder, BertForPreTraining, create_model
from ln_jax.config import PLACEMENTS, SIZES, ModelConfig, model_config

__all__ = [
    "PLACEMENTS",
    "SIZES",
    "BertEncoder",
    "BertForPreTraining",
    "ModelConfig",
    "create_model",
    "model_config",
]
