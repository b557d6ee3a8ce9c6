"""A vLLM rollout engine whole on one rank against split over two (`rollout.tensor_parallel_size`): how fast it
generates, how long an in-place weight update takes, and that it samples the same tokens.

The Qwen2-shaped model of actor_memory.py (about 45 M parameters, random init, float32 on CPU) is served by
`VLLMEngine` as a rollout rank builds it: split over 2 ranks, each rank is a process of its own in a gloo process
group of the two, pinned to a core of its own (as a cpu cluster pins a rank to its device's cores), and builds its
part with the tensor-parallel size. Measured: the tokens per second of 64 prompts answered with 32 sampled tokens
each (every rank of a split engine generates every response, so its throughput is one rank's), and one
`load_weights` of the whole float32 state, as weight sync streams it. What a rank holds is not measured here: vLLM's
CPU kernels repack the weights where torch's counters do not see them, and the process's resident memory is mostly
the engine's fixed KV cache reserve and its runtime (`rlplace.reasoning.memory` predicts a split engine's share).

    .venv/bin/python benchmarks/rollout_split.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from actor_memory import engine_folder
from results import write_section
from transformers import Qwen2ForCausalLM

from rlplace.reasoning.generation.engine import EngineOptions, make_engine

PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 64, 32, 32
SIZES = (1, 2)


def rank_run(rank: int, size: int, folder: str, out: str) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/init-{size}", rank=rank, world_size=size)
    engine = make_engine("vllm", folder, "cpu", options=EngineOptions(tensor_parallel_size=size))
    prompts = [[3 + (7 * i + j) % 90 for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
    ids = list(range(PROMPTS))
    sample = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    engine.generate(prompts[:2], ids[:2], **sample)  # warm-up
    start = time.perf_counter()
    tokens = engine.generate(prompts, ids, **sample)
    generate_s = time.perf_counter() - start
    state = Qwen2ForCausalLM.from_pretrained(folder).state_dict()
    start = time.perf_counter()
    engine.load_weights(state.items())
    load_s = time.perf_counter() - start
    engine.close()
    torch.save({"generate_s": generate_s, "load_s": load_s, "tokens": tokens}, f"{out}/{size}-{rank}.pt")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = engine_folder(Path(scratch) / "model")
        results = {}
        for size in SIZES:
            mp.spawn(rank_run, args=(size, str(folder), scratch), nprocs=size)
            results[size] = [torch.load(f"{scratch}/{size}-{rank}.pt") for rank in range(size)]
    whole = results[1][0]
    assert all(r["tokens"] == whole["tokens"] for ranks in results.values() for r in ranks), "split != whole"
    base = PROMPTS * NEW_TOKENS / whole["generate_s"]
    lines = [
        "| engine | ranks (a core each) | tokens/s | vs whole | weight update |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for size, ranks in results.items():
        tokens_per_s = PROMPTS * NEW_TOKENS / max(r["generate_s"] for r in ranks)
        lines.append(
            f"| {'whole' if size == 1 else f'split over {size}'} | {size} | {tokens_per_s:,.0f} | "
            f"{tokens_per_s / base:.2f}x | {max(r['load_s'] for r in ranks):.2f} s |"
        )
    table = "\n".join(lines)
    print(table)
    print("same sampled tokens whole and split: yes")
    write_section("rollout_split.py", table + "\n\nSame sampled tokens whole and split (checked).")


if __name__ == "__main__":
    sys.exit(main())
