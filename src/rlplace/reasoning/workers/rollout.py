"""LLMRolloutWorker: generates responses to a step's prompts with the `hf` or `vllm` engine.

Every rank derives the step's prompts from the task itself (`train_batch(step, n)` is deterministic), so no
prompts travel; a rank generates its micro-batches only. Each response is sampled with randomness keyed by its
global sample id, so what is generated does not depend on how micro-batches are split over ranks. The engine's
weights are replaced in place after each training step (the engine keeps running), and it sleeps while a
collocated actor trains.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoConfig

from rlplace.core.weights import StaleWeightsError, receive_state
from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.evaluation import Answered, sample_ids
from rlplace.reasoning.generation.engine import EngineOptions, make_engine
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import SCORE
from rlplace.reasoning.streams import (
    FILTERED_GROUPS,
    GENERATION_ROUNDS,
    TRUNCATED,
    consumer_key,
    micro_batches_of,
)
from rlplace.reasoning.tasks import drop_overlong, make_prompt_source
from rlplace.reasoning.tasks.prompts import Problem, encode_prompts
from rlplace.scheduler import Channel, Worker, timer


class LLMRolloutWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, reward_world_size: int) -> None:
        self.cfg = cfg
        self.reward_world_size = reward_world_size
        self.tokenizer = load_tokenizer(model_path)
        options = EngineOptions(
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            cuda_graphs=cfg.rollout.cuda_graphs,
            compile_step=cfg.rollout.compile_step,
        )
        self.engine = make_engine(cfg.rollout.backend, model_path, self.device, options=options)
        self.source = make_prompt_source(cfg.task)
        context = AutoConfig.from_pretrained(model_path).max_position_embeddings
        drop_overlong(self.source, cfg.task, self.tokenizer, context, cfg.rollout.max_new_tokens)  # as the driver did
        self.reward = cfg.reward_function()
        self.version = 0
        """The initial weights are the model folder's, as the actor's are: version 0."""

    @property
    def num_micro_batches(self) -> int:
        return self.cfg.task.prompts_per_step // self.cfg.rollout.micro_batch_prompts

    @timer("sync_weights")
    def sync_weights(self) -> int:
        """Receive the actor's weights (broadcast by actor rank 0) into the running engine; returns their version."""
        self.version, state = receive_state(self, src_group="actor")
        self.engine.load_weights(state)
        return self.version

    def generate(self, step: int, version: int, out: Channel) -> int:
        """Generate this rank's micro-batches of step `step` and hand each to its reward rank through `out` as soon as
        it is done;
        returns how many. Each batch carries its generation seconds to the actor, which reports them per step."""
        if self.version != version:
            raise StaleWeightsError(f"rollout rank {self.rank} holds weights v{self.version}, asked for v{version}")
        cfg = self.cfg
        per_batch = cfg.rollout.micro_batch_prompts
        problems = self.source.train_batch(step, cfg.task.prompts_per_step)
        mine = micro_batches_of(self.rank, self.world_size, self.num_micro_batches)
        for m in mine:
            first = m * per_batch
            start = time.perf_counter()
            with self.span("rollout_generate"):
                batch = self._sample_groups(step, m, problems[first : first + per_batch])
            batch.meta["generate_seconds"] = time.perf_counter() - start
            batch.version = version
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
        kept: list[tuple[list[int], list[int], Problem]] = []
        dropped: list[tuple[list[int], list[int], Problem]] = []
        for round_ in range(rounds):
            if round_:  # the next prompts of the step's stream, beyond those of its earlier rounds
                total = task.prompts_per_step * (round_ + 1)
                prompts = self.source.train_batch(step, total)[total - task.prompts_per_step + first :][:size]
            rows = [p for p in prompts for _ in range(group)]
            base = (step * task.prompts_per_step + first) * group
            if round_:  # ids of their own, above those of the first round of every step
                base += (1 << 40) * round_
            ids, responses = self._tokens(rows, [base + i for i in range(len(rows))], self.cfg.rollout.temperature)
            samples = list(zip(ids, responses, rows, strict=True))
            if not alg.filter_groups:
                kept = samples
                break
            scores = [s[SCORE] for s in self.reward.scores(rows, self.reward.decode(self.tokenizer, ids, responses))]
            for g in range(size):
                same = len(set(scores[g * group : (g + 1) * group])) == 1
                (dropped if same else kept).extend(samples[g * group : (g + 1) * group])
            if len(kept) >= size * group:
                break
        samples = (kept + dropped)[: size * group]
        batch = pack(index, *map(list, zip(*samples, strict=True)), self.cfg.rollout.max_new_tokens)
        batch.meta[TRUNCATED] = float(sum(self._truncated(response) for _, response, _ in samples))
        if alg.filter_groups:
            batch.meta[FILTERED_GROUPS] = float(len(dropped) // group)
            batch.meta[GENERATION_ROUNDS] = float(round_ + 1)
        return batch

    def _truncated(self, response: list[int]) -> bool:
        """The response was cut at max_new_tokens before any of the model's end tokens."""
        return len(response) == self.cfg.rollout.max_new_tokens and response[-1] not in self.engine.eos_ids

    @torch.no_grad()
    def _tokens(
        self, problems: list[Problem], sample_ids: list[int], temperature: float
    ) -> tuple[list[list[int]], list[list[int]]]:
        """The prompts' token ids and the engine's response to each."""
        prompts = encode_prompts(self.tokenizer, problems, self.cfg.task)
        responses = self.engine.generate(
            prompts,
            sample_ids,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            temperature=temperature,
            seed=self.cfg.runner.seed,
            top_p=self.cfg.rollout.top_p,
            top_k=self.cfg.rollout.top_k,
        )
        return prompts, responses

    @timer("evaluate")
    def evaluate(self) -> list[Answered]:
        """This rank's share of the held-out split, each problem answered `rollout.eval_samples` times at
        `rollout.eval_temperature`, with the answers' scores (`reasoning.evaluation`). Generated as many rows at a
        time as a training micro-batch (micro_batch_prompts x group_size), so that evaluating needs no more device
        memory than generating does, which is what the planner's memory model counts (`reasoning.memory`)."""
        rollout, samples = self.cfg.rollout, self.cfg.rollout.eval_samples
        problems = self.source.eval_set()
        mine = range(self.rank, len(problems), self.world_size)
        rows = [(i, key) for i in mine for key in sample_ids(i, samples)]
        per_call = rollout.micro_batch_prompts * self.cfg.algorithm.group_size
        scores: list[float] = []
        for first in range(0, len(rows), per_call):
            part = rows[first : first + per_call]
            chunk = [problems[i] for i, _ in part]
            prompts, responses = self._tokens(chunk, [key for _, key in part], rollout.eval_temperature)
            scores += [
                s[SCORE] for s in self.reward.scores(chunk, self.reward.decode(self.tokenizer, prompts, responses))
            ]
        answered = []
        for n, i in enumerate(mine):
            source = problems[i].extra.get("data_source")
            answered.append(
                Answered(i, None if source is None else str(source), scores[n * samples : (n + 1) * samples])
            )
        return answered

    @timer("offload")
    def offload(self) -> None:
        self.engine.sleep()

    @timer("onload")
    def onload(self) -> None:
        self.engine.wake_up()


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
