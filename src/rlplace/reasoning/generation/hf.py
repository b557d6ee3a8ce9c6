"""HFEngine: batched generation with transformers and a KV cache, sampling keyed per sequence.

`model.generate` draws every row's sample from one random stream, so a row's tokens would depend on its batch. This
loop instead gives each row a generator seeded by (seed, sample id) and samples by Gumbel-max (the argmax of
logits / temperature plus Gumbel noise is a draw from the softmax), one vocabulary-sized draw per generated token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlplace.reasoning.models.tiny_lm import load_causal_lm

from .engine import check_lengths, eos_ids, sequence_seed


class HFEngine:
    def __init__(self, model_path: str, device: torch.device, *, max_model_len: int | None = None) -> None:
        self.device = device
        self.model = load_causal_lm(model_path, device)
        config = self.model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.eos_ids = eos_ids(config)
        self.pad_id = int(config.pad_token_id) if config.pad_token_id is not None else self.eos_ids[0]

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sample_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        ignore_eos: bool = False,
    ) -> list[list[int]]:
        """See `GenerationEngine.generate`. Prompts are left-padded; positions count real tokens only."""
        check_lengths(prompts, sample_ids, max_new_tokens, self.max_model_len)
        rows, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        next_position = mask.sum(dim=1, keepdim=True)
        generators = None
        if temperature > 0:
            generators = [
                torch.Generator(self.device).manual_seed(sequence_seed(seed, sample_id)) for sample_id in sample_ids
            ]
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        eos = torch.tensor(self.eos_ids, device=self.device)
        tokens = []
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for step in range(max_new_tokens):
            token = self._pick(out.logits[:, -1].float(), temperature, generators)
            token = token.masked_fill(done, self.pad_id)
            tokens.append(token)
            if not ignore_eos:
                done |= torch.isin(token, eos)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=next_position + step,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        return self._responses(torch.stack(tokens, dim=1).cpu(), ignore_eos)

    def _pick(self, logits: Tensor, temperature: float, generators: list[torch.Generator] | None) -> Tensor:
        """Each row's next token: the argmax, or a Gumbel-max draw from row i's own generator."""
        if generators is None:
            return logits.argmax(dim=-1)
        vocab = logits.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g, device=self.device) for g in generators])
        gumbel = -torch.log(-torch.log(uniform))
        return (logits / temperature + gumbel).argmax(dim=-1)

    def _responses(self, tokens: Tensor, ignore_eos: bool) -> list[list[int]]:
        """Rows of the [B, T] token grid cut after their first EOS (the padding after it is not generated)."""
        out = []
        for row in tokens.tolist():
            stops = [] if ignore_eos else [t for t, token in enumerate(row) if token in self.eos_ids]
            out.append(row[: stops[0] + 1] if stops else row)
        return out

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `state` into the model's parameters (strict: every name must match)."""
        self.model.load_state_dict(state, strict=True)

    def sleep(self) -> None:
        """On a GPU, move the weights to host memory and release the cached blocks; no-op on CPU."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """On a GPU, move the weights back; no-op on CPU."""
        if self.device.type == "cuda":
            self.model.to(self.device)

    def close(self) -> None:
        """Nothing to release: the model is an ordinary module, freed with the engine."""
