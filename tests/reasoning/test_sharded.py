"""The sharded actor (`actor.strategy = fsdp`, FSDP2 over gloo on the CPU) trains what a full replica trains: the
same losses and weights after 3 GRPO steps on a ~0.18 M-parameter Qwen2 of 4 layers (and PPO's critic beside it), a
checkpoint written by 2 sharded ranks resuming on 1 full replica and the reverse, bf16 mixed precision close to fp32
on the first step, activation checkpointing recomputing the same step, offload/onload of sharded state keeping
every value, and an inference rank's sharded frozen copy scoring what the trained policy scores. LoRA adapters train
alike under both strategies, leave the base weights as they were loaded, resume across strategies, and give the
inference copy, merged or sent alone, the policy's log-probs."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rlplace.reasoning import lora
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from tests.reasoning.sharded_ranks import STEPS, Job, build_model, run_rank

JOBS = (
    Job("replica", "ddp", 1, save="replica_ckpt"),
    Job("sharded", "fsdp", 2, save="sharded_ckpt"),
    Job("sharded_bf16", "fsdp", 2, dtype="bf16", steps=(0,)),
    Job("sharded_recompute", "fsdp", 2, recompute=True, steps=(0,)),
    Job("replica_ppo", "ddp", 1, algorithm="ppo"),
    Job("sharded_ppo", "fsdp", 2, algorithm="ppo"),
    Job("replica_from_sharded", "ddp", 1, steps=(2,), resume="sharded_ckpt"),
    Job("sharded_from_replica", "fsdp", 2, steps=(2,), resume="replica_ckpt"),
    Job("replica_lora", "ddp", 1, lora=4),
    Job("sharded_lora", "fsdp", 2, lora=4, save="sharded_lora_ckpt"),
    Job("replica_lora_from_sharded", "ddp", 1, lora=4, steps=(2,), resume="sharded_lora_ckpt"),
    Job("replica_ppo_lora", "ddp", 1, algorithm="ppo", lora=4),
    Job("sharded_ppo_lora", "fsdp", 2, algorithm="ppo", lora=4),
)
RTOL, ATOL = 1e-4, 1e-5
"""Two ranks sum each gradient in another order than one process (reduce-scatter of two halves, a minibatch's loss
split in two parts): an ulp or so per gradient. AdamW divides by the root of the second moment, which turns such a
difference into a step-sized one where a gradient is pure rounding: the key projections' biases, whose gradient is
exactly 0 in exact arithmetic (a softmax does not change when every logit of a row shifts alike), end up to 4e-6
apart after three steps of lr 1e-3 (measured; everything else agrees to about 1e-6). A wrong shard or reduction moves
weights by 1e-3 and more."""


pytestmark = pytest.mark.slow  # processes of their own, importing torch and transformers each


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model folder every job starts from."""
    return build_model(tmp_path_factory.mktemp("model") / "model")


@pytest.fixture(scope="module")
def results(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Every job's ranks: one process group per rank count, both started at once (a resumed job waits for the
    checkpoint it reads)."""
    root = tmp_path_factory.mktemp("sharded")
    context = mp.get_context("spawn")
    processes: list[multiprocessing.process.BaseProcess] = []
    for world_size in (1, 2):  # a group of processes each, running its jobs in turn
        jobs = [job for job in JOBS if job.world_size == world_size]
        for rank in range(world_size):
            args = (rank, world_size, jobs, folder, root, str(root / f"world{world_size}.init"))
            processes.append(context.Process(target=run_rank, args=args, daemon=True))
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
    codes = [process.exitcode for process in processes]
    for process in processes:
        if process.is_alive():
            process.kill()
    assert codes == [0] * len(processes), codes
    return {
        job.name: [torch.load(root / f"{job.name}.rank{r}.pt", weights_only=False) for r in range(job.world_size)]
        for job in JOBS
    }


def _close_stats(found: dict[str, float], expected: dict[str, float], rel: float = RTOL) -> None:
    assert found.keys() == expected.keys()
    for key in expected:
        assert found[key] == pytest.approx(expected[key], rel=rel, abs=ATOL), key


@pytest.mark.parametrize(
    "algorithm", ["", "_ppo", "_lora", "_ppo_lora"], ids=["grpo", "ppo_with_critic", "grpo_lora", "ppo_lora"]
)
def test_two_sharded_ranks_train_what_one_replica_trains(results, algorithm):
    replica, sharded = results[f"replica{algorithm}"][0], results[f"sharded{algorithm}"]
    for step in range(STEPS):
        for rank in sharded:  # every rank reports the global minibatches' stats
            _close_stats(rank["stats"][step], replica["stats"][step])
    assert replica["stats"][0]["train/policy_loss"] != replica["stats"][2]["train/policy_loss"]  # it learned
    weights = sharded[0]["weights"]
    assert weights.keys() == replica["weights"].keys() and not sharded[1]["weights"]  # gathered on rank 0 alone
    for name, expected in replica["weights"].items():
        torch.testing.assert_close(weights[name], expected, rtol=RTOL, atol=ATOL, msg=name)


@pytest.mark.parametrize(
    "resumed, uninterrupted",
    [
        ("replica_from_sharded", "replica"),
        ("sharded_from_replica", "sharded"),
        ("replica_lora_from_sharded", "replica_lora"),
    ],
)
def test_a_checkpoint_resumes_under_another_rank_count_and_strategy(results, resumed, uninterrupted):
    # 2 sharded ranks -> 1 replica, and 1 replica -> 2 sharded ranks: the third step continues as the run that never
    # stopped (the checkpoint holds weights and AdamW moments, resharded on load).
    found, expected = results[resumed][0], results[uninterrupted][0]
    _close_stats(found["stats"][2], expected["stats"][2])
    for name, tensor in expected["weights"].items():
        torch.testing.assert_close(found["weights"][name], tensor, rtol=RTOL, atol=ATOL, msg=name)


def test_bf16_mixed_precision_stays_close_to_fp32_on_the_first_step(results):
    # bfloat16 keeps 8 bits of mantissa: log-probs of a forward pass in it differ from fp32's by about 1e-2, so the
    # first step's loss and gradient norm agree to a few percent, not to float32's 1e-5.
    bf16, fp32 = results["sharded_bf16"][0]["stats"][0], results["sharded"][0]["stats"][0]
    for key in ("train/policy_loss", "train/grad_norm", "train/entropy"):
        assert bf16[key] == pytest.approx(fp32[key], rel=5e-2, abs=1e-3), key
    assert bf16 != fp32  # it did compute in bf16


def test_offload_and_onload_of_sharded_state_keep_every_value(results):
    # On a CPU cluster there is no device memory to free: moving a rank's shards, their gradients and the AdamW
    # moments to the CPU and back is a recorded no-op, and training goes on unchanged (the steps above ran after it).
    for rank in results["sharded"]:
        assert rank["offload"] == {"bytes": 0, "same": True, "tensors": rank["offload"]["tensors"]}
        assert rank["offload"]["tensors"] > 0


def test_activation_checkpointing_recomputes_the_same_step(results):
    # Each decoder layer's activations are recomputed in the backward pass from its input: the same arithmetic again.
    _close_stats(results["sharded_recompute"][0]["stats"][0], results["sharded"][0]["stats"][0])


@pytest.mark.parametrize("job", ["replica", "sharded", "sharded_bf16", "sharded_lora"])
def test_an_inference_copy_given_the_trained_weights_scores_what_the_policy_scores(results, job):
    # The inference group's frozen copy of the policy under the actor's strategy: sharded, each rank keeps its part of
    # the whole tensors weight sync sends (`load_whole`), and scores to the last bit what the trained shards score.
    # A LoRA policy's copy holds W + s B A where the policy computes W x + s B (A x): the same to float rounding.
    for rank in results[job]:
        copy = rank["copy"]
        if job.endswith("_lora"):
            torch.testing.assert_close(copy["after"], copy["policy"], rtol=0, atol=1e-5)
        else:
            assert torch.equal(copy["after"], copy["policy"])
        assert not torch.equal(copy["before"], copy["after"])  # the weights it was given are the trained ones
        for scored, reference in copy["micro_batches"]:
            assert torch.equal(scored, copy["after"])
            torch.testing.assert_close(reference, copy["reference"], rtol=0, atol=0 if job != "sharded_bf16" else 0.1)
        # In passes of a token budget, shortest rows first and trimmed: the same log-probs but for float rounding.
        mask = rank["mask"].bool()
        assert len(copy["budget"]) == len(copy["micro_batches"])
        for scored, reference in copy["budget"]:
            torch.testing.assert_close(scored[mask], copy["after"][mask], rtol=0, atol=1e-5)
            atol = 1e-5 if job != "sharded_bf16" else 0.1
            torch.testing.assert_close(reference[mask], copy["reference"][mask], rtol=0, atol=atol)


@pytest.mark.parametrize("job", ["replica_lora", "sharded_lora"])
def test_an_inference_copy_given_the_adapters_alone_scores_the_policy_and_with_them_off_the_reference(results, job):
    # `actor.lora.sync: adapters`: the copy holds the folder's weights and receives the adapters alone; it computes
    # what the policy computes, W x + s B (A x), so it scores the policy's log-probs to the last bit, and with the
    # adapters off the base model's, which the reference model would have scored.
    for rank in results[job]:
        copy = rank["copy"]
        assert len(copy["adapters_alone"]) == len(copy["micro_batches"])
        for scored, reference in copy["adapters_alone"]:
            assert torch.equal(scored, copy["policy"])
            assert torch.equal(reference, copy["reference"])


def test_lora_trains_its_adapters_alone(results, folder):
    # The base weights stay as loaded, to the bit, the policy's and the critic's backbone's; every adapter's B (zero at
    # the start) has moved, and the critic's value head (its bias started at zero).
    weights = results["sharded_ppo_lora"][0]["weights"]
    start = load_causal_lm(folder).state_dict()
    adapters = [name for name in weights if ".lora_" in name]
    assert adapters and {name.split(".")[0] for name in adapters} == {"policy", "critic"}
    for name, tensor in weights.items():
        model, own = name.split(".", 1)
        if name in adapters:
            assert ".lora_A." in name or tensor.abs().max() > 0, name
        elif own.startswith("value_head."):
            assert own == "value_head.weight" or tensor.abs().max() > 0, name
        elif model == "critic":  # the backbone of a causal LM: its weights without the `model.` before them
            assert torch.equal(tensor, start["model." + lora.base_name(own.removeprefix("backbone."))]), name
        else:
            assert torch.equal(tensor, start[lora.base_name(own)]), name
