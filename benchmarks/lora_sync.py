"""What a LoRA policy's weight sync sends (`actor.lora.sync`): the merged weights, or the adapters alone, which the
rollout engine then applies itself; how long a sync takes and what applying the adapters costs generation.

The Qwen2-shaped model of actor_memory.py (about 45 M parameters, random init, float32 on CPU) with rank-16 adapters on
every linear layer (B drawn at random, as after training). Two rlplace workers on a local Ray cluster of 2 logical
devices, a core each, as a disaggregated run places them: the actor's rank, which sends its weights with
`broadcast_weights` (merging each bucket, or sending the adapters alone), and a rollout rank, whose engine (hf, and
vLLM where it is installed) loads them as they arrive (`received_tensors`, `load_weights`). Measured per backend and
sync mode: the megabytes a sync sends, a sync's seconds from the driver's call to both ranks done (median of 5), and
the tokens per second of 64 prompts answered with 32 sampled tokens each after the sync; and whether an engine
sampled the same tokens in both modes.

    .venv/bin/python benchmarks/lora_sync.py
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from actor_memory import CONFIG, engine_folder
from results import publish

from rlplace.core.config import ClusterConfig
from rlplace.core.weights import broadcast_weights, received_tensors
from rlplace.placement.placement import Placement
from rlplace.planner.memory import TransformerShape
from rlplace.reasoning import lora
from rlplace.reasoning.config import LoRAConfig
from rlplace.reasoning.generation.engine import EngineOptions, make_engine
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.scheduler import Cluster, Worker

RANK = 16
SYNCS = ("merged", "adapters")
BUCKET_MB = 64.0
REPEAT = 5
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 64, 32, 32
BACKENDS = ("hf", "vllm") if importlib.util.find_spec("vllm") else ("hf",)


class Sender(Worker):
    """The actor's rank: the adapted policy, B drawn at random."""

    def __init__(self, folder: str, sync: str) -> None:
        settings = LoRAConfig(rank=RANK, alpha=2 * RANK, sync=sync)
        torch.manual_seed(0)
        self.policy = lora.adapt(load_causal_lm(folder), settings)
        with torch.no_grad():
            for name, parameter in self.policy.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(std=0.01)
        self.export = lora.export(self.policy, settings.sends_adapters)

    def sent_bytes(self) -> int:
        state = self.policy.state_dict()
        keep = self.export.keep or (lambda name: True)
        sent = self.export.convert({name: tensor for name, tensor in state.items() if keep(name)})
        return sum(t.numel() * t.element_size() for t in sent.values())

    def send(self, version: int) -> None:
        broadcast_weights(self, self.policy, version, "rollout", BUCKET_MB, export=self.export)


class Receiver(Worker):
    """A rollout rank's engine, applying the adapters itself under `sync: adapters`."""

    def __init__(self, folder: str, backend: str, sync: str) -> None:
        settings = LoRAConfig(rank=RANK, alpha=2 * RANK, sync=sync)
        options = EngineOptions(adapters=settings if settings.sends_adapters else None)
        self.engine = make_engine(backend, folder, self.device, options=options)

    def receive(self) -> int:
        version, tensors = received_tensors(self, "actor")
        self.engine.load_weights(tensors)
        return version

    def generate(self) -> tuple[float, list[list[int]]]:
        prompts = [[3 + (7 * i + j) % 90 for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
        ids = list(range(PROMPTS))
        sample = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "seed": 3, "ignore_eos": True}
        self.engine.generate(prompts[:2], ids[:2], **sample)  # warm-up
        start = time.perf_counter()
        tokens = self.engine.generate(prompts, ids, **sample)
        return time.perf_counter() - start, tokens

    def close(self) -> None:
        self.engine.close()


def on_device(device: int) -> list[Placement]:
    return [
        Placement(
            rank=0,
            world_size=1,
            node_rank=0,
            devices=(device,),
            local_devices=(device,),
            local_rank=0,
            local_world_size=1,
        )
    ]


def measure(cluster: Cluster, folder: str, backend: str, sync: str) -> dict:
    sender = Sender.create_group(folder, sync).launch(cluster, name="actor", placement_strategy=on_device(0))
    receiver = Receiver.create_group(folder, backend, sync).launch(
        cluster, name="rollout", placement_strategy=on_device(1)
    )
    sent = sender.sent_bytes().wait(timeout=600)[0]
    seconds = []
    for version in range(1, REPEAT + 1):
        start = time.perf_counter()
        received = receiver.receive()
        sender.send(version).wait(timeout=600)
        assert received.wait(timeout=600) == [version]
        seconds.append(time.perf_counter() - start)
    generate_s, tokens = receiver.generate().wait(timeout=600)[0]
    receiver.terminate()
    sender.terminate()
    return {"sent": sent, "sync_s": statistics.median(seconds), "generate_s": generate_s, "tokens": tokens}


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = engine_folder(Path(scratch) / "model")
        with Cluster(ClusterConfig(num_devices_per_node=2)) as cluster:
            results = {
                (backend, sync): measure(cluster, str(folder), backend, sync) for backend in BACKENDS for sync in SYNCS
            }
    lines = [
        "| backend | actor.lora.sync | sent per sync | sync (median) | generation tokens/s | vs merged |",
        "|---|---|---:|---:|---:|---:|",
    ]
    same = []
    for (backend, sync), found in results.items():
        merged = results[backend, "merged"]
        tokens_per_s = PROMPTS * NEW_TOKENS / found["generate_s"]
        lines.append(
            f"| {backend} | {sync} | {found['sent'] / 1e6:,.1f} MB | {found['sync_s']:.3f} s | {tokens_per_s:,.0f} | "
            f"{merged['generate_s'] / found['generate_s']:.2f}x |"
        )
        if sync != "merged":
            matching = sum(a == b for a, b in zip(merged["tokens"], found["tokens"], strict=True))
            same.append(f"{backend} {matching} of {PROMPTS}")
    caption = (
        f"A {TransformerShape.from_config(CONFIG.to_dict()).parameters() / 1e6:.0f} M-parameter Qwen2 shape with "
        f"rank-{RANK} adapters on every linear layer, the actor and a rollout rank on a core each (local Ray); "
        f"sampled responses the same with the adapters sent alone as merged: {', '.join(same)}."
    )
    publish("lora_sync.py", caption, lines)


if __name__ == "__main__":
    sys.exit(main())
