"""How a run's reservation is sized (no Ray needed): a device's bundle, and each process's share of it."""

from __future__ import annotations

import pytest

from rlplace.scheduler.reservation import cpu_bundles, gpu_bundles, process_share


def test_a_cpu_device_reserves_the_cores_it_owns() -> None:
    assert cpu_bundles([(0, 1), (2, 3)], node_cpus=8) == [{"CPU": 2.0}, {"CPU": 2.0}]


def test_devices_sharing_cores_reserve_a_part_of_each() -> None:
    # 4 devices wrapped round-robin on 2 cores (split_cores): half a core each, never more than the node has
    assert cpu_bundles([(0,), (1,), (0,), (1,)], node_cpus=2) == [{"CPU": 0.5}] * 4
    assert cpu_bundles([(0,), (1,), (0,)], node_cpus=2) == [{"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 0.5}]


def test_cpu_bundles_fit_what_ray_offers_the_node() -> None:
    assert cpu_bundles([(0, 1), (2, 3)], node_cpus=3) == [{"CPU": 1.5}, {"CPU": 1.5}]


def test_a_gpu_device_reserves_one_gpu_and_the_node_cpus_per_gpu() -> None:
    assert gpu_bundles(2, {"GPU": 4.0, "CPU": 10.0}) == [{"GPU": 1.0, "CPU": 2.5}] * 2
    assert gpu_bundles(1, {"GPU": 1.0}) == [{"GPU": 1.0}]


def test_processes_split_their_device_and_extra_ones_ask_for_nothing() -> None:
    bundle = {"GPU": 1.0, "CPU": 1.0}
    shares: list[dict[str, float]] = []
    for _ in range(4):
        shares.append(process_share(bundle, expected=3, held=shares))
    assert [share["CPU"] for share in shares[:3]] == pytest.approx([1 / 3] * 3, abs=1e-3)
    assert shares[3] == {}
    assert sum(share["CPU"] for share in shares[:3]) <= 1.0 and sum(share["GPU"] for share in shares[:3]) <= 1.0


def test_a_new_process_takes_what_processes_kept_from_another_placement_leave() -> None:
    bundle = {"CPU": 2.0}
    kept = [{"CPU": 1.0}, {"CPU": 0.5}]  # two of a device's three processes, which held half and a quarter before
    assert process_share(bundle, expected=3, held=kept) == {"CPU": 0.5}
    assert process_share(bundle, expected=4, held=kept) == {"CPU": 0.25}


@pytest.mark.parametrize("cores", [1, 3, 7])
def test_shares_never_sum_past_their_bundle(cores: int) -> None:
    bundle = cpu_bundles([tuple(range(cores))], node_cpus=cores)[0]
    shares: list[dict[str, float]] = []
    for _ in range(7):
        shares.append(process_share(bundle, expected=7, held=shares))
    assert sum(share["CPU"] for share in shares) <= bundle["CPU"]
