"""Properties of every plan under every combination of the placement levers (hypothesis):
no node is given more than it holds, no create passes a hard cap, and CPU-only work stays
off GPU capacity while something without GPUs fits it.

The fleet is random: cloud VMs of a small catalogue in every scheduler state, with
Running containers holding them (sometimes more than they hold: an old leader's
overcommit; some being cancelled, their room back soon), side nodes with and without GPUs off, waking or on; a random queue; the
limits from random PowerPolicy limits under random operator ceilings
(`scheduling.caps.effective_limits`); a cloud that blocks some types or every create."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.caps import Ceilings, Fleet, PolicyLimits, admit_create, effective_limits
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.placement import PlacementRules
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    NodeState,
    NodeView,
    Phase,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GI = 2**30
TYPES = (
    InstanceType(name="one", provider_type="c1", vcpus=1, ram=2 * GI, price=0.02),
    InstanceType(name="two", provider_type="c2", vcpus=2, ram=4 * GI, price=0.03),
    InstanceType(name="four", provider_type="c4", vcpus=4, ram=16 * GI, price=0.20),
    InstanceType(
        name="gpu", provider_type="g", vcpus=4, ram=16 * GI, gpus=1, gpu_model="a10", price=0.21
    ),
)
CATALOGUE = Catalogue(types=TYPES)
BY_NAME = {t.name: t for t in TYPES}
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=1.5)
SHAPES = [(1, 1), (1, 2), (2, 3), (4, 12), (8, 32), (32, 64)]  # vCPUs, GiB

rules_st = st.builds(
    PlacementRules,
    best_fit=st.booleans(),
    queue_launch=st.booleans(),
    gpu_last=st.booleans(),
    per_resource_price=st.booleans(),
    wait_budget=st.sampled_from([None, timedelta(0), timedelta(minutes=2)]),
    no_wait_above=st.sampled_from([0, 900, 1000]),
)
container_st = st.tuples(
    st.sampled_from(SHAPES), st.integers(0, 1), st.integers(0, 1000), st.integers(0, 600)
)
vm_st = st.tuples(
    st.sampled_from([t.name for t in TYPES]),
    st.sampled_from([*NodeState, NodeState.ACTIVE, NodeState.ACTIVE, NodeState.ACTIVE]),
    # Running there; some being cancelled (their room back in 30 s or 10 min)
    st.lists(st.tuples(st.sampled_from(SHAPES[:4]), st.sampled_from([None, 30, 600])), max_size=3),
)
side_st = st.tuples(
    st.sampled_from([NodeState.OFF, NodeState.WAKING, NodeState.IDLE, NodeState.ACTIVE]),
    st.sampled_from([0, 2]),
    st.sampled_from([0.05, 0.35, 2.0]),
    st.sampled_from([None, 60.0, 600.0]),
)


def _resources(shape: tuple[int, int], gpus: int) -> ContainerResources:
    return ContainerResources(vcpus=shape[0], ram=f"{shape[1]}Gi", gpus=gpus)


@settings(max_examples=150, deadline=None)
@given(
    rules=rules_st,
    queued=st.lists(container_st, max_size=25),
    vms=st.lists(vm_st, max_size=6),
    sides=st.lists(side_st, max_size=3),
    policy_nodes=st.sampled_from([None, 0, 2, 6]),
    ceiling_nodes=st.sampled_from([None, 3, 8]),
    spend=st.sampled_from([None, 0.1, 0.5]),
    per_type=st.dictionaries(st.sampled_from(["one", "two", "four"]), st.integers(0, 3)),
    new_left=st.sampled_from([None, 0, 1, 3]),
    blocked=st.sampled_from([{}, {"one": "capacity"}, {"four": "capacity", "two": "quota"}]),
    all_blocked=st.booleans(),
)
def test_a_plan_never_overcommits_a_node_nor_passes_a_cap(
    rules: PlacementRules,
    queued: list[tuple[tuple[int, int], int, int, int]],
    vms: list[tuple[str, NodeState, list[tuple[tuple[int, int], int | None]]]],
    sides: list[tuple[NodeState, int, float, float | None]],
    policy_nodes: int | None,
    ceiling_nodes: int | None,
    spend: float | None,
    per_type: dict[str, int],
    new_left: int | None,
    blocked: dict[str, str],
    all_blocked: bool,
) -> None:
    nodes: list[NodeView] = []
    containers: list[ContainerView] = []
    for i, (type_name, state, running) in enumerate(vms):
        t = BY_NAME[type_name]
        ready = state in (NodeState.IDLE, NodeState.ACTIVE)
        name = f"vm{i}"
        nodes.append(
            NodeView(name, state, Capacity.of(t), t.name, t.price, admission_open=True, ready=ready)
        )
        for j, (shape, frees_in) in enumerate(running):
            frees_at = None if frees_in is None else T0 + timedelta(seconds=frees_in)
            containers.append(
                ContainerView(
                    f"{name}-r{j}",
                    Phase.RUNNING,
                    500,
                    T0,
                    _resources(shape, 0),
                    name,
                    frees_at=frees_at,
                )
            )
    for i, (state, gpus, price, boot) in enumerate(sides):
        on = state in (NodeState.IDLE, NodeState.ACTIVE)
        nodes.append(
            NodeView(
                f"side{i}",
                state,
                Capacity(16, 64 * GI, 0, gpus, "a100" if gpus else None),
                None,
                price,
                admission_open=on,
                ready=on,
                wakeable=not on,
                coming_since=T0 - timedelta(seconds=30) if state is NodeState.WAKING else None,
                boot_seconds=boot,
            )
        )
    for i, (shape, gpus, priority, age) in enumerate(queued):
        containers.append(
            ContainerView(
                f"q{i}",
                Phase.QUEUED,
                priority,
                T0 - timedelta(seconds=age),
                _resources(shape, gpus),
            )
        )
    policy = PolicyLimits("default", policy_nodes, spend, per_type)
    ceilings = Ceilings(max_nodes=ceiling_nodes, max_per_type=4)
    limits = effective_limits(policy, ceilings, BY_NAME)
    cloud = CloudState(
        creates_blocked="quota" if all_blocked else None,
        blocked_types=blocked,
        max_new_nodes=new_left,
    )

    p = plan(containers, nodes, CATALOGUE, POLICY, limits, cloud, T0, rules)

    by_name = {n.name: n for n in nodes}
    need = {c.uuid: c.resources for c in containers}
    queue = {c.uuid for c in containers if c.phase is Phase.QUEUED}
    # every queued container has exactly one outcome
    started = [s.uuid for s in p.starts]
    assert len(started) == len(set(started))
    outcomes = [set(started), set(p.waits), set(p.unsatisfiable)]
    assert set().union(*outcomes) == queue
    assert sum(len(o) for o in outcomes) == len(queue)
    # no node is given more than it holds: now, Running + started; once the containers
    # being cancelled are gone, the rest + started + waited for (or woken for)
    now_on: dict[str, list[str]] = defaultdict(list)
    later_on: dict[str, list[str]] = defaultdict(list)
    for s in p.starts:
        node = by_name[s.node]
        assert node.ready and node.admission_open
        assert node.state in (NodeState.IDLE, NodeState.ACTIVE)
        assert s.node not in p.over_capacity
        now_on[s.node].append(s.uuid)
        later_on[s.node].append(s.uuid)
    for uuid, name in p.wait_nodes.items():
        later_on[name].append(uuid)
    for c in containers:
        if c.phase is Phase.RUNNING and c.node in now_on:
            now_on[c.node].append(c.uuid)
        if c.phase is Phase.RUNNING and c.node in later_on and c.frees_at is None:
            later_on[c.node].append(c.uuid)
    for given_to in (now_on, later_on):
        for name, uuids in given_to.items():
            cap = by_name[name].capacity
            assert sum(need[u].vcpus for u in uuids) <= cap.vcpus
            assert sum(int(need[u].ram[:-2]) * GI for u in uuids) <= cap.ram
            assert sum(need[u].gpus for u in uuids) <= cap.gpus
    for name, uuids in p.wakes.items():
        assert by_name[name].state is NodeState.OFF and by_name[name].wakeable
        assert set(uuids) <= {u for u, n in p.wait_nodes.items() if n == name}
    # each create's containers fit its type together; no cap is passed
    if all_blocked:
        assert p.creates == []
    fleet = Fleet.of(
        (n.instance_type, n.price)
        for n in nodes
        if n.instance_type is not None and n.state is not NodeState.OFF
    )
    if new_left is not None:
        assert len(p.creates) <= new_left
    for create in p.creates:
        t = BY_NAME[create.instance_type]
        assert create.instance_type not in blocked
        assert sum(need[u].vcpus for u in create.for_containers) <= t.vcpus
        assert sum(int(need[u].ram[:-2]) * GI for u in create.for_containers) <= t.ram
        assert sum(need[u].gpus for u in create.for_containers) <= t.gpus
        verdict = admit_create(t.name, t.price, fleet, policy, ceilings)
        assert verdict.allowed, verdict.message
        fleet = Fleet(
            fleet.nodes + 1,
            fleet.hourly_spend + t.price,
            {**fleet.per_type, t.name: fleet.per_type.get(t.name, 0) + 1},
        )
    # GPU capacity last: CPU-only work on GPU capacity only when nothing else fits it
    if rules.gpu_last:
        gpu_nodes = {n.name for n in nodes if n.capacity.gpus > 0}
        for uuid in queue:
            r = need[uuid]
            if r.gpus or r.vcpus > 4 or int(r.ram[:-2]) > 16:  # "four" fits up to 4, 16 GiB
                continue
            assert uuid not in {s.uuid for s in p.starts if s.node in gpu_nodes}
            assert p.wait_nodes.get(uuid) not in gpu_nodes
            assert all(uuid not in c.for_containers for c in p.creates if c.instance_type == "gpu")
