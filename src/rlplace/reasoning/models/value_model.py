"""The critic of PPO on LLMs: a causal LM's backbone (no lm_head) with a linear value head on each position.

The critic starts from the policy's own checkpoint, so it reads prompts and responses with the features the policy
learned, but it trains as a separate model with its own optimizer (verl's and OpenRLHF's layout), so its gradients
never disturb the policy.

Convention (the same slicing as `rlplace.reasoning.batch.response_logits`): the value of response token t is read
at column `prompt_width - 1 + t` of `prompt + response`, the position whose logits predict token t. It is V(s_t), the
value of the state in which token t is chosen (the prompt and tokens < t read). GAE then takes V after the last
valid token as 0: the episode ends at EOS.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlplace.reasoning.batch import SequenceBatch


class ValueModel(nn.Module):
    """A transformer backbone and a hidden -> 1 linear head: one scalar value per position."""

    def __init__(self, backbone: PreTrainedModel, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden_size, 1)
        # A small init (the backbone's initializer_range) keeps the first values near 0, the midpoint of 0/1 rewards,
        # while letting gradients reach the backbone from the first step (a zero weight would block them). The head
        # is drawn from its own seeded generator, so every data-parallel rank builds the same critic.
        std = getattr(backbone.config, "initializer_range", 0.02)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.value_head.weight.copy_(torch.randn(1, hidden_size, generator=generator) * std)
            self.value_head.bias.zero_()

    @classmethod
    def from_pretrained(cls, path: str | Path, seed: int = 0) -> ValueModel:
        """The backbone of the causal LM in `path` (its lm_head dropped), in float32, with a fresh value head.

        Loaded as the causal LM and then unwrapped, rather than as a bare base model, so that every weight in the
        folder finds its place and transformers has no unexpected lm_head to warn about."""
        causal_lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return cls(causal_lm.base_model, seed=seed)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        """[B, L] values, one per input position (float32)."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return self.value_head(hidden.float()).squeeze(-1)

    def response_values(self, batch: SequenceBatch) -> Tensor:
        """[B, T] values V(s_t) for each response token of `batch`, on this model's device."""
        return self.values_after(batch.input_ids, batch.attention_mask, batch.prompts.shape[1])

    def values_after(self, input_ids: Tensor, attention_mask: Tensor, prompt_width: int) -> Tensor:
        """[B, T] values V(s_t) of the tokens after the first `prompt_width` columns of `input_ids` (the responses).

        Positions count real tokens only, as in `response_logits`, so left padding changes nothing.
        """
        device = self.value_head.weight.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        return self(input_ids, attention_mask, position_ids)[:, prompt_width - 1 : -1]
