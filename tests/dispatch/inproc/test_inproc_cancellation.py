"""Cancellation, in process: TERM repeated every term_interval, KILL after term_timeout,
Cancelled once the runner is gone; a container cancelled or deleted before or while it
runs never leaves a runner behind."""

from __future__ import annotations

from fakes import Rig, container


async def test_cancel_sends_term_then_repeats_it_then_kills() -> None:
    rig = Rig()  # term_interval 5 s, term_timeout 30 s
    uuid = await rig.running()
    vm = rig.cloud.vms["vm-a"]
    vm.term_stops = False  # the runner ignores TERM
    rig.api.cancel("c1")
    await rig.round(0.1)
    assert vm.signals == [(uuid, "TERM")]
    await rig.rounds(4, 1.0)  # < term_interval since the first TERM: no repeat
    assert vm.signals == [(uuid, "TERM")]
    await rig.rounds(25, 1.0)  # repeated every 5 s until 30 s have passed
    assert vm.signals == [(uuid, "TERM")] * 6
    await rig.rounds(6, 1.0)
    assert [s for _, s in vm.signals][-1] == "KILL"
    await rig.rounds(2)
    assert rig.runners() == {}
    assert rig.api.phase("c1") == "Cancelled"


async def test_a_runner_that_stops_on_term_is_cancelled_without_kill() -> None:
    rig = Rig()
    uuid = await rig.running()
    rig.api.cancel("c1")
    await rig.rounds(3)
    assert rig.cloud.vms["vm-a"].signals == [(uuid, "TERM")]
    assert rig.api.phase("c1") == "Cancelled"


async def test_cancel_before_it_ran_starts_nothing() -> None:
    rig = Rig()
    await rig.start()  # no node: the container waits for a create
    rig.api.create(container("c1"))
    await rig.round()
    rig.api.cancel("c1")
    await rig.rounds(3)
    for vm in rig.cloud.vms.values():
        vm.ready = True
    await rig.rounds(3)
    assert rig.api.phase("c1") == "Cancelled"
    assert rig.starts() == []


async def test_deleting_a_running_container_stops_its_runner() -> None:
    rig = Rig()
    uuid = await rig.running()
    vm = rig.cloud.vms["vm-a"]
    vm.term_stops = False
    rig.api.delete("c1")
    await rig.rounds(3)
    assert "c1" not in rig.api.objects  # no finalizer: the object goes at once
    assert (uuid, "TERM") in vm.signals  # and its runner, which nobody wants now, is stopped
    vm.term_stops = True
    await rig.rounds(8, 1.0)
    assert rig.runners() == {}
    assert "c1" not in rig.api.objects


async def test_deleting_a_queued_container_lets_it_go() -> None:
    rig = Rig(maxNodes=0)  # nowhere to run: it waits
    await rig.start()
    rig.api.create(container("c1"))
    await rig.rounds(2)
    rig.api.delete("c1")
    await rig.rounds(2)
    assert "c1" not in rig.api.objects
    assert rig.starts() == []


async def test_cancelling_a_running_container_whose_node_is_gone_says_so() -> None:
    rig = Rig()
    await rig.running()
    del rig.cloud.vms["vm-a"], rig.pool.workers["vm-a"]  # its node went away
    rig.api.cancel("c1")
    await rig.rounds(2)
    assert rig.api.phase("c1") == "Cancelled"
    status = str(rig.api.status("c1"))
    assert "node vm-a is gone" in status, status
    assert "before it ran" not in status
