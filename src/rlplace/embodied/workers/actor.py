"""ActorWorker: PPO training, data-parallel over actor ranks.

Every rank starts from the same seed (so identical initial weights), trains on its own shard of env columns and
averages gradients with an all-reduce before each optimizer step. Minibatches are drawn over the global batch by a
generator seeded identically on every rank, so ranks step in lockstep and any rank count trains the same update
(`core.data_parallel`). Rank 0 owns weight sync and checkpoints.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch

from rlplace.core.data_parallel import Shard
from rlplace.core.gradients import average_grads
from rlplace.core.lr_schedule import lr_factor
from rlplace.core.offload import HostCopies, move
from rlplace.core.pending import load_pending, save_pending
from rlplace.core.rng import rng_states, set_rng_states
from rlplace.core.timing import WARMUP, interleaved_medians, median_seconds, repeats_for, seconds_of
from rlplace.core.weights import broadcast_weights
from rlplace.embodied.advantages import compute_advantages
from rlplace.embodied.algorithms import ALGORITHMS
from rlplace.embodied.config import EmbodiedConfig
from rlplace.embodied.envs import env_spec
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.ppo import make_optimizer, minibatch_step, proximal_logprobs
from rlplace.embodied.streams import actor_pieces, actor_shard, all_streams
from rlplace.embodied.trajectory import Trajectory
from rlplace.scheduler import Channel, Worker, timer


class ActorWorker(Worker):
    def __init__(self, cfg: EmbodiedConfig, env_world_size: int) -> None:
        self.cfg = cfg
        streams = all_streams(cfg.task.total_num_envs, env_world_size, cfg.rollout.pipeline_stage_num)
        self.num_pieces = sum(
            rank == self.rank
            for stream in streams
            for rank, _, _ in actor_pieces(stream, cfg.task.total_num_envs, self.world_size)
        )
        """Trajectory pieces per step: one from each stream that overlaps this rank's shard (each sent in two
        parts, `Trajectory.ending`)."""
        spec = env_spec(cfg.task.env_id)
        torch.manual_seed(cfg.runner.seed)
        self.model = MLPActorCritic(spec.obs_dim, spec.action, cfg.model.hidden_sizes, cfg.model.activation)
        self.model.to(self.device)
        self.optimizer = make_optimizer(self.model, cfg.algorithm.lr)
        self.update = ALGORITHMS[cfg.algorithm.name].load()
        """The algorithm's update over this rank's batch (`ppo_update` for ppo)."""
        self.host_copies = HostCopies()
        self.generator = torch.Generator().manual_seed(cfg.runner.seed)
        self.version = 0
        """Weight version: the number of PPO updates these weights have had."""
        self.pending: deque[Trajectory] = deque()
        """Batches received and not yet trained on, oldest first: with runner.max_staleness = K, up to K steps'."""
        self.batch: Trajectory | None = None
        self.advantages: torch.Tensor | None = None
        self.returns: torch.Tensor | None = None
        if self.world_size > 1:
            self.init_process_group()

    @timer("sync_weights")
    def sync_weights(self) -> int:
        """Rank 0 broadcasts the current weights and their version to every rollout rank, in buckets."""
        if self.rank == 0:
            bucket_mb = self.cfg.weight_sync.bucket_mb
            broadcast_weights(self, self.model, self.version, dst_group="rollout", bucket_mb=bucket_mb)
        return self.version

    def recv_rollout_batch(self, trajectory_channel: Channel) -> int:
        """Collect one step's pieces of trajectory of this rank's env columns from `trajectory_channel`, queued
        behind the batches not trained on yet.

        Not timed as a whole: beside generation (asynchronous training) it waits for the rollout, and the timeline
        should show the actor idle then.
        """
        parts = [trajectory_channel.get(key=f"actor{self.rank}") for _ in range(2 * self.num_pieces)]
        with self.span("recv_rollout_batch"):
            self.pending.append(Trajectory.assemble(parts))
        return int(self.pending[-1].rewards.numel())

    @timer("advantages")
    def compute_advantages_and_returns(self) -> None:
        """Take the oldest batch received; its advantages and returns."""
        assert self.pending, "recv_rollout_batch must run first"
        self.batch = self.pending.popleft()
        self.advantages, self.returns = compute_advantages(self.batch, self.cfg.algorithm)

    @timer("training")
    def run_training(self, step: int) -> dict[str, float]:
        """One PPO update on this rank's shard; returns train/* stats (identical on every rank up to float order)."""
        batch, alg = self.batch, self.cfg.algorithm
        assert batch is not None and self.advantages is not None and self.returns is not None
        for group in self.optimizer.param_groups:
            group["lr"] = alg.lr * lr_factor(alg, step, self.cfg.runner.max_steps)
        flat = {
            "obs": batch.obs.flatten(0, 1),
            "actions": batch.actions.flatten(0, 1),
            "logprobs": batch.logprobs.flatten(),
            "values": batch.values.flatten(),
            "advantages": self.advantages.flatten(),
            "returns": self.returns.flatten(),
        }
        flat = {k: v.to(self.device) for k, v in flat.items()}
        if self.cfg.runner.max_staleness:  # the batch came from an older policy: correct for it
            flat["prox_logprobs"] = proximal_logprobs(self.model, flat["obs"], flat["actions"])
        allreduce, shard = None, None
        if self.world_size > 1:
            allreduce, shard = self._average_grads, self._shard(batch.rewards.shape[0])
        stats = self.update(self.model, self.optimizer, flat, alg, self.generator, allreduce, shard)
        self.version += 1
        stats["train/lr"] = self.optimizer.param_groups[0]["lr"]
        stats["async/staleness"] = float(step - batch.versions.float().mean())
        return stats

    def _average_grads(self, grads: list[torch.Tensor]) -> None:
        average_grads(grads, self.average_over_group)

    def _shard(self, num_steps: int) -> Shard:
        """Where this rank's samples ([T, n] flattened, its env columns) lie in the global batch ([T, N] flattened),
        so that every rank count trains the same update (`core.data_parallel`)."""
        total = self.cfg.task.total_num_envs
        start, end = actor_shard(total, self.rank, self.world_size)
        index = torch.arange(num_steps)[:, None] * total + torch.arange(start, end)[None, :]
        return Shard(index.flatten(), num_steps * total, self.world_size, self.sum_over_group, self.rank)

    def profile_update(self, sizes: list[int], repeats: int | None = None) -> list[float]:
        """For each n of `sizes`, the median seconds of one minibatch step of the update (`minibatch_step`: loss,
        backward, optimizer step; no gradient averaging, which `profile_average` times) on n synthetic samples: the
        actor's unit of work, for the run's profile (`rlplace.embodied.profile`; `repeats` None picks the count),
        the sizes timed in turns (`interleaved_medians`).

        It steps deep copies of the model and optimizer and draws from its own generator, so the trained weights,
        the optimizer state and the RNGs stay as the run left them."""
        model, optimizer = copy.deepcopy((self.model, self.optimizer))  # one copy: the optimizer steps the copy's
        generator = torch.Generator().manual_seed(self.cfg.runner.seed)
        return interleaved_medians([self._update_step(model, optimizer, n, generator) for n in sizes], repeats)

    def _update_step(
        self, model: MLPActorCritic, optimizer: torch.optim.Optimizer, n: int, generator: torch.Generator
    ) -> Callable[[], None]:
        """One minibatch step on n synthetic samples, as a call to time."""
        spec = env_spec(self.cfg.task.env_id)
        obs = torch.randn(n, spec.obs_dim, generator=generator)
        if spec.action.discrete:
            actions = torch.randint(0, spec.action.n, (n,), generator=generator).float()
        else:
            actions = torch.randn(n, spec.action.dim, generator=generator)
        batch = {"obs": obs, "actions": actions}
        batch.update({key: torch.randn(n, generator=generator) for key in ("values", "advantages", "returns")})
        batch = {key: value.to(self.device) for key, value in batch.items()}
        batch["logprobs"] = proximal_logprobs(model, batch["obs"], batch["actions"])  # ratios near 1, as in the run
        # Asynchronous training weighs each sample by its behaviour weight; synchronous training has none.
        weights = torch.ones(n, device=self.device) if self.cfg.runner.max_staleness else None
        mb = torch.randperm(n, generator=generator).to(self.device)  # a gather, as a shuffled minibatch is

        def step() -> None:
            minibatch_step(model, optimizer, batch, mb, batch["logprobs"], weights, self.cfg.algorithm)
            self._synchronize()

        return step

    def profile_average(self, repeats: int | None = None) -> dict[str, float]:
        """The median seconds of one gradient averaging over the actor ranks, and the gradients' bytes (which pick
        its path: rank to rank below `SMALL_BYTES`, a ring above), through the update's own path
        (`_average_grads`) on zero tensors shaped like the model's gradients (the real ones stay as they are), for
        the run's profile (`rlplace.embodied.profile`).

        Collective: every actor rank calls it at once, in a group of more than one rank. With `repeats` None each
        rank times one call and the group averages those times, so that every rank picks the same number of calls
        and none waits for a call that never comes."""
        grads = [torch.zeros_like(p) for p in self.model.parameters() if p.requires_grad]

        def average() -> None:
            self._average_grads(grads)
            self._synchronize()

        nbytes = sum(g.numel() * g.element_size() for g in grads)
        if repeats is None:
            for _ in range(WARMUP):
                average()
            probe = torch.tensor([seconds_of(average)], dtype=torch.float64)
            self.average_over_group(probe)  # the same bits on every rank
            return {"seconds": median_seconds(average, repeats_for(probe.item()), warmup=0), "bytes": nbytes}
        return {"seconds": median_seconds(average, repeats), "bytes": nbytes}

    def _synchronize(self) -> None:
        """Wait for the device's queued work: a timed GPU call has finished only once its kernels have."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @timer("offload")
    def offload(self) -> int:
        return move(self.model, self.optimizer, torch.device("cpu"), self.host_copies).bytes

    @timer("onload")
    def onload(self) -> int:
        return move(self.model, self.optimizer, self.device, self.host_copies).bytes

    def save_checkpoint(self, folder: str) -> None:
        """Rank 0 writes weights, optimizer, and RNG states (all ranks hold the same ones); every rank writes the
        batches it has not trained on yet (asynchronous training), its columns of them, to `pending/<rank>.pt`."""
        save_pending(folder, self.rank, self.pending)
        if self.rank != 0:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "rng": rng_states(),
            "version": self.version,
        }
        torch.save(state, Path(folder) / "actor.pt")

    def load_checkpoint(self, folder: str) -> None:
        """Take back the state, and this rank's columns of the pending batches, whichever ranks wrote them."""
        state = torch.load(Path(folder) / "actor.pt", map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        set_rng_states(state["rng"])
        self.version = state["version"]
        shard = actor_shard(self.cfg.task.total_num_envs, self.rank, self.world_size)
        self.pending = deque(Trajectory.merge(list(parts)).columns(*shard) for parts in load_pending(folder))
