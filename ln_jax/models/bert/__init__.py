"""BERT: the encoder with its pretraining heads, pretraining as a task, HuggingFace conversion and
GLUE fine-tuning.
"""
