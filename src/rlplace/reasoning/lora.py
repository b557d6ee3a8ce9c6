"""LoRA for the reasoning actor (`actor.lora.rank`): the policy's base weights frozen, low-rank adapters trained (and
PPO's critic's alike, `adapt_critic`).

The actor wraps its policy with PEFT's LoRA (`adapt`), so gradients and AdamW state exist for the adapters alone:
a rank's training state shrinks from 16 bytes a parameter (weight, gradient, two moments) to the 4 of its frozen
weight, plus the adapters' few percent. By default everything the actor hands out is an ordinary model's weights,
each adapted matrix merged as W + s · B A (`merge`, the arithmetic of PEFT's own merge): weight sync (the rollout
engine and the inference group's policy copy never see an adapter), the final model and `rlplace-export`, which also
keep the adapters alone in PEFT's format (`save_model`). The merge is computed out of place, bucket by bucket, so the
frozen W stays exactly what was loaded; merging into W and out again would move it by rounding at every sync. B
starts at zero, so the first policy is the base model, and the reference model stays the base, as the inference group
loads it.

With `actor.lora.sync: adapters`, weight sync sends the adapters alone (`export`): the receivers hold the base weights
from the model folder with the same adapters added (`inject`; vLLM through its LoRA support, `save_adapters`), and the
inference group's copy, which computes what the policy computes, scores the reference with them off
(`without_adapters`) instead of holding a second model.

Adapters are initialised from torch's generator, which the actor seeds with runner.seed before it loads the model:
the same on every rank and in every placement. There is no adapter dropout, which would draw noise per rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from rlplace.core.errors import ConfigError
from rlplace.core.weights import Export
from rlplace.planner.memory import ALL_LINEAR
from rlplace.reasoning.config import LoRAConfig
from rlplace.reasoning.models.tiny_lm import causal_lm_skeleton
from rlplace.reasoning.models.value_model import ValueModel

ADAPTER = "default"
"""PEFT's name of the one adapter."""
PREFIX = "base_model.model."
"""What PEFT's wrapper puts before the wrapped model's parameter names."""
BASE = ".base_layer"
"""What PEFT puts between an adapted layer and its original parameters."""
ADAPTER_FOLDER = "adapter"
"""Where a model folder written from an adapted policy keeps the adapters alone, in PEFT's format."""
IDENTITY = "actor.lora"
"""The checkpoint identity's entry of the adapters' settings (`launch.checkpoint_identity`): a run resumes only the
adapters it trains, and `rlplace-export` rebuilds them from it."""


def peft_config(settings: LoRAConfig):
    """`settings` as PEFT's LoraConfig."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        target_modules=peft_targets(settings.target_modules),
        lora_dropout=0.0,
        bias="none",
    )


def adapt(model: nn.Module, settings: LoRAConfig) -> nn.Module:
    """`model` with LoRA adapters as `settings` say (only they train), or `model` itself when they are off."""
    if not settings.enabled:
        return model
    from peft import get_peft_model

    return get_peft_model(model, peft_config(settings))


def inject(model: nn.Module, settings: LoRAConfig) -> nn.Module:
    """`model` itself with the adapters `settings` describe added to its layers in place (no wrapper: its class,
    forward and names stay its own, each adapted layer's `base_layer` and `lora_A`/`lora_B` within it): a receiver
    of `sync: adapters`, which loads what `export` sends by these names. B is zero until then, so it runs the base."""
    from peft import inject_adapter_in_model

    return inject_adapter_in_model(peft_config(settings), model)


@contextmanager
def without_adapters(model: nn.Module) -> Iterator[None]:
    """`model`'s adapted layers compute their base layer alone meanwhile (exactly the base model's forward pass:
    the reference model of an `inject`-ed policy copy)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def check_targets(model_path: str | Path, settings: LoRAConfig) -> None:
    """Refuse (ConfigError, one line) a target that names no linear layer of the model in `model_path` (by its
    name, `q_proj`, or its path, `model.layers.0.self_attn.q_proj`, as PEFT matches them), read from its config
    on the meta device (no weights)."""
    if not settings.enabled or settings.target_modules == [ALL_LINEAR]:
        return
    model = causal_lm_skeleton(model_path)
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for target in settings.target_modules:
        if not any(name == target or name.endswith(f".{target}") for name in linear):
            names = sorted({name.rsplit(".", 1)[-1] for name in linear})
            raise ConfigError(
                f"actor.lora.target_modules = {settings.target_modules} is invalid: {target!r} is no linear layer "
                f"of the model in {model_path} (valid: [{ALL_LINEAR}] or names among {', '.join(names)})"
            )


def trained(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: every one of a plain model; an adapted one's adapters (and a critic's value
    head)."""
    return [parameter for parameter in model.parameters() if parameter.requires_grad]


def adapt_critic(critic: ValueModel, settings: LoRAConfig) -> ValueModel:
    """PPO's critic with adapters on its backbone as `settings` say (OpenRLHF's `--lora_rank` adapts both models; the
    value head, new and small, trains in full), or as it is when they are off or kept off the critic
    (`settings.critic`). Its weights never leave the actor, so nothing merges them."""
    if settings.critic:
        critic.backbone = adapt(critic.backbone, settings)
    return critic


def peft_targets(target_modules: list[str]) -> str | list[str]:
    """`actor.lora.target_modules` as PEFT takes it."""
    return ALL_LINEAR if target_modules == [ALL_LINEAR] else list(target_modules)


def is_adapted(model: nn.Module) -> bool:
    return any(name.startswith(PREFIX) for name, _ in model.named_parameters())


def scaling(model: nn.Module) -> float:
    """The factor s of W + s · B A, as PEFT's layers hold it (alpha / rank)."""
    from peft.tuners.lora import LoraLayer

    return next(float(m.scaling[ADAPTER]) for m in model.modules() if isinstance(m, LoraLayer))


def base_name(name: str) -> str:
    """The wrapped model's own name of a parameter of the PEFT model."""
    return name.removeprefix(PREFIX).replace(f"{BASE}.", ".")


def layer_of(name: str) -> str:
    """The adapted layer an entry of the PEFT model's state dict belongs to (its base weight, bias and both
    adapters), or the entry itself: what must travel in one bucket to be merged."""
    for marker in (f"{BASE}.", f".lora_A.{ADAPTER}.", f".lora_B.{ADAPTER}."):
        if marker in name:
            return name.split(marker)[0]
    return name


def merge(tensors: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Whole tensors of the PEFT model's state dict (every entry of each adapted layer among them) as the wrapped
    model's state dict: each adapted weight W + (B @ A) · s under its own name, the adapters dropped."""
    merged = {}
    for name, tensor in tensors.items():
        if is_adapter(name):
            continue
        if name.endswith(f"{BASE}.weight"):
            layer = name.removesuffix(f"{BASE}.weight")
            a, b = tensors[f"{layer}.lora_A.{ADAPTER}.weight"], tensors[f"{layer}.lora_B.{ADAPTER}.weight"]
            tensor = tensor + (b @ a) * scale
        merged[base_name(name)] = tensor
    return merged


def is_adapter(name: str) -> bool:
    """Whether a state dict entry is an adapter's (A or B)."""
    return f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name


def export(model: nn.Module, adapters_alone: bool = False) -> Export | None:
    """How the weights of `model` leave the actor: None for a plain model; when it is adapted, merged (`merge`), or
    the adapters alone (`actor.lora.sync: adapters`) under the names `inject` gives them."""
    if not is_adapted(model):
        return None
    if adapters_alone:
        return Export(keep=is_adapter, convert=lambda tensors: {n.removeprefix(PREFIX): t for n, t in tensors.items()})
    scale = scaling(model)
    return Export(unit=layer_of, convert=lambda tensors: merge(tensors, scale))


def save_adapters(tensors: Mapping[str, torch.Tensor], settings: LoRAConfig, folder: Path) -> Path:
    """Write adapters as `export` sends them into `folder` in PEFT's format (what `PeftModel.from_pretrained` and
    vLLM's LoRA loader read), and return it."""
    from safetensors.torch import save_file

    peft_config(settings).save_pretrained(folder)
    saved = {PREFIX + name.replace(f".{ADAPTER}.", "."): t.contiguous() for name, t in tensors.items()}
    save_file(saved, Path(folder) / "adapter_model.safetensors")
    return Path(folder)


def save_model(model: nn.Module, policy: nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write `policy`'s whole `state` (its state dict's tensors) as the Hugging Face folder of `model`, the model it
    trains: merged when the policy is adapted, with the adapters alone beside it in `folder/adapter` (PEFT's
    format: `PeftModel.from_pretrained(base, folder/adapter)`, to serve or share them without the weights)."""
    if not is_adapted(policy):
        model.save_pretrained(folder, state_dict=state)
        return
    model.save_pretrained(folder, state_dict=merge(state, scaling(policy)))
    policy.save_pretrained(folder / ADAPTER_FOLDER, state_dict=state)
