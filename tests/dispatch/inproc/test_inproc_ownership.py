"""Whose runners a dispatcher may touch, in process: only its own.

Two installs share nodes (a cloud VM claimed from another dispatcher, a side node relabelled)
and runners outlive operator upgrades: a runner another dispatcher id started, or one that
names no owner (an older operator or runner program), is never killed by the runner
reconcile; only a runner naming this dispatcher and wanted by nobody is.
"""

from __future__ import annotations

from fakes import ME, Rig, container, uuid_of


async def test_only_runners_of_this_dispatcher_nobody_wants_are_killed() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("mine")] = 10  # ours; its ContainerDispatch is gone
    vm.runners[uuid_of("theirs")] = 11
    vm.owners[uuid_of("theirs")] = "disp-b"  # another install's runner
    vm.runners[uuid_of("old")] = 12
    vm.owners[uuid_of("old")] = None  # names no owner
    await rig.start()
    await rig.rounds(3)
    assert {u for u, _ in vm.signals} == {uuid_of("mine")}
    assert set(rig.runners()) == {"theirs", "old"}
    worker = rig.pool.workers["vm-a"]
    assert worker.listed_runners[uuid_of("old")].dispatcher_id is None


async def test_a_runner_of_another_dispatcher_is_not_adopted_for_a_queued_container() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("c1")] = 4242
    vm.owners[uuid_of("c1")] = "disp-b"
    rig.api.create(container("c1"))
    await rig.start()
    await rig.rounds(2)
    status = rig.api.status("c1")
    assert status.get("reason") != "Adopted"
    assert vm.signals == []


async def test_an_ownerless_runner_of_a_container_we_locked_there_is_adopted() -> None:
    """Upgrading from a release whose runners recorded no owner: the lock proves it ours."""
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("c1")] = 4242
    vm.owners[uuid_of("c1")] = None
    rig.api.create(container("c1", status={"phase": "Locked", "lockedBy": ME, "node": "vm-a"}))
    await rig.start()
    await rig.rounds(2)
    status = rig.api.status("c1")
    assert (status["phase"], status["reason"], status["runnerPid"]) == ("Running", "Adopted", 4242)
    assert rig.starts() == [] and vm.signals == []
