"""The actor phase against the same update in one process: what data parallelism costs and gains on a small model.

One PPO update of the default CartPole run (a batch of 1,024 samples, 20 epochs x 4 minibatches, the 64x64 MLP),
timed as the actor worker runs it:

- one process holding the whole batch (what a single-process PPO does);
- 2 actor ranks on 2 logical devices, half the batch each, gradients averaged once per minibatch through
  `Worker.average_over_group` (rank to rank through the mailboxes, what rlplace uses for small CPU tensors);
- the same 2 ranks averaging through gloo's all-reduce (torch.distributed), what it used before;
- 2 ranks that do not average at all: the compute alone, the floor for the other two.

Each figure is the median of 5 updates after one warm-up, with the seconds spent averaging next to it.

    .venv/bin/python benchmarks/actor_update.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from results import write_section

from rlplace.core.config import ClusterConfig
from rlplace.core.gradients import average_grads
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.envs import env_spec
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.ppo import make_optimizer, ppo_update
from rlplace.placement.placement import Placement
from rlplace.scheduler import Cluster, Worker

BATCH = 1024
REPEAT = 5
ALGORITHM = PPOConfig(update_epochs=20, num_minibatches=4)


def timed_updates(batch_size: int, average: Callable[[torch.Tensor], None] | None) -> tuple[float, float]:
    """Median seconds of one update, and of the averaging within it."""
    spec = env_spec("CartPole-v1")
    torch.manual_seed(0)
    model = MLPActorCritic(spec.obs_dim, spec.action, [64, 64], "tanh")
    optimizer = make_optimizer(model, 1e-3)
    batch = {
        "obs": torch.randn(batch_size, spec.obs_dim),
        "actions": torch.randint(0, 2, (batch_size,)).float(),
        "logprobs": -torch.rand(batch_size),
        "values": torch.randn(batch_size),
        "advantages": torch.randn(batch_size),
        "returns": torch.randn(batch_size),
    }
    generator = torch.Generator().manual_seed(0)
    averaging = [0.0]

    def timed_average(grads: list[torch.Tensor]) -> None:
        start = time.perf_counter()
        average_grads(grads, average)  # type: ignore[arg-type]
        averaging[0] += time.perf_counter() - start

    totals, spent = [], []
    for i in range(REPEAT + 1):
        averaging[0] = 0.0
        start = time.perf_counter()
        ppo_update(model, optimizer, batch, ALGORITHM, generator, None if average is None else timed_average)
        if i:
            totals.append(time.perf_counter() - start)
            spent.append(averaging[0])
    return statistics.median(totals), statistics.median(spent)


class Actor(Worker):
    def __init__(self) -> None:
        self.init_process_group()

    def update(self, how: str) -> tuple[float, float]:
        averages = {"mailbox": self.average_over_group, "gloo": self._gloo_mean, "none": None}
        return timed_updates(BATCH // self.world_size, averages[how])

    def _gloo_mean(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)
        tensor /= self.world_size


def ranks(n: int) -> list[Placement]:
    return [
        Placement(rank=i, world_size=n, node_rank=0, devices=(i,), local_devices=(i,), local_rank=i, local_world_size=n)
        for i in range(n)
    ]


def main() -> None:
    rows = []
    with Cluster(ClusterConfig()) as cluster:
        one = Actor.create_group().launch(cluster, name="one", placement_strategy=ranks(1))
        rows.append(("1 process, whole batch", *one.update("none").wait()[0]))
        one.terminate()
        two = Actor.create_group().launch(cluster, name="two", placement_strategy=ranks(2))
        for how, label in (("mailbox", "mailboxes"), ("gloo", "gloo all-reduce"), ("none", "no averaging")):
            per_rank = two.update(how).wait()
            rows.append((f"2 ranks, {label}", max(r[0] for r in per_rank), max(r[1] for r in per_rank)))
        two.terminate()
    steps = ALGORITHM.update_epochs * ALGORITHM.num_minibatches
    lines = [
        f"One PPO update: {BATCH} samples, {steps} minibatch steps, 64x64 MLP (median of {REPEAT})\n",
        "| actor | update (ms) | averaging (ms) | per minibatch step (ms) |",
        "|---|---:|---:|---:|",
    ]
    for label, total, averaging in rows:
        lines.append(f"| {label} | {total * 1e3:,.0f} | {averaging * 1e3:,.0f} | {total / steps * 1e3:.2f} |")
    print("\n".join(lines))
    write_section("actor_update.py", "\n".join(lines))


if __name__ == "__main__":
    main()
