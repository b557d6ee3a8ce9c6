"""ValueModel: the causal LM's backbone with a value head; shapes, the response-slicing convention, gradient flow."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.models.value_model import ValueModel
from rlplace.reasoning.tasks.prompts import Problem


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def _batch(folder, prompts: list[str], responses: list[str]) -> SequenceBatch:
    tokenizer = load_tokenizer(folder)
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in responses]
    width = max(len(r) for r in ids)
    responses_t = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, tokens in enumerate(ids):
        responses_t[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    problems = [Problem(p, r) for p, r in zip(prompts, responses, strict=True)]  # the responses as answers
    return SequenceBatch(0, encoded["input_ids"], encoded["attention_mask"], responses_t, mask, problems)


def test_backbone_is_the_causal_lms_without_lm_head(folder):
    critic = ValueModel.from_pretrained(folder)
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    lm_params = dict(lm.model.named_parameters())
    critic_params = dict(critic.backbone.named_parameters())
    assert critic_params.keys() == lm_params.keys()
    for name, param in critic_params.items():
        assert torch.equal(param, lm_params[name]), name
    assert not any("lm_head" in name for name, _ in critic.named_parameters())
    assert critic.value_head.weight.shape == (1, 64)
    # The same seed gives the same head (data-parallel ranks build identical critics); another seed another head.
    assert torch.equal(ValueModel.from_pretrained(folder, seed=0).value_head.weight, critic.value_head.weight)
    assert not torch.equal(ValueModel.from_pretrained(folder, seed=1).value_head.weight, critic.value_head.weight)


def test_shapes_and_response_slicing(folder):
    critic = ValueModel.from_pretrained(folder)
    batch = _batch(folder, ["1+2=", "10+20="], ["3", "30"])  # prompts [2, 7], responses [2, 3]
    ids, mask = batch.input_ids, batch.attention_mask
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        full = critic(ids, mask, position_ids)
        values = critic.response_values(batch)
        rows = critic.values_after(ids[1:], mask[1:], batch.prompts.shape[1])
    assert full.shape == ids.shape and full.dtype == torch.float32
    assert values.shape == batch.responses.shape
    # Response token t's value sits at column prompt_width - 1 + t: the position that predicts it.
    torch.testing.assert_close(values, full[:, 6:9])
    torch.testing.assert_close(rows, values[1:])


def test_left_padding_does_not_change_values(folder):
    # "1+2=" alone has no padding; next to a longer prompt it is left-padded by 2. Positions skip the padding, so
    # its response values are the same either way.
    critic = ValueModel.from_pretrained(folder)
    with torch.no_grad():
        alone = critic.response_values(_batch(folder, ["1+2="], ["3"]))
        padded = critic.response_values(_batch(folder, ["1+2=", "10+20="], ["3", "30"]))
    torch.testing.assert_close(padded[0, :2], alone[0], atol=1e-5, rtol=1e-5)


def test_gradients_reach_the_head_and_the_backbone(folder):
    critic = ValueModel.from_pretrained(folder)
    batch = _batch(folder, ["1+2=", "10+20="], ["3", "30"])
    values = critic.response_values(batch)
    ((values - 1.0) ** 2).mean().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0 and critic.value_head.bias.grad.abs().sum() > 0
    embedding = critic.backbone.get_input_embeddings().weight
    assert embedding.grad is not None and embedding.grad.abs().sum() > 0
    # A few steps towards a target of 1 move the values there.
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for _ in range(20):
        optimizer.zero_grad()
        loss = ((critic.response_values(batch) - 1.0) ** 2 * batch.response_mask).sum() / batch.response_mask.sum()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
