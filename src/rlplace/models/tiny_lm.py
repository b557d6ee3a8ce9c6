"""The tiny language model of the reasoning tasks, and the checks every `model.path` goes through.

`build_tiny_lm` writes a randomly initialised Llama-architecture causal LM with the character tokenizer into an
ordinary Hugging Face folder (Llama rather than Qwen2 because transformers replaces the tokenizer of a `qwen2`
folder with Qwen's byte-level one, which would drop the character vocabulary), so the same code path (transformers for training and the hf backend, vLLM for the
vllm backend) serves it and any real checkpoint such as Qwen2.5-0.5B. Input and output embeddings are untied and
heads are 32 wide: the shapes vLLM's kernels and weight loader expect of a real model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlplace.config import ConfigError

from .char_tokenizer import SPECIAL_TOKENS, build_char_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A folder holding one of these (next to tokenizer_config.json) carries a tokenizer transformers can load."""


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
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_model_folder(path: str | Path | None, key: str = "model.path") -> Path:
    """Refuse, naming `key`, a path that is missing or is not a Hugging Face model folder with a tokenizer."""
    if path is None or str(path) == "":
        raise ConfigError(f"{key} = {path!r} is invalid: set it to a Hugging Face model folder")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is invalid: no such folder")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{key} = {str(path)!r} is invalid: not a Hugging Face model folder (no config.json)")
    try:
        json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{key} = {str(path)!r} is invalid: config.json is not JSON ({err})") from err
    if not (folder / "tokenizer_config.json").is_file() or not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{key} = {str(path)!r} is invalid: tokenizer missing (needs tokenizer_config.json and one of "
            f"{', '.join(TOKENIZER_FILES)})"
        )
    return folder


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, padding on the left so that batched prompts end where generation starts."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, device: torch.device | str = "cpu") -> PreTrainedModel:
    """The folder's causal LM in float32 on `device`, in eval mode (callers switch to train mode to train)."""
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    return model.to(device).eval()
