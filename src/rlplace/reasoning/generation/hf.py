"""HFEngine: batched generation with transformers, sampling keyed per sequence.

`model.generate` draws every row's sample from one random stream, so a row's tokens would depend on its batch. This
loop instead samples row i's token t by inverse CDF from one uniform that is a pure function of (seed, sample id,
t) (`core.rng.uniform_noise`), so what a row generates does not depend on its batch, micro-batch or rank.

Decoding is `DynamicDecoder` (transformers' growing cache) or, on a GPU, `StaticDecoder` replayed as CUDA graphs,
one per bucket of (rows, cache length), kept until `sleep` frees the device memory they point at.

With LoRA adapters sent alone (`actor.lora.sync: adapters`), the model carries PEFT's adapter layers over the folder's
weights, and weight sync replaces the adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from rlplace.core.offload import HostCopies, move
from rlplace.core.rng import uniform_noise
from rlplace.reasoning import lora
from rlplace.reasoning.config import LoRAConfig
from rlplace.reasoning.models.tiny_lm import load_causal_lm

from .decoding import Decoder, DynamicDecoder, StaticDecoder, bucket_cache_len, bucket_rows
from .engine import EngineOptions, check_lengths, eos_ids

DECODINGS = ("dynamic", "static", "cuda_graph")
DONE_CHECK_INTERVAL = 8
"""Steps between checks that every row has ended: each check waits for the device, which a graph replay avoids."""


class HFEngine:
    def __init__(
        self,
        model_path: str,
        device: torch.device,
        *,
        max_model_len: int | None = None,
        decoding: str = "dynamic",
        compile_step: bool = False,
        dtype: torch.dtype = torch.float32,
        adapters: LoRAConfig | None = None,
    ) -> None:
        if decoding not in DECODINGS:
            raise ValueError(f"decoding {decoding!r} is unknown: choose one of {', '.join(DECODINGS)}")
        if decoding == "cuda_graph" and device.type != "cuda":
            raise ValueError(f"decoding 'cuda_graph' needs a CUDA device, not {device}")
        self.device = device
        self.decoding = decoding
        self.model = load_causal_lm(model_path, device, dtype)
        if adapters is not None:
            lora.inject(self.model, adapters)
        self.replaced = lora.is_adapter if adapters is not None else None
        """Which of the model's tensors `load_weights` replaces (by name): the adapters, or all (None)."""
        config = self.model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.eos_ids = eos_ids(model_path, config)
        self.pad_id = int(config.pad_token_id) if config.pad_token_id is not None else next(iter(self.eos_ids), 0)
        self._static: dict[tuple[int, int], StaticDecoder] = {}
        self._pool: Any = None
        self._host = HostCopies()
        self._step_model = torch.compile(self.model) if compile_step else None

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sample_ids: list[int],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
        ignore_eos: bool = False,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_ids: Sequence[int] = (),
        logprobs: bool = False,
        on_done: Callable[[int, list[int]], None] | None = None,
    ) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
        """See `GenerationEngine.generate`. Prompts are left-padded; positions count real tokens only. Rows decode
        together up to the largest limit; each is cut to its own. `on_done` hears of the rows that have ended every
        DONE_CHECK_INTERVAL steps, when the loop looks at them anyway, and of the rest at the end."""
        limits = check_lengths(prompts, sample_ids, max_new_tokens, self.max_model_len)
        max_new_tokens = max(limits)
        rows, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        uniforms = None
        if temperature > 0:
            uniforms = uniform_noise(seed, torch.tensor(sample_ids), 0, max_new_tokens).to(self.device)
        decoder = self._decoder(rows, width + max_new_tokens)
        logits = decoder.prefill(input_ids.to(self.device), mask.to(self.device))
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        stops = torch.tensor([*self.eos_ids, *stop_ids], device=self.device)
        last = torch.tensor(limits, device=self.device) - 1  # each row's last step
        may_end_early = not ignore_eos or min(limits) < max_new_tokens
        grid = torch.full((rows, max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        """Each row's tokens so far, step by step (the pad id after it ended)."""
        token_logprobs = []
        reported = torch.zeros(rows, dtype=torch.bool)
        """The rows `on_done` has heard of."""

        def report(rows_done: Tensor, steps: int) -> None:
            ended = [] if on_done is None else (rows_done & ~reported).nonzero()[:, 0].tolist()
            if not ended:
                return
            made = grid[ended, :steps].cpu().tolist()
            cut = [row[: limits[i]] for i, row in zip(ended, made, strict=True)]
            for i, response in zip(ended, self._responses(cut, ignore_eos, stop_ids), strict=True):
                on_done(i, response)
            reported[ended] = True

        for step in range(max_new_tokens):
            noise = None if uniforms is None else uniforms[:, step]
            token, logprob = pick(logits, temperature, noise, top_p, top_k, logprobs)
            token = token.masked_fill(done, self.pad_id)
            grid[:, step] = token
            if logprob is not None:
                token_logprobs.append(logprob)
            if not ignore_eos:
                done |= torch.isin(token, stops)
            done |= last == step
            if step == max_new_tokens - 1:
                break
            if step % DONE_CHECK_INTERVAL == DONE_CHECK_INTERVAL - 1 and (may_end_early or on_done is not None):
                rows_done = done.cpu()
                report(rows_done, step + 1)
                if bool(rows_done.all()):
                    break
            logits = decoder.step(token)
        steps = step + 1
        report(torch.ones(rows, dtype=torch.bool), steps)
        cut = [row[:limit] for row, limit in zip(grid[:, :steps].cpu().tolist(), limits, strict=True)]
        responses = self._responses(cut, ignore_eos, stop_ids)
        if not logprobs:
            return responses
        values = torch.stack(token_logprobs, dim=1).cpu().tolist()
        return responses, [row[: len(response)] for row, response in zip(values, responses, strict=True)]

    def _decoder(self, rows: int, tokens: int) -> Decoder:
        if self.decoding == "dynamic":
            return DynamicDecoder(self.model)
        key = (bucket_rows(rows), bucket_cache_len(tokens))
        if key not in self._static:
            capture = self.decoding == "cuda_graph"
            if capture and self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            self._static[key] = StaticDecoder(
                self.model, *key, capture=capture, pool=self._pool, step_model=self._step_model
            )
        return self._static[key]

    def _responses(self, rows: list[list[int]], ignore_eos: bool, stop_ids: Sequence[int]) -> list[list[int]]:
        """Rows of the token grid cut after their first EOS or stop id (the padding after it is not generated)."""
        ends = set() if ignore_eos else {*self.eos_ids, *stop_ids}
        out = []
        for row in rows:
            stops = [t for t, token in enumerate(row) if token in ends]
            out.append(row[: stops[0] + 1] if stops else row)
        return out

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each tensor into the model's tensor of that name as it comes, in place, so captured graphs, which point
        at the parameters, decode with the new weights. Strict, as `load_state_dict` is: every name must be the
        model's, and every tensor of the model must come (every adapter tensor, when it applies adapters)."""
        state = {n: t for n, t in self.model.state_dict().items() if self.replaced is None or self.replaced(n)}
        missing = set(state)
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"load_weights: {name} is not a tensor of the rollout's model")
            state[name].copy_(tensor)
            missing.discard(name)
        if missing:
            lacking = ", ".join(sorted(missing)[:3])
            raise KeyError(f"load_weights: the update lacks {len(missing)} of the model's tensors ({lacking}, ...)")

    def sleep(self) -> None:
        """On a GPU, move the weights to pinned host memory (`core.offload.move`: at the pinned copy rate, where
        `Module.to("cpu")` copies into pageable memory) and drop the static caches and graphs, which point at device
        memory that moves; no-op on CPU."""
        if self.device.type == "cuda":
            self._static.clear()
            self._pool = None
            move(self.model, None, torch.device("cpu"), self._host)

    def wake_up(self) -> None:
        """On a GPU, move the weights back (graphs are captured again on first use); no-op on CPU."""
        if self.device.type == "cuda":
            move(self.model, None, self.device, self._host)

    def close(self) -> None:
        """Nothing to release: the model is an ordinary module, freed with the engine."""


def pick(
    logits: Tensor,
    temperature: float,
    uniforms: Tensor | None,
    top_p: float = 1.0,
    top_k: int = 0,
    logprobs: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Each row's next token and, with `logprobs`, its log-prob under the distribution it was drawn from (else None,
    at no cost): the argmax (temperature 0; its log-prob under softmax(logits)), else the inverse CDF of
    softmax(logits / temperature) at the row's uniform. Rows are independent, so a row's token depends on its logits
    and uniform alone.

    With `top_k` > 0 or `top_p` < 1 the CDF runs over the tokens sorted by probability (ties by id), cut to the `top_k`
    first, then to the fewest of those whose renormalised mass reaches `top_p` (the most likely always kept), as
    transformers' and vLLM's filters, applied in that order, keep them; the log-prob is then the token's share of
    what is kept, as vLLM's `processed_logprobs` are."""
    if uniforms is None:
        token = logits.argmax(dim=-1)
        if not logprobs:
            return token, None
        return token, torch.log_softmax(logits.float(), dim=-1).gather(-1, token[:, None])[:, 0]
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    order = None
    if top_k > 0 or top_p < 1:
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        if top_k > 0:
            probs[:, top_k:] = 0
            probs = probs / probs.sum(dim=-1, keepdim=True)
        if top_p < 1:
            probs = probs * (probs.cumsum(dim=-1) - probs < top_p)  # the mass before a token is short of top_p
    cdf = probs.cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    position = torch.searchsorted(cdf, target).clamp(max=logits.shape[-1] - 1)
    logprob = (probs.gather(-1, position) / cdf[:, -1:]).log()[:, 0] if logprobs else None
    token = position if order is None else order.gather(-1, position)
    return token.squeeze(-1), logprob


def build(model_path: str, device: torch.device, max_model_len: int | None, options: EngineOptions) -> HFEngine:
    """The hf backend's engine (`engine.make_engine`): CUDA graphs on a CUDA device when asked for."""
    decoding = "cuda_graph" if options.cuda_graphs and device.type == "cuda" else "dynamic"
    return HFEngine(
        model_path,
        device,
        max_model_len=max_model_len,
        decoding=decoding,
        compile_step=options.compile_step,
        adapters=options.adapters,
    )
