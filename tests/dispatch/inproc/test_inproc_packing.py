"""The placement levers of issue 25 in the live dispatcher, in process with a fake clock
(`Dispatcher.step()` through the rig of `fakes.py`): best fit, new capacity for the
queue as a whole, GPU capacity last (and a VM the power controller shows GPUOnly), and
the wait budget -- with its priority threshold, and its expiry planned as a due time,
not found by polling. Each lever is read from the default PowerPolicy's
`spec.placement`, and switched back to the earlier behaviour there."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fakes import T0, Rig, container, uuid_of

from nodewarden.fleet.board import NodePowerView
from nodewarden.policy.state import PowerState
from nodewarden.pool.worker import Worker
from nodewarden.scheduling.instancetypes import InstanceType
from nodewarden.scheduling.views import Capacity, NodeState, NodeView

QUAD = InstanceType(name="quad", provider_type="q1", vcpus=4, ram="16Gi", price=0.20)
ONE = InstanceType(name="one", provider_type="o1", vcpus=1, ram="2Gi", price=0.02)
PAIR = InstanceType(name="pair", provider_type="p1", vcpus=2, ram="4Gi", price=0.03)
SMALL = InstanceType(name="small", provider_type="s1", vcpus=2, ram="8Gi", price=0.10)
GPU = InstanceType(
    name="gpu", provider_type="g1", vcpus=4, ram="16Gi", gpus=1, gpu_model="a10", price=0.12
)
EARLIER = {
    "packing": "IdleFirst",
    "launch": "PerContainer",
    "gpuCapacity": "GpuWorkOnly",
    "sideNodePrice": "PerNode",
    "waitForCheaper": "Unbounded",
}
SIDE = "side-1"


def statuses(rig: Rig, name: str) -> str | None:
    status: dict[str, Any] = rig.api.status(name)
    return status.get("schedulingStatus")


async def test_best_fit_runs_work_on_the_busy_vm_and_leaves_the_idle_one_idle() -> None:
    for placement, where in (({}, "vm-a"), ({"packing": "IdleFirst"}, "vm-b")):
        rig = Rig([QUAD], placement=placement)
        rig.vm("vm-a", QUAD)
        rig.vm("vm-b", QUAD)
        await rig.start()
        rig.api.create(container("c1", vcpus=2, ram="4Gi"))
        await rig.rounds(2)
        assert rig.runners() == {"c1": "vm-a"}
        rig.api.create(container("c2", vcpus=2, ram="4Gi"))
        await rig.rounds(2)
        assert rig.runners() == {"c1": "vm-a", "c2": where}, placement


async def test_the_queue_as_a_whole_gets_one_new_node_for_two_containers() -> None:
    for placement, created in (({}, ["pair"]), ({"launch": "PerContainer"}, ["one", "one"])):
        rig = Rig([ONE, PAIR], placement=placement)
        await rig.start()
        rig.api.create(container("c1"))
        rig.api.create(container("c2"))
        await rig.rounds(2)
        assert rig.cloud.created == created, placement
        assert statuses(rig, "c1") == f"waiting for a new {created[0]} to boot"


async def test_cpu_work_does_not_take_an_idle_gpu_vm_while_a_cpu_type_fits() -> None:
    # the GPU type is within the price factor of the CPU one: earlier it was a fitting type
    for placement, runs_on_gpu in (({}, False), ({"gpuCapacity": "GpuWorkOnly"}, True)):
        rig = Rig([SMALL, GPU], placement=placement)
        rig.vm("vm-gpu", GPU)
        await rig.start()
        rig.api.create(container("c1"))
        await rig.rounds(2)
        assert (rig.runners() == {"c1": "vm-gpu"}) is runs_on_gpu, placement
        assert rig.cloud.created == ([] if runs_on_gpu else ["small"])


async def test_a_gpu_only_vm_starts_gpu_work_and_no_cpu_work() -> None:
    # earlier releases' GPU rule: a GPU VM within the price factor takes CPU work too
    for gpu_only, cpu_on_gpu in ((False, True), (True, False)):
        rig = Rig([SMALL, GPU], placement={"gpuCapacity": "GpuWorkOnly"})
        rig.vm("vm-gpu", GPU)
        if gpu_only:
            rig.gpu_only.add("vm-gpu")  # the power controller shows it GPUOnly
        await rig.start()
        rig.api.create(container("c1"))
        await rig.rounds(2)
        assert (rig.runners().get("c1") == "vm-gpu") is cpu_on_gpu, gpu_only
        if not gpu_only:
            continue
        assert rig.cloud.created == ["small"]  # not the GPUOnly VM
        body = container("g1")
        body["spec"]["resources"]["gpus"] = 1
        rig.api.create(body)
        await rig.rounds(2)
        assert rig.runners().get("g1") == "vm-gpu"


async def test_a_cpu_start_in_flight_when_its_node_turns_gpu_only_does_not_go_ahead() -> None:
    """A start decided while the node was Open, not yet begun when the power controller
    shows it GPUOnly: admission is re-checked for the container's kind where a start
    re-checks it (CPU-only work that fits elsewhere refused, GPU work still admitted);
    the CPU container is planned again elsewhere."""
    rig = Rig([SMALL, GPU], placement={"gpuCapacity": "GpuWorkOnly"})
    vm = rig.vm("vm-gpu", GPU)
    await rig.start()
    rig.api.create(container("c1"))
    body = container("g1")
    body["spec"]["resources"]["gpus"] = 1
    rig.api.create(body)
    # one round whose plan starts both on the GPU VM; the VM turns GPUOnly after the
    # plan, before the starts it spawned run
    rig.clock.advance(1.0)
    await rig.pool.probe_all()
    rig.power()
    await rig.dispatcher.step()
    rig.gpu_only.add("vm-gpu")
    rig.power()
    await rig.settle()
    assert uuid_of("c1") not in vm.started, rig.runners()
    assert rig.runners().get("g1") == "vm-gpu"
    await rig.rounds(3)
    assert rig.runners().get("c1") != "vm-gpu"
    assert uuid_of("c1") not in vm.started
    assert rig.cloud.created == ["small"]
    # CPU-only work that nothing without GPUs could ever fit still starts there (GPU
    # capacity last, the default: the plan would place it there GPUOnly or not)
    rig = Rig([GPU])
    vm = rig.vm("vm-gpu", GPU)
    await rig.start()
    rig.api.create(container("c1"))
    rig.clock.advance(1.0)
    await rig.pool.probe_all()
    rig.power()
    await rig.dispatcher.step()
    rig.gpu_only.add("vm-gpu")
    rig.power()
    await rig.settle()
    assert rig.runners() == {"c1": "vm-gpu"}


# -- the wait budget --------------------------------------------------------------------


def waking_side_node(rig: Rig, since_seconds: float, boot: float | None = None) -> None:
    """Side node SIDE (16 vCPUs, 0.05/h) waking for `since_seconds` by the power board;
    `boot`: the boot time the dispatcher has seen of it (None: none seen)."""
    spec = {
        "nodeType": "SideNode",
        "controlMethod": "Redfish",
        "capacity": {"vcpus": 16, "ram": "64Gi"},
        "costPerHour": 0.05,
    }
    worker = Worker(SIDE, None, T0, body={"metadata": {"name": SIDE}, "spec": spec}, side=True)
    rig.pool.workers[SIDE] = worker
    since = rig.clock() - timedelta(seconds=since_seconds)
    rig.board.set(
        SIDE, NodePowerView(PowerState.WAKING, False, False, wakeable=True, waking_since=since)
    )
    if boot is not None:  # as the planner's views saw it come up once
        boots = rig.dispatcher.planner.views.boots
        capacity = Capacity(16, 64 << 30, 0, 0)
        start = T0 - timedelta(hours=1)
        view = NodeView(SIDE, NodeState.WAKING, capacity, None, 0.05, coming_since=start)
        boots.watch([view], start)
        ready = NodeView(SIDE, NodeState.IDLE, capacity, None, 0.05, True, True)
        boots.watch([ready], start + timedelta(seconds=boot))


async def test_a_wait_budget_runs_out_at_its_due_time_not_by_polling() -> None:
    rig = Rig([SMALL])
    await rig.start()
    # the wake began 100 s ago; no boot of it seen (assumed 2m): on time until +20 s,
    # late until +140 s (twice that), then taken for hung
    waking_side_node(rig, 100)
    rig.api.create(container("c1"))
    planned_at = []
    for _ in range(160):
        before = rig.dispatcher.ctx.plans
        await rig.round()
        if rig.dispatcher.ctx.plans > before:
            planned_at.append(round((rig.clock() - T0).total_seconds()))
        if rig.cloud.created:
            break
    waited = rig.api.status("c1")
    assert rig.cloud.created == ["small"]
    assert planned_at[-1] == 140  # a VM once the wake is taken for hung ...
    assert 20 in planned_at  # ... re-judged when it fell behind its usual boot ...
    assert len(planned_at) <= 6, planned_at  # ... and at no other time but the first
    assert waited["schedulingStatus"] == "waiting for a new small to boot"


async def test_the_status_says_what_a_container_waits_for_and_why() -> None:
    rig = Rig([SMALL])
    await rig.start()
    waking_side_node(rig, 10)
    rig.api.create(container("c1"))
    await rig.rounds(3)
    # 1/16 of a 0.05/h node instead of a 0.10/h VM
    assert statuses(rig, "c1") == f"waiting up to 2m for side node {SIDE}: 97 % cheaper"
    assert rig.cloud.created == []


async def test_above_the_priority_threshold_a_container_takes_a_vm_at_once() -> None:
    # the side node comes up 200 s from now; a VM would take 120 s
    for priority, waits in ((950, False), (900, True)):
        rig = Rig([SMALL])
        await rig.start()
        waking_side_node(rig, 100, boot=300)
        rig.api.create(container("c1", priority=priority))
        await rig.rounds(3)
        assert (rig.cloud.created == []) is waits, priority
        assert rig.dispatcher.ctx.claims == {} or uuid_of("c1") not in rig.dispatcher.ctx.claims


async def test_unbounded_waits_for_the_waking_side_node_however_long_it_takes() -> None:
    rig = Rig([SMALL], placement=EARLIER)
    await rig.start()
    waking_side_node(rig, 100, boot=3600)
    rig.api.create(container("c1"))
    await rig.rounds(200)
    assert rig.cloud.created == []
    assert statuses(rig, "c1") == f"waiting for side node {SIDE} to wake"


async def test_a_container_waits_for_the_room_a_cancelled_container_leaves() -> None:
    for placement, created in (({}, []), ({"waitForCheaper": "Unbounded"}, ["quad"])):
        rig = Rig([QUAD], placement=placement)
        vm = rig.vm("vm-a", QUAD)
        vm.term_stops = False  # the runner goes only at the KILL (term_timeout 30 s)
        await rig.start()
        rig.api.create(container("c1", vcpus=4, ram="8Gi"))
        await rig.rounds(2)
        rig.api.create(container("c2", vcpus=4, ram="8Gi"))
        rig.api.cancel("c1")
        await rig.rounds(3)
        assert rig.cloud.created == created, placement
        if created:
            continue
        assert statuses(rig, "c2") == "waiting up to 2m for node vm-a to free up"
        await rig.rounds(40)  # KILL after 30 s, then the probe sees the runner gone
        assert rig.runners() == {"c2": "vm-a"} and rig.cloud.created == []
