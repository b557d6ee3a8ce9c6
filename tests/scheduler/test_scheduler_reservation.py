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
    shares = [process_share(bundle, expected=3, placed=placed) for placed in range(4)]
    assert shares[:3] == [{"GPU": 0.3333, "CPU": 0.3333}] * 3  # rounded down to Ray's 0.0001: they fit the bundle
    assert shares[3] == {}
    assert sum(share["CPU"] for share in shares[:3]) <= 1.0


@pytest.mark.parametrize("cores", [1, 3, 7])
def test_shares_never_sum_past_their_bundle(cores: int) -> None:
    bundle = cpu_bundles([tuple(range(cores))], node_cpus=cores)[0]
    assert sum(process_share(bundle, expected=7, placed=i)["CPU"] for i in range(7)) <= bundle["CPU"]
