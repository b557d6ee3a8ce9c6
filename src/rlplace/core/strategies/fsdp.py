"""`actor.strategy = fsdp`: PyTorch's FSDP2 shards parameters, gradients and optimizer state over the ranks.

One FSDP unit per decoder layer (the classes a Hugging Face model lists in `_no_split_modules`), one each for untied
input and output embeddings, and the root for what remains (final norm, tied embeddings): a rank gathers one unit's
weights at a time for its forward and backward passes and frees them after, so its peak holds its shards plus about
one unit in full. Embeddings get units of their own because a vocabulary-sized matrix is often larger than a layer,
and the root's weights stay gathered from the forward pass to the backward one (benchmarks/actor_memory.py measures
the peak). Gradients are reduce-scattered (averaged) during the backward pass, and the optimizer steps on each rank's
shards alone. With `actor.dtype = bf16` the gathered weights compute in bfloat16 while the shards, the optimizer and
the gradient reduction stay float32 (FSDP2's `MixedPrecisionPolicy`); outputs come back in float32, so log-probs and
losses are taken at full precision.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rlplace.core.strategies.base import Strategy


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The submodules of the layer classes that `model`'s Hugging Face parts name as indivisible
    (`_no_split_modules`): the decoder layers, the unit a transformer is sharded by."""
    names = {name for module in model.modules() for name in getattr(module, "_no_split_modules", None) or ()}
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    return layers


def embeddings(model: nn.Module) -> list[nn.Module]:
    """The input and output embeddings of `model`'s outermost Hugging Face part, unless they share their weight."""
    part = next((m for m in model.modules() if hasattr(m, "get_input_embeddings") and hasattr(m, "config")), None)
    if part is None or getattr(part.config, "tie_word_embeddings", False):
        return []
    found = [part.get_input_embeddings(), getattr(part, "get_output_embeddings", lambda: None)()]
    return [module for module in found if module is not None]


class FullyShard(Strategy):
    """FSDP2 over this group's default process group (one mesh dimension: every rank holds one shard)."""

    collective_passes: ClassVar[bool] = True

    def wrap(self, model: nn.Module, trained: bool = True) -> nn.Module:
        """A frozen model's root unit is resharded after each forward pass, as the others are: FSDP2 keeps a root's
        weights gathered after the forward pass for the backward one, which a frozen model never runs, so they would
        stay whole on the device between passes and phases (tied embeddings: a vocabulary matrix)."""
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        inner = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        for unit in decoder_layers(model) + embeddings(model):
            fully_shard(unit, mesh=mesh, mp_policy=inner)
        outer = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)
        fully_shard(model, mesh=mesh, mp_policy=outer, reshard_after_forward=None if trained else True)
        return model

    def reduce_grads(self, model: nn.Module) -> None:
        """Nothing left to do: the backward pass reduce-scattered them."""

    def sync_grads(self, model: nn.Module, enabled: bool) -> None:
        assert isinstance(model, FSDPModule), "wrap the model first"
        model.set_requires_gradient_sync(enabled)

    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
