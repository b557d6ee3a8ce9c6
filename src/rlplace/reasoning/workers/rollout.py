"""LLMRolloutWorker: generates responses to a step's prompts with the `hf` or `vllm` engine.

Every rank derives the step's prompts from the task itself (`train_batch(step, n)` is deterministic), so no
prompts travel; a rank generates its micro-batches only (its engine replica's, where `rollout.tensor_parallel_size`
ranks hold each engine: `generation.replicas`). Each response is sampled with randomness keyed by its
global sample id, so what is generated does not depend on how micro-batches are split over ranks. The engine's
weights are replaced in place after each training step (the engine keeps running), and it sleeps while a
collocated actor trains.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
from transformers import AutoConfig

from rlplace.core.weights import StaleWeightsError, received_tensors
from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.evaluation import Answered, sample_ids
from rlplace.reasoning.generation.engine import EngineOptions, make_engine
from rlplace.reasoning.generation.replicas import Replica
from rlplace.reasoning.generation.turns import MultiTurn, Turns
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import SCORE
from rlplace.reasoning.streams import (
    FILTERED_GROUPS,
    GENERATION_ROUNDS,
    INTERACTION_ERRORS,
    TOOL_CALLS,
    TOOL_ERRORS,
    TRUNCATED,
    USER_TURNS,
    consumer_key,
    micro_batches_of,
)
from rlplace.reasoning.tasks import drop_overlong, make_prompt_source
from rlplace.reasoning.tasks.prompts import Problem, encode_prompts, uses_chat_template
from rlplace.scheduler import Channel, Worker, timer


class LLMRolloutWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, reward_world_size: int) -> None:
        self.cfg = cfg
        self.reward_world_size = reward_world_size
        self.tokenizer = load_tokenizer(model_path)
        split = cfg.rollout.tensor_parallel_size
        self.replica = Replica.of(self.rank, self.world_size, split)
        if split > 1:  # the ranks of each replica, the world of the engine split over them
            self.init_process_group(ranks_per_group=split)
        options = EngineOptions(
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            cuda_graphs=cfg.rollout.cuda_graphs,
            compile_step=cfg.rollout.compile_step,
            tensor_parallel_size=split,
            adapters=cfg.actor.lora if cfg.actor.lora.sends_adapters else None,
        )
        self.engine = make_engine(cfg.rollout.backend, model_path, self.device, options=options)
        self.source = make_prompt_source(cfg.task)
        context = AutoConfig.from_pretrained(model_path).max_position_embeddings
        drop_overlong(self.source, cfg.task, self.tokenizer, context, cfg.rollout.max_new_tokens)  # as the driver did
        self.reward = cfg.reward_function()
        multi_turn = cfg.rollout.multi_turn
        self.multi_turn = None
        if multi_turn.enabled:
            chat = uses_chat_template(self.tokenizer, cfg.task)
            self.multi_turn = MultiTurn(self.tokenizer, multi_turn, self.reward, chat)
        self.logprobs = cfg.algorithm.behaviour_logprobs == "rollout"
        """The engine returns its tokens' log-probs, which the actor weighs the update by."""
        self.version = 0
        """The initial weights are the model folder's, as the actor's are: version 0."""

    @property
    def num_micro_batches(self) -> int:
        return self.cfg.task.prompts_per_step // self.cfg.rollout.micro_batch_prompts

    @timer("sync_weights")
    def sync_weights(self) -> int:
        """Receive the actor's weights (broadcast by actor rank 0) into the running engine; returns their version."""
        self.version, weights = received_tensors(self, src_group="actor")
        self.engine.load_weights(weights)
        return self.version

    def close(self) -> None:
        """Shut the engine down (vLLM's engine core, its scratch folder) when the process retires this worker."""
        self.engine.close()

    def generate(self, step: int, version: int, out: Channel) -> int:
        """Generate this rank's micro-batches of step `step` (its engine replica's) and, on the replica's first rank,
        hand each to its reward rank through `out` as soon as it is done; returns how many. Each batch carries its
        generation seconds to the actor, which reports them per step."""
        if self.version != version:
            raise StaleWeightsError(f"rollout rank {self.rank} holds weights v{self.version}, asked for v{version}")
        cfg = self.cfg
        per_batch = cfg.rollout.micro_batch_prompts
        problems = self.source.train_batch(step, cfg.task.prompts_per_step)
        mine = micro_batches_of(self.replica.index, self.replica.count, self.num_micro_batches)
        for m in mine:
            first = m * per_batch
            start = time.perf_counter()
            with self.span("rollout_generate"):
                batch = self._sample_groups(step, m, problems[first : first + per_batch])
            batch.meta["generate_seconds"] = time.perf_counter() - start
            batch.version = version
            if self.replica.hands_on:
                out.put(batch, key=consumer_key("reward", m, self.reward_world_size))
        return len(mine)

    def _sample_groups(self, step: int, index: int, prompts: list[Problem]) -> SequenceBatch:
        """Micro-batch `index` of `step`: `algorithm.group_size` responses to each of `prompts`. With
        `algorithm.filter_groups`, a group whose rewards are all equal is dropped and the next round generates for as
        many fresh prompts, until the micro-batch is full or `max_generation_rounds` have run; what each round draws
        and samples is a function of (step, index, round), so the micro-batch is the same whichever rank makes it."""
        alg, task = self.cfg.algorithm, self.cfg.task
        group, first, size = alg.group_size, index * len(prompts), len(prompts)
        rounds = alg.max_generation_rounds if alg.filter_groups else 1
        kept: list[Sample] = []
        dropped: list[Sample] = []
        for round_ in range(rounds):
            if round_:  # the next prompts of the step's stream, beyond those of its earlier rounds
                total = task.prompts_per_step * (round_ + 1)
                prompts = self.source.train_batch(step, total)[total - task.prompts_per_step + first :][:size]
            rows = [p for p in prompts for _ in range(group)]
            base = (step * task.prompts_per_step + first) * group
            if round_:  # ids of their own, above those of the first round of every step
                base += (1 << 40) * round_
            ids = [base + i for i in range(len(rows))]
            made = self._tokens(rows, ids, self.cfg.rollout.temperature, self.logprobs)
            turns = made.turns
            numbered = enumerate(zip(made.prompts, rows, strict=True))
            samples = [Sample(prompt, problem, turns, i) for i, (prompt, problem) in numbered]
            if not alg.filter_groups:
                kept = samples
                break
            decoded = self.reward.decode(self.tokenizer, made.prompts, turns.responses)
            weight = self.cfg.reward.interaction_weight
            pairs = zip(self.reward.scores(rows, decoded), turns.scores, strict=True)
            scores = [s[SCORE] + weight * interaction for s, interaction in pairs]
            for g in range(size):
                same = len(set(scores[g * group : (g + 1) * group])) == 1
                (dropped if same else kept).extend(samples[g * group : (g + 1) * group])
            if len(kept) >= size * group:
                break
        samples = (kept + dropped)[: size * group]
        responses = column(samples, "responses")
        multi_turn, width = self.cfg.rollout.multi_turn, self.cfg.rollout.max_new_tokens
        batch = pack(index, [s.prompt for s in samples], responses, [s.problem for s in samples], width)
        batch.meta[TRUNCATED] = float(sum(self._truncated(response) for response in responses))
        if self.logprobs:
            batch.rollout_logprobs = padded(column(samples, "logprobs"), width, torch.float32)
        if multi_turn.enabled:
            batch.tool_mask = padded(column(samples, "tool_masks"), width, torch.long)
        if multi_turn.tool is not None:
            batch.meta[TOOL_CALLS] = float(sum(column(samples, "calls")))
            batch.meta[TOOL_ERRORS] = float(sum(column(samples, "tool_errors")))
        if multi_turn.interaction is not None:
            batch.interaction_scores = torch.tensor(column(samples, "scores"), dtype=torch.float32)
            batch.meta[USER_TURNS] = float(sum(column(samples, "user_turns")))
            batch.meta[INTERACTION_ERRORS] = float(sum(column(samples, "interaction_errors")))
        if alg.filter_groups:
            batch.meta[FILTERED_GROUPS] = float(len(dropped) // group)
            batch.meta[GENERATION_ROUNDS] = float(round_ + 1)
        return batch

    def _truncated(self, response: list[int]) -> bool:
        """The response was cut at max_new_tokens before any of the model's end tokens."""
        return len(response) == self.cfg.rollout.max_new_tokens and response[-1] not in self.engine.eos_ids

    @torch.no_grad()
    def _tokens(
        self, problems: list[Problem], sample_ids: list[int], temperature: float, logprobs: bool = False
    ) -> Generated:
        """The prompts' token ids and the response to each (with `logprobs`, the engine's log-probs of its tokens):
        the engine's, or made in turns with a tool or an interaction (`rollout.multi_turn`)."""
        prompts = encode_prompts(self.tokenizer, problems, self.cfg.task)
        rollout = self.cfg.rollout
        sampling = {
            "temperature": temperature,
            "seed": self.cfg.runner.seed,
            "top_p": rollout.top_p,
            "top_k": rollout.top_k,
        }
        sampling["max_new_tokens"] = rollout.max_new_tokens
        sampling["logprobs"] = logprobs
        if self.multi_turn is not None:
            return Generated(prompts, self.multi_turn.generate(self.engine, prompts, sample_ids, problems, **sampling))
        turns = Turns.empty(len(prompts))
        made = self.engine.generate(prompts, sample_ids, **sampling)
        turns.responses, turns.logprobs = made if logprobs else (made, turns.logprobs)
        return Generated(prompts, turns)

    @timer("evaluate")
    def evaluate(self) -> list[Answered]:
        """This rank's share of the held-out split (its engine replica's, returned by the replica's first rank only),
        each problem answered `rollout.eval_samples` times at
        `rollout.eval_temperature`, with the answers' scores (`reasoning.evaluation`). Generated as many rows at a
        time as a training micro-batch (micro_batch_prompts x group_size), so that evaluating needs no more device
        memory than generating does, which is what the planner's memory model counts (`reasoning.memory`)."""
        rollout, samples = self.cfg.rollout, self.cfg.rollout.eval_samples
        problems = self.source.eval_set()
        mine = range(self.replica.index, len(problems), self.replica.count)
        rows = [(i, key) for i in mine for key in sample_ids(i, samples)]
        per_call = rollout.micro_batch_prompts * self.cfg.algorithm.group_size
        scores: list[float] = []
        for first in range(0, len(rows), per_call):
            part = rows[first : first + per_call]
            chunk = [problems[i] for i, _ in part]
            made = self._tokens(chunk, [key for _, key in part], rollout.eval_temperature)
            decoded = self.reward.decode(self.tokenizer, made.prompts, made.turns.responses)
            scores += [s[SCORE] for s in self.reward.scores(chunk, decoded)]
        answered = []
        for n, i in enumerate(mine):
            source = problems[i].extra.get("data_source")
            answered.append(
                Answered(i, None if source is None else str(source), scores[n * samples : (n + 1) * samples])
            )
        return answered if self.replica.hands_on else []

    @timer("offload")
    def offload(self) -> None:
        self.engine.sleep()

    @timer("onload")
    def onload(self) -> None:
        self.engine.wake_up()


class Sample(NamedTuple):
    """One response of a generation round, kept or dropped by dynamic sampling: its prompt's token ids, its problem,
    and its row of the round's turns."""

    prompt: list[int]
    problem: Problem
    turns: Turns
    row: int


def column(samples: list[Sample], field: str) -> list:
    """Each sample's value of a `Turns` field (`responses`, `tool_masks`, ...)."""
    return [getattr(sample.turns, field)[sample.row] for sample in samples]


class Generated(NamedTuple):
    """A batch's prompts as token ids, and the responses to them (made in one turn, or several)."""

    prompts: list[list[int]]
    turns: Turns


def pack(
    index: int, prompts: list[list[int]], responses: list[list[int]], problems: list[Problem], width: int
) -> SequenceBatch:
    """Prompts left-padded to their longest, responses right-padded to `width` (pad id 0), with their masks."""
    prompt_width = max(len(p) for p in prompts)
    rows = len(prompts)
    prompt_ids = torch.zeros(rows, prompt_width, dtype=torch.long)
    prompt_mask = torch.zeros(rows, prompt_width, dtype=torch.long)
    response_ids = torch.zeros(rows, width, dtype=torch.long)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, prompt_width - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, prompt_width - len(prompt) :] = 1
        response = response[:width]
        response_ids[i, : len(response)] = torch.tensor(response, dtype=torch.long)
        response_mask[i, : len(response)] = 1
    return SequenceBatch(index, prompt_ids, prompt_mask, response_ids, response_mask, problems)


def padded(rows: list[list[int]] | list[list[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, width] per-token values of the responses (`SequenceBatch.tool_mask`, `rollout_logprobs`), right-padded
    with 0."""
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : min(len(row), width)] = torch.tensor(row[:width], dtype=dtype)
    return out
