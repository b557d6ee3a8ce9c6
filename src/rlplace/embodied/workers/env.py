"""EnvWorker: simulators for a slice of the global sub-envs, stepped stage by stage against the rollout.

Each env rank holds `total_num_envs / env world size` sub-envs, split into `rollout.pipeline_stage_num` streams.
During generation it sends each stream's observations to the rollout, waits for that stream's actions, and steps
only that stream, so while it simulates stream s the rollout can already infer for stream s+1.

Checkpoints keep each sub-env in its own file named by global index, whichever rank wrote it, so a run resumes under
any placement with the same `task.total_num_envs`: each rank reads the files of the envs it holds now.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rlplace.core.timing import interleaved_medians
from rlplace.embodied.config import EmbodiedConfig
from rlplace.embodied.envs import (
    ActionSpec,
    EnvSlice,
    EpisodeStats,
    Normalization,
    SubEnvState,
    env_spec,
    merge_episode_stats,
)
from rlplace.embodied.streams import all_streams
from rlplace.scheduler import Channel, Worker, timer

ENVS_DIR = "envs"
"""The checkpoint's subfolder of sub-env files, `<global env index>.pkl` (zero-padded to 6 digits)."""
PROFILE_ACTIONS = 16
"""Random action batches a profiled slice cycles through: drawn before timing, so that drawing is not timed."""


class SavedSubEnv(NamedTuple):
    """One sub-env in a checkpoint: its state, and the observation and done flag the rollout is sent next."""

    state: SubEnvState
    obs: np.ndarray
    done: np.float32


def _sub_env_file(folder: str, index: int) -> Path:
    return Path(folder) / ENVS_DIR / f"{index:06d}.pkl"


def _random_actions(spec: ActionSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Valid actions for `n` sub-envs: integers [n] below spec.n, or floats [n, dim] within the bounds."""
    if spec.discrete:
        return rng.integers(0, spec.n, size=n)
    return rng.uniform(spec.low, spec.high, size=(n, spec.dim)).astype(np.float32)


class EnvWorker(Worker):
    def __init__(self, cfg: EmbodiedConfig) -> None:
        self.cfg = cfg
        streams = all_streams(cfg.task.total_num_envs, self.world_size, cfg.rollout.pipeline_stage_num)
        self.streams = [s for s in streams if s.env_rank == self.rank]
        cap = cfg.task.max_episode_steps
        self.env_kwargs = {} if cap is None else {"max_episode_steps": cap}
        """What each simulator is made with: the run's slices and the throwaway ones of `profile_step`."""
        observations, rewards = cfg.task.normalize_observation, cfg.task.normalize_reward
        self.normalize = Normalization(observations, rewards, cfg.algorithm.gamma) if observations or rewards else None
        """What each slice normalises (None: nothing), the throwaway ones of `profile_step` too."""
        self.slices = [self._slice(s.start, s.end) for s in self.streams]
        self.obs = [env.reset() for env in self.slices]
        self.dones = [np.zeros(env.num_envs, dtype=np.float32) for env in self.slices]
        self.first_sent = False
        """Whether the rollout already has the observations the next step starts from."""

    def _slice(self, start: int, end: int) -> EnvSlice:
        return EnvSlice(self.cfg.task.env_id, start, end, self.cfg.runner.seed, self.normalize, **self.env_kwargs)

    def interact(self, num_steps: int, obs_channel: Channel, action_channel: Channel) -> EpisodeStats:
        """Run `num_steps` steps on every stream, sending observations to the rollout on `obs_channel` and taking
        its actions from `action_channel`.

        The first message of a stream carries the observation the last call ended on (sent when that call ended);
        each later one carries the reward for the previous action. Returns the episodes that finished, in
        layout-independent order.
        """
        if not self.first_sent:
            self._send_first(obs_channel)
        for _ in range(num_steps):
            for i, (stream, env) in enumerate(zip(self.streams, self.slices, strict=True)):
                actions = action_channel.get(key=stream.key)
                with self.span("env_step"):
                    obs, reward, terminated, truncated = env.step(actions)
                    self.obs[i], self.dones[i] = obs, (terminated | truncated).astype(np.float32)
                obs_channel.put((obs, reward, self.dones[i]), key=stream.key)
        self._send_first(obs_channel)
        return merge_episode_stats([env.pop_episode_stats() for env in self.slices])

    def _send_first(self, obs_channel: Channel) -> None:
        """Send each stream's observation that the next step's first action answers (with no reward). Sent at the
        end of a step, so the rollout starts the next one without waiting for this worker's call to arrive."""
        for stream, obs, done in zip(self.streams, self.obs, self.dones, strict=True):
            obs_channel.put((obs, np.zeros(len(obs), dtype=np.float32), done), key=stream.key)
        self.first_sent = True

    def profile_step(self, sizes: list[int], repeats: int | None = None) -> list[float]:
        """For each n of `sizes`, the median seconds of one `step` of n sub-envs with random valid actions: the env's
        unit of work, for the run's profile (`rlplace.embodied.profile`; `repeats` None picks the count).

        Each n gets a fresh slice, reset and stepped twice before timing, then thrown away: the run's own simulators
        and their episodes are untouched. The sizes are timed in turns (`interleaved_medians`)."""
        spec = env_spec(self.cfg.task.env_id, **self.env_kwargs).action
        rng = np.random.default_rng(self.cfg.runner.seed)
        envs: list[EnvSlice] = []
        try:
            steps = []
            for n in sizes:
                env = self._slice(0, n)
                envs.append(env)
                env.reset()
                actions = itertools.cycle([_random_actions(spec, n, rng) for _ in range(PROFILE_ACTIONS)])
                steps.append(lambda env=env, actions=actions: env.step(next(actions)))
            return interleaved_medians(steps, repeats)
        finally:
            for env in envs:
                env.close()

    @timer("offload")
    def offload(self) -> int:
        """CPU simulators hold no device memory: a recorded no-op that keeps the phase on the timeline."""
        return 0

    @timer("onload")
    def onload(self) -> int:
        return 0

    def save_checkpoint(self, folder: str) -> None:
        """Every sub-env of this rank (simulator mid-episode, running episode stats, last observation) to the file of
        its global index, so a resumed run continues exactly however it splits the envs."""
        (Path(folder) / ENVS_DIR).mkdir(exist_ok=True)  # every env rank makes it; the first one wins
        for env, obs, dones in zip(self.slices, self.obs, self.dones, strict=True):
            for index, state, row, done in zip(env.global_indices.tolist(), env.states(), obs, dones, strict=True):
                _sub_env_file(folder, index).write_bytes(pickle.dumps(SavedSubEnv(state, row, done)))

    def load_checkpoint(self, folder: str) -> None:
        """Take back the sub-envs this rank holds now from their files, whichever rank wrote them."""
        for i, env in enumerate(self.slices):
            saved = [pickle.loads(_sub_env_file(folder, index).read_bytes()) for index in env.global_indices.tolist()]
            env.restore([s.state for s in saved])
            self.obs[i] = np.stack([s.obs for s in saved])
            self.dones[i] = np.array([s.done for s in saved], dtype=np.float32)
