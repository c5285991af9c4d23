"""Recovery, in process: a restarted dispatcher adopts the runners it finds, starts
nothing twice, kills runners nobody wants, and does nothing before its first probe round."""

from __future__ import annotations

from datetime import timedelta

from fakes import ME, Rig, container, uuid_of


async def test_a_runner_of_a_locked_container_is_adopted_not_started_again() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("c1")] = 4242  # started just before the crash, Running never written
    rig.api.create(container("c1", status={"phase": "Locked", "lockedBy": ME, "node": "vm-a"}))
    await rig.start()
    await rig.rounds(2)
    status = rig.api.status("c1")
    assert (status["phase"], status["reason"], status["runnerPid"]) == ("Running", "Adopted", 4242)
    assert rig.starts() == []


async def test_a_restart_mid_run_starts_nothing_twice() -> None:
    first = Rig()
    first.vm("vm-a")
    await first.start()
    first.api.create(container("c1"))
    await first.rounds(2)
    assert first.api.phase("c1") == "Running"
    # the operator dies; a new one starts from the same API objects and cloud
    second = Rig(api=first.api, cloud=first.cloud, clock=first.clock)
    await second.start()
    await second.rounds(3)
    assert second.api.phase("c1") == "Running"
    assert second.starts() == ["c1"]
    second.cloud.vms["vm-a"].exit(uuid_of("c1"), 0)
    await second.rounds(2)
    assert second.api.phase("c1") == "Complete"
    assert second.starts() == ["c1"]


async def test_runners_nobody_wants_are_killed() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("gone")] = 10  # its ContainerDispatch no longer exists
    vm.runners[uuid_of("done")] = 11  # its container already finished
    rig.api.create(container("done", status={"phase": "Complete", "exitCode": 0}))
    await rig.start()
    await rig.rounds(2)
    assert rig.runners() == {}
    assert {u for u, _ in vm.signals} == {uuid_of("gone"), uuid_of("done")}
    assert rig.api.phase("done") == "Complete"


async def test_nothing_is_started_or_killed_before_the_first_probe_round() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("gone")] = 10
    rig.api.create(container("c1"))
    await rig.pool.sync_cloud()
    await rig.pool.probe_all()
    rig.power()
    await rig.dispatcher.step()  # no start(): not recovered yet
    await rig.settle()
    assert rig.starts() == []
    assert vm.signals == []
    assert rig.cloud.created == []


async def test_a_runner_that_finished_while_the_dispatcher_was_down_completes() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.ended[uuid_of("c1")] = ("exited", 7)
    running = {
        "phase": "Running",
        "lockedBy": ME,
        "node": "vm-a",
        "attempts": 1,
        "startedAt": "2025-12-31T23:00:00Z",
    }
    rig.api.create(container("c1", status=running))
    await rig.start()
    await rig.rounds(2)
    status = rig.api.status("c1")
    assert (status["phase"], status["exitCode"]) == ("Complete", 7)
    assert rig.starts() == []


async def test_a_locked_container_whose_runner_already_ended_is_not_run_again() -> None:
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.ended[uuid_of("c1")] = ("exited", 0)  # started before the crash, ended while down
    vm.ended[uuid_of("c2")] = ("lost", None)  # started before the crash, then vanished
    for name in ("c1", "c2"):
        locked = {"phase": "Locked", "lockedBy": ME, "node": "vm-a", "attempts": 0}
        rig.api.create(container(name, status=locked))
    await rig.start()
    await rig.rounds(3)
    status = rig.api.status("c1")
    assert (status["phase"], status["exitCode"], status["attempts"]) == ("Complete", 0, 1)
    assert rig.starts() == ["c2"]  # requeued as a lost run (attempt 1 counted), run again
    assert rig.api.status("c2")["attempts"] == 2


async def test_a_start_stamped_by_a_clock_ahead_never_hides_the_runners_end() -> None:
    """The replica that started the runner had its wall clock 90 s ahead: its `startedAt`
    lies in this replica's future. The end is still seen at the next listings (old code
    took every listing for one older than the start until its clock passed `startedAt`)."""
    rig = Rig()
    vm = rig.vm("vm-a")
    vm.ended[uuid_of("c1")] = ("exited", 0)
    ahead = rig.clock() + timedelta(seconds=90)
    running = {
        "phase": "Running",
        "lockedBy": ME,
        "node": "vm-a",
        "attempts": 1,
        "startedAt": ahead.isoformat().replace("+00:00", "Z"),
    }
    rig.api.create(container("c1", status=running))
    await rig.start()
    await rig.rounds(3)
    status = rig.api.status("c1")
    assert (status["phase"], status["exitCode"]) == ("Complete", 0)
    assert rig.starts() == []
