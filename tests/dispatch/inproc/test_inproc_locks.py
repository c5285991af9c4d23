"""Locks, in process: a lock write that loses its precondition starts nothing; a container
locked by another dispatcher is left alone; a lock released unused counts a flap, and
after policy maxLockFlaps the container is held back before it is locked again."""

from __future__ import annotations

from fakes import ME, OTHER, Rig, container


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
