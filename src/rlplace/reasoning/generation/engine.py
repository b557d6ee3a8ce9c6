"""What the LLM rollout needs of a generation engine, and the factory that builds the chosen backend's.

The backends (`backends.BACKENDS`: `hf`, transformers with a decoding loop of ours; `vllm`, vLLM's offline engine)
serve the same contract. Sampling randomness is keyed by (seed, sample id) per sequence, so what a response turns out
to be does not depend on which batch, micro-batch or rank generated it, and a run is reproducible however it is
placed.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from rlplace.core.rng import splitmix64
from rlplace.reasoning.config import LoRAConfig

from .backends import BACKENDS


class GenerationEngine(Protocol):
    """Generates responses token by token; weights can be replaced while it keeps running."""

    eos_ids: list[int]
    """The token ids that end a response (`eos_ids`)."""

    def generate(
        self,
        prompts: list[list[int]],
        sample_ids: list[int],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
        ignore_eos: bool = False,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_ids: Sequence[int] = (),
        logprobs: bool = False,
        on_done: Callable[[int, list[int]], None] | None = None,
    ) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
        """Each prompt's response token ids (no padding; ending with EOS where it stopped on EOS).

        `prompts` are token ids including BOS. `max_new_tokens` is one limit for every sequence or one per sequence.
        Temperature 0 is greedy decoding. Sampling draws from the `top_k` most likely tokens (0: all) and, of those,
        the fewest whose probability reaches `top_p`, renormalised. Sampling randomness is keyed by (seed,
        sample_ids[i]) for sequence i. A sequence also stops after any of `stop_ids` (a tool call's end token),
        which ends its response as EOS does. `ignore_eos` decodes `max_new_tokens` tokens whatever they are (for
        benchmarks, where every response should have the same length). With `logprobs`, also each token's log-prob
        under the distribution it was drawn from (temperature applied, then top-k and top-p, renormalised; greedy:
        under the plain softmax), as `(responses, logprobs)`. `on_done(i, response)` is called once for each
        sequence i with its response, as soon as the engine knows it has ended (while the others still decode) and at
        the latest before `generate` returns: what follows a turn (a tool call) can start early.
        """
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place with `weights`, every tensor of the model by its Hugging Face name, each loaded
        as it comes (weight sync streams them bucket by bucket: `core.weights.received_tensors`); the engine keeps
        running. An engine built with `EngineOptions.adapters` takes every adapter tensor instead."""
        ...

    def sleep(self) -> None:
        """Free device memory while a collocated trainer needs it; no-op on CPU, where nothing is scarce."""
        ...

    def wake_up(self) -> None:
        """Restore what `sleep` freed; no-op on CPU."""
        ...

    def close(self) -> None:
        """Release the engine's threads and memory; the engine is unusable afterwards."""
        ...


def sequence_seed(seed: int, sample_id: int) -> int:
    """A 63-bit seed for sequence `sample_id` of a run seeded `seed` (splitmix64 of both: nearby ids decorrelate)."""
    mask = (1 << 64) - 1
    key = splitmix64(splitmix64(np.array([seed & mask], dtype=np.uint64)) + np.uint64(sample_id & mask))
    return int(key[0]) >> 1


def eos_ids(model_path: str | Path, config) -> list[int]:
    """The ids that end a response: the model config's `eos_token_id` and those of the folder's
    generation_config.json, which transformers' `generate` and vLLM stop on too. Chat models often name the token that
    ends their turn only there (Llama 3 Instruct's <|eot_id|>, Gemma's <end_of_turn>): without it a response would
    run on to max_new_tokens past its answer."""
    ids = _listed(config.eos_token_id)
    generation = Path(model_path) / "generation_config.json"
    if generation.is_file():
        ids += _listed(json.loads(generation.read_text()).get("eos_token_id"))
    return list(dict.fromkeys(ids))


def _listed(ids: int | list[int] | None) -> list[int]:
    """An `eos_token_id` setting (one id, a list of them, or none) as a list."""
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, list | tuple) else [int(ids)]


def check_lengths(
    prompts: list[list[int]], sample_ids: list[int], max_new_tokens: int | Sequence[int], max_model_len: int
) -> list[int]:
    """Refuse a request either backend could not serve whole, naming the sequence, before any work is done; returns
    each sequence's limit of new tokens."""
    if len(prompts) != len(sample_ids):
        raise ValueError(f"{len(prompts)} prompts but {len(sample_ids)} sample ids")
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(limits)} limits of new tokens")
    for prompt, sample_id, limit in zip(prompts, sample_ids, limits, strict=True):
        if limit < 1:
            raise ValueError(f"sample {sample_id}: max_new_tokens = {limit} is invalid: at least 1")
        if not prompt or len(prompt) + limit > max_model_len:
            raise ValueError(
                f"sample {sample_id}: prompt of {len(prompt)} tokens plus max_new_tokens = {limit} does not "
                f"fit max_model_len = {max_model_len}"
            )
    return limits


@dataclass(frozen=True)
class EngineOptions:
    """The rollout section's engine settings; each backend reads those it has."""

    gpu_memory_utilization: float = 0.4
    """vllm on a GPU: the share of device memory it may take (weights and KV cache); hf allocates as it goes."""
    cuda_graphs: bool = True
    """hf on a CUDA device: decode with a static KV cache, each step replayed as a CUDA graph (vllm captures its
    own graphs)."""
    compile_step: bool = False
    """hf with cuda_graphs: compile the decode step with `torch.compile` before capturing it."""
    tensor_parallel_size: int = 1
    """Ranks one engine is split over (backends with `tensor_parallel`): this process must have joined a default
    torch.distributed group of that many ranks, each building its part of the same engine."""
    adapters: LoRAConfig | None = None
    """The LoRA adapters the engine applies over the model folder's weights (`actor.lora.sync: adapters`): its
    `load_weights` then takes those adapters alone, as `lora.export` sends them."""


def make_engine(
    backend: str,
    model_path: str,
    device: torch.device | str,
    *,
    max_model_len: int | None = None,
    options: EngineOptions | None = None,
) -> GenerationEngine:
    """The `backend` engine (`BACKENDS`) serving the Hugging Face folder `model_path` on `device`.

    `max_model_len` (prompt plus response tokens) defaults to the model's `max_position_embeddings`.
    """
    options = options or EngineOptions()
    if options.tensor_parallel_size > 1 and not BACKENDS[backend].tensor_parallel:
        raise ValueError(f"the {backend} backend cannot split an engine over {options.tensor_parallel_size} ranks")
    module = importlib.import_module(BACKENDS[backend].module)
    return module.build(model_path, torch.device(device), max_model_len, options)
