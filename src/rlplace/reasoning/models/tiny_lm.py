"""The tiny language model of the reasoning tasks, and how any model folder is loaded.

`build_tiny_lm` writes a randomly initialised Llama-architecture causal LM with the character tokenizer into an
ordinary Hugging Face folder, so the same code path (transformers for training and the hf backend, vLLM for the
vllm backend) serves it and any real checkpoint such as Qwen2.5-0.5B. Llama rather than Qwen2: transformers gives a
`qwen2` folder Qwen's byte-level tokenizer whatever the folder holds, which would drop the character vocabulary.
Input and output embeddings are untied and heads are 32 wide: the shapes vLLM's kernels expect of a real model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)
from transformers.utils import logging as transformers_logging

from .char_tokenizer import SPECIAL_TOKENS, build_char_tokenizer

# Every process that loads or saves a model goes through this module. Ray forwards each worker's output to the
# driver's console, where transformers' per-load progress bars would interleave with the run's own progress line.
transformers_logging.disable_progress_bar()


@dataclass(frozen=True)
class TinyLMShape:
    """Size of the tiny LM; the defaults (about 1.2 M parameters) learn 2-digit arithmetic in minutes on a CPU."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 128


def build_tiny_lm(folder: str | Path, shape: TinyLMShape = TinyLMShape(), seed: int = 0) -> Path:
    """Write a fresh tiny LM (weights, config, generation config, tokenizer) into `folder` and return it."""
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=SPECIAL_TOKENS.index(tokenizer.pad_token),
        bos_token_id=SPECIAL_TOKENS.index(tokenizer.bos_token),
        eos_token_id=SPECIAL_TOKENS.index(tokenizer.eos_token),
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build(folder: str | Path, source: object, seed: int) -> None:
    """The `tiny_lm` model kind's builder (`models.registry`): its character vocabulary needs no text to learn from."""
    build_tiny_lm(folder, TinyLMShape(), seed)


def causal_lm_skeleton(path: str | Path) -> PreTrainedModel:
    """The folder's causal LM built from its config on the meta device, in float32: its modules, names and shapes
    without weights (to check names against, or to fill from a checkpoint after `to_empty`)."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)


def load_causal_lm(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """The folder's causal LM in `dtype` (float32 unless a caller only generates) on `device`, in eval mode
    (callers switch to train mode to train)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()
