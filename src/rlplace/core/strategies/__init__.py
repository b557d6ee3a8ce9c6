"""Training strategies: how the ranks of a data-parallel actor hold and update a model (`actor.strategy`).

`ddp`: every rank holds a full replica (weights, gradients and AdamW state in float32) and gradients are averaged over
the ranks after each backward pass. `fsdp`: PyTorch's FSDP2 (`fully_shard`) shards parameters, gradients and optimizer
state over the ranks (units of decoder layers and embeddings, `fsdp.py`), so that a rank holds about 1/N of the training
state and a model whose state exceeds one device can still be trained (benchmarks/actor_memory.py); it also brings mixed
precision (bfloat16 compute over float32 master weights and reductions). Both train the same update: the gradient is the
mean over the ranks either way, and the checkpoint format (`torch.distributed.checkpoint`) is shared, so a run saved by
one strategy and rank count resumes under another.

Pure Python: entries are named by import path, so configs are checked before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplace.core.registry import Registry

AUTO = "auto"
"""`actor.strategy = auto`: fsdp where sharding pays (several ranks on GPUs) or is needed (bf16), else ddp."""
DTYPES = ("fp32", "bf16")
"""`actor.dtype` choices: the precision the forward and backward passes compute in."""


@dataclass(frozen=True)
class StrategyKind:
    """One training strategy."""

    factory: str
    """`module:Class` of its `rlplace.core.strategies.base.Strategy`."""
    dtypes: tuple[str, ...]
    """The `actor.dtype` values it trains in."""


STRATEGIES: Registry[StrategyKind] = Registry("actor.strategy")
STRATEGIES.register("ddp", StrategyKind("rlplace.core.strategies.replica:Replica", dtypes=("fp32",)))
STRATEGIES.register("fsdp", StrategyKind("rlplace.core.strategies.fsdp:FullyShard", dtypes=DTYPES))


def resolve(strategy: str, dtype: str, world_size: int, on_gpu: bool) -> str:
    """The strategy `actor.strategy` names, with `auto` resolved for a group of `world_size` ranks."""
    if strategy != AUTO:
        return strategy
    return "fsdp" if dtype != "fp32" or (on_gpu and world_size > 1) else "ddp"
