"""Each actor rank's memory for parameters, gradients and optimizer state, and each inference rank's for its copy of
the policy and the reference model: one full replica against FSDP2 shards.

A Qwen2-shaped model (12 decoder layers, hidden 512, vocabulary 8,192: about 45 M parameters, random init) takes two
AdamW steps as the reasoning actor takes them (`rlplace.core.strategies`): `ddp` on 1 rank, `fsdp` on 1, 2 and 4
ranks (processes of their own, gloo over the CPU). PyTorch's memory trackers (`torch.distributed._tools`: a dispatch
mode that sees every tensor allocation and files it as parameter, gradient, optimizer state, activation, ...) report
each rank's categories at its peak; the table shows rank 0's (ranks hold equal shards). Parameters count the gathered
units held in full during a pass (FSDP2's unsharded parameters: one decoder layer or embedding matrix) beside the
shards. The ideal is the 1-rank figure / N. Next to the measurement, the planner's prediction of the same rank's
state and peak (`rlplace.planner.memory`, as `rlplace-plan` predicts the reasoning actor's). Two more rows train LoRA
adapters (`actor.lora`) on 1 replica and on 2 sharded ranks; the LoRA table times an update of each kind.

The inference table: two frozen copies of the same model under the same strategies (`Strategy.wrap(trained=False)`,
as the inference group holds the policy and, with a KL term, the reference model) score one micro-batch of
16 x 64 tokens each (`response_logprobs`); rank 0's peak against the prediction `rlplace.reasoning.memory` makes.

The weight-sync table: an hf rollout engine of the same model takes one update, bucket by bucket, loading each as it
arrives (as the rollout does), against receiving the whole update before loading it.

    .venv/bin/python benchmarks/actor_memory.py
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from results import write_section
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlplace.core.config import WeightSyncConfig
from rlplace.core.strategies.base import Strategy, build_strategy
from rlplace.core.timing import median_seconds
from rlplace.core.weights import buckets
from rlplace.planner.memory import ALL_LINEAR, TransformerShape
from rlplace.reasoning import lora
from rlplace.reasoning.batch import SequenceBatch, response_logprobs, scoring_passes
from rlplace.reasoning.config import LoRAConfig
from rlplace.reasoning.generation.hf import HFEngine
from rlplace.reasoning.models.char_tokenizer import build_char_tokenizer
from rlplace.reasoning.update import optimizer_step

CONFIG = Qwen2Config(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=12,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)
RUNS = (("ddp", 1), ("fsdp", 1), ("fsdp", 2), ("fsdp", 4))
LORA_RANK = 16
LORA_RUNS = (("ddp", 1), ("fsdp", 2))
TIMED_UPDATES = 7
"""The actor training LoRA adapters of rank LORA_RANK on every linear layer (`actor.lora`) instead of every weight."""
STEPS = 2
ROWS, SEQ_LEN = 2, 64
SCORED_ROWS, SCORED_HALF = 16, 32
"""A scored micro-batch: rows of a 32-token prompt and a 32-token response."""
SCORING_BUDGETS = (("ddp", 1, 256), ("fsdp", 2, 256))
"""Inference ranks scoring in passes of 256 tokens (4 rows) instead of the micro-batch's 1,024 at once."""
MIB = 2**20
PARAMS = ("PARAM", "SHARDED_PARAM", "UNSHARDED_PARAM")
GRADS = ("GRAD", "SHARDED_GRAD", "UNSHARDED_GRAD")
HELD = "held"
WORKING = ("ACT", "TEMP", "ALL_GATHER", "REDUCE_SCATTER")
"""What a pass holds beyond the training state: activations, temporaries, collective buffers."""


def engine_folder(folder: Path) -> Path:
    """The model of `CONFIG` (random init, seed 0) written into `folder` as an engine loads it: with the character
    tokenizer, which the engines load; the benchmarks' prompts are token ids below its vocabulary."""
    torch.manual_seed(0)
    Qwen2ForCausalLM(CONFIG).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return folder


def predicted(strategy: str, world_size: int, lora_rank: int = 0) -> tuple[int, int, int]:
    """The planner's (`rlplace.planner.memory`) training state, peak and state held between updates for one rank, as
    `rlplace.reasoning.memory` predicts the actor's."""
    shape = TransformerShape.from_config(CONFIG.to_dict())
    sharded = strategy == "fsdp"
    adapters = shape.lora_parameters(lora_rank, [ALL_LINEAR]) if lora_rank else None
    state = shape.training_state_bytes(world_size, sharded, compute_bytes=4, adapters=adapters)
    held = shape.state_bytes(world_size if sharded else 1, adapters=adapters)
    return state, state + shape.activation_bytes(ROWS, SEQ_LEN, checkpointing=False), held


def predicted_scoring(strategy: str, world_size: int, budget: int | None = None) -> int:
    """The planner's peak for one inference rank scoring a micro-batch (in passes of `budget` tokens), as
    `rlplace.reasoning.memory` predicts it."""
    shape = TransformerShape.from_config(CONFIG.to_dict())
    sharded = strategy == "fsdp"
    gathered = shape.largest_unit() * 4 if sharded else 0
    seq_len = 2 * SCORED_HALF
    rows = SCORED_ROWS if budget is None else max(1, min(SCORED_ROWS, budget // seq_len))
    return 2 * shape.frozen_bytes(world_size, sharded) + gathered + shape.scoring_bytes(rows, seq_len)


def rank_peak(
    rank: int, role: str, strategy: str, world_size: int, lora_rank: int, init: str, out: Path, budget: int | None
) -> None:
    """Two AdamW steps (`role` actor, training LoRA adapters of `lora_rank` if not 0) or two models' scoring of a
    micro-batch (inference, in passes of `budget` tokens) of one rank under `strategy`; writes its peak's categories
    (bytes) to `out`."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    trainer = build_strategy(strategy, world_size, torch.device("cpu"))
    peak = train_peak(rank, trainer, lora_rank) if role == "actor" else scoring_peak(rank, trainer, budget)
    torch.save({str(kind).rsplit(".", 1)[-1]: int(size) for kind, size in peak.items()}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def scoring_peak(rank: int, holder: Strategy, budget: int | None) -> dict:
    """Every rank scores the same rows (a forward pass of sharded models is collective), in passes of `budget` tokens
    (`inference.max_tokens_per_micro_batch`; None: all rows at once)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    # Not frozen as the inference worker's (MemTracker hooks every parameter's gradient, which a frozen one refuses):
    # the passes run without autograd either way, so they hold the same.
    models = [holder.wrap(Qwen2ForCausalLM(CONFIG).eval(), trained=False) for _ in range(2)]
    ids = torch.randint(1, CONFIG.vocab_size, (SCORED_ROWS, 2 * SCORED_HALF), generator=torch.Generator())
    mask = torch.ones_like(ids)
    half = SCORED_HALF
    batch = SequenceBatch(0, ids[:, :half], mask[:, :half], ids[:, half:], mask[:, half:], problems=[])
    tracker = MemTracker()
    tracker.track_external(*models)
    with tracker:
        for model in models:
            for one in scoring_passes(batch, budget):  # the tracker takes one forward pass of a module at a time
                response_logprobs(model, batch, passes=[one])
                tracker.reset_mod_stats()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]


class _NoHook:
    """A hook handle with nothing to remove."""

    def remove(self) -> None:
        pass


NO_HOOK = _NoHook()


def train_peak(rank: int, trainer: Strategy, lora_rank: int) -> dict:
    """The peak's categories, and under `HELD` the bytes still held after the last update (what stays on the device
    through weight sync and generation)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    model = trainer.wrap(lora.adapt(Qwen2ForCausalLM(CONFIG).train(), LoRAConfig(rank=lora_rank)))
    optimizer = torch.optim.AdamW(lora.trained(model), lr=1e-4)
    ids = torch.randint(0, CONFIG.vocab_size, (ROWS, SEQ_LEN), generator=torch.Generator().manual_seed(rank))
    if trainer.collective_passes:  # fsdp: its tracker tells shards from gathered units
        tracker = FSDPMemTracker(model, optimizer)
    else:
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
    # The tracker hooks each parameter's gradient as a pass first meets it, which a frozen one (LoRA's base weights)
    # refuses: those are marked hooked already (with handles that remove nothing).
    for parameter in model.parameters():
        if not parameter.requires_grad:
            tracker._param_to_grad_hook_handles[parameter] = (NO_HOOK, NO_HOOK)
    with tracker:
        for _ in range(STEPS):  # the optimizer state exists from the first step on: the second is the steady one
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer_step(model, optimizer, 1.0, trainer)  # the reasoning actor's: reduce, clip, step
            tracker.reset_mod_stats()
        optimizer.zero_grad(set_to_none=True)  # as `llm_update` ends
    cpu = torch.device("cpu")
    return {**tracker.get_tracker_snapshot("peak")[cpu], HELD: tracker.get_tracker_snapshot()[cpu]["Total"]}


def measure(role: str, strategy: str, world_size: int, lora_rank: int = 0, budget: int | None = None) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        args = (role, strategy, world_size, lora_rank, str(out / "init"), out, budget)
        mp.spawn(rank_peak, args=args, nprocs=world_size)
        return torch.load(out / "rank0.pt")


def inference_table() -> list[str]:
    rows = []
    baseline = None
    for strategy, world_size, budget in [(*run, None) for run in RUNS] + list(SCORING_BUDGETS):
        total = measure("inference", strategy, world_size, budget=budget)["Total"]
        baseline = baseline or total
        whole = predicted_scoring(strategy, world_size, budget)
        tokens = SCORED_ROWS * 2 * SCORED_HALF if budget is None else budget
        rows.append(
            f"| {strategy} | {world_size} | {tokens} | {total / MIB:.0f} | {total / baseline:.0%} | "
            f"{whole / MIB:.0f} | {whole / total - 1:+.0%} |"
        )
        print(rows[-1], file=sys.stderr)
    return [
        f"Inference ranks: the policy's copy and the reference model (float32) scoring {SCORED_ROWS} x "
        f"{2 * SCORED_HALF} tokens each, at once or in passes of a token budget "
        "(`inference.max_tokens_per_micro_batch`); rank 0's peak, MiB.",
        "",
        "| strategy | ranks | tokens a pass | peak | of 1 rank | predicted peak | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def sync_peak(folder: Path, streamed: bool) -> int:
    """An hf rollout engine's peak while it takes one update of weight sync: its buckets, each a new tensor as a
    received message is, loaded as they come (`received_tensors`, `HFEngine.load_weights`), or all received before
    any is loaded."""
    from torch.distributed._tools.mem_tracker import MemTracker

    # Cut before tracking: the tracker would count each bucket's views of the sender's tensors as new memory.
    sent = buckets(Qwen2ForCausalLM(CONFIG).state_dict(), WeightSyncConfig().bucket_mb)
    engine = HFEngine(str(folder), torch.device("cpu"))

    def received() -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in sent:
            yield from {name: tensor.clone() for name, tensor in bucket.items()}.items()

    tracker = MemTracker()
    tracker.track_external(engine.model)
    with tracker:
        engine.load_weights(received() if streamed else dict(received()).items())
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def sync_table() -> list[str]:
    shape = TransformerShape.from_config(CONFIG.to_dict())
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        Qwen2ForCausalLM(CONFIG).save_pretrained(scratch)
        for label, streamed in (("as they arrive", True), ("all, then loaded", False)):
            peak = sync_peak(Path(scratch), streamed)
            rows.append(f"| {label} | {peak / MIB:.0f} | {peak / (4 * shape.parameters()):.2f} |")
            print(rows[-1], file=sys.stderr)
    bucket_mb = WeightSyncConfig().bucket_mb
    predicted = 4 * shape.parameters() + shape.bucket_bytes(bucket_mb)
    return [
        f"Rollout rank (hf engine, float32) taking one weight-sync update in buckets of {bucket_mb:g} MB; its peak, "
        f"MiB, and in units of its weights. Predicted (buckets loaded as they arrive): {predicted / MIB:.0f} MiB.",
        "",
        "| buckets loaded | peak | x weights |",
        "| --- | ---: | ---: |",
        *rows,
    ]


def update_seconds(lora_rank: int) -> float:
    """Median seconds of one update (forward and backward pass over ROWS x SEQ_LEN tokens, then an AdamW step) of
    one replica, training every weight or LoRA adapters of `lora_rank`."""
    torch.manual_seed(0)
    trainer = build_strategy("ddp", 1, torch.device("cpu"))
    model = lora.adapt(Qwen2ForCausalLM(CONFIG).train(), LoRAConfig(rank=lora_rank))
    optimizer = torch.optim.AdamW(lora.trained(model), lr=1e-4)
    ids = torch.randint(0, CONFIG.vocab_size, (ROWS, SEQ_LEN), generator=torch.Generator().manual_seed(0))

    def update() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer_step(model, optimizer, 1.0, trainer)

    return median_seconds(update, repeats=TIMED_UPDATES)


def lora_table() -> list[str]:
    full, adapted = update_seconds(0), update_seconds(LORA_RANK)
    print(f"update: all {full:.3f} s, LoRA {adapted:.3f} s", file=sys.stderr)
    return [
        f"One replica's update (a pass over {ROWS} x {SEQ_LEN} tokens and an AdamW step), median of "
        f"{TIMED_UPDATES}, seconds.",
        "",
        "| trains | update | of all |",
        "| --- | ---: | ---: |",
        f"| all | {full:.3f} | 100% |",
        f"| LoRA {LORA_RANK} | {adapted:.3f} | {adapted / full:.0%} |",
    ]


def main() -> None:
    parameters = sum(p.numel() for p in Qwen2ForCausalLM(CONFIG).parameters())
    rows = []
    baseline = None
    runs = [(strategy, world_size, 0) for strategy, world_size in RUNS]
    for strategy, world_size, lora_rank in runs + [(*run, LORA_RANK) for run in LORA_RUNS]:
        peak = measure("actor", strategy, world_size, lora_rank)
        params = sum(peak.get(k, 0) for k in PARAMS)
        grads = sum(peak.get(k, 0) for k in GRADS)
        total = params + grads + peak["OPT"]
        working = sum(peak.get(k, 0) for k in WORKING)
        baseline = baseline or total
        state, whole, held = predicted(strategy, world_size, lora_rank)
        trains = f"LoRA {lora_rank}" if lora_rank else "all"
        rows.append(
            f"| {strategy} | {world_size} | {trains} | {params / MIB:.0f} | {grads / MIB:.0f} | "
            f"{peak['OPT'] / MIB:.0f} | "
            f"{total / MIB:.0f} | {baseline / world_size / MIB:.0f} | {total / baseline:.0%} | {state / MIB:.0f} | "
            f"{working / MIB:.0f} | {(total + working) / MIB:.0f} | {whole / MIB:.0f} | "
            f"{whole / (total + working) - 1:+.0%} | {peak[HELD] / MIB:.0f} | {held / MIB:.0f} |"
        )
        print(rows[-1], file=sys.stderr)
    table = "\n".join(
        [
            f"Qwen2-shaped, {parameters / 1e6:.1f} M parameters, float32, AdamW, passes of {ROWS} x {SEQ_LEN} "
            "tokens; rank 0's peak, MiB. Trains: every weight, or LoRA adapters of that rank on every linear layer "
            "(`actor.lora`; the frozen weights are parameters). Training state = parameters + gradients + optimizer; "
            "working = activations, temporaries and collective buffers; predicted = `rlplace.planner.memory`; held = "
            "what the rank still holds after an update, through weight sync and generation.",
            "",
            "| strategy | ranks | trains | parameters | gradients | optimizer | state | ideal (1/N) | of 1 rank "
            "| predicted state | working | peak | predicted peak | error | held | predicted held |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |",
            *rows,
            "",
            *inference_table(),
            "",
            *sync_table(),
            "",
            *lora_table(),
        ]
    )
    print(table)
    write_section("actor_memory.py", table)


if __name__ == "__main__":
    main()
