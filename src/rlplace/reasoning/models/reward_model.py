"""A reward model: a Hugging Face sequence classifier with one output (`AutoModelForSequenceClassification`,
num_labels=1), scoring a prompt and its response as one text.

It reads text, not the policy's token ids: its tokenizer need not be the policy's (a reward model is usually trained
from another checkpoint). With a chat template, the text is the conversation [user: prompt, assistant: response], as
reward models trained on conversations expect; without one, the prompt followed by the response.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlplace.reasoning.tasks.prompts import Problem

MICRO_ROWS = 64
"""Rows per forward pass: a step's responses are scored in slices, so the activations stay small."""


class RewardModel:
    """The classifier and its tokenizer, on one device; `score` is its scalar per response."""

    def __init__(self, path: str | Path, device: torch.device) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        # The classifier reads the logit of each row's last real token, which it finds by the pad id.
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.requires_grad_(False).to(device).eval()
        self.device = device

    def text(self, prompt: str, response: str) -> str:
        """What the model reads of one response (see the module's docstring)."""
        if self.tokenizer.chat_template is None:
            return prompt + response
        conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return self.tokenizer.apply_chat_template(conversation, tokenize=False)

    @torch.no_grad()
    def score(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
        """The model's scalar for each response to its problem."""
        texts = [self.text(p.prompt, r) for p, r in zip(problems, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), MICRO_ROWS):
            encoded = self.tokenizer(texts[start : start + MICRO_ROWS], padding=True, return_tensors="pt")
            logits = self.model(**encoded.to(self.device)).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
