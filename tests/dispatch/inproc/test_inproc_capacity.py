"""The capacity ledger, in process: a container holds its node's capacity from the moment
it is chosen for the node until its runner is seen gone there, whatever its phase, and the
scheduler, every start path and the power controller's work evidence count the same
holdings. One test per hole an independent review found (issue 19, paths (a)-(e)): each
ran more containers on a node than it holds.

Nodes are `small` (2 vCPUs); a 2-vCPU container takes a whole node. `FakeVM.most_vcpus`
is the ground truth: the most vCPUs the node's runners ever used at once, counted from
the configs the runners were started with.
"""

from __future__ import annotations

from typing import Any

from fakes import ME, SMALL, Rig, container, name_of, uuid_of

from nodewarden.metrics import OVERCOMMITTED_NODES
from nodewarden.policy.facts import NodeFacts
from nodewarden.power.nodestatus import conditions
from nodewarden.power.runtime import NodeRuntime
from nodewarden.rules.demand import placed_counts
from nodewarden.scheduling.views import ContainerView, Plan
from nodewarden.ssh.credentials import SshTarget
from policy.policy_builders import NOW, on_state


def whole(name: str, **kw: Any) -> dict[str, Any]:
    """A container that takes a whole `small` node."""
    return container(name, vcpus=2, **kw)


def locked_on(node: str, **extra: Any) -> dict[str, Any]:
    return {"phase": "Locked", "lockedBy": ME, "node": node, "attempts": 0, **extra}


class Handed:
    """What the dispatcher hands the power controller after each round, as the power
    controller's work evidence counts it (`placed_counts`)."""

    def __init__(self, rig: Rig) -> None:
        self.busy: list[dict[str, int]] = []
        rig.dispatcher.planned = self

    def __call__(self, containers: list[ContainerView], plan: Plan, now: Any) -> None:
        self.busy.append(placed_counts(containers))


# --- (a) a lock or start in flight holds its node ------------------------------------------


async def test_a_start_in_flight_holds_its_node_for_placement_and_power() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    vm.slow_starts = True  # every SSH start takes longer than several rounds
    handed = Handed(rig)
    await rig.start()
    for name in ("c1", "c2", "c3"):
        rig.api.create(whole(name))
    await rig.rounds(5)
    assert len(vm.started) == 1, f"starts sent to a node with one in flight: {vm.started}"
    # the power controller is told the node is busy from the round that chose it
    assert all(b.get("vm-a") == 1 for b in handed.busy[1:]), handed.busy
    vm.release()
    await rig.rounds(3)
    assert vm.most_vcpus <= 2
    assert len(rig.runners()) == 1


# --- (b) a relock is placed like any placement, after the node's runner list is read ----


async def test_a_takeover_relocks_only_what_fits_and_adopts_what_runs() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("run")] = 4242  # the old leader started it; Running never written
    rig.api.create(container("run", status=locked_on("vm-a")))
    rig.api.create(container("fits", priority=5, status=locked_on("vm-a")))
    rig.api.create(container("over", priority=1, status=locked_on("vm-a")))
    await rig.start()
    await rig.rounds(4)
    status = {n: rig.api.status(n) for n in ("run", "fits", "over")}
    assert (status["run"]["phase"], status["run"]["reason"]) == ("Running", "Adopted")
    assert status["fits"]["phase"] == "Running"
    assert (status["over"]["phase"], status["over"]["reason"]) == ("Queued", "Overflow")
    assert "no room on vm-a" in status["over"]["schedulingStatus"], status["over"]
    assert [name_of(u) for u in vm.started] == ["fits"]
    assert vm.most_vcpus <= 2


async def test_a_pile_of_locks_on_a_one_slot_node_starts_one() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    for name in ("l1", "l2", "l3"):
        rig.api.create(whole(name, status=locked_on("vm-a")))
    handed = Handed(rig)
    await rig.start()
    await rig.rounds(4)
    phases = sorted(rig.api.phase(n) or "" for n in ("l1", "l2", "l3"))
    assert phases == ["Queued", "Queued", "Running"], phases
    assert len(vm.started) == 1
    assert vm.most_vcpus <= 2
    # Locked containers are work on the node while their runners are asked about
    assert all(b.get("vm-a", 0) >= 1 for b in handed.busy), handed.busy


async def test_a_relock_waits_for_admission_like_any_start() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    rig.closed = {"vm-a"}  # the power controller closed its admission (a shutdown is near)
    rig.api.create(whole("l1", status=locked_on("vm-a")))
    await rig.start()
    await rig.rounds(4)
    assert vm.started == []
    assert rig.api.phase("l1") == "Queued"


# --- (c) a failed or timed-out start asks the node before it requeues --------------------


async def test_a_timed_out_start_whose_runner_runs_is_adopted_not_requeued() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    vm.start_times_out = True  # the runner starts; the answer to `run` times out
    await rig.start()
    rig.api.create(whole("c1"))
    await rig.unprobed_round()
    vm.start_times_out = False
    rig.api.create(whole("c2", priority=10))
    # the next rounds plan with the listing of before the start (probes have their own
    # interval): the node must not look free
    for _ in range(3):
        await rig.unprobed_round()
    assert vm.most_vcpus <= 2, rig.runners()
    assert rig.runners() == {"c1": "vm-a"}
    assert rig.api.phase("c1") == "Running"
    assert rig.api.status("c1")["attempts"] == 1
    await rig.rounds(2)
    assert rig.runners() == {"c1": "vm-a"}


# --- (d) a cancelled container holds its node until its runner is seen gone --------------


async def test_a_cancelled_runner_holds_its_node_until_it_is_seen_gone() -> None:
    rig = Rig([SMALL], maxNodes=1)  # TERM every 5 s, KILL after 30 s
    vm = rig.vm("vm-a")
    handed = Handed(rig)
    await rig.start()
    rig.api.create(whole("c1"))
    await rig.rounds(2)
    assert rig.runners() == {"c1": "vm-a"}
    vm.term_stops = False  # the runner takes its time to stop
    rig.api.cancel("c1")
    rig.api.create(whole("c2"))
    await rig.rounds(10)
    assert rig.runners() == {"c1": "vm-a"}, "a container started beside a cancelled runner"
    assert all(b.get("vm-a") == 1 for b in handed.busy[-10:]), handed.busy[-10:]
    await rig.rounds(25)  # KILL after 30 s: the runner is gone, the node takes c2
    assert rig.api.phase("c1") == "Cancelled"
    assert rig.runners() == {"c2": "vm-a"}
    assert vm.most_vcpus <= 2


async def test_the_runner_of_a_deleted_container_holds_its_node_until_it_is_gone() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    await rig.start()
    rig.api.create(whole("c1"))
    await rig.rounds(2)
    vm.term_stops = False
    rig.api.delete("c1")  # no finalizer: the object is gone at once, its runner is not
    rig.api.create(whole("c2"))
    await rig.rounds(10)
    assert rig.runners() == {"c1": "vm-a"}
    await rig.rounds(25)
    assert rig.runners() == {"c2": "vm-a"}
    assert vm.most_vcpus <= 2


# --- (e) what a container holds is what it was locked with ------------------------------


async def test_shrinking_the_spec_of_a_running_container_frees_nothing() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    await rig.start()
    rig.api.create(whole("c1"))
    await rig.rounds(2)
    rig.api.change("c1", spec={"resources": {"vcpus": 1, "ram": "1Gi"}})
    rig.api.create(container("c2", vcpus=1))
    await rig.rounds(3)
    assert rig.runners() == {"c1": "vm-a"}
    assert vm.most_vcpus <= 2
    assert rig.api.status("c1")["resources"]["vcpus"] == 2  # the snapshot of the lock


async def test_a_spec_edit_between_plan_and_lock_fails_the_lock_and_is_planned_again() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    await rig.start()
    rig.api.create(container("c0", vcpus=1))
    await rig.rounds(2)
    rig.api.create(container("c1", vcpus=1))  # fits beside c0 as planned ...
    real_target = rig.pool.target
    edited: list[str] = []

    async def target(worker: Any) -> SshTarget | None:
        # ... but its spec grows while its start is on the way to the lock write
        if not edited and "c1" in rig.api.objects and rig.api.phase("c1") in (None, "Queued"):
            edited.append("c1")
            rig.api.change("c1", spec={"resources": {"vcpus": 2, "ram": "1Gi"}})
        return await real_target(worker)

    rig.pool.target = target  # type: ignore[method-assign]
    await rig.rounds(3)
    assert edited == ["c1"]
    assert rig.runners() == {"c0": "vm-a"}, "started with the resources of before the edit"
    assert rig.api.phase("c1") in (None, "Queued")
    vm.exit(uuid_of("c0"), 0)
    await rig.rounds(3)
    assert rig.runners() == {"c1": "vm-a"}
    assert rig.api.status("c1")["resources"]["vcpus"] == 2
    assert vm.runner_vcpus[uuid_of("c1")] == 2
    assert vm.most_vcpus <= 2


# --- a node found running more than it holds --------------------------------------------


async def test_an_overcommitted_node_is_reported_takes_no_work_and_loses_no_runner() -> None:
    rig = Rig([SMALL], maxNodes=1)
    vm = rig.vm("vm-a")
    for i, name in enumerate(("r1", "r2", "r3")):  # an old leader ran 3 vCPUs on 2
        vm.runners[uuid_of(name)] = 500 + i
        running = {"phase": "Running", "lockedBy": ME, "node": "vm-a", "attempts": 1}
        rig.api.create(container(name, status=running))
    rig.api.create(container("q"))
    await rig.start()
    await rig.rounds(3)
    assert "vm-a" in rig.dispatcher.overcommitted
    assert OVERCOMMITTED_NODES._value.get() == 1
    assert rig.dispatcher.snapshot()["instances"][0]["overCapacity"]
    assert vm.signals == [] and len(vm.runners) == 3  # nothing is killed to make it fit
    assert vm.started == [] and rig.api.phase("q") == "Queued"
    vm.exit(uuid_of("r1"), 0)
    await rig.rounds(2)  # 2 vCPUs on 2: it fits again, and is full
    assert rig.dispatcher.overcommitted == {}
    assert OVERCOMMITTED_NODES._value.get() == 0
    assert vm.started == []
    vm.exit(uuid_of("r2"), 0)
    await rig.rounds(2)
    assert rig.runners() == {"r3": "vm-a", "q": "vm-a"}


def test_the_power_controller_shows_an_overcommitted_node_in_its_conditions() -> None:
    state = on_state(node="vm-a")
    rt = NodeRuntime(
        "vm-a", None, {}, state, NodeFacts(node="vm-a", node_type="SideNode"), spec_seen_at=NOW
    )
    assert conditions(rt, [], None, NOW) == []  # a node never overcommitted has none
    rt.overcommit = "runs 3 containers using 3 vCPUs, ...; it holds 2 vCPUs, ..."
    over = conditions(rt, [], None, NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in over] == [
        ("Overcommitted", "True", "RunsMoreThanItHolds")
    ]
    assert "takes no new work" in over[0]["message"]
    rt.overcommit = None
    fits = conditions(rt, over, None, NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in fits] == [
        ("Overcommitted", "False", "WithinCapacity")
    ]
