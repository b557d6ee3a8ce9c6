"""The GPU suite: one command, one table (also written as JSON), everything README's GPU section quotes.

    PYTHONPATH=src python benchmarks/gpu_suite.py --out gpu_suite.json            # on a machine with an NVIDIA GPU
    PYTHONPATH=src python benchmarks/gpu_suite.py --smoke --sections generation  # a quick pass, CPU included

Sections (`--sections` picks some; each one's failure becomes a row, the others still run):
- `tests`: the GPU-marked tests (pytest -m gpu), which ran and which passed.
- `copy`: the pinned host<->device copy rate and the device's own copy rate, the references for the rows below.
- `offload`: an actor's weights, gradients and Adam state (a 0.5B model in float32) to pinned host memory and back,
  in GB/s, and as a share of the pinned copy rate.
- `weight_sync`: actor -> rollout weights (0.5B, bf16) between two Ray workers on one GPU through rlplace's
  broadcast (CUDA IPC), and a direct NCCL broadcast between two processes on that one GPU.
- `generation`: hf decoding of a random-initialised Qwen2.5-0.5B-shaped model (bf16, built from a config) at
  batch 1/8/64/256, eager vs CUDA graphs, tokens/s next to the memory-bandwidth floor.
- `planner`: the halfcheetah_pipeline preset on the GPU, collocated vs hybrid (env on CPU processes), 1 vs 2
  pipeline stages, each run measured; the planner, from the profile of the collocated 1-stage run, predicts each.
- `reasoning`: GRPO on arithmetic with a 0.25B char-level LM, collocated on the GPU, offload timed.
- `llm_step`: GRPO on arithmetic with a Qwen2.5-1.5B-shaped model (random init, bf16 folder, a BPE tokenizer trained
  here), collocated on the GPU with the hf rollout; the actor sharded (`actor.strategy=fsdp`, one rank), bf16 compute,
  activation checkpointing: seconds per step and per phase, tokens/s; and (rows `llm_step memory`) the planner's
  predicted peak device memory per phase (`rlplace-plan`, `rlplace.reasoning.memory`) next to the measured one.
- `llm_lora`: the same step training LoRA adapters (`actor.lora.rank=64`) instead of every weight; the same rows.
  PEFT must be importable (`../shared/device/bundle.sh peft accelerate psutil` on a machine without a registry).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from results import write_section

from rlplace.scheduler.context import cuda_alloc_conf

# Before torch starts CUDA: the driver's offloads pin host memory as rlplace's GPU workers do.
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = cuda_alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9


@dataclass
class Row:
    section: str
    name: str
    value: float | str
    unit: str = ""
    note: str = ""


@dataclass
class Settings:
    smoke: bool
    device: torch.device
    tmp: Path
    decodings: list[str]


def timed(fn: Callable[[], object], repeats: int, sync: bool) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after one untimed warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


# --- tests ----------------------------------------------------------------------------------------------------


def section_tests(s: Settings) -> list[Row]:
    report = s.tmp / "gpu_tests.txt"
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider", *files]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    report.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))]
    rows = [Row("tests", line.split(" ", 1)[1].split(" - ")[0], line.split(" ", 1)[0]) for line in lines]
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    failures = [line for line in done.stdout.splitlines() if line.startswith("E ")][:6]
    return [*rows, Row("tests", "pytest -m gpu", tail, note=" | ".join(failures))]


# --- copy and offload -----------------------------------------------------------------------------------------


def section_copy(s: Settings) -> list[Row]:
    size = (64 if s.smoke else 1024) * 2**20
    device = torch.empty(size, dtype=torch.uint8, device=s.device)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    other = torch.empty_like(device)
    d2h = statistics.median(timed(lambda: host.copy_(device, non_blocking=True), 5, True))
    h2d = statistics.median(timed(lambda: device.copy_(host, non_blocking=True), 5, True))
    d2d = statistics.median(timed(lambda: other.copy_(device), 10, True))
    return [
        Row("copy", "pinned device -> host", size / d2h / GB, "GB/s", f"{size / 2**20:.0f} MiB, one tensor"),
        Row("copy", "pinned host -> device", size / h2d / GB, "GB/s", f"{size / 2**20:.0f} MiB, one tensor"),
        Row("copy", "device -> device", 2 * size / d2d / GB, "GB/s", "bytes read + written (the decode floor)"),
    ]


QWEN_SHAPES = {
    "0.5B": {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "max_position_embeddings": 32768, "rope_theta": 1e6, "eos": 151643},
    "smoke": {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
              "num_attention_heads": 4, "max_position_embeddings": 512, "eos": 0},
}  # fmt: skip


def qwen_config(smoke: bool):
    """Qwen2.5-0.5B's shape (494 M parameters: 2 KV heads, tied embeddings), or a small one for --smoke."""
    from transformers import Qwen2Config

    shape = dict(QWEN_SHAPES["smoke" if smoke else "0.5B"])
    eos = shape.pop("eos")
    return Qwen2Config(
        **shape, num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos
    )


def qwen_folder(s: Settings) -> Path:
    """The random-initialised model saved once (bf16) for the sections that load it by path."""
    from transformers import Qwen2ForCausalLM

    folder = s.tmp / "qwen"
    if not folder.exists():
        torch.manual_seed(0)
        with torch.device(s.device):
            model = Qwen2ForCausalLM(qwen_config(s.smoke)).to(torch.bfloat16)
        model.save_pretrained(folder)
        del model
    return folder


def section_offload(s: Settings) -> list[Row]:
    from rlplace.core.offload import HostCopies, move
    from rlplace.reasoning.models.tiny_lm import load_causal_lm

    model = load_causal_lm(qwen_folder(s), s.device, torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), device=s.device)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    rows = []
    cpu = torch.device("cpu")
    host = HostCopies()  # as each worker keeps one
    records = [(move(model, optimizer, cpu, host), move(model, optimizer, s.device, host)) for _ in range(4)]
    first_off, first_on = records[0]
    off = statistics.median(r[0].gb_per_s for r in records[1:])
    on = statistics.median(r[1].gb_per_s for r in records[1:])
    gb = first_off.bytes / GB
    rows.append(Row("offload", "offload (first, pins the host copies)", first_off.gb_per_s, "GB/s", f"{gb:.2f} GB"))
    rows.append(Row("offload", "offload (steady)", off, "GB/s", f"{gb:.2f} GB: params, grads, AdamW state"))
    rows.append(Row("offload", "onload (first)", first_on.gb_per_s, "GB/s", f"{gb:.2f} GB"))
    rows.append(Row("offload", "onload (steady)", on, "GB/s", f"{gb:.2f} GB"))
    del model, optimizer
    torch.cuda.empty_cache() if s.device.type == "cuda" else None
    return rows


# --- weight sync ----------------------------------------------------------------------------------------------


def sync_peer_class() -> type:
    """A Worker that holds the model and times sending and receiving it (defined here, pickled by value to Ray)."""
    import torch.distributed as dist

    from rlplace.core.weights import broadcast_weights, receive_weights
    from rlplace.reasoning.models.tiny_lm import load_causal_lm
    from rlplace.scheduler import Worker

    class SyncPeer(Worker):
        def __init__(self, folder: str) -> None:
            self.model = load_causal_lm(folder, self.device, torch.bfloat16)

        def state_bytes(self) -> int:
            return sum(t.numel() * t.element_size() for t in self.model.state_dict().values())

        def send(self, dst: str, bucket_mb: float, repeats: int) -> None:
            for version in range(repeats):
                broadcast_weights(self, self.model, version, dst, bucket_mb)

        def receive(self, src: str, repeats: int) -> list[float]:
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                receive_weights(self, self.model, src)
                torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            return seconds

        def nccl_broadcast(self, port: int, repeats: int) -> float | str:
            """Median seconds to broadcast the weights as one flat tensor from rank 0, or why NCCL refused."""
            try:
                dist.init_process_group(
                    "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank, world_size=2, device_id=self.device
                )
                flat = torch.cat([t.flatten() for t in self.model.state_dict().values()])
                seconds = timed(lambda: dist.broadcast(flat, 0), repeats, True)
                dist.destroy_process_group()
                return statistics.median(seconds)
            except Exception as error:  # noqa: BLE001 - the refusal is the measurement
                return f"{type(error).__name__}: {error}".replace("\n", " ")

    return SyncPeer


def section_weight_sync(s: Settings) -> list[Row]:
    SyncPeer = sync_peer_class()  # noqa: N806 - a class
    from rlplace.core.config import ClusterConfig
    from rlplace.placement.placement import Placement
    from rlplace.scheduler import Cluster

    def on_gpu0(ranks: int) -> list[Placement]:
        return [
            Placement(
                rank=r,
                world_size=ranks,
                node_rank=0,
                devices=(0,),
                local_devices=(0,),
                local_rank=r,
                local_world_size=ranks,
            )
            for r in range(ranks)
        ]

    folder = str(qwen_folder(s))
    repeats = 2 if s.smoke else 5
    rows = []
    with Cluster(ClusterConfig(device_type="gpu", num_devices_per_node=1)) as cluster:
        actor = SyncPeer.create_group(folder).launch(cluster, name="actor", placement_strategy=on_gpu0(1))
        rollout = SyncPeer.create_group(folder).launch(cluster, name="rollout", placement_strategy=on_gpu0(1))
        nbytes = actor.state_bytes().wait(timeout=300)[0]
        for bucket_mb in (256, 1024):
            received = rollout.receive("actor", repeats + 1)
            actor.send("rollout", bucket_mb, repeats + 1).wait(timeout=600)
            seconds = statistics.median(received.wait(timeout=600)[0][1:])
            rows.append(
                Row(
                    "weight_sync",
                    f"actor -> rollout, one GPU, CUDA IPC, {bucket_mb} MB buckets",
                    nbytes / seconds / GB,
                    "GB/s",
                    f"{nbytes / GB:.2f} GB bf16, {seconds * 1e3:.0f} ms",
                )
            )
        actor.terminate()
        rollout.terminate()
        pair = SyncPeer.create_group(folder).launch(cluster, name="pair", placement_strategy=on_gpu0(2))
        results = pair.nccl_broadcast(29517, repeats).wait(timeout=300)
        pair.terminate()
    outcome = results[1]
    if isinstance(outcome, str):
        rows.append(Row("weight_sync", "NCCL broadcast, two processes on one GPU", "refused", note=outcome[:200]))
    else:
        rows.append(
            Row(
                "weight_sync",
                "NCCL broadcast, two processes on one GPU",
                nbytes / outcome / GB,
                "GB/s",
                f"{nbytes / GB:.2f} GB as one flat bf16 tensor",
            )
        )
    return rows


# --- generation -----------------------------------------------------------------------------------------------


DECODINGS = {
    "eager": {"decoding": "dynamic"},
    "cuda_graph": {"decoding": "cuda_graph"},
    "compiled cuda_graph": {"decoding": "cuda_graph", "compile_step": True},
}
"""Each fast path against eager decoding; on the CPU (--smoke) the static cache stands in for the graphs."""


def section_generation(s: Settings, bandwidth: float | None) -> list[Row]:
    from rlplace.reasoning.generation.hf import HFEngine

    folder = str(qwen_folder(s))
    config = qwen_config(s.smoke)
    batches = [1, 8] if s.smoke else [1, 8, 64, 256]
    prompt_len, new_tokens = 32, (16 if s.smoke else 64)
    generator = torch.Generator().manual_seed(0)
    all_prompts = torch.randint(1, config.vocab_size, (max(batches), prompt_len), generator=generator).tolist()
    chosen = {name: DECODINGS[name] for name in s.decodings}
    decodings = chosen if s.device.type == "cuda" else {"eager": DECODINGS["eager"], "static": {"decoding": "static"}}
    params = sum(
        p.numel() * p.element_size() for p in HFEngine(folder, s.device, dtype=torch.bfloat16).model.parameters()
    )
    kv_per_token = (
        4 * config.num_hidden_layers * config.num_key_value_heads * config.hidden_size // config.num_attention_heads
    )
    rows = []
    eager: dict[int, float] = {}
    for name, options in decodings.items():
        try:
            start = time.perf_counter()
            engine = HFEngine(folder, s.device, dtype=torch.bfloat16, **options)
            for batch in batches:
                prompts = all_prompts[:batch]

                def run(prompts=prompts, engine=engine) -> None:
                    engine.generate(
                        prompts,
                        list(range(len(prompts))),
                        max_new_tokens=new_tokens,
                        temperature=1.0,
                        seed=1,
                        ignore_eos=True,
                    )

                rate = batch * new_tokens / statistics.median(timed(run, 2 if s.smoke else 3, s.device.type == "cuda"))
                if name == "eager":
                    eager[batch] = rate
                note = f"{rate / eager[batch]:.1f}x eager" if name != "eager" and batch in eager else ""
                if bandwidth:
                    floor = batch * bandwidth / (params + batch * (prompt_len + new_tokens / 2) * kv_per_token)
                    note += f"; {rate / floor:.0%} of the floor, {floor:,.0f} tok/s"
                rows.append(Row("generation", f"batch {batch}: {name}", rate, "tok/s", note.lstrip("; ")))
            del engine
            rows.append(
                Row("generation", f"{name}: whole section", time.perf_counter() - start, "s", "incl. capture/compile")
            )
        except Exception as error:  # noqa: BLE001 - one decoding failing leaves the others measured
            traceback.print_exc()
            rows.append(Row("generation", f"{name}: FAILED", type(error).__name__, note=str(error)[-300:]))
    return rows


# --- end-to-end runs ------------------------------------------------------------------------------------------


def train(s: Settings, name: str, overrides: list[str], timeout: int = 420) -> dict:
    """One `rlplace-train` run with `overrides`; its summary.json (or the failure's last lines as an exception)."""
    run_dir = s.tmp / "runs" / name
    cmd = [sys.executable, "-m", "rlplace.train", *overrides, "logger=jsonl", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    (s.tmp / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}")
    return json.loads((run_dir / "summary.json").read_text())


HALFCHEETAH = {
    "collocated, 1 stage": ["placement=collocated", "rollout.pipeline_stage_num=1"],
    "collocated, 2 stages": ["placement=collocated", "rollout.pipeline_stage_num=2"],
    "hybrid, 1 stage": ["rollout.pipeline_stage_num=1"],
    "hybrid, 2 stages": ["rollout.pipeline_stage_num=2"],
}
"""Collocated: every component on the GPU's processes (one env process). Hybrid: the env on 8 CPU-only processes
(a node group), rollout and actor sharing the GPU, so env and rollout work at once."""
HYBRID_GPU = 'cluster.component_placement={actor: 0, rollout: 0, env: {node_group: node, placement: "0:0-7"}}'
PROFILED = "collocated, 1 stage"
"""The placement whose profile predicts the others."""


def section_planner(s: Settings) -> list[Row]:
    """The four HalfCheetah placements run (each profiled, for the record); the planner, given the profile of the
    collocated 1-stage run alone, predicts each one's step time."""
    base = [
        "experiment=halfcheetah_pipeline",
        # Steps on a shared GPU host vary by half and more from one to the next; a median of 28 holds still.
        "runner.max_steps=30",
        "runner.profile=true",
        "runner.save_interval=null",
    ]
    base += ["cluster=local", "task.total_num_envs=32", "runner.max_steps=4"] if s.smoke else ["cluster=single_gpu"]
    runs = {}
    for name, extra in HALFCHEETAH.items():
        overrides = [*base, *extra]
        if name.startswith("hybrid") and not s.smoke:
            overrides.append(HYBRID_GPU)
        folder = "halfcheetah_" + name.replace(", ", "_").replace(" ", "")
        runs[name] = (overrides, folder, train(s, folder, overrides))
    profile = s.tmp / "runs" / runs[PROFILED][1]
    rows = []
    for name, (overrides, _, summary) in runs.items():
        predicted = plan(overrides, f"plan.profile={profile}")["prediction"]["step_s"]
        measured = summary["time/step"]
        rows.append(
            Row(
                "planner",
                name,
                predicted / measured - 1,
                "error",
                f"predicted {predicted:.3f} s, measured {measured:.3f} s/step "
                f"({summary['throughput/env_steps_per_s']:,.0f} env steps/s): generate "
                f"{summary['time/generate_rollouts']:.3f} (env busy {summary['time/env']:.3f}, rollout busy "
                f"{summary['time/rollout']:.3f}), train {summary['time/training']:.3f}",
            )
        )
    return rows


def plan(overrides: list[str], *extra: str) -> dict:
    """`rlplace-plan`'s JSON answer for a run of `overrides`."""
    done = subprocess.run(
        [sys.executable, "-m", "rlplace.plan", *overrides, *extra, "plan.format=json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rlplace-plan: {done.stderr[-600:]}")
    return json.loads(done.stdout)


def section_reasoning(s: Settings) -> list[Row]:
    from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm

    shape = TinyLMShape(
        hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=4, head_dim=64, intermediate_size=4096
    )
    if s.smoke:
        shape = TinyLMShape()
    folder = build_tiny_lm(s.tmp / "char_lm", shape)
    overrides = [
        "experiment=arithmetic_grpo",
        "model=hf",
        f"model.path={folder}",
        "runner.max_steps=6",
        "runner.eval_interval=100",
    ]
    overrides += ["cluster=local", "runner.max_steps=3"] if s.smoke else ["cluster=single_gpu"]
    summary = train(s, "reasoning_grpo", overrides)
    params = sum(p.numel() for p in load_causal_lm(folder).parameters())
    keys = ["time/step", "time/generate_rollouts", "time/training", "time/offload", "time/onload", "time/sync_weights"]
    detail = ", ".join(f"{k.split('/')[1]} {summary[k]:.3f}" for k in keys if k in summary)
    return [
        Row(
            "reasoning",
            f"GRPO arithmetic, {params / 1e6:.0f} M params, collocated",
            summary["time/step"],
            "s/step",
            detail,
        )
    ]


QWEN_1_5B = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768}  # fmt: skip
"""Qwen2.5-1.5B's shape (1.54 B parameters, tied embeddings); --smoke shrinks it to 2 small layers and a vocabulary
of 1,024."""
LLM_STEP = [
    "experiment=arithmetic_grpo",
    "actor.strategy=fsdp",
    "actor.dtype=bf16",
    "actor.gradient_checkpointing=true",
    "task.prompts_per_step=32",
    "rollout.micro_batch_prompts=8",
    "rollout.max_new_tokens=16",
    "algorithm.num_minibatches=2",
    "runner.eval_interval=100",
]


def qwen_1_5b_folder(s: Settings) -> Path:
    """A random-initialised Qwen2-shaped model in bf16 with a byte-level BPE tokenizer trained on arithmetic text (its
    vocabulary smaller than the model's: the extra rows are never used)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlplace.reasoning.models.tiny_qwen2 import train_tokenizer

    folder = s.tmp / "qwen_1_5b"
    if folder.exists():
        return folder
    tokenizer = train_tokenizer([f"{a}+{b}={a + b}" for a in range(100) for b in range(100)], 512)
    shape = dict(QWEN_1_5B)
    if s.smoke:
        # A vocabulary near the tokenizer's: Qwen's 151,936 rows make each CPU pass minutes long.
        shape.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
        shape.update(vocab_size=1024)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = Qwen2Config(**shape, tie_word_embeddings=True, eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(s.device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return folder


LLM_LORA = ["actor.lora.rank=64", "actor.lora.alpha=128"]
"""`llm_lora`: the same step training LoRA adapters on every linear layer (PEFT must be importable)."""


def section_llm_step(s: Settings) -> list[Row]:
    return llm_step(s, "llm_step", [], "GRPO step, collocated, fsdp bf16 + recompute")


def section_llm_lora(s: Settings) -> list[Row]:
    return llm_step(s, "llm_lora", LLM_LORA, "the same step, LoRA rank 64 on every linear layer")


def llm_step(s: Settings, name: str, extra: list[str], label: str) -> list[Row]:
    """The Qwen2.5-1.5B-shaped GRPO step (with `extra` overrides): its seconds per step and per phase, tokens/s, and
    the predicted peak memory of device 0 per phase next to the measured one."""
    from rlplace.planner.memory import TransformerShape

    folder = qwen_1_5b_folder(s)
    overrides = [*LLM_STEP, "model=hf", f"model.path={folder}", *extra]
    overrides += ["cluster=local", "runner.max_steps=3", "rollout.micro_batch_prompts=4"] if s.smoke else []
    overrides += [] if s.smoke else ["cluster=single_gpu", "runner.max_steps=5"]
    overrides += ["runner.save_interval=null"]
    memory = plan(overrides)["memory"]
    summary = train(s, name, overrides, timeout=900)
    keys = ["generate_rollouts", "inference", "training", "offload", "onload", "sync_weights"]
    phases = ", ".join(f"{k} {summary[f'time/{k}']:.3f}" for k in keys if f"time/{k}" in summary)
    predicted = ", ".join(f"{phase} {gb:.1f}" for phase, gb in memory["devices_gb"]["0"].items())
    params = TransformerShape.from_config(json.loads((folder / "config.json").read_text())).parameters()
    return [
        *memory_rows(s, name, memory["devices_gb"]["0"]),
        Row(name, label, summary["time/step"], "s/step", phases),
        Row(name, "tokens/s", summary.get("throughput/tokens_per_s", float("nan")), "tokens/s"),
        Row(name, "predicted peak memory, device 0", max(memory["devices_gb"]["0"].values()), "GB", predicted),
        Row(name, "parameters", params / 1e9, "B", "smoke shape" if s.smoke else "Qwen2.5-1.5B shape"),
    ]


def memory_rows(s: Settings, name: str, predicted: dict[str, float]) -> list[Row]:
    """Per phase, the predicted peak of device 0 next to the measured one in run `name`: the largest over its steps
    of the sum of its processes' `torch.cuda.max_memory_allocated` (`Timeline.memory`)."""
    steps = [json.loads(line) for line in (s.tmp / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    rows = []
    for phase, gb in predicted.items():
        found = [step[f"memory/device_0/{phase}_gb"] for step in steps if f"memory/device_0/{phase}_gb" in step]
        if not found:
            rows.append(Row(f"{name} memory", phase, "not measured", note=f"predicted {gb:.2f} GB (no CUDA workers)"))
            continue
        rows.append(
            Row(
                f"{name} memory",
                phase,
                gb / max(found) - 1,
                "error",
                f"predicted {gb:.2f} GB, measured {max(found):.2f}",
            )
        )
    return rows


# --- main -----------------------------------------------------------------------------------------------------


SECTIONS = ("tests", "planner", "llm_step", "llm_lora", "copy", "offload", "weight_sync", "generation", "reasoning")


def print_table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for row in rows:
        value = f"{row.value:,.2f}" if isinstance(row.value, float) else str(row.value)
        lines.append(f"{row.section:<12} {row.name:<{width}}  {value:>12} {row.unit:<12} {row.note}")
    print("\n".join(lines))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--smoke", action="store_true", help="small sizes, any device: checks the script runs")
    parser.add_argument(
        "--decodings", nargs="+", default=list(DECODINGS), choices=DECODINGS, help="the generation section's paths"
    )
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--keep", type=Path, help="a folder for models, run logs and test output (default: temp)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(args.smoke, device, args.keep or Path(tmp), args.decodings)
        s.tmp.mkdir(parents=True, exist_ok=True)
        rows = [
            Row(
                "machine",
                "device",
                torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                note=f"torch {torch.__version__}, {os.cpu_count()} cores",
            )
        ]
        bandwidth = None
        for name in args.sections:
            start = time.perf_counter()
            try:
                if name == "generation":
                    found = section_generation(s, bandwidth)
                else:
                    found = globals()[f"section_{name}"](s)
                if name == "copy":
                    bandwidth = found[-1].value * GB
            except Exception as error:  # noqa: BLE001 - a failed section is a row; the others still run
                traceback.print_exc()
                found = [Row(name, "FAILED", type(error).__name__, note=str(error)[-300:].replace("\n", " "))]
            rows += found
            print(f"[{name}: {time.perf_counter() - start:.0f} s]", flush=True)
            print_table(found)
        print()
        table = print_table(rows)
        if not args.smoke:
            some = [] if args.sections == list(SECTIONS) else ["--sections", *args.sections]
            write_section(" ".join(["gpu_suite.py", *some]), f"```text\n{table}\n```")
        if args.out:
            args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
