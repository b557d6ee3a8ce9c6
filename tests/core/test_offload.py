"""Offload and onload: a module, its gradients and its optimizer state to pinned host memory and back."""

from __future__ import annotations

import pytest
import torch

from rlplace.core.offload import HostCopies, _tensors, move

CPU = torch.device("cpu")


def trained_linear(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small Linear with its Adam state created by one step (grads left in place)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 16, device=device)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_moving_to_the_cpu_on_a_cpu_cluster_is_a_recorded_no_op() -> None:
    model, optimizer = trained_linear(CPU)
    before = [(name, tensor.data_ptr()) for _, name, tensor in _tensors(model, optimizer)]
    record = move(model, optimizer, CPU, HostCopies())
    assert (record.bytes, record.gb_per_s) == (0, 0.0)
    assert [(name, tensor.data_ptr()) for _, name, tensor in _tensors(model, optimizer)] == before
    optimizer.step()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_round_trips_keep_every_value_reuse_the_pinned_memory_and_leave_adam_steps_on_the_cpu() -> None:
    cuda = torch.device("cuda", torch.cuda.current_device())
    model, optimizer = trained_linear(cuda)
    host = HostCopies()
    first_pinned: list[int] = []
    for _ in range(2):
        on_device = [tensor.clone() for _, _, tensor in _tensors(model, optimizer)]
        assert len(on_device) == 8  # weight and bias, their grads, their two Adam moments each
        offloaded = move(model, optimizer, CPU, host)
        assert offloaded.bytes == sum(t.numel() * t.element_size() for t in on_device)
        assert all(t.device == CPU and t.is_pinned() for _, _, t in _tensors(model, optimizer))
        pinned = [tensor.data_ptr() for _, _, tensor in _tensors(model, optimizer)]
        assert pinned == (first_pinned or pinned)  # the second offload copies into the memory the first pinned
        first_pinned = pinned
        move(model, optimizer, cuda, host)
        back = [tensor for _, _, tensor in _tensors(model, optimizer)]
        assert all(t.device == cuda and torch.equal(t, e) for t, e in zip(back, on_device, strict=True))
        assert all(state["step"].device == CPU for state in optimizer.state.values())
        optimizer.step()  # new values for the next round trip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_sharded_state_round_trips_every_value(tmp_path) -> None:
    """An FSDP2-sharded model (`actor.strategy = fsdp`), its gradients and AdamW state: off the GPU into pinned host
    memory and back, every shard's value kept, and training goes on."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlplace.core.strategies.fsdp import FullyShard

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        cuda = torch.device("cuda", torch.cuda.current_device())
        config = Qwen2Config(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
        model = FullyShard(1, cuda).wrap(Qwen2ForCausalLM(config).to(cuda))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 256, (2, 8), device=cuda)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

        def local(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to_local() if isinstance(tensor, DTensor) else tensor

        on_device = [local(t).clone() for _, _, t in _tensors(model, optimizer)]
        host = HostCopies()
        offloaded = move(model, optimizer, CPU, host)
        assert offloaded.bytes == sum(t.numel() * t.element_size() for t in on_device)
        assert all(local(t).device == CPU and local(t).is_pinned() for _, _, t in _tensors(model, optimizer))
        move(model, optimizer, cuda, host)
        back = [local(t) for _, _, t in _tensors(model, optimizer)]
        assert all(t.device == cuda and torch.equal(t, e) for t, e in zip(back, on_device, strict=True))
        model(input_ids=ids, labels=ids).loss.backward()  # FSDP2 gathers from the moved shards
        optimizer.step()
    finally:
        dist.destroy_process_group()
