"""The placement levers of issue 25, one by one, on the pure scheduler (`plan`): best fit,
side nodes priced per resource, new capacity for the queue as a whole, GPU capacity last,
the wait budget (with its priority threshold and its expiry as the plan's due time), and
each lever switched back to the earlier behaviour (`EARLIER`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.api.powerpolicy import PlacementPolicy
from nodewarden.scheduling.instancetypes import Catalogue, InstanceType, InstanceTypePolicy
from nodewarden.scheduling.placement import EARLIER, PlacementRules
from nodewarden.scheduling.scheduler import plan, qualified_demand
from nodewarden.scheduling.views import (
    Capacity,
    CloudState,
    ContainerView,
    Limits,
    NodeState,
    NodeView,
    Phase,
    Plan,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GI = 2**30
ONE = InstanceType(name="one", provider_type="c1", vcpus=1, ram=2 * GI, price=0.02)
TWO = InstanceType(name="two", provider_type="c2", vcpus=2, ram=4 * GI, price=0.04)
FOUR = InstanceType(name="four", provider_type="c4", vcpus=4, ram=16 * GI, price=0.20)
GPU = InstanceType(
    name="gpu", provider_type="g", vcpus=4, ram=16 * GI, gpus=1, gpu_model="a10", price=0.21
)
CATALOGUE = Catalogue(types=(ONE, TWO, FOUR, GPU))
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=1.5)
DEFAULT = PlacementRules()


def cv(
    uuid: str,
    vcpus: int = 1,
    ram: str = "1Gi",
    prio: int = 500,
    phase: Phase = Phase.QUEUED,
    node: str | None = None,
    age: float = 0,
    gpus: int = 0,
) -> ContainerView:
    return ContainerView(
        uuid=uuid,
        phase=phase,
        priority=prio,
        first_seen=T0 - timedelta(seconds=age),
        resources=ContainerResources(vcpus=vcpus, ram=ram, gpus=gpus),
        node=node,
    )


def vm(name: str, t: InstanceType, state: NodeState = NodeState.IDLE) -> NodeView:
    ready = state in (NodeState.IDLE, NodeState.ACTIVE)
    return NodeView(name, state, Capacity.of(t), t.name, t.price, admission_open=True, ready=ready)


def side(
    name: str,
    state: NodeState = NodeState.OFF,
    vcpus: int = 64,
    gpus: int = 0,
    price: float = 0.35,
    since: datetime | None = None,
    boot: float | None = None,
) -> NodeView:
    on = state in (NodeState.IDLE, NodeState.ACTIVE)
    return NodeView(
        name,
        state,
        Capacity(vcpus, 256 * GI, 0, gpus, "a100" if gpus else None),
        None,
        price,
        admission_open=on,
        ready=on,
        wakeable=state in (NodeState.OFF, NodeState.WAKING),
        coming_since=since,
        boot_seconds=boot,
    )


def run(
    containers: list[ContainerView],
    nodes: list[NodeView],
    rules: PlacementRules = DEFAULT,
    cloud: CloudState | None = None,
    now: datetime = T0,
    catalogue: Catalogue = CATALOGUE,
) -> Plan:
    return plan(containers, nodes, catalogue, POLICY, Limits(), cloud or CloudState(), now, rules)


def starts(p: Plan) -> dict[str, str]:
    return {s.uuid: s.node for s in p.starts}


# -- best fit --------------------------------------------------------------------------


def test_best_fit_takes_the_fullest_node_and_leaves_the_idle_one_idle() -> None:
    twos = Catalogue(types=(TWO,))
    nodes = [vm("idle", TWO), vm("busy", TWO, NodeState.ACTIVE)]
    held = cv("r", ram="2Gi", phase=Phase.RUNNING, node="busy")
    work = [held, cv("a", ram="2Gi")]
    assert starts(run(work, nodes, catalogue=twos)) == {"a": "busy"}
    # earlier releases: an idle node of a fitting type first
    earlier = replace(DEFAULT, best_fit=False)
    assert starts(run(work, nodes, earlier, catalogue=twos)) == {"a": "idle"}


def test_best_fit_fills_the_fuller_of_two_busy_nodes_first() -> None:
    fours = Catalogue(types=(FOUR,))
    nodes = [vm("half", FOUR, NodeState.ACTIVE), vm("most", FOUR, NodeState.ACTIVE)]
    held = [
        cv("r1", vcpus=2, ram="8Gi", phase=Phase.RUNNING, node="half"),
        cv("r2", vcpus=3, ram="12Gi", phase=Phase.RUNNING, node="most"),
    ]
    work = [*held, cv("a", ram="2Gi"), cv("b", ram="2Gi")]
    assert starts(run(work, nodes, catalogue=fours)) == {"a": "most", "b": "half"}


def test_best_fit_stays_within_the_types_a_new_node_would_be_chosen_from() -> None:
    # "four" is 10x the price of "one": a small container does not keep it on
    nodes = [vm("big", FOUR, NodeState.ACTIVE)]
    held = cv("r", vcpus=2, ram="8Gi", phase=Phase.RUNNING, node="big")
    p = run([held, cv("a")], nodes)
    assert starts(p) == {} and [c.instance_type for c in p.creates] == ["one"]


def test_priced_per_resource_a_dear_side_node_takes_no_small_container() -> None:
    # an eighth of a 2.00/h node costs 0.25/h; the container's own type 0.02/h
    dear = side("dear", NodeState.ACTIVE, vcpus=8, price=2.0)
    cheap = side("cheap", NodeState.ACTIVE, vcpus=64, price=0.35)  # 0.0055/h for it
    assert starts(run([cv("a")], [dear])) == {}
    assert starts(run([cv("a")], [dear, cheap])) == {"a": "cheap"}
    per_node = replace(DEFAULT, per_resource_price=False)  # earlier: any ready side node
    assert starts(run([cv("a")], [dear], per_node)) == {"a": "dear"}


# -- new capacity for the queue as a whole ----------------------------------------------


def test_pending_containers_share_a_new_node_when_that_is_cheaper_per_container_hour() -> None:
    queue = [cv(f"c{i}", ram="2Gi") for i in range(4)]
    cheaper = Catalogue(types=(ONE, TWO.model_copy(update={"price": 0.03})))
    p = plan(queue, [], cheaper, POLICY, Limits(), CloudState(), T0, DEFAULT)
    assert [(c.instance_type, len(c.for_containers)) for c in p.creates] == [("two", 2)] * 2
    one_each = plan(queue, [], cheaper, POLICY, Limits(), CloudState(), T0, EARLIER)
    assert [c.instance_type for c in one_each.creates] == ["one"] * 4


def test_no_packing_onto_a_new_node_that_is_not_cheaper() -> None:
    # two "one" cost what one "two" costs: a node each (it runs no longer than its container)
    p = run([cv(f"c{i}", ram="2Gi") for i in range(2)], [])
    assert [c.instance_type for c in p.creates] == ["one", "one"]


def test_a_large_side_node_is_woken_for_a_burst_but_not_for_one_container() -> None:
    alone = run([cv("a", vcpus=4, ram="8Gi")], [side("epyc")])
    assert alone.wakes == {} and [c.instance_type for c in alone.creates] == ["four"]
    burst = [cv(f"b{i}", vcpus=4, ram="8Gi") for i in range(3)]  # 3 x 0.20/h > 0.35/h
    p = run(burst, [side("epyc")])
    assert p.wakes == {"epyc": ["b0", "b1", "b2"]} and p.creates == []
    assert p.waits["b0"] == "waiting up to 2m for side node epyc: 89 % cheaper"
    # priced per node (earlier): 0.35/h is dearer than "four" at 0.20/h, never woken
    per_node = replace(DEFAULT, per_resource_price=False)
    assert run(burst, [side("epyc")], per_node).wakes == {}


def test_containers_waiting_for_a_booting_vm_move_to_a_side_node_woken_for_them() -> None:
    booting = vm("vm-1", FOUR, NodeState.BOOTING)
    burst = [cv(f"b{i}", vcpus=4, ram="8Gi") for i in range(3)]
    p = run(burst, [booting, side("epyc")])
    assert p.wakes == {"epyc": ["b0", "b1", "b2"]} and p.wait_nodes["b0"] == "epyc"


# -- GPU capacity last ------------------------------------------------------------------


def test_cpu_work_never_goes_to_a_gpu_type_while_a_type_without_gpus_fits() -> None:
    at_capacity = CloudState(blocked_types={"four": "capacity"})
    work = [cv("a", vcpus=4, ram="12Gi")]
    p = run(work, [], cloud=at_capacity)
    assert p.creates == [] and p.waits["a"].startswith("waiting: every fitting instance type")
    earlier = replace(DEFAULT, gpu_last=False)  # a GPU type within the price factor
    assert [c.instance_type for c in run(work, [], earlier, at_capacity).creates] == ["gpu"]


def test_cpu_work_that_only_a_gpu_side_node_can_hold_is_woken_for_not_failed() -> None:
    big = [cv("big", vcpus=32, ram="64Gi")]
    gpu_side = side("a100", gpus=4, price=1.1)
    p = run(big, [gpu_side])
    assert p.wakes == {"a100": ["big"]} and p.unsatisfiable == {}
    assert "big" in run(big, [gpu_side], EARLIER).unsatisfiable


def test_a_gpu_node_takes_cpu_work_only_when_nothing_else_fits() -> None:
    gpu_on = side("a100", NodeState.IDLE, gpus=4, price=1.1)
    p = run([cv("small"), cv("g", gpus=1, ram="8Gi")], [gpu_on])
    assert starts(p) == {"g": "a100"} and p.chosen_types["small"] == "one"


# -- the wait budget --------------------------------------------------------------------


def test_a_container_waits_for_a_waking_side_node_within_its_budget() -> None:
    # woken 60 s ago, ready 100 s from now; a new VM would take 120 s (ASSUMED_BOOT)
    waking = side("epyc", NodeState.WAKING, since=T0 - timedelta(seconds=60), boot=160)
    p = run([cv("a", vcpus=4, ram="8Gi")], [waking])
    assert p.wait_nodes == {"a": "epyc"} and p.creates == []
    assert p.waits["a"] == "waiting up to 2m for side node epyc: 89 % cheaper"
    assert p.due == T0 + timedelta(seconds=100)  # when it would fall behind


def test_beyond_the_budget_a_new_vm_is_created_instead() -> None:
    # ready in 10 minutes: later than a VM (2 min) plus the budget (2 min)
    slow = side("epyc", NodeState.WAKING, since=T0, boot=600)
    p = run([cv("a", vcpus=4, ram="8Gi")], [slow])
    assert p.wait_nodes == {} and [c.instance_type for c in p.creates] == ["four"]
    # Unbounded (earlier releases): it waits however long the wake takes
    unbounded = replace(DEFAULT, wait_budget=None)
    assert run([cv("a", vcpus=4, ram="8Gi")], [slow], unbounded).wait_nodes == {"a": "epyc"}


def test_containers_above_the_priority_threshold_never_wait_for_cheaper_capacity() -> None:
    waking = side("epyc", NodeState.WAKING, since=T0, boot=180)  # 60 s slower than a VM
    urgent = cv("u", vcpus=4, ram="8Gi", prio=950)
    usual = cv("n", vcpus=4, ram="8Gi", prio=900)
    p = run([urgent, usual], [waking])
    assert p.wait_nodes == {"n": "epyc"} and p.chosen_types["u"] == "four"
    # ... but sunk capacity that is no slower than a VM they take
    quick = side("epyc", NodeState.WAKING, since=T0, boot=60)
    assert run([urgent], [quick]).wait_nodes == {"u": "epyc"}


def test_the_budget_running_out_is_the_plans_due_time_and_changes_the_plan_then() -> None:
    # seen 30 s ago; the wake began 10 s ago and takes 200 s: on schedule at T0 + 190 s
    waking = side("epyc", NodeState.WAKING, since=T0 - timedelta(seconds=10), boot=200)
    queued = [cv("a", vcpus=4, ram="8Gi", age=30)]
    p = run(queued, [waking])
    assert p.wait_nodes == {"a": "epyc"} and p.due == T0 + timedelta(seconds=190)
    just_before = run(queued, [waking], now=p.due - timedelta(seconds=1))
    assert just_before.wait_nodes == {"a": "epyc"} and just_before.creates == []
    # the wake falls behind: expected a whole boot later, past the budget -> a new VM
    after = run(queued, [waking], now=p.due + timedelta(seconds=1))
    assert after.wait_nodes == {} and [c.instance_type for c in after.creates] == ["four"]


def test_no_budget_applies_without_an_alternative() -> None:
    slow = side("epyc", NodeState.WAKING, since=T0, boot=3600)
    quota = CloudState(creates_blocked="cloud instance quota reached; creates paused")
    p = run([cv("a", vcpus=4, ram="8Gi")], [slow], cloud=quota)
    assert p.wait_nodes == {"a": "epyc"} and p.waits["a"] == "waiting for side node epyc to wake"


# -- the knobs --------------------------------------------------------------------------


def test_the_policy_knobs_map_onto_the_levers() -> None:
    assert PlacementRules.of(PlacementPolicy()) == DEFAULT
    earlier = PlacementPolicy.model_validate(
        {
            "packing": "IdleFirst",
            "launch": "PerContainer",
            "gpuCapacity": "GpuWorkOnly",
            "sideNodePrice": "PerNode",
            "waitForCheaper": "Unbounded",
            "noWaitAbovePriority": 1000,
        }
    )
    assert PlacementRules.of(earlier) == EARLIER
    budget = PlacementRules.of(PlacementPolicy(wait_budget="45s", no_wait_above_priority=500))
    assert budget.budget(500) == timedelta(seconds=45) and budget.budget(501) == timedelta(0)


def test_qualified_demand_follows_the_same_levers() -> None:
    queued = [cv("small"), cv("g", gpus=1, ram="8Gi")]
    busy_big = vm("big", FOUR)
    assert qualified_demand(busy_big, queued, CATALOGUE, POLICY) == []  # per resource: dear
    assert qualified_demand(busy_big, queued, CATALOGUE, POLICY, EARLIER) == []  # not a fit type
    dear = side("dear", NodeState.IDLE, vcpus=8, price=2.0)
    assert qualified_demand(dear, queued, CATALOGUE, POLICY) == []  # per resource: dear
    assert qualified_demand(dear, queued, CATALOGUE, POLICY, EARLIER) == []  # per node: dear
    gpu_side = side("a100", NodeState.IDLE, gpus=4, price=1.1)
    assert qualified_demand(gpu_side, queued, CATALOGUE, POLICY) == ["g"]  # a quarter: 0.275/h
    dear_gpu = side("a100", NodeState.IDLE, gpus=4, price=4.0)  # a quarter: 1.00/h > 1.5 x 0.21
    assert qualified_demand(dear_gpu, queued, CATALOGUE, POLICY) == []


# -- a node about to free up --------------------------------------------------------------


def test_a_container_waits_for_room_that_a_cancelled_container_frees_soon() -> None:
    fours = Catalogue(types=(FOUR,))
    full = vm("busy", FOUR, NodeState.ACTIVE)
    cancelling = replace(
        cv("r", vcpus=4, ram="8Gi", phase=Phase.RUNNING, node="busy"),
        frees_at=T0 + timedelta(seconds=60),
    )
    queued = cv("a", vcpus=4, ram="8Gi")
    p = run([cancelling, queued], [full], catalogue=fours)
    assert p.creates == [] and p.wait_nodes == {"a": "busy"}
    assert p.waits["a"] == "waiting up to 2m for node busy to free up"
    assert p.due == T0 + timedelta(seconds=60)
    # not back by then: a new VM
    later = run([cancelling, queued], [full], now=p.due, catalogue=fours)
    assert [c.instance_type for c in later.creates] == ["four"]
    # back later than a VM plus the budget: a new VM at once
    slow = replace(cancelling, frees_at=T0 + timedelta(minutes=5))
    assert run([slow, queued], [full], catalogue=fours).creates != []
    # earlier releases never waited for it
    unbounded = replace(DEFAULT, wait_budget=None)
    assert run([cancelling, queued], [full], unbounded, catalogue=fours).creates != []
    # nothing else starts on the room it waits for
    both = run([cancelling, queued, cv("b", ram="1Gi")], [full], catalogue=fours)
    assert both.starts == [] and both.wait_nodes == {"a": "busy"}
