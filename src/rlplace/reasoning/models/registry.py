"""The reasoning model registry: `model.name` -> how a run gets its starting model folder.

A kind either builds a fresh model (and tokenizer) that pretraining then fine-tunes on the task to partial accuracy,
cached under outputs/pretrained/ (`rlplace.reasoning.pretrain`), or is only ever loaded from `model.path` (`hf`: any
local Hugging Face folder). Builders are named by import path, so this registry imports neither torch nor
transformers and configs are checked with it before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplace.core.registry import Registry


@dataclass(frozen=True)
class ModelKind:
    build: str | None = None
    """`module:function` writing a fresh model and tokenizer into a folder, `(folder, prompt source, seed) -> None`;
    None: the kind is loaded from `model.path` only."""
    shape: str | None = None
    """`module:Class` of the built model's size (a dataclass): it keys the pretrained-model cache."""


MODELS: Registry[ModelKind] = Registry("model.name")
MODELS.register(
    "tiny_lm", ModelKind("rlplace.reasoning.models.tiny_lm:build", "rlplace.reasoning.models.tiny_lm:TinyLMShape")
)
MODELS.register(
    "tiny_qwen2",
    ModelKind("rlplace.reasoning.models.tiny_qwen2:build", "rlplace.reasoning.models.tiny_qwen2:TinyQwen2Shape"),
)
MODELS.register("hf", ModelKind())
