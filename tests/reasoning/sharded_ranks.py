"""Actor ranks as processes of their own (torch.multiprocessing, gloo over a file), training a tiny Qwen2 with
`llm_update` under a training strategy, then scoring with an inference rank's frozen copy of the policy under the same
strategy: what tests/reasoning/test_sharded.py compares across strategies, rank counts, precisions and checkpoints.
Each rank writes what it measured to `<out>/<name>.rank<r>.pt`."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from rlplace.core.data_parallel import Shard, most_over_ranks
from rlplace.core.offload import HostCopies, _tensors, move
from rlplace.core.sharded import gathered
from rlplace.core.strategies.base import Strategy, build_strategy
from rlplace.core.strategies.training_state import load_training_state, save_training_state
from rlplace.core.weights import load_whole
from rlplace.reasoning import lora
from rlplace.reasoning.batch import SequenceBatch, response_logprobs
from rlplace.reasoning.config import LoRAConfig, ReasoningAlgorithmConfig
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.models.tiny_qwen2 import TinyQwen2Shape, build_tiny_qwen2
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.models.value_model import ValueModel
from rlplace.reasoning.streams import micro_batches_of
from rlplace.reasoning.tasks.prompts import Problem
from rlplace.reasoning.update import compute_advantages, llm_update
from rlplace.reasoning.workers.inference import Scorer, score_round

SHAPE = TinyQwen2Shape(hidden_size=64, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=128)
"""About 0.18 M parameters: four decoder layers to shard by, as a real model has many, each small, since what the
tests compare is arithmetic, not capacity."""
PROMPTS = ["12+7=", "3+4=", "30+45=", "8+8=", "1+1=", "62+9=", "5+17=", "40+2="]
RESPONSES = ["19", "8", "75", "16", "2", "71", "22", "42", "1", "7", "77", "61", "20", "71", "12", "43"]
GROUP = 2
STEPS = 3
SETTINGS = {"group_size": GROUP, "update_epochs": 1, "num_minibatches": 2, "ent_coef": 0.0, "max_grad_norm": 1.0}
ALGORITHMS = {
    "grpo": ReasoningAlgorithmConfig(name="grpo", lr=1e-3, **SETTINGS),
    "ppo": ReasoningAlgorithmConfig(name="ppo", lr=1e-3, critic_lr=1e-3, **SETTINGS),
}


def build_model(folder: Path) -> Path:
    return build_tiny_qwen2(folder, PROMPTS + RESPONSES, SHAPE)


@dataclass(frozen=True)
class Job:
    """One group of ranks' run: `steps` GRPO steps from the model folder, or from `resume` (a checkpoint folder's name
    in the output folder, waited for), saving a checkpoint named `save` after `save_after` steps, with an
    offload/onload round trip after the first step."""

    name: str
    strategy: str
    world_size: int
    dtype: str = "fp32"
    algorithm: str = "grpo"
    """`ppo` trains a critic beside the policy, under the same strategy."""
    recompute: bool = False
    """Activation checkpointing per decoder layer (`actor.gradient_checkpointing`)."""
    lora: int = 0
    """LoRA adapters of this rank on the policy (`actor.lora.rank`); 0: the whole policy trains."""
    steps: tuple[int, ...] = tuple(range(STEPS))
    save: str | None = None
    save_after: int = 2
    resume: str | None = None


def batch_of(folder: Path, rank: int, world_size: int) -> tuple[SequenceBatch, Shard | None]:
    """This rank's groups (every world_size-th) of the 8 prompts x 2 responses, with fixed 0/1 rewards."""
    tokenizer = load_tokenizer(folder)
    groups = [g for g in range(len(PROMPTS)) if g % world_size == rank]
    rows = [g * GROUP + i for g in groups for i in range(GROUP)]
    prompts = [PROMPTS[r // GROUP] for r in rows]
    encoded = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    ids = [tokenizer(RESPONSES[r], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in rows]
    width = max(len(i) for i in ids)
    responses = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros_like(responses)
    for row, tokens in enumerate(ids):
        responses[row, : len(tokens)], mask[row, : len(tokens)] = torch.tensor(tokens), 1
    rewards = torch.tensor([float(r % 3 == 0) for r in rows])
    problems = [Problem(p, RESPONSES[r]) for p, r in zip(prompts, rows, strict=True)]
    batch = SequenceBatch(0, encoded["input_ids"], encoded["attention_mask"], responses, mask, problems, rewards)
    shard = None
    if world_size > 1:
        total = len(PROMPTS) * GROUP

        def sum_over_ranks(tensor: torch.Tensor) -> None:
            dist.all_reduce(tensor)

        shard = Shard(torch.tensor(rows), total, world_size, sum_over_ranks, rank)
    return batch, shard


def run_rank(rank: int, world_size: int, jobs: list[Job], folder: Path, out: Path, init_file: str) -> None:
    """One rank of a group that runs `jobs` in turn (their world size: `world_size`)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        for job in jobs:
            assert job.world_size == world_size
            _run_job(rank, job, folder, out)
    finally:
        dist.destroy_process_group()


def _run_job(rank: int, job: Job, folder: Path, out: Path) -> None:
    """Writes {"stats": per step, "weights": the policy's full state (rank 0), "offload": ...} of one rank of `job`."""
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    alg = ALGORITHMS[job.algorithm]
    average = functools.partial(_mean, job.world_size)
    strategy = build_strategy(job.strategy, job.world_size, cpu, job.dtype, average)
    policy = load_causal_lm(folder).train()
    if job.recompute:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = strategy.wrap(lora.adapt(policy, LoRAConfig(rank=job.lora)))
    optimizer = torch.optim.AdamW(lora.trained(policy), lr=alg.lr, weight_decay=0.0)
    trained = {"policy": (policy, optimizer)}
    critic = None
    if alg.has_critic:
        critic = strategy.wrap(lora.adapt_critic(ValueModel.from_pretrained(folder).train(), LoRAConfig(rank=job.lora)))
        trained["critic"] = (critic, torch.optim.AdamW(lora.trained(critic), lr=alg.critic_lr, weight_decay=0.0))
    if job.resume is not None:
        _wait_for(out / job.resume / ".done")
        load_training_state(out / job.resume, trained)
    batch, shard = batch_of(folder, rank, job.world_size)
    stats: dict[int, dict[str, float]] = {}
    offload: dict[str, object] = {}
    for step in job.steps:
        batch.old_logprobs = response_logprobs(policy, batch)
        sum_over_ranks = None if shard is None else shard.sum_over_ranks
        critic_args: dict[str, object] = {}
        if critic is not None:
            with torch.no_grad():
                critic_args["old_values"] = critic.response_values(batch).cpu()
        advantages, returns = compute_advantages(batch, alg, critic_args.get("old_values"), sum_over_ranks)
        if critic is not None:
            critic_args.update(critic=critic, critic_optimizer=trained["critic"][1], returns=returns)
        generator = torch.Generator().manual_seed(step)
        stats[step] = llm_update(
            policy, optimizer, batch, advantages, alg, generator, strategy=strategy, shard=shard, **critic_args
        )
        if step == job.steps[0]:
            offload = _round_trip(policy, optimizer, cpu)
        if job.save is not None and step + 1 == job.save_after:
            save_training_state(out / job.save, trained)
            dist.barrier()
            if rank == 0:
                (out / job.save / ".done").touch()
    copy = _frozen_copy(rank, policy, strategy, folder, batch)
    if job.lora:
        copy["adapters_alone"] = _adapters_copy(rank, policy, strategy, folder, batch, LoRAConfig(rank=job.lora))
    weights = {
        f"{name}.{key}": tensor
        for name, (model, _) in trained.items()
        for key, tensor in strategy.full_state_dict(model).items()
    }
    result = {"stats": stats, "weights": weights, "offload": offload, "copy": copy, "mask": batch.response_mask}
    torch.save(result, out / f"{job.name}.rank{rank}.pt")


def _frozen_copy(
    rank: int, policy: torch.nn.Module, strategy: Strategy, folder: Path, batch: SequenceBatch
) -> dict[str, object]:
    """An inference rank's copy of the policy under the same strategy, holding the starting weights and having scored
    once (a sharded copy gathers its units then), given the trained policy's whole tensors as weight sync gives them:
    its log-probs and the policy's own for this rank's batch."""
    copy = strategy.wrap(load_causal_lm(folder).requires_grad_(False).eval(), trained=False)
    before = response_logprobs(copy, batch)
    whole = {name: gathered(tensor) for name, tensor in policy.state_dict().items()}
    export = lora.export(policy)  # a LoRA policy's adapters merged into its weights
    load_whole(copy.state_dict(), (whole if export is None else export.convert(whole)).items())
    scores = {"before": before, "after": response_logprobs(copy, batch), "policy": response_logprobs(policy, batch)}
    # Three micro-batches over the ranks, scored by the copy and a reference model: rank 0 scores two, rank 1 one
    # and keeps in step for the second; sharded passes out of step would hang or gather the wrong model's shards.
    # Then again in passes of a token budget (inference.max_tokens_per_micro_batch), several a micro-batch.
    reference = strategy.wrap(load_causal_lm(folder).requires_grad_(False).eval(), trained=False)
    scorers = [Scorer("old_logprobs", copy), Scorer("ref_logprobs", reference)]
    scores["micro_batches"] = _scored_in_rounds(rank, strategy, scorers, batch, None)
    scores["budget"] = _scored_in_rounds(rank, strategy, scorers, batch, SCORING_BUDGET)
    scores["reference"] = response_logprobs(load_causal_lm(folder).eval(), batch)
    return scores


SCORING_BUDGET = 12
"""Tokens a scoring pass of `_frozen_copy` holds at most: two rows of this batch (prompts of 4 tokens, responses of up
to 2), so that a micro-batch takes several passes (4 on each of 2 ranks)."""


def _scored_in_rounds(
    rank: int, strategy: Strategy, scorers: list[Scorer], batch: SequenceBatch, max_tokens: int | None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three micro-batches over the ranks (each a copy of `batch`), scored round by round as
    `InferenceWorker.compute_logprobs` scores them (`score_round`); this rank's (old, reference) log-probs."""
    mine = micro_batches_of(rank, strategy.world_size, 3)
    most, rounds = None, len(mine)
    if strategy.collective_passes:
        most = functools.partial(_most_passes, rank=rank, world_size=strategy.world_size)
        rounds = len(micro_batches_of(0, strategy.world_size, 3))
    scored = []
    for round_ in range(rounds):
        part = replace(batch) if round_ < len(mine) else None
        score_round(scorers, part, 1.0, max_tokens, most, torch.device("cpu"))
        if part is not None:
            scored.append((part.old_logprobs, part.ref_logprobs))
    return scored


def _adapters_copy(
    rank: int, policy: torch.nn.Module, strategy: Strategy, folder: Path, batch: SequenceBatch, settings: LoRAConfig
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """An inference rank's copy of a LoRA policy under `actor.lora.sync: adapters`: the folder's weights with adapters
    added (`lora.inject`), given the trained adapters alone as weight sync sends them (only they gathered), scoring
    three micro-batches over the ranks as `InferenceWorker.compute_logprobs` does: the policy's log-probs, and the
    reference's with the adapters off; a rank with fewer keeps in step."""
    copy = strategy.wrap(lora.inject(load_causal_lm(folder), settings).requires_grad_(False).eval(), trained=False)
    export = lora.export(policy, adapters_alone=True)
    sent = {name: gathered(tensor) for name, tensor in policy.state_dict().items() if export.keep(name)}
    load_whole(copy.state_dict(), export.convert(sent).items())
    scorers = [Scorer("old_logprobs", copy), Scorer("ref_logprobs", copy, adapters_off=True)]
    return _scored_in_rounds(rank, strategy, scorers, batch, None)


def _most_passes(passes: int, rank: int, world_size: int) -> int:
    """The most passes any rank runs this round, as `InferenceWorker` finds it (`most_over_ranks`)."""
    return most_over_ranks([passes], rank, world_size, dist.all_reduce)[0]


def _mean(world_size: int, tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)
    tensor.div_(world_size)


def _round_trip(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> dict[str, object]:
    """Offload and onload this rank's state to and from `device` (the CPU here: a recorded no-op); whether every
    value came back."""
    before = [t.to_local().clone() if hasattr(t, "to_local") else t.clone() for _, _, t in _tensors(policy, optimizer)]
    host = HostCopies()
    moved = move(policy, optimizer, device, host).bytes + move(policy, optimizer, device, host).bytes
    after = [t.to_local() if hasattr(t, "to_local") else t for _, _, t in _tensors(policy, optimizer)]
    same = len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return {"bytes": moved, "same": same, "tensors": len(before)}


def _wait_for(path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout_s} s")
        time.sleep(0.05)
