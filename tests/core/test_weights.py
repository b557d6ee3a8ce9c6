"""Weight-sync buckets: a state dict split in order into messages of a bounded size."""

from __future__ import annotations

import torch

from rlplace.core.weights import buckets

MB = 1e6


def _state(*numels: int) -> dict[str, torch.Tensor]:
    """float32 tensors of the given sizes (4 bytes per element), named w0, w1, ..."""
    return {f"w{i}": torch.full((n,), float(i)) for i, n in enumerate(numels)}


def test_fills_buckets_in_order_up_to_the_limit() -> None:
    # 1 MB limit; tensors of 0.4, 0.4, 0.4, 0.8 MB: [w0, w1] (0.8), [w2] (0.4 + 0.8 would exceed it), [w3].
    state = _state(100_000, 100_000, 100_000, 200_000)
    parts = buckets(state, bucket_mb=1.0)
    assert [list(p) for p in parts] == [["w0", "w1"], ["w2"], ["w3"]]
    assert all(sum(t.numel() * t.element_size() for t in p.values()) <= 1.0 * MB for p in parts)
    # Nothing lost, nothing copied: the buckets hold the state's own tensors, in the state's order.
    merged = {name: tensor for part in parts for name, tensor in part.items()}
    assert list(merged) == list(state)
    assert all(merged[name].data_ptr() == state[name].data_ptr() for name in state)


def test_exactly_full_bucket_is_kept_whole() -> None:
    # Two 0.5 MB tensors fill 1 MB exactly: one bucket.
    assert [list(p) for p in buckets(_state(125_000, 125_000), bucket_mb=1.0)] == [["w0", "w1"]]


def test_a_tensor_larger_than_a_bucket_travels_alone() -> None:
    parts = buckets(_state(10, 1_000_000, 10), bucket_mb=1.0)  # w1 is 4 MB
    assert [list(p) for p in parts] == [["w0"], ["w1"], ["w2"]]


def test_one_bucket_when_everything_fits_and_for_an_empty_state() -> None:
    assert [list(p) for p in buckets(_state(10, 20, 30), bucket_mb=64.0)] == [["w0", "w1", "w2"]]
    assert buckets({}, bucket_mb=1.0) == [{}]


def test_buckets_are_detached() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    (part,) = buckets({"weight": weight}, bucket_mb=1.0)
    assert not part["weight"].requires_grad
    assert part["weight"].data_ptr() == weight.data_ptr()


def test_model_state_round_trips() -> None:
    torch.manual_seed(0)
    source, target = torch.nn.Linear(300, 200), torch.nn.Linear(300, 200)
    parts = buckets(source.state_dict(), bucket_mb=0.1)  # the 240 kB weight alone, then the bias
    assert len(parts) == 2
    with torch.no_grad():
        state = target.state_dict()
        for part in parts:
            for name, tensor in part.items():
                state[name].copy_(tensor)
    for a, b in zip(source.parameters(), target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
