"""The pure scheduler: ordering, reuse, packing, booting nodes counted, limits, reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.placement import EARLIER
from nodewarden.scheduling.scheduler import plan
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GI = 2**30
CATALOGUE = Catalogue(
    types=(
        InstanceType(name="small", provider_type="s", vcpus=2, ram=8 * GI, price=0.10),
        InstanceType(name="large", provider_type="l", vcpus=8, ram=32 * GI, price=0.40),
        InstanceType(name="large-alt", provider_type="l2", vcpus=8, ram=32 * GI, price=0.45),
        InstanceType(
            name="gpu", provider_type="g", vcpus=8, ram=64 * GI, gpus=1, gpu_model="a10", price=1.20
        ),
        InstanceType(
            name="spot", provider_type="s", vcpus=2, ram=8 * GI, price=0.03, preemptible=True
        ),
    )
)
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=1.2)


def cv(
    uuid: str,
    vcpus: int = 1,
    ram: str = "1Gi",
    prio: int = 500,
    phase: Phase = Phase.QUEUED,
    node: str | None = None,
    age: int = 0,
    gpus: int = 0,
    preemptible: bool = False,
    absent: bool = False,
) -> ContainerView:
    return ContainerView(
        uuid=uuid,
        phase=phase,
        priority=prio,
        first_seen=T0 - timedelta(seconds=age),
        resources=ContainerResources(vcpus=vcpus, ram=ram, gpus=gpus, preemptible=preemptible),
        node=node,
        runner_absent=absent,
    )


def nv(
    name: str,
    type_name: str,
    state: NodeState = NodeState.IDLE,
    ready: bool = True,
    admission: bool = True,
) -> NodeView:
    t = CATALOGUE.by_name(type_name)
    assert t is not None
    return NodeView(
        name=name,
        state=state,
        capacity=Capacity.of(t),
        instance_type=t.name,
        price=t.price,
        ready=ready,
        admission_open=admission,
    )


def run(
    containers: list[ContainerView],
    nodes: list[NodeView],
    limits: Limits | None = None,
    cloud: CloudState | None = None,
):  # type: ignore[no-untyped-def]
    return plan(containers, nodes, CATALOGUE, POLICY, limits or Limits(), cloud or CloudState(), T0)


def test_idle_fitting_node_is_preferred_over_creating() -> None:
    p = run([cv("a")], [nv("n1", "small")])
    assert [(s.uuid, s.node) for s in p.starts] == [("a", "n1")]
    assert p.creates == []


def test_creates_cheapest_fitting_type() -> None:
    p = run([cv("a", vcpus=4, ram="16Gi")], [])
    assert [c.instance_type for c in p.creates] == ["large"]
    assert "waiting for a new large" in p.waits["a"]


def test_dearer_type_when_cheapest_at_capacity() -> None:
    p = run([cv("a", vcpus=4)], [], cloud=CloudState(blocked_types={"large": "capacity"}))
    assert [c.instance_type for c in p.creates] == ["large-alt"]


def test_booting_nodes_are_counted_not_double_created() -> None:
    nodes = [nv("boot1", "small", state=NodeState.BOOTING, ready=False)]
    p = run([cv("a", vcpus=1), cv("b", vcpus=1), cv("c", vcpus=1)], nodes)
    # two fit on the booting small node, the third needs one new node
    assert len(p.creates) == 1
    assert p.wait_nodes["a"] == "boot1" and p.wait_nodes["b"] == "boot1"
    assert p.waits["a"] == "waiting for a new small to boot"


def test_several_containers_pack_into_one_new_node() -> None:
    p = run([cv(f"c{i}", vcpus=1, ram="1Gi") for i in range(4)], [])
    assert len(p.creates) == 2  # small has 2 vCPUs
    assert sorted(len(c.for_containers) for c in p.creates) == [2, 2]


def test_packing_onto_busy_node_with_room() -> None:
    nodes = [nv("n1", "large", state=NodeState.ACTIVE)]
    running = cv("r", vcpus=4, phase=Phase.RUNNING, node="n1")
    p = run([running, cv("a", vcpus=4, ram="4Gi")], nodes)
    assert [(s.uuid, s.node) for s in p.starts] == [("a", "n1")]


def test_priority_order_then_first_seen() -> None:
    nodes = [nv("n1", "small")]
    p = run(
        [
            cv("low", vcpus=2, prio=1),
            cv("high", vcpus=2, prio=900),
            cv("old", vcpus=2, prio=900, age=60),
        ],
        nodes,
    )
    assert p.starts[0].uuid == "old"
    assert p.creates and set(p.creates[0].for_containers) <= {"high", "low"}


def test_small_container_does_not_take_gpu_node() -> None:
    p = run([cv("cpu", vcpus=1)], [nv("g1", "gpu")])
    assert p.starts == []
    assert p.creates[0].instance_type == "small"


def test_gpu_container_uses_gpu_node() -> None:
    p = run([cv("g", vcpus=2, gpus=1)], [nv("g1", "gpu")])
    assert [(s.uuid, s.node) for s in p.starts] == [("g", "g1")]


def test_preemptible_matched_exactly() -> None:
    p = run([cv("s", preemptible=True)], [nv("n1", "small")])
    assert p.starts == [] and p.creates[0].instance_type == "spot"


def test_unsatisfiable_reports_reason() -> None:
    p = run([cv("huge", vcpus=512)], [])
    assert "huge" in p.unsatisfiable and "vCPUs" in p.unsatisfiable["huge"]


def test_max_nodes_limit_makes_rest_wait_with_reason() -> None:
    p = run([cv(f"c{i}", vcpus=2) for i in range(5)], [], limits=Limits(max_nodes=3))
    assert len(p.creates) == 3
    waiting = [u for u, why in p.waits.items() if "max nodes (3)" in why]
    assert len(waiting) == 2


def test_hourly_spend_limit() -> None:
    p = run([cv(f"c{i}", vcpus=8) for i in range(3)], [], limits=Limits(max_hourly_spend=1.0))
    assert len(p.creates) == 2
    assert any("max hourly spend" in why for why in p.waits.values())


def test_quota_block_waits_without_creating() -> None:
    p = run(
        [cv("a")],
        [],
        cloud=CloudState(creates_blocked="cloud instance quota reached (InstanceLimitExceeded)"),
    )
    assert p.creates == []
    assert p.waits["a"] == "waiting: cloud instance quota reached (InstanceLimitExceeded)"


def test_per_type_limit() -> None:
    nodes = [nv("n1", "small", state=NodeState.ACTIVE)]
    p = run(
        [cv("r", vcpus=2, phase=Phase.RUNNING, node="n1"), cv("a", vcpus=2)],
        nodes,
        limits=Limits(per_type_max={"small": 1}),
    )
    # small is at its limit; large is not within the 1.2 price factor -> wait
    assert p.creates == []
    assert "per-type limit" in p.waits["a"]


def test_locked_container_restarts_on_its_ready_node_and_unlocks_when_node_gone() -> None:
    nodes = [nv("n1", "small")]
    p = run(
        [
            cv("a", phase=Phase.LOCKED, node="n1", absent=True),
            cv("b", phase=Phase.LOCKED, node="gone", absent=True),
        ],
        nodes,
    )
    assert [(s.uuid, s.node, s.relock) for s in p.starts] == [("a", "n1", True)]
    assert "gone" in p.unlocks["b"]


def test_a_locked_container_not_known_to_be_without_a_runner_only_holds_its_node() -> None:
    p = run([cv("a", vcpus=2, phase=Phase.LOCKED, node="n1"), cv("q")], [nv("n1", "small")])
    assert p.starts == [] and p.unlocks == {}
    assert len(p.creates) == 1  # n1 is held: the queued one needs a new node


def test_draining_node_takes_no_new_work() -> None:
    p = run([cv("a")], [nv("n1", "small", state=NodeState.DRAINING, admission=False)])
    assert p.starts == [] and len(p.creates) == 1


def test_surplus_and_warm_idle_nodes() -> None:
    nodes = [nv("a", "small"), nv("b", "small"), nv("c", "large")]
    p = run([], nodes, limits=Limits(min_warm_nodes=1))
    assert p.kept_warm == ["a"]
    assert sorted(p.surplus_idle) == ["b", "c"]


def test_create_queue_cap() -> None:
    p = run([cv(f"c{i}", vcpus=2) for i in range(4)], [], cloud=CloudState(max_new_nodes=1))
    assert len(p.creates) == 1
    assert sum("create queue full" in w for w in p.waits.values()) == 3


def test_held_priority_zero() -> None:
    p = run([cv("z", prio=0)], [nv("n1", "small")])
    assert p.starts == [] and p.waits["z"] == "held: priority 0"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 10),
            st.sampled_from(["1Gi", "4Gi", "30Gi"]),
            st.integers(0, 1),
            st.integers(1, 1000),
        ),
        max_size=30,
    ),
    st.lists(
        st.tuples(st.sampled_from(["small", "large", "gpu"]), st.sampled_from(list(NodeState))),
        max_size=8,
    ),
    st.integers(0, 10),
)
def test_properties_no_overcommit_no_double_placement(
    cs: list[tuple[int, str, int, int]], ns: list[tuple[str, NodeState]], max_nodes: int
) -> None:
    containers = [cv(f"c{i}", vcpus=v, ram=r, gpus=g, prio=p) for i, (v, r, g, p) in enumerate(cs)]
    nodes = [
        nv(f"n{i}", t, state=s, ready=s in (NodeState.IDLE, NodeState.ACTIVE))
        for i, (t, s) in enumerate(ns)
    ]
    p = run(containers, nodes, limits=Limits(max_nodes=max_nodes))
    # every container gets exactly one outcome
    placed = [s.uuid for s in p.starts]
    assert len(placed) == len(set(placed))
    outcomes = set(placed) | set(p.waits) | set(p.unsatisfiable)
    assert outcomes == {c.uuid for c in containers}
    assert not (set(placed) & set(p.waits))
    # no node overcommitted
    by_node: dict[str, list[ContainerView]] = {}
    lookup = {c.uuid: c for c in containers}
    for s in p.starts:
        by_node.setdefault(s.node, []).append(lookup[s.uuid])
    for name, placed_cs in by_node.items():
        node = next(n for n in nodes if n.name == name)
        assert node.ready and node.state in (NodeState.IDLE, NodeState.ACTIVE)
        assert sum(c.resources.vcpus for c in placed_cs) <= node.capacity.vcpus
        assert sum(c.resources.gpus for c in placed_cs) <= node.capacity.gpus
    # limits respected: existing cloud nodes (not Off) + creates <= max_nodes (when creates happen)
    existing = sum(1 for n in nodes if n.state is not NodeState.OFF)
    if p.creates:
        assert existing + len(p.creates) <= max_nodes


def test_same_input_same_plan() -> None:
    cs = [cv(f"c{i}", vcpus=(i % 4) + 1) for i in range(50)]
    ns = [nv(f"n{i}", "large") for i in range(3)]
    assert run(cs, ns) == run(list(reversed(cs)), list(reversed(ns)))


@pytest.mark.parametrize("n", [0, 1])
def test_empty_inputs(n: int) -> None:
    p = run([], [nv("n1", "small")] * n)
    assert p.starts == [] and p.creates == []


def test_quota_block_message_wins_over_per_type_reasons() -> None:
    blocked = {t.name: "quota error" for t in CATALOGUE.types}
    p = run(
        [cv("a", vcpus=4)],
        [],
        cloud=CloudState(
            creates_blocked="cloud instance quota reached; creates paused", blocked_types=blocked
        ),
    )
    assert p.waits["a"] == "waiting: cloud instance quota reached; creates paused"


def test_lock_flap_backoff() -> None:
    from nodewarden.scheduling.scheduler import lock_retry_at

    locked = T0 - timedelta(seconds=10)
    assert lock_retry_at(2, 3, locked, T0) is None  # below the policy's limit
    assert lock_retry_at(3, 3, locked, T0) == locked + timedelta(seconds=30)
    assert lock_retry_at(4, 3, locked, T0) == locked + timedelta(seconds=60)
    assert lock_retry_at(3, 3, T0 - timedelta(seconds=31), T0) is None  # back-off over
    assert lock_retry_at(30, 3, locked, T0) == locked + timedelta(seconds=600)  # capped
    assert lock_retry_at(5, 3, None, T0) is None
    # a lock stamped by a replica whose clock runs 90 s ahead waits the back-off, no more
    ahead = T0 + timedelta(seconds=90)
    assert lock_retry_at(3, 3, ahead, T0) == T0 + timedelta(seconds=30)


# -- side nodes: ready ones take work, off ones are woken when they are the fit ----------


def sv(
    name: str,
    state: NodeState = NodeState.OFF,
    gpus: int = 1,
    price: float = 0.0,
    admission: bool = False,
) -> NodeView:
    return NodeView(
        name=name,
        state=state,
        capacity=Capacity(16, 128 * GI, 0, gpus, "a10" if gpus else None),
        instance_type=None,
        price=price,
        ready=state in (NodeState.IDLE, NodeState.ACTIVE),
        admission_open=admission,
        wakeable=state in (NodeState.OFF, NodeState.WAKING),
    )


def test_a_gpu_container_wakes_the_off_side_node_instead_of_creating_a_vm() -> None:
    p = run([cv("g1", gpus=1)], [sv("gpu-side")])
    assert p.wakes == {"gpu-side": ["g1"]} and p.creates == []
    # a free side node instead of a 1.20/h gpu VM, within the default wait budget
    assert p.waits["g1"] == "waiting up to 2m for side node gpu-side: 100 % cheaper"
    earlier = plan(
        [cv("g1", gpus=1)], [sv("gpu-side")], CATALOGUE, POLICY, Limits(), CloudState(), T0, EARLIER
    )
    assert earlier.waits["g1"] == "waiting for side node gpu-side to wake"


def test_more_containers_pack_into_one_wake_before_a_second_node() -> None:
    p = run(
        [cv("a", vcpus=8), cv("b", vcpus=8), cv("c", vcpus=8)], [sv("s1", gpus=0), sv("s2", gpus=0)]
    )
    assert p.wakes == {"s1": ["a", "b"], "s2": ["c"]}


def test_a_waking_node_is_counted_not_woken_twice() -> None:
    p = run([cv("g1", gpus=1)], [sv("gpu-side", NodeState.WAKING), sv("gpu-other")])
    assert p.wakes == {} and p.waits["g1"].startswith("waiting up to 2m for side node gpu-side:")


def test_a_dearer_side_node_loses_to_a_cheaper_vm() -> None:
    p = run([cv("s", vcpus=1)], [sv("costly", gpus=0, price=0.5)])
    assert p.wakes == {} and [c.instance_type for c in p.creates] == ["small"]
    p = run([cv("s", vcpus=1)], [sv("cheap", gpus=0, price=0.05)])
    assert p.wakes == {"cheap": ["s"]} and p.creates == []


def test_a_gpu_side_node_is_not_woken_for_cpu_work() -> None:
    p = run([cv("cpu", vcpus=1)], [sv("gpu-side", gpus=1)])
    assert p.wakes == {} and len(p.creates) == 1


def test_a_ready_open_side_node_takes_work_and_a_closed_one_does_not() -> None:
    p = run([cv("g1", gpus=1)], [sv("open", NodeState.IDLE, admission=True)])
    assert [(s.uuid, s.node) for s in p.starts] == [("g1", "open")]
    p = run([cv("g1", gpus=1)], [sv("closed", NodeState.IDLE, admission=False)])
    assert p.starts == [] and p.wakes == {}


def test_qualified_demand_follows_the_fit_rules() -> None:
    from nodewarden.scheduling.scheduler import qualified_demand

    queued = [
        cv("gpu-job", gpus=1),
        cv("cpu-job", vcpus=1),
        cv("held", gpus=1, prio=0),
        cv("running", gpus=1, phase=Phase.RUNNING, node="x"),
    ]
    gpu_side = sv("gpu-side", NodeState.IDLE)
    assert qualified_demand(gpu_side, queued, CATALOGUE, POLICY) == ["gpu-job"]
    cpu_side = sv("cpu-side", NodeState.IDLE, gpus=0, price=0.0)
    assert qualified_demand(cpu_side, queued, CATALOGUE, POLICY) == ["cpu-job"]
    dear = sv("dear", NodeState.IDLE, gpus=0, price=5.0)
    assert qualified_demand(dear, queued, CATALOGUE, POLICY) == []
    vm = nv("vm", "small")
    assert qualified_demand(vm, queued, CATALOGUE, POLICY) == ["cpu-job"]
    assert qualified_demand(nv("big", "large"), queued, CATALOGUE, POLICY) == []
    assert qualified_demand(nv("big", "large"), queued, CATALOGUE, POLICY, EARLIER) == []
    # GPU capacity last: never CPU work on a GPU VM while a type without GPUs fits it
    assert qualified_demand(nv("g", "gpu"), queued, CATALOGUE, POLICY) == ["gpu-job"]
