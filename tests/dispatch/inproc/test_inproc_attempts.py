"""Requeue and the attempts cap, in process: each lost run or failed start is one attempt;
at policy maxAttempts the container is Failed with a reason, not run again."""

from __future__ import annotations

from fakes import ME, Rig, container, uuid_of


async def test_runs_lost_up_to_the_cap_then_failed_with_a_reason() -> None:
    rig = Rig(maxAttempts=2)
    rig.vm("vm-a")
    await rig.start()
    rig.api.create(container("c1"))
    vm = rig.cloud.vms["vm-a"]
    for _ in range(2):
        await rig.rounds(2)
        assert rig.api.phase("c1") == "Running"
        vm.lose(rig.queue.by_name["c1"].uuid)
        await rig.round()
    status = rig.api.status("c1")
    assert status["phase"] == "Failed"
    assert status["reason"] == "MaxAttemptsExceeded"
    assert "gave up after 2 attempts" in status["schedulingStatus"]
    await rig.rounds(3)
    assert rig.starts() == ["c1", "c1"]
    assert rig.api.phase("c1") == "Failed"


async def test_failed_starts_count_as_attempts() -> None:
    rig = Rig(maxAttempts=3)
    vm = rig.vm("vm-a")
    vm.start_fails = True
    await rig.start()
    rig.api.create(container("c1"))
    for attempt in (1, 2):
        await rig.round()
        status = rig.api.status("c1")
        assert (status["phase"], status["reason"]) == ("Queued", "RunnerStartFailed")
        assert status["attempts"] == attempt
    await rig.rounds(3)
    status = rig.api.status("c1")
    assert status["phase"] == "Failed"
    assert status["reason"] == "MaxAttemptsExceeded"
    assert vm.runners == {}


async def test_a_container_that_fits_no_type_fails_at_once() -> None:
    rig = Rig()
    await rig.start()
    rig.api.create(container("c1", vcpus=64))
    await rig.round()
    status = rig.api.status("c1")
    assert status["phase"] == "Failed"
    assert status["reason"] == "NoInstanceTypeFits"
    assert rig.cloud.created == []


async def test_an_adopted_run_of_a_locked_container_counts_as_an_attempt() -> None:
    # one run counted; a second started just before a crash (still Locked, not counted)
    rig = Rig(maxAttempts=2)
    vm = rig.vm("vm-a")
    vm.runners[uuid_of("c1")] = 500
    locked = {"phase": "Locked", "lockedBy": ME, "node": "vm-a", "attempts": 1}
    rig.api.create(container("c1", status=locked))
    await rig.start()
    await rig.rounds(2)
    assert (rig.api.phase("c1"), rig.api.status("c1")["attempts"]) == ("Running", 2)
    vm.lose(uuid_of("c1"))
    await rig.round()
    status = rig.api.status("c1")
    assert (status["phase"], status["reason"]) == ("Failed", "MaxAttemptsExceeded")
    assert rig.starts() == []
