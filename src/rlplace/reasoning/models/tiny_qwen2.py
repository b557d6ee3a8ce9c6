"""A tiny Qwen2-architecture LM with a byte-level BPE tokenizer trained on the task's own text, and a chat template.

What a user's real model folder has (Qwen2 weights, a BPE `tokenizer.json`, a ChatML chat template), only small:
the reasoning code paths that real checkpoints take (chat-template rendering, BPE decoding, `####` and `\\boxed{}`
answers in free text) run on it in seconds on a CPU. The tokenizer is trained with the `tokenizers` library on the
texts it is given (the task's training prompts and answers), so no vocabulary is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlplace.reasoning.tasks.prompts import PromptSource

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
"""Qwen's special tokens: padding, and a turn's start and end (a response ends with `<|im_end|>`, its EOS)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, as Qwen's instruct models format a conversation."""


@dataclass(frozen=True)
class TinyQwen2Shape:
    """Size of the tiny Qwen2; about 0.5 M parameters with the default vocabulary."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    """Heads 32 wide, the narrowest vLLM's kernels take."""
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 512


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 and Qwen style: any text encodes) trained on `texts`, with Qwen's special
    tokens and the ChatML template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=IM_END, pad_token=END_OF_TEXT)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2(
    folder: str | Path, texts: Iterable[str], shape: TinyQwen2Shape = TinyQwen2Shape(), seed: int = 0
) -> Path:
    """Write a randomly initialised tiny Qwen2 and a tokenizer trained on `texts` into `folder`; return it."""
    tokenizer = train_tokenizer(texts, shape.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    folder = Path(folder)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TOKENIZER_TEXTS = 4096
"""Training problems the tokenizer is trained on (drawn through the task's batches: every problem of a smaller
file, epoch by epoch)."""


def build(folder: str | Path, source: PromptSource, seed: int) -> None:
    """The `tiny_qwen2` model kind's builder (`models.registry`): its tokenizer learns the task's training text."""
    problems = source.train_batch(0, TOKENIZER_TEXTS)
    build_tiny_qwen2(folder, [text for p in problems for text in (p.prompt, p.answer)], TinyQwen2Shape(), seed)
