"""GPU work first on GPU capacity (issue 25 item 4), on the pure scheduler: CPU-only
containers land on capacity without GPUs when it fits -- ready nodes, new VMs (the
launcher's choice for the queue as a whole), the cheapest-type choice -- and on GPU
capacity only when nothing else fits; a node open to GPU work only (admission GPUOnly,
`NodeView.gpu_only`) takes GPU work and no CPU-only work that fits elsewhere, relocks
included; and the property (hypothesis) that a CPU-only container never takes a GPU node
while a node without GPUs that fits it is open (GPU capacity last), nor a GPUOnly node
unless nothing without GPUs fits it (whatever the levers)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.scheduling.instancetypes import (
    Catalogue,
    InstanceType,
    InstanceTypePolicy,
    choose_instance_type,
    effective_requirements,
    gpu_last,
)
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
CPU4 = InstanceType(name="cpu4", provider_type="c4", vcpus=4, ram=16 * GI, price=0.20)
CPU16 = InstanceType(name="cpu16", provider_type="c16", vcpus=16, ram=64 * GI, price=0.80)
# cheaper than either CPU type: by price alone it would win
GPU8 = InstanceType(
    name="gpu8", provider_type="g8", vcpus=8, ram=32 * GI, gpus=1, gpu_model="a10", price=0.19
)
CATALOGUE = Catalogue(types=(CPU4, CPU16, GPU8))
POLICY = InstanceTypePolicy(ram_overhead=0, ram_discount_percent=0, price_factor=1.5)
DEFAULT = PlacementRules()


def cv(
    uuid: str, vcpus: int = 1, ram: str = "1Gi", gpus: int = 0, prio: int = 500
) -> ContainerView:
    return ContainerView(
        uuid, Phase.QUEUED, prio, T0, ContainerResources(vcpus=vcpus, ram=ram, gpus=gpus)
    )


def running(uuid: str, node: str, vcpus: int = 1) -> ContainerView:
    return replace(cv(uuid, vcpus), phase=Phase.RUNNING, node=node)


def vm(name: str, t: InstanceType, state: NodeState = NodeState.IDLE, **kw: object) -> NodeView:
    return NodeView(name, state, Capacity.of(t), t.name, t.price, True, True, **kw)  # type: ignore[arg-type]


def side(name: str, vcpus: int, gpus: int = 0, price: float = 0.3, **kw: object) -> NodeView:
    cap = Capacity(vcpus, 4 * vcpus * GI, 0, gpus, "a100" if gpus else None)
    return NodeView(name, NodeState.IDLE, cap, None, price, True, True, **kw)  # type: ignore[arg-type]


def run(
    containers: list[ContainerView],
    nodes: list[NodeView],
    rules: PlacementRules = DEFAULT,
    catalogue: Catalogue = CATALOGUE,
) -> Plan:
    return plan(containers, nodes, catalogue, POLICY, Limits(), CloudState(), T0, rules)


def starts(p: Plan) -> dict[str, str]:
    return {s.uuid: s.node for s in p.starts}


def created(p: Plan) -> dict[str, str]:
    return {u: c.instance_type for c in p.creates for u in c.for_containers}


# -- ready nodes ------------------------------------------------------------------------


def test_cpu_work_takes_the_node_without_gpus_even_when_the_gpu_node_is_fuller() -> None:
    # best fit alone would choose the fuller GPU VM
    nodes = [vm("g", GPU8, NodeState.ACTIVE), vm("c", CPU4)]
    p = run([running("r", "g", 4), cv("x")], nodes)
    assert starts(p) == {"x": "c"}


def test_cpu_work_takes_a_gpu_node_only_when_nothing_without_gpus_could_fit_it() -> None:
    big = cv("big", vcpus=32, ram="64Gi")  # no type fits; only the GPU side node holds it
    nodes = [side("gpu-side", 64, gpus=4), side("cpu-side", 16)]
    assert starts(run([big], nodes)) == {"big": "gpu-side"}
    small = cv("small")
    assert starts(run([small], nodes)) == {"small": "cpu-side"}


# -- new capacity: the launcher's type choice, and the cheapest-type choice ----------------


def test_a_new_vm_for_cpu_work_is_never_a_gpu_type_while_a_type_without_gpus_fits() -> None:
    queue = [cv(f"c{i}", vcpus=2, ram="4Gi") for i in range(4)]  # 8 vCPUs: one gpu8 holds all
    assert set(created(run(queue, [])).values()) <= {"cpu4", "cpu16"}
    # earlier releases: judged by price, the GPU type wins the whole queue
    assert set(created(run(queue, [], EARLIER)).values()) == {"gpu8"}
    # per container too (launch PerContainer)
    per = replace(DEFAULT, queue_launch=False)
    assert set(created(run(queue, [], per)).values()) == {"cpu4"}


def test_a_new_vm_for_cpu_work_is_a_gpu_type_when_nothing_else_fits() -> None:
    wide = Catalogue(types=(CPU4, GPU8))
    assert created(run([cv("x", vcpus=8, ram="32Gi")], [], catalogue=wide)) == {"x": "gpu8"}


def test_gpu_work_gets_a_gpu_type() -> None:
    assert created(run([cv("g", gpus=1)], [])) == {"g": "gpu8"}


def test_the_cheapest_type_choice_skips_gpu_types_while_one_without_gpus_fits() -> None:
    r = ContainerResources(vcpus=2, ram="4Gi")
    need = effective_requirements(r, POLICY)
    types, without = gpu_last(CATALOGUE.types, need)
    assert without and all(t.gpus == 0 for t in types)
    assert choose_instance_type(r, types, POLICY).instance_type == CPU4
    assert choose_instance_type(r, CATALOGUE.types, POLICY).instance_type == GPU8  # by price
    wide = ContainerResources(vcpus=8, ram="32Gi")
    types, without = gpu_last((CPU4, GPU8), effective_requirements(wide, POLICY))
    assert not without and [t.name for t in types] == ["cpu4", "gpu8"]


# -- a node open to GPU work only (GPUOnly) ------------------------------------------------


def test_a_gpu_only_node_takes_gpu_work_and_no_cpu_work_that_fits_elsewhere() -> None:
    for rules in (DEFAULT, EARLIER, replace(DEFAULT, gpu_last=False)):
        gpu = vm("g", GPU8, NodeState.ACTIVE, gpu_only=True)
        p = run([running("r", "g"), cv("x"), cv("y", gpus=1)], [gpu], rules)
        assert starts(p) == {"y": "g"}, rules
        assert "x" in created(p), rules


def test_a_gpu_only_node_still_takes_cpu_work_that_nothing_else_could_fit() -> None:
    gpu = side("gpu-side", 64, gpus=4, gpu_only=True)
    assert starts(run([cv("big", vcpus=32, ram="64Gi")], [gpu])) == {"big": "gpu-side"}


def test_a_cpu_relock_on_a_gpu_only_node_is_unlocked_and_a_gpu_one_restarts() -> None:
    gpu = vm("g", GPU8, NodeState.ACTIVE, gpu_only=True)
    lost = replace(cv("x"), phase=Phase.LOCKED, node="g", runner_absent=True)
    lost_gpu = replace(cv("y", gpus=1), phase=Phase.LOCKED, node="g", runner_absent=True)
    p = run([lost, lost_gpu], [gpu])
    assert "GPUOnly" in p.unlocks["x"]
    assert [(s.uuid, s.relock) for s in p.starts] == [("y", True)]
    # open again: the relock starts where it was
    p = run([lost], [replace(gpu, gpu_only=False)])
    assert [(s.uuid, s.relock) for s in p.starts] == [("x", True)]


def test_cpu_work_is_no_demand_for_a_gpu_only_node() -> None:
    queued = [cv("x", vcpus=8, ram="32Gi"), cv("y", gpus=1)]
    gpu = side("gpu-side", 64, gpus=4, price=0.3)
    narrow = Catalogue(types=(CPU4, GPU8))  # x fits no type without GPUs
    assert qualified_demand(gpu, queued, narrow, POLICY) == ["x", "y"]
    only = replace(gpu, gpu_only=True)
    side_caps = [gpu.capacity]
    assert qualified_demand(only, queued, narrow, POLICY, side=side_caps) == ["x", "y"]
    both = [cv("z"), *queued]
    assert "z" not in qualified_demand(only, both, narrow, POLICY, side=side_caps)


# -- the property -----------------------------------------------------------------------

SHAPES = [(1, 1), (2, 4), (4, 12), (8, 30), (16, 60), (48, 100)]  # vCPUs, GiB
node_st = st.tuples(
    st.sampled_from(["cpu4", "cpu16", "gpu8", "side-cpu", "side-gpu"]),
    st.booleans(),  # gpu_only (only meaningful on GPU nodes)
    st.lists(st.sampled_from(SHAPES[:3]), max_size=3),  # running there
    st.sampled_from([NodeState.IDLE, NodeState.ACTIVE]),
)


def _holds(cap: Capacity, vcpus: int, gib: int) -> bool:
    return vcpus <= cap.vcpus and gib * GI <= cap.ram


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(node_st, min_size=1, max_size=6),
    queue=st.lists(st.tuples(st.sampled_from(SHAPES), st.integers(0, 1)), max_size=12),
    best_fit=st.booleans(),
    queue_launch=st.booleans(),
    per_resource_price=st.booleans(),
    gpu_last=st.sampled_from([True, True, False]),
)
def test_cpu_work_never_takes_a_gpu_node_while_one_without_gpus_that_fits_is_open(
    nodes: list[tuple[str, bool, list[tuple[int, int]], NodeState]],
    queue: list[tuple[tuple[int, int], int]],
    best_fit: bool,
    queue_launch: bool,
    per_resource_price: bool,
    gpu_last: bool,
) -> None:
    rules = PlacementRules(
        best_fit=best_fit,
        queue_launch=queue_launch,
        per_resource_price=per_resource_price,
        gpu_last=gpu_last,
    )
    types = {t.name: t for t in CATALOGUE.types}
    views: list[NodeView] = []
    containers: list[ContainerView] = []
    for i, (kind, gpu_only, held, state) in enumerate(nodes):
        name = f"n{i}-{kind}"
        if kind.startswith("side"):
            view = side(name, 64, gpus=2 if kind == "side-gpu" else 0, price=0.5)
        else:
            view = vm(name, types[kind], state)
        views.append(replace(view, gpu_only=gpu_only and view.capacity.gpus > 0))
        for j, (vcpus, gib) in enumerate(held):
            c = cv(f"{name}-r{j}", vcpus, f"{gib}Gi")
            containers.append(replace(c, phase=Phase.RUNNING, node=name))
    need: dict[str, tuple[int, int, int]] = {}
    for k, ((vcpus, gib), gpus) in enumerate(queue):
        containers.append(cv(f"q{k}", vcpus, f"{gib}Gi", gpus))
        need[f"q{k}"] = (vcpus, gib, gpus)
    p = plan(containers, views, CATALOGUE, POLICY, Limits(), CloudState(), T0, rules)
    by_name = {v.name: v for v in views}

    # free room on each node, replayed in the order the plan placed
    free = {v.name: [v.capacity.vcpus, v.capacity.ram] for v in views}
    for c in containers:
        if c.phase is Phase.RUNNING and c.node is not None:
            free[c.node][0] -= c.resources.vcpus
            free[c.node][1] -= int(c.resources.ram[:-2]) * GI
    for s in p.starts:
        vcpus, gib, gpus = need[s.uuid]
        node = by_name[s.node]
        if gpus == 0 and node.capacity.gpus > 0 and gpu_last:
            open_without = [
                v.name
                for v in views
                if v.capacity.gpus == 0
                and free[v.name][0] >= vcpus
                and free[v.name][1] >= gib * GI
                and (v.instance_type is None or v.instance_type == "cpu4" or vcpus > 4)
            ]
            assert not open_without, (s, open_without)
            # and nothing without GPUs could ever have held it
            assert not any(_holds(Capacity.of(t), vcpus, gib) for t in (CPU4, CPU16))
            assert not any(_holds(v.capacity, vcpus, gib) for v in views if v.capacity.gpus == 0)
        free[s.node][0] -= vcpus
        free[s.node][1] -= gib * GI
        assert free[s.node][0] >= 0 and free[s.node][1] >= 0, s  # never more than it holds
        if node.gpu_only and gpus == 0:  # GPUOnly: CPU work only when nothing else fits
            assert not any(_holds(Capacity.of(t), vcpus, gib) for t in (CPU4, CPU16))
    for uuid, itype in created(p).items():
        vcpus, gib, gpus = need[uuid]
        if gpus == 0 and types[itype].gpus > 0 and gpu_last:
            assert not any(_holds(Capacity.of(t), vcpus, gib) for t in (CPU4, CPU16)), uuid
    for uuid, node_name in p.wait_nodes.items():
        vcpus, gib, gpus = need[uuid]
        if gpus == 0 and gpu_last and by_name.get(node_name) is not None:
            assert by_name[node_name].capacity.gpus == 0 or not any(
                _holds(Capacity.of(t), vcpus, gib) for t in (CPU4, CPU16)
            )


def test_the_property_can_fail() -> None:
    """Without the lever a CPU-only container does take a GPU VM while a CPU node with room
    is open (what the property rules out)."""
    nodes = [vm("g", GPU8, NodeState.ACTIVE), vm("c", CPU4)]
    p = run([running("r", "g", 4), cv("x")], nodes, replace(DEFAULT, gpu_last=False))
    assert starts(p) == {"x": "g"}
