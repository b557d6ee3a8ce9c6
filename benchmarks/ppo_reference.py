"""PPO on one process, built from rlplace's modules in the loop shape of the distributed embodied runner.

Each training step: collect T steps from N sub-envs (EnvSlice + MLPActorCritic.act with counter-based noise), compute
GAE, run ppo_update. It is the single-process reference the distributed runner must match, and the place to tune
hyperparameters for wall time: the distributed runner adds a fixed cost per training step (weight sync, queues), so
the table also shows the time with an assumed per-step overhead.

    python benchmarks/ppo_reference.py train --seeds 1 2 3        # time to mean return >= 475 on CartPole
    python benchmarks/ppo_reference.py train --stats ...          # also each step's train/* metrics, as JSON lines
    python benchmarks/ppo_reference.py timing                     # HalfCheetah sim vs MLP inference cost per env step

With one actor rank, the distributed runner computes exactly these numbers whatever the placement (the env split
over workers and pipeline stages does not matter: seeds and sampling noise are keyed by global env index), so
`--stats` gives the train/* metrics a tiny run must log (tests/embodied/test_runner.py pins them).

The train defaults are the tuned CartPole settings: 16 envs x 256 steps, Adam lr 3e-3 (constant), 10 epochs x 4
minibatches, ent_coef 0, gamma 0.995, lambda 0.95, clip 0.2, vf 0.5, max grad norm 0.5. Few, large steps were
preferred because the distributed runner pays a fixed cost per step; they solved seeds 1-10 in 16-29 steps.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from rlplace.core.rng import uniform_noise
from rlplace.embodied.advantages import compute_gae
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.envs import EnvSlice, env_spec
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.ppo import make_optimizer, ppo_update


@dataclass
class Result:
    seed: int
    solved: bool
    train_steps: int
    env_steps: int
    wall_s: float
    env_s: float
    infer_s: float
    update_s: float


def train(args: argparse.Namespace, seed: int) -> Result:
    """Train until the mean return of the last 20 finished episodes reaches `args.target`, checked per rollout."""
    torch.manual_seed(seed)
    spec = env_spec(args.task)
    n, T = args.num_envs, args.num_steps
    envs = EnvSlice(args.task, 0, n, seed)
    model = MLPActorCritic(spec.obs_dim, spec.action, args.hidden_sizes)
    optimizer = make_optimizer(model, args.lr)
    params = PPOConfig(
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        lr=args.lr,
        anneal_lr=args.anneal_steps > 0,
        update_epochs=args.update_epochs,
        num_minibatches=args.num_minibatches,
        clip_ratio_low=args.clip_coef,
        clip_ratio_high=args.clip_coef,
        clip_vloss=not args.no_clip_vloss,
        vf_coef=args.vf_coef,
        ent_coef=args.ent_coef,
        max_grad_norm=args.max_grad_norm,
    )
    generator = torch.Generator().manual_seed(seed)
    action_shape = () if spec.action.discrete else (spec.action.dim,)

    obs = torch.zeros((T, n, spec.obs_dim))
    actions = torch.zeros((T, n, *action_shape), dtype=torch.long if spec.action.discrete else torch.float32)
    logprobs = torch.zeros((T, n))
    rewards = torch.zeros((T, n))
    dones = torch.zeros((T, n))
    values = torch.zeros((T, n))

    recent_returns: deque[float] = deque(maxlen=20)
    env_s = infer_s = update_s = 0.0
    start = time.perf_counter()
    next_obs = torch.from_numpy(envs.reset())
    next_done = torch.zeros(n)
    env_indices = envs.global_indices
    for step in range(1, args.max_steps + 1):
        if args.anneal_steps:
            frac = max(0.0, 1.0 - (step - 1.0) / args.anneal_steps)
            optimizer.param_groups[0]["lr"] = frac * args.lr

        for t in range(T):
            obs[t] = next_obs
            dones[t] = next_done
            t0 = time.perf_counter()
            noise = uniform_noise(seed, env_indices, (step - 1) * T + t, model.noise_dim)
            action, logprob, value = model.act(next_obs, noise)
            t1 = time.perf_counter()
            o, r, terminated, truncated = envs.step(action.numpy())
            t2 = time.perf_counter()
            infer_s += t1 - t0
            env_s += t2 - t1
            actions[t], logprobs[t], values[t] = action, logprob, value
            rewards[t] = torch.from_numpy(r)
            next_obs = torch.from_numpy(o)
            next_done = torch.from_numpy(terminated | truncated).float()

        episodes = envs.pop_episode_stats()
        recent_returns.extend(episodes.returns)
        if args.verbose and recent_returns:
            print(f"  step {step:>4}  mean return (last 20) {np.mean(recent_returns):7.1f}", flush=True)
        if len(recent_returns) == recent_returns.maxlen and np.mean(recent_returns) >= args.target:
            return Result(seed, True, step, step * T * n, time.perf_counter() - start, env_s, infer_s, update_s)

        t0 = time.perf_counter()
        with torch.no_grad():
            last_value = model.value(next_obs)
        advantages, returns = compute_gae(
            rewards, values, dones, last_value, next_done, params.gamma, params.gae_lambda
        )
        batch = {
            "obs": obs.reshape(T * n, -1),
            "actions": actions.reshape(T * n, *action_shape),
            "logprobs": logprobs.reshape(-1),
            "values": values.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
        }
        stats = ppo_update(model, optimizer, batch, params, generator)
        update_s += time.perf_counter() - t0
        if args.stats:  # what the runner logs under the same names, at its 0-based step
            stats["train/lr"] = optimizer.param_groups[0]["lr"]
            if episodes.returns:
                stats["env/episode_return"] = float(np.mean(episodes.returns))
                stats["env/episodes"] = len(episodes.returns)
            if recent_returns:
                stats["env/return_last20"] = float(np.mean(recent_returns))
            stats["env/total_steps"] = step * T * n
            print(json.dumps({"step": step - 1, **stats}), flush=True)
    steps = args.max_steps
    return Result(seed, False, steps, steps * T * n, time.perf_counter() - start, env_s, infer_s, update_s)


def run_train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(
        f"# {args.task}: envs={args.num_envs} T={args.num_steps} lr={args.lr} anneal_steps={args.anneal_steps} "
        f"epochs={args.update_epochs} minibatches={args.num_minibatches} ent={args.ent_coef} vf={args.vf_coef} "
        f"clip={args.clip_coef} gamma={args.gamma} lambda={args.gae_lambda} hidden={args.hidden_sizes} "
        f"threads={args.threads}"
    )
    overhead = f"wall+{args.step_overhead_ms:.0f}ms/step_s"
    print(f"seed  solved  steps  env_steps   wall_s  env_s  infer_s  update_s  {overhead}")
    for seed in args.seeds:
        r = train(args, seed)
        with_overhead = r.wall_s + r.train_steps * args.step_overhead_ms / 1000
        print(
            f"{r.seed:>4}  {r.solved!s:>6}  {r.train_steps:>5}  {r.env_steps:>9}  {r.wall_s:>7.2f}  {r.env_s:>5.2f}  "
            f"{r.infer_s:>7.2f}  {r.update_s:>8.2f}  {with_overhead:>8.2f}",
            flush=True,
        )


def run_timing(args: argparse.Namespace) -> None:
    """Microseconds per env step for the simulator and for MLP inference of several sizes, at `num_envs` envs."""
    torch.set_num_threads(args.threads)
    n = args.num_envs
    spec = env_spec(args.task)
    envs = EnvSlice(args.task, 0, n, seed=1)
    envs.reset()
    rng = np.random.default_rng(0)
    shape = (n,) if spec.action.discrete else (n, spec.action.dim)
    random_actions = [
        rng.integers(spec.action.n, size=shape) if spec.action.discrete else rng.uniform(-1, 1, size=shape)
        for _ in range(64)
    ]
    for a in random_actions[:8]:
        envs.step(a)
    t0 = time.perf_counter()
    for i in range(args.iters):
        envs.step(random_actions[i % 64])
    sim_us = (time.perf_counter() - t0) / (args.iters * n) * 1e6
    print(f"# {args.task}: {n} envs, threads={args.threads}")
    print(f"simulation: {sim_us:.1f} us per env step ({sim_us * n:.0f} us per slice step)")
    print("hidden_sizes            params  infer_us/env_step  infer_us/slice_step  ratio_to_sim")
    obs = torch.from_numpy(envs.reset())
    indices = envs.global_indices
    for hidden in args.widths:
        sizes = tuple(int(w) for w in hidden.split("x")) if "x" in hidden else (int(hidden), int(hidden))
        model = MLPActorCritic(spec.obs_dim, spec.action, sizes)
        num_params = sum(p.numel() for p in model.parameters())
        for i in range(5):
            model.act(obs, uniform_noise(1, indices, i, model.noise_dim))
        iters = max(20, args.iters // 10)
        t0 = time.perf_counter()
        for i in range(iters):
            model.act(obs, uniform_noise(1, indices, i, model.noise_dim))
        infer_us = (time.perf_counter() - t0) / iters * 1e6
        label = "x".join(map(str, sizes))
        print(f"{label:<20} {num_params:>9}  {infer_us / n:>17.1f}  {infer_us:>19.0f}  {infer_us / n / sim_us:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    tr = sub.add_parser("train", help="time to solve")
    tr.add_argument("--task", default="CartPole-v1", help="a gymnasium environment id")
    tr.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    tr.add_argument("--num-envs", type=int, default=16)
    tr.add_argument("--num-steps", type=int, default=256)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--anneal-steps", type=int, default=0, help="decay lr linearly to 0 over this many steps; 0: off")
    tr.add_argument("--update-epochs", type=int, default=10)
    tr.add_argument("--num-minibatches", type=int, default=4)
    tr.add_argument("--ent-coef", type=float, default=0.0)
    tr.add_argument("--vf-coef", type=float, default=0.5)
    tr.add_argument("--clip-coef", type=float, default=0.2)
    tr.add_argument("--no-clip-vloss", action="store_true")
    tr.add_argument("--max-grad-norm", type=float, default=0.5)
    tr.add_argument("--gamma", type=float, default=0.995)
    tr.add_argument("--gae-lambda", type=float, default=0.95)
    tr.add_argument("--hidden-sizes", type=int, nargs="+", default=[64, 64])
    tr.add_argument("--max-steps", type=int, default=100)
    tr.add_argument("--target", type=float, default=475.0)
    tr.add_argument("--step-overhead-ms", type=float, default=100.0, help="assumed distributed cost per step")
    tr.add_argument("--threads", type=int, default=1)
    tr.add_argument("--verbose", action="store_true", help="print the mean return after every step")
    tr.add_argument("--stats", action="store_true", help="print every step's train/* metrics as a JSON line")
    tm = sub.add_parser("timing", help="sim vs inference cost per env step")
    tm.add_argument("--task", default="HalfCheetah-v5", help="a gymnasium environment id")
    tm.add_argument("--num-envs", type=int, default=8)
    tm.add_argument("--iters", type=int, default=2000)
    tm.add_argument("--threads", type=int, default=1)
    tm.add_argument("--widths", nargs="+", default=["64", "256", "512", "1024", "2048", "1024x1024x1024"])
    args = parser.parse_args()
    run_train(args) if args.mode == "train" else run_timing(args)


if __name__ == "__main__":
    main()
