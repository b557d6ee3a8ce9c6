"""A tiny reward model built here from a config (no download): a one-layer Qwen2 sequence classifier with one output,
reading the tiny LM's character tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from rlplace.reasoning.models.char_tokenizer import build_char_tokenizer


def build_reward_model(folder: Path, seed: int = 0) -> Path:
    """Write the classifier and its tokenizer into `folder` and return it."""
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
