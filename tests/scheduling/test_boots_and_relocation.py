"""Two pure pieces beside the scheduler: the boot times the wait budget reads
(`rules.boots`), and the placement query consolidation asks (`scheduling.relocation`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.rules.boots import KEEP, BootTimes
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.placement import EARLIER
from nodewarden.scheduling.relocation import relocation
from nodewarden.scheduling.views import Capacity, ContainerView, NodeState, NodeView, Phase

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GI = 2**30
FOUR = InstanceType(name="four", provider_type="c4", vcpus=4, ram=16 * GI, price=0.20)
CATALOGUE = Catalogue(types=(FOUR,))
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def coming(name: str, since: datetime, vm: bool = True, ready: bool = False) -> NodeView:
    if vm:
        state = NodeState.IDLE if ready else NodeState.BOOTING
        return NodeView(name, state, Capacity.of(FOUR), "four", 0.2, True, ready, False, since)
    state = NodeState.IDLE if ready else NodeState.WAKING
    return NodeView(
        name, state, Capacity(64, 256 * GI, 0, 0), None, 0.35, ready, ready, True, since
    )


# -- boot times -------------------------------------------------------------------------


def test_a_boot_is_timed_from_its_start_to_the_first_view_that_shows_it_ready() -> None:
    boots = BootTimes()
    boots.watch([coming("vm-1", T0), coming("side-1", T0, vm=False)], at(10))
    assert boots.types() == {} and boots.estimate("side-1") == (None, None)
    assert boots.tracking() == ["vm-1", "side-1"]
    boots.watch([coming("vm-1", T0, ready=True), coming("side-1", T0, vm=False)], at(100))
    boots.watch([coming("side-1", T0, vm=False, ready=True)], at(170))
    assert boots.types() == {"four": 100.0}
    assert boots.estimate("side-1") == (170.0, 170.0)


def test_the_estimate_is_the_median_of_the_last_few_and_the_slowest_of_them() -> None:
    boots = BootTimes()
    for n, seconds in enumerate([500, 90, 100, 110, 120, 300]):  # the 500 s one is forgotten
        start = at(1000 * n)
        boots.watch([coming("side-1", start, vm=False)], start)
        boots.watch(
            [coming("side-1", start, vm=False, ready=True)], start + timedelta(seconds=seconds)
        )
    assert KEEP == 5
    assert boots.estimate("side-1") == (110.0, 300.0)


def test_a_node_first_seen_ready_or_gone_teaches_nothing() -> None:
    boots = BootTimes()
    boots.watch([coming("adopted", T0, ready=True)], at(5))
    boots.watch([coming("vm-2", T0)], at(10))
    boots.watch([], at(20))  # vm-2 vanished while booting
    boots.watch([coming("vm-2", T0, ready=True)], at(400))  # a new vm-2: not timed
    assert boots.types() == {}


# -- where else could these containers run ----------------------------------------------


def vm(name: str, state: NodeState = NodeState.ACTIVE) -> NodeView:
    return NodeView(name, state, Capacity.of(FOUR), "four", 0.2, admission_open=True, ready=True)


def running(uuid: str, node: str, vcpus: int) -> ContainerView:
    resources = ContainerResources(vcpus=vcpus, ram=f"{vcpus}Gi")
    return ContainerView(uuid, Phase.RUNNING, 500, T0, resources, node)


def test_the_query_places_a_nodes_containers_on_the_other_open_nodes_best_fit() -> None:
    held = [
        running("a", "light", 1),
        running("b", "light", 1),
        running("x", "busy", 3),
        running("y", "half", 2),
    ]
    nodes = [vm("light"), vm("busy"), vm("half"), vm("closed")]
    nodes[3] = NodeView("closed", NodeState.IDLE, Capacity.of(FOUR), "four", 0.2, False, True)
    moving = [c for c in held if c.node == "light"]
    answer = relocation(moving, held, nodes, {"light"}, CATALOGUE, POLICY, T0)
    assert answer.fits and answer.targets == {"a": "busy", "b": "half"}  # the fullest first
    # nothing is changed by asking: the same question, the same answer
    assert relocation(moving, held, nodes, {"light"}, CATALOGUE, POLICY, T0) == answer


def test_what_no_other_open_node_can_take_is_named() -> None:
    held = [running("a", "light", 3), running("x", "full", 4)]
    nodes = [vm("light"), vm("full"), NodeView("off", NodeState.OFF, Capacity.of(FOUR), "four")]
    answer = relocation([held[0]], held, nodes, {"light"}, CATALOGUE, POLICY, T0)
    assert not answer.fits and answer.unplaced == ("a",) and answer.targets == {}
    # the earlier placement answers by its own order: an idle node first
    idle = [vm("light"), vm("busy"), vm("idle", NodeState.IDLE)]
    held = [running("a", "light", 1), running("x", "busy", 2)]
    earlier = relocation([held[0]], held, idle, {"light"}, CATALOGUE, POLICY, T0, EARLIER)
    assert earlier.targets == {"a": "idle"}
