"""LoRA on the reasoning actor (`rlplace.reasoning.lora`): what leaves the actor is the merged model PEFT itself
would make, bucket by bucket, or the adapters alone, which a receiver's copy applies as the policy does; targets are
checked against the model; the memory model counts the adapters PEFT adds. Training with adapters (under ddp and
fsdp, resumed across them) is in test_sharded.py, end to end in test_runner.py; engines applying them in
test_generation.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rlplace.core.errors import ConfigError
from rlplace.core.weights import buckets
from rlplace.planner.memory import TransformerShape
from rlplace.reasoning import lora
from rlplace.reasoning.config import LoRAConfig
from rlplace.reasoning.models.tiny_lm import build_tiny_lm, load_causal_lm
from rlplace.reasoning.models.value_model import ValueModel


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


def trained_adapters(folder: Path, settings: LoRAConfig) -> torch.nn.Module:
    """The model with adapters whose B is not zero, as after some training."""
    torch.manual_seed(0)
    policy = lora.adapt(load_causal_lm(folder), settings)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(std=0.05)
    return policy


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]])
def test_merged_weights_are_what_peft_merges(folder: Path, targets: list[str]) -> None:
    policy = trained_adapters(folder, LoRAConfig(rank=4, alpha=8, target_modules=targets))
    assert lora.scaling(policy) == 2.0
    merged = lora.export(policy).convert(policy.state_dict())
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys() == load_causal_lm(folder).state_dict().keys()
    for name, tensor in expected.items():
        assert torch.equal(merged[name], tensor), name
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        policy.state_dict()["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
    )


def test_small_buckets_keep_each_adapted_layer_whole(folder: Path) -> None:
    # Weight sync converts bucket by bucket: a layer's weight and both its adapters must travel together, however
    # small the buckets.
    policy = trained_adapters(folder, LoRAConfig(rank=4))
    export = lora.export(policy)
    parts = buckets(policy.state_dict(), bucket_mb=0.001, unit=export.unit)
    assert len(parts) > 30
    sent = {name: tensor for part in parts for name, tensor in export.convert(part).items()}
    whole = export.convert(policy.state_dict())
    assert list(sent) == list(whole) and all(torch.equal(sent[name], whole[name]) for name in whole)
    assert lora.export(load_causal_lm(folder)) is None  # a plain policy is sent as it is


def test_adapters_sent_alone_load_into_an_injected_copy_and_peft_reads_them_saved(folder: Path, tmp_path) -> None:
    # `actor.lora.sync: adapters`: only the adapters leave, under the plain model's names; a copy given adapters by
    # `inject` takes them by those names and computes what the policy computes; written by `save_adapters`, PEFT
    # reads them as the adapters of the base model (vLLM's loader reads the same files).
    settings = LoRAConfig(rank=4, alpha=8, sync="adapters")
    policy = trained_adapters(folder, settings)
    export = lora.export(policy, adapters_alone=True)
    state = policy.state_dict()
    sent = export.convert({name: tensor for name, tensor in state.items() if export.keep(name)})
    assert len(sent) == 2 * 7 * len(policy.base_model.model.model.layers)  # A and B of the 7 projections a layer
    assert all(lora.is_adapter(name) and not name.startswith(lora.PREFIX) for name in sent)
    copy = lora.inject(load_causal_lm(folder), settings)
    assert type(copy).__name__ == "LlamaForCausalLM"
    copy.load_state_dict(sent, strict=False)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    expected = policy(input_ids=ids).logits
    assert torch.equal(copy(input_ids=ids).logits, expected)
    with lora.without_adapters(copy):
        assert torch.equal(copy(input_ids=ids).logits, load_causal_lm(folder)(input_ids=ids).logits)
    assert torch.equal(copy(input_ids=ids).logits, expected)  # switched back on

    from peft import PeftModel

    saved = PeftModel.from_pretrained(load_causal_lm(folder), lora.save_adapters(sent, settings, tmp_path / "a"))
    assert torch.equal(saved(input_ids=ids).logits, expected)


@pytest.mark.parametrize("critic", [True, False])
def test_the_critic_trains_adapters_or_every_weight_as_asked(folder: Path, critic: bool) -> None:
    # `actor.lora.critic`: adapters on the backbone (the value head in full), or the whole critic, as verl trains it
    # unless its critic.model.lora_rank is set.
    model = lora.adapt_critic(ValueModel.from_pretrained(folder), LoRAConfig(rank=4, critic=critic))
    names = {name for name, _ in model.named_parameters()}
    trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    if critic:
        assert trained == {name for name in names if lora.is_adapter(name)} | {"value_head.weight", "value_head.bias"}
    else:
        assert trained == names and not any(lora.is_adapter(name) for name in names)


def test_lora_sync_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"actor.lora.sync = 'adapter' is invalid: valid: merged, adapters"):
        LoRAConfig(rank=4, sync="adapter")
    with pytest.raises(ConfigError, match=r"actor.lora.sync = 'adapters' is invalid: merged without adapters"):
        LoRAConfig(sync="adapters")
    assert LoRAConfig(rank=4, sync="adapters").sends_adapters and not LoRAConfig(rank=4).sends_adapters


def test_targets_naming_no_linear_layer_are_refused(folder: Path) -> None:
    lora.check_targets(folder, LoRAConfig(rank=4, target_modules=["q_proj", "model.layers.0.mlp.down_proj"]))
    lora.check_targets(folder, LoRAConfig(rank=4))
    message = r"actor.lora.target_modules = \['q_proj', 'qkv'\] is invalid: 'qkv' is no linear layer of the model in"
    with pytest.raises(ConfigError, match=message) as refused:
        lora.check_targets(folder, LoRAConfig(rank=4, target_modules=["q_proj", "qkv"]))
    assert "valid: [all-linear] or names among down_proj, gate_proj, k_proj, lm_head, o_proj" in str(refused.value)
    with pytest.raises(ConfigError, match="actor.lora.rank = -1 is invalid"):
        LoRAConfig(rank=-1)


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]])
def test_the_memory_model_counts_the_adapters_peft_adds(folder: Path, targets: list[str]) -> None:
    shape = TransformerShape.from_config(json.loads((folder / "config.json").read_text()))
    policy = lora.adapt(load_causal_lm(folder), LoRAConfig(rank=8, target_modules=targets))
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert shape.lora_parameters(8, targets) == trained
    assert shape.parameters() + trained == sum(p.numel() for p in policy.parameters())
    # Frozen weights take 4 bytes a parameter, the adapters 12 with their AdamW moments.
    assert shape.state_bytes(1, adapters=trained) == 4 * shape.parameters() + 12 * trained < shape.state_bytes(1)
