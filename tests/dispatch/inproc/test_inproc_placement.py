"""Placement rules, in process: priority order, idle nodes first, reuse of the node a
container is locked on, creates that count booting nodes, the cheapest type within the
price factor, several containers per node."""

from __future__ import annotations

import pytest
from fakes import LARGE, ME, MEDIUM, SMALL, Rig, container


async def test_a_free_idle_node_is_used_before_anything_is_created() -> None:
    rig = Rig([SMALL])
    rig.vm("vm-idle")
    await rig.start()
    rig.api.create(container("c1"))
    await rig.rounds(2)
    assert rig.runners() == {"c1": "vm-idle"}
    assert rig.api.phase("c1") == "Running"
    assert rig.api.status("c1")["lockedBy"] == ME
    assert rig.cloud.created == []


async def test_the_highest_priority_container_gets_the_only_node() -> None:
    rig = Rig([SMALL], maxNodes=1)
    rig.vm("vm-only")
    await rig.start()
    rig.api.create(container("lo", priority=1, vcpus=2))
    rig.api.create(container("hi", priority=10, vcpus=2))
    await rig.rounds(3)
    assert rig.runners() == {"hi": "vm-only"}
    assert rig.api.phase("lo") == "Queued"
    assert rig.cloud.created == []
    # the node frees up: the waiting one runs there next
    rig.cloud.vms["vm-only"].exit(rig.queue.by_name["hi"].uuid, 0)
    await rig.rounds(3)
    assert rig.api.phase("hi") == "Complete"
    assert rig.runners() == {"lo": "vm-only"}


async def test_a_container_locked_on_a_node_starts_there() -> None:
    rig = Rig([SMALL], maxNodes=2)
    rig.vm("vm-a")
    rig.vm("vm-b")
    rig.api.create(
        container("c1", status={"phase": "Locked", "node": "vm-b", "lockedBy": ME, "attempts": 0})
    )
    await rig.start()
    await rig.rounds(2)
    assert rig.runners() == {"c1": "vm-b"}
    assert rig.api.phase("c1") == "Running"


async def test_creates_count_the_nodes_still_booting() -> None:
    rig = Rig([SMALL])
    await rig.start()
    rig.api.create(container("c1", vcpus=2))
    rig.api.create(container("c2", vcpus=2))
    await rig.rounds(5)
    assert rig.cloud.created == ["small", "small"]
    assert rig.runners() == {}
    for vm in rig.cloud.vms.values():
        vm.ready = True
    await rig.rounds(2)
    placed = rig.runners()
    assert set(placed) == {"c1", "c2"}
    assert len(set(placed.values())) == 2
    assert rig.cloud.created == ["small", "small"]


@pytest.mark.parametrize(
    ("at_capacity", "created"),
    [
        (set(), ["small"]),
        ({"small"}, ["medium"]),  # 1.4x the cheapest: within the price factor 1.5
        ({"small", "medium"}, []),  # large is 5x: too dear, the container waits
    ],
)
async def test_the_cheapest_type_that_fits_within_the_price_factor(
    at_capacity: set[str], created: list[str]
) -> None:
    rig = Rig([LARGE, MEDIUM, SMALL], price_factor=1.5)
    rig.cloud.at_capacity = at_capacity
    await rig.start()
    rig.api.create(container("c1"))
    await rig.rounds(3)
    assert rig.cloud.created == created
    if not created:
        assert rig.api.phase("c1") == "Queued"
        assert "capacity" in rig.api.status("c1")["schedulingStatus"]


async def test_several_containers_share_one_node_when_they_fit() -> None:
    rig = Rig([LARGE])  # (containers run on their chosen type: here the only one)
    rig.vm("vm-big", LARGE)
    await rig.start()
    for name in ("c1", "c2", "c3"):
        rig.api.create(container(name, vcpus=2))
    await rig.rounds(3)
    assert rig.runners() == {"c1": "vm-big", "c2": "vm-big", "c3": "vm-big"}
    assert rig.cloud.created == []
