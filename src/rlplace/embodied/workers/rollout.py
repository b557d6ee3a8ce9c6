"""RolloutWorker: policy inference answering env observations, stream by stream, and assembling trajectories.

Sampling randomness comes from `uniform_noise(seed, global env index, global step)`, never from a stateful RNG, so
the actions do not depend on how envs are split over workers and stages. Weights arrive from actor rank 0 with a
version number; in synchronous training the rollout refuses to act on a stale version.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from rlplace.core.offload import HostCopies, move
from rlplace.core.rng import uniform_noise
from rlplace.core.timing import interleaved_medians
from rlplace.core.weights import StaleWeightsError, receive_weights
from rlplace.embodied.config import EmbodiedConfig
from rlplace.embodied.envs import env_spec
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.streams import Stream, actor_pieces, all_streams, streams_of_rollout
from rlplace.embodied.trajectory import Trajectory
from rlplace.scheduler import Channel, Worker, timer


class RolloutWorker(Worker):
    def __init__(self, cfg: EmbodiedConfig, env_world_size: int, actor_world_size: int) -> None:
        self.cfg = cfg
        self.actor_world_size = actor_world_size
        spec = env_spec(cfg.task.env_id)
        self.model = MLPActorCritic(spec.obs_dim, spec.action, cfg.model.hidden_sizes, cfg.model.activation)
        self.model.requires_grad_(False)
        self.model.to(self.device)
        self.host_copies = HostCopies()
        self.obs_dim = spec.obs_dim
        self.action_shape = () if spec.action.discrete else (spec.action.dim,)
        self.version = -1
        streams = all_streams(cfg.task.total_num_envs, env_world_size, cfg.rollout.pipeline_stage_num)
        self.streams = streams_of_rollout(streams, self.rank, self.world_size)
        self.buffers = [
            Trajectory.allocate(cfg.rollout.num_steps, torch.arange(s.start, s.end), spec.obs_dim, self.action_shape, 0)
            for s in self.streams
        ]
        """One trajectory per stream, refilled every step (each is sent as a copy): allocating them anew was a large
        share of the time from the driver's call to the first inference (benchmarks/handoff.py)."""

    @timer("sync_weights")
    def sync_weights(self) -> int:
        """Receive the actor's weights (broadcast by actor rank 0); returns their version."""
        self.version = receive_weights(self, self.model, src_group="actor")
        return self.version

    @torch.no_grad()
    def generate(
        self, step: int, version: int, obs_channel: Channel, action_channel: Channel, trajectory_channel: Channel
    ) -> int:
        """Answer `rollout.num_steps` observations on each of this rank's streams; send each actor rank the columns
        of the trajectories it trains on: all but their ending once the last action is out (the env's last step
        hides the sending), then the ending. An action goes out as soon as it is chosen, and the trajectory is
        written while the env steps with it.

        `step` is the training step: the noise for env i at its t-th action of this step is keyed by
        `step * num_steps + t`, a global env-step counter. Returns the number of env steps served.
        """
        if self.version != version:
            raise StaleWeightsError(
                f"rollout rank {self.rank} holds weights v{self.version}, asked to act with v{version}"
            )
        num_steps = self.cfg.rollout.num_steps
        for traj in self.buffers:  # every other field is written whole below
            traj.versions.fill_(version)
        for t in range(num_steps + 1):
            for stream, traj in zip(self.streams, self.buffers, strict=True):
                obs, reward, done = map(torch.from_numpy, obs_channel.get(key=stream.key))
                if t == num_steps:
                    with self.span("rollout_infer"):
                        traj.rewards[t - 1] = reward
                        traj.last_value, traj.last_done = self.model.value(obs.to(self.device)).cpu(), done
                    self._send(stream, traj, trajectory_channel, ending=True)
                    continue
                with self.span("rollout_infer"):
                    action, logprob, value = self._act(obs, traj.env_indices, step * num_steps + t)
                action_channel.put(action.numpy(), key=stream.key)
                with self.span("rollout_infer"):  # the step's columns of the trajectory, while the env steps
                    if t > 0:
                        traj.rewards[t - 1] = reward
                    traj.obs[t], traj.dones[t], traj.actions[t] = obs, done, action.to(traj.actions.dtype)
                    traj.logprobs[t], traj.values[t] = logprob, value
                if t == num_steps - 1:
                    self._send(stream, traj, trajectory_channel, ending=False)
        return num_steps * sum(s.end - s.start for s in self.streams)

    def _send(self, stream: Stream, traj: Trajectory, trajectory_channel: Channel, ending: bool) -> None:
        """Send each actor rank its columns of `traj` (a view, `columns`, sends its own), or with `ending` their
        `Trajectory.ending`."""
        for actor_rank, start, end in actor_pieces(stream, self.cfg.task.total_num_envs, self.actor_world_size):
            columns = traj.columns(start, end)
            trajectory_channel.put(columns.ending() if ending else columns, key=f"actor{actor_rank}")

    def _act(self, obs: Tensor, env_indices: Tensor, counter: int) -> tuple[Tensor, Tensor, Tensor]:
        """One stream's inference: the noise of `env_indices` at env-step counter `counter`, the policy on `obs`,
        and action, log-prob and value back on the CPU. Its own method so that `profile_infer` times exactly it."""
        noise = uniform_noise(self.cfg.runner.seed, env_indices, counter, self.model.noise_dim)
        action, logprob, value = self.model.act(obs.to(self.device), noise.to(self.device))
        return action.cpu(), logprob.cpu(), value.cpu()

    @torch.no_grad()
    def profile_infer(self, sizes: list[int], repeats: int | None = None) -> list[float]:
        """For each n of `sizes`, the median seconds of one stream's inference (`_act`) on n random observations:
        the rollout's unit of work, for the run's profile (`rlplace.embodied.profile`; `repeats` None picks the
        count), the sizes timed in turns (`interleaved_medians`). Inference changes nothing the run keeps."""
        generator = torch.Generator().manual_seed(self.cfg.runner.seed)
        calls = []
        for n in sizes:
            obs, env_indices = torch.randn(n, self.obs_dim, generator=generator), torch.arange(n)
            counters = itertools.count()  # a new env-step counter each call, as in generation: new noise
            calls.append(lambda o=obs, i=env_indices, c=counters: self._act(o, i, next(c)))
        return interleaved_medians(calls, repeats)

    @timer("offload")
    def offload(self) -> int:
        return move(self.model, None, torch.device("cpu"), self.host_copies).bytes

    @timer("onload")
    def onload(self) -> int:
        return move(self.model, None, self.device, self.host_copies).bytes
