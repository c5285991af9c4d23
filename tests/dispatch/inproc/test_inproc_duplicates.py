"""Unique containers, in process (issue 20, item 4): an object whose spec.uuid another one
already holds is marked Valid=False DuplicateUuid and never scheduled, adopted or
cancelled; it is judged again when the first is deleted."""

from __future__ import annotations

from typing import Any

from fakes import Rig, container, uuid_of

from nodewarden.dispatch.queue import DUPLICATE_UUID


def copy_of(victim: str, name: str, created: str = "2026-01-01T00:00:05Z", **spec: Any) -> Any:
    """Another user's object with the victim's uuid, created later."""
    body = container(name)
    body["spec"]["uuid"] = uuid_of(victim)
    body["spec"].update(spec)
    body["metadata"]["creationTimestamp"] = created
    return body


def valid(rig: Rig, name: str) -> dict[str, Any]:
    conds = rig.api.status(name).get("conditions") or []
    return next((c for c in conds if c["type"] == "Valid"), {})


async def test_a_cancelled_copy_of_a_uuid_leaves_the_victim_to_complete() -> None:
    rig = Rig()
    uuid = await rig.running("c1")
    vm = rig.cloud.vms["vm-a"]
    rig.api.create(copy_of("c1", "attacker", cancel=True))
    await rig.rounds(4)
    assert vm.signals == []  # the victim's runner was never signalled
    assert rig.api.phase("c1") == "Running"
    mark = valid(rig, "attacker")
    assert mark["status"] == "False" and mark["reason"] == DUPLICATE_UUID
    assert "'c1'" in mark["message"] and uuid in mark["message"]
    assert rig.api.phase("attacker") is None  # never queued, locked or cancelled
    vm.exit(uuid, 0)
    await rig.rounds(3)
    assert rig.api.phase("c1") == "Complete"
    assert rig.api.phase("attacker") is None and vm.signals == []


async def test_a_copy_is_never_scheduled_and_takes_over_once_the_first_is_gone() -> None:
    rig = Rig()
    uuid = await rig.running("c1")
    rig.api.create(copy_of("c1", "later"))
    await rig.rounds(2)
    assert rig.starts() == ["c1"]
    rig.cloud.vms["vm-a"].exit(uuid, 0)
    await rig.rounds(2)
    assert rig.api.phase("c1") == "Complete"
    rig.api.delete("c1")
    await rig.rounds(4)
    assert valid(rig, "later")["status"] == "True"  # judged again: now it is the container
    assert rig.api.phase("later") in ("Locked", "Running")


async def test_the_first_deleted_while_running_hands_its_uuid_to_nobody() -> None:
    rig = Rig()
    await rig.running("c1")
    rig.api.create(copy_of("c1", "later"))
    await rig.rounds(2)
    rig.api.delete("c1")
    await rig.rounds(4)
    mark = valid(rig, "later")
    assert mark["status"] == "False" and mark["reason"] == DUPLICATE_UUID
    assert "deleted while it was Locked or Running" in mark["message"]
    assert rig.starts() == ["c1"] and rig.api.phase("later") is None


async def test_the_earlier_object_holds_the_uuid_whatever_the_order_of_events() -> None:
    """The dispatcher hears of the later object first (e.g. after a restart)."""
    rig = Rig()
    rig.vm("vm-a")
    await rig.start()
    rig.api.create(copy_of("c1", "a-later"))  # sorts before c1 by name, created later
    rig.api.create(container("c1"))
    await rig.rounds(3)
    assert rig.starts() == ["c1"]
    assert valid(rig, "a-later")["reason"] == DUPLICATE_UUID


async def test_a_runner_of_a_deleted_object_is_never_the_new_objects_runner() -> None:
    """Runners are keyed by metadata.uid as well as the uuid: after a restart, the object
    left holding the uuid of one deleted while it ran never adopts the deleted object's
    runner (that runner is killed, as any unwanted one), and runs its own once it is gone."""
    rig = Rig()
    vm = rig.vm("vm-a")
    uuid = uuid_of("c1")
    vm.runners[uuid] = 4242  # started for c1, deleted while the operator was down
    vm.uids[uuid] = "uid-of-the-deleted-c1"
    vm.term_stops = False  # the old runner takes a while to stop
    rig.api.create(copy_of("c1", "later"))
    await rig.start()
    await rig.rounds(3)
    assert (uuid, "TERM") in vm.signals
    assert rig.api.status("later").get("reason") != "Adopted"
    assert rig.api.phase("later") != "Running" and vm.started == []
    vm.term_stops = True
    await rig.rounds(8)
    assert rig.api.phase("later") == "Running"
    assert vm.uids[uuid] == rig.api.objects["later"]["metadata"]["uid"]  # its own runner
