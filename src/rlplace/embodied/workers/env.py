"""EnvWorker: simulators for a slice of the global sub-envs, stepped stage by stage against the rollout.

Each env rank holds `total_num_envs / env world size` sub-envs, split into `rollout.pipeline_stage_num` streams.
During generation it sends each stream's observations to the rollout, waits for that stream's actions, and steps
only that stream, so while it simulates stream s the rollout can already infer for stream s+1.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from rlplace.embodied.config import EmbodiedConfig
from rlplace.embodied.envs import EnvSlice, EpisodeStats, merge_episode_stats
from rlplace.embodied.streams import all_streams
from rlplace.scheduler import Channel, Worker, timer


class EnvWorker(Worker):
    def __init__(self, cfg: EmbodiedConfig) -> None:
        self.cfg = cfg
        streams = all_streams(cfg.task.total_num_envs, self.world_size, cfg.rollout.pipeline_stage_num)
        self.streams = [s for s in streams if s.env_rank == self.rank]
        kwargs = {} if cfg.task.max_episode_steps is None else {"max_episode_steps": cfg.task.max_episode_steps}
        self.slices = [EnvSlice(cfg.task.env_id, s.start, s.end, cfg.runner.seed, **kwargs) for s in self.streams]
        self.obs = [env.reset() for env in self.slices]
        self.dones = [np.zeros(env.num_envs, dtype=np.float32) for env in self.slices]

    def interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel) -> EpisodeStats:
        """Run `num_steps` steps on every stream, sending observations to the rollout on `obs_channel` and taking
        its actions from `action_channel`.

        The first message of a stream carries the observation the last call ended on; each later one carries the
        reward for the previous action. Returns the episodes that finished, in layout-independent order.
        """
        zeros = [np.zeros(env.num_envs, dtype=np.float32) for env in self.slices]
        for stream, obs, done, reward in zip(self.streams, self.obs, self.dones, zeros, strict=True):
            obs_channel.put((obs, reward, done), key=stream.key)
        for _ in range(num_steps):
            for i, (stream, env) in enumerate(zip(self.streams, self.slices, strict=True)):
                actions = action_channel.get(key=stream.key)
                with self.span("env_step"):
                    obs, reward, terminated, truncated = env.step(actions)
                    self.obs[i], self.dones[i] = obs, (terminated | truncated).astype(np.float32)
                obs_channel.put((obs, reward, self.dones[i]), key=stream.key)
        return merge_episode_stats([env.pop_episode_stats() for env in self.slices])

    @timer("offload")
    def offload(self) -> int:
        """CPU simulators hold no device memory: a recorded no-op that keeps the phase on the timeline."""
        return 0

    @timer("onload")
    def onload(self) -> int:
        return 0

    def save_checkpoint(self, folder: str) -> None:
        """Simulator states (mid-episode included) and the last observations, so a resumed run continues exactly."""
        state = {"slices": self.slices, "obs": self.obs, "dones": self.dones}
        (Path(folder) / f"env_rank{self.rank}.pkl").write_bytes(pickle.dumps(state))

    def load_checkpoint(self, folder: str) -> None:
        state = pickle.loads((Path(folder) / f"env_rank{self.rank}.pkl").read_bytes())
        self.slices, self.obs, self.dones = state["slices"], state["obs"], state["dones"]
