"""The reasoning placements give the same metrics: `sweep=reasoning_placements` on tiny settings, one step off, with
dynamic sampling, Dr. GRPO's loss, a KL to the reference model, a sharded actor and inference group, token-budget
micro-batches, tool calls and an interaction, as a user runs it (a module of its own, so that it runs beside the
embodied sweeps of tests/test_report.py rather than after them).

Responses are made in turns with a tool and an interaction (`rollout.multi_turn`), so they hold the tool's and the
interaction's tokens, which the update reads as context and does not train on, and the interaction's scores join the
reward. The sweep's disaggregated and hybrid jobs run: they train the sharded policy on 1 and 2 actor ranks, and the
hybrid job offloads its rollout while inference scores. The collocated job (4 components on each of 4 devices: 16
worker processes, more than the other two together) is left out; collocated runs are compared with other placements
in tests/reasoning/test_runner.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlplace.train import RUN_INFO
from tests.test_report import metrics
from tests.train_here import train_here

REASONING = [  # sweep=reasoning_placements on the tiny settings, one step off only: its three placements
    "experiment=arithmetic_grpo",
    "sweep=reasoning_placements",
    "placement=reasoning_disaggregated,reasoning_hybrid",
    "runner.max_staleness=1",
    "task.min_digits=1",
    "task.max_digits=1",
    "task.operations=+",
    "task.eval_size=8",
    "task.prompts_per_step=8",
    "algorithm.group_size=4",
    "rollout.micro_batch_prompts=2",
    "rollout.max_new_tokens=4",
    "runner.max_steps=2",
    "runner.eval_interval=1",
    "logger=jsonl",
    "model.pretrain.max_steps=50",  # a short pretraining: some groups get mixed rewards, many all 0
    "model.pretrain.eval_interval=50",
    "algorithm=dr_grpo",  # its loss divides by a constant token budget, rollout.max_new_tokens, in every placement
    "algorithm.filter_groups=true",  # dynamic sampling refills micro-batches alike in every placement
    "actor.strategy=fsdp",  # the policy sharded over the actor's ranks, however many the placement gives it, and the
    "algorithm.kl_coef=0.01",  # inference ranks' copy of it and reference model over theirs
    "actor.max_tokens_per_micro_batch=48",  # 3-5 rows a pass: ranks run unequal pass counts, padded to the most
    "inference.max_tokens_per_micro_batch=24",  # the inference ranks' scoring passes too (2 sharded ranks in hybrid)
    "rollout.eval_samples=2",  # sampled evaluation, answered by 1 rollout rank (disaggregated) and by 2 (hybrid)
    "rollout.eval_temperature=1.0",
    "rollout.multi_turn.tool=calculator",  # responses made in turns, the tool's tokens masked out of the update:
    "rollout.multi_turn.call_end=1",  # a call ends at a digit the tiny model writes often; the tool's answer (an
    "rollout.multi_turn.max_response_tokens=2",  # error, cut to 2 tokens) goes in and the model writes on after it
    "rollout.multi_turn.max_user_turns=1",  # and an interaction (INTERACTION) answers the first turn the model ends
]
INTERACTION = """
def graded(prompt, turns, answer, extra):
    correct = turns[-1].strip() == answer
    return correct, "no", float(correct) / len(turns)
"""
"""The interaction of the sweep: a correct turn ends the episode, scoring 1 on the first try and 1/2 on the second; a
wrong one reads "no" and tries again."""
REASONING_COMPARED = (
    "rollout/filtered_groups",
    "rollout/generation_rounds",
    "train/policy_loss",
    "train/grad_norm",
    "train/kl",  # to the reference model, scored by 1 inference rank (disaggregated) and by 2 sharded ones (hybrid)
    "rollout/reward",
    "rollout/response_length",
    "rollout/clip_ratio",
    "rollout/tool_calls",
    "rollout/tool_errors",
    "rollout/user_turns",
    "rollout/interaction_errors",
    "reward/interaction",
    "eval/accuracy",
    "eval/best@2",
)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
def test_the_reasoning_placements_give_the_same_metrics(tmp_path: Path) -> None:
    # Disaggregated on 4 devices trains with 1 sharded actor rank (FSDP2), hybrid with 2: sums over ranks round
    # differently from one tensor's sum, by about 1e-7 relative, hence the tolerance; generation and rewards are
    # exact.
    sweep_dir = tmp_path / "sweep"
    interaction = tmp_path / "interaction.py"
    interaction.write_text(INTERACTION)
    train_here(
        *REASONING,
        f"rollout.multi_turn.interaction={interaction}:graded",
        f"hydra.sweep.dir={sweep_dir}",
        env={"RLPLACE_OUTPUT_DIR": f"{sweep_dir}-outputs"},
    )
    jobs = [metrics(sweep_dir / str(job)) for job in range(2)]
    modes = [json.loads((sweep_dir / str(job) / RUN_INFO).read_text())["mode"] for job in range(2)]
    assert modes == ["disaggregated", "hybrid"]
    assert "| 1 | hybrid |" in (sweep_dir / "report.md").read_text()
    for rows in jobs[1:]:
        assert len(rows) == len(jobs[0]) == 2
        for step in range(2):
            for key in REASONING_COMPARED:
                assert rows[step][key] == pytest.approx(jobs[0][step][key], rel=1e-5, abs=1e-6), (step, key)
    assert all(0 < row["rollout/tool_calls"] < 2 and 0 < row["rollout/user_turns"] < 1 for row in jobs[0])
    assert jobs[0][1]["train/kl"] > 0  # the policy moved away from the reference
