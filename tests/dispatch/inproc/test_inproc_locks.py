"""Locks, in process: a lock write that loses its precondition starts nothing; a container
locked by another dispatcher is left alone; a lock released unused counts a flap, and
after policy maxLockFlaps the container is held back before it is locked again."""

from __future__ import annotations

from typing import Any

from fakes import ME, OTHER, Rig, container, uuid_of


async def test_a_lock_that_loses_its_precondition_starts_nothing() -> None:
    rig = Rig()
    rig.vm("vm-a")
    await rig.start()
    rig.api.create(container("c1"))
    # another dispatcher locks it; our cache has not seen that event yet
    rig.api.change(
        "c1", deliver=False, status={"phase": "Locked", "lockedBy": OTHER, "node": "vm-x"}
    )
    await rig.round()
    assert rig.api.conflicts >= 1
    assert rig.starts() == []
    assert rig.api.status("c1")["lockedBy"] == OTHER
    rig.api.deliver("c1")  # the event arrives: it is theirs now
    await rig.rounds(3)
    assert rig.starts() == []
    assert rig.api.status("c1")["lockedBy"] == OTHER


async def test_a_container_of_another_dispatcher_is_left_alone() -> None:
    rig = Rig()
    rig.vm("vm-a")
    running = {"phase": "Running", "lockedBy": OTHER, "node": "vm-theirs", "attempts": 1}
    rig.api.create(container("c1", status=running))
    await rig.start()
    await rig.rounds(3)
    assert rig.api.status("c1") == running  # not requeued for a node we do not know
    rig.api.cancel("c1")
    await rig.rounds(3)
    assert rig.api.status("c1") == running  # its dispatcher cancels it, not us
    assert rig.starts() == []
    assert rig.cloud.vms["vm-a"].signals == []


async def test_an_unused_lock_is_released_and_flapping_is_held_back() -> None:
    rig = Rig(maxLockFlaps=1)
    rig.vm("vm-a")
    rig.vm("vm-b")
    rig.draining = {"vm-a"}
    locked = {"phase": "Locked", "lockedBy": ME, "node": "vm-a", "lockedAt": "2026-01-01T00:00:00Z"}
    rig.api.create(container("c1", status=locked))
    await rig.start()
    await rig.rounds(2)  # (the first asks vm-a whether its runner ran: it did not)
    status = rig.api.status("c1")
    assert (status["phase"], status["reason"], status["lockFlaps"]) == ("Queued", "Unlocked", 1)
    await rig.rounds(10)  # held back for 30 s after its last lock
    assert rig.api.phase("c1") == "Queued"
    assert rig.starts() == []
    await rig.rounds(25)
    assert rig.runners() == {"c1": "vm-b"}


async def test_a_checked_lock_is_checked_again_after_a_start_so_nothing_runs_twice() -> None:
    """Found by chaos seed 933420 (one container ran three times on one VM, each start
    0.3 s after the last exit): a Locked container whose runner the node said never ran
    is started again under its lock; its Running write fails (the API server is away)
    and the runner exits. The node's answer ("never ran") was consumed by that start:
    the next absence asks the node again, which reports the exit -- Complete, one run."""
    rig = Rig()
    vm = rig.vm("vm-a")
    locked = {"phase": "Locked", "lockedBy": ME, "node": "vm-a", "lockedAt": "2026-01-01T00:00:00Z"}
    rig.api.create(container("c1", status=locked))
    real_patch = rig.api.patch_status

    def no_running(name: str, status: Any, resource_version: str | None) -> Any:
        if status.get("phase") == "Running":
            return None  # the write is lost (an API outage)
        return real_patch(name, status, resource_version)

    rig.api.patch_status = no_running  # type: ignore[method-assign]
    await rig.start()
    await rig.rounds(3)  # asks the node (never ran), starts it under its lock
    assert rig.starts() == ["c1"]
    assert rig.api.phase("c1") == "Locked"  # its Running write was lost
    vm.exit(uuid_of("c1"), 0)
    await rig.rounds(5)
    assert rig.starts() == ["c1"], "started again after it exited"
    status = rig.api.status("c1")
    assert (status["phase"], status["attempts"]) == ("Complete", 1), status
