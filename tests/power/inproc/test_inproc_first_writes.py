"""A starting node's first status write waits for its start-up facts (`power.firstwrites`),
but never for a fact that cannot come: with no cloud configured, no cloud list will ever
observe a cloud VM's power, so its first write -- its `Valid` acknowledgement -- goes out
at the first round, not after `power.first_write_hold` (20 s).

The cluster symptom: a CloudVM WorkerNode created while the operator started (a freshly
started API server's 429 "storage is (re)initializing" delayed the first LIST by a second)
was acknowledged 20 s late."""

from __future__ import annotations

from typing import Any

from harness import NS, PowerHarness

from nodewarden.api.kinds import WORKER_NODE


def _valid(h: PowerHarness, name: str) -> dict[str, Any] | None:
    obj = h.kube.objects[(WORKER_NODE.kind, NS, name)]
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"].get("generation", 1):
        return None
    return next((c for c in status.get("conditions", []) if c["type"] == "Valid"), None)


async def test_a_cloud_vm_at_start_up_without_a_cloud_is_acknowledged_at_once() -> None:
    async with PowerHarness() as h:
        h.pool.cloud = False  # the pool serves side nodes only: no cloud list will come
        h.put_node("vm1", {"nodeType": "CloudVM", "instanceType": "small"})
        await h.start()  # the node is part of the start-up fleet
        took = await h.run_until(lambda: _valid(h, "vm1") is not None, within=19, what="Valid")
        assert took <= 2.0, took
        cond = _valid(h, "vm1")
        assert cond is not None and cond["status"] == "True", cond


async def test_a_cloud_vm_at_start_up_with_a_cloud_waits_for_the_cloud_list() -> None:
    """The hold itself is kept: with a cloud, the first write carries the listed power."""
    async with PowerHarness() as h:
        h.put_node("vm1", {"nodeType": "CloudVM", "instanceType": "small"})
        await h.start()
        await h.run_for(5)
        assert _valid(h, "vm1") is None, h.status("vm1")
        h.cloud_vm("vm1")  # its instance: listed at the next round
        await h.run_until(lambda: _valid(h, "vm1") is not None, within=5, what="Valid")
        assert h.status("vm1").get("observedPower") is not None, h.status("vm1")


async def test_a_declared_cloud_vm_the_cloud_list_does_not_hold_is_not_held_for_it() -> None:
    """A declared VM (no instance yet) is not in the cloud list: once a list was read, its
    power cannot be observed until it is created, so its first write waits no longer."""
    async with PowerHarness() as h:
        h.cloud_vm("running")  # the fake cloud lists this one
        h.put_node("declared", {"nodeType": "CloudVM", "instanceType": "small"})
        await h.start()
        took = await h.run_until(
            lambda: _valid(h, "declared") is not None, within=19, what="Valid of declared"
        )
        assert took <= 2.0, took
        assert _valid(h, "running") is not None, h.status("running")


async def test_a_cloud_vm_is_not_held_for_a_cloud_list_that_failed() -> None:
    """The cloud API refuses the start-up's list (down, rate-limited): as with a failing
    BMC, a starting VM's first write waits no longer for a reading."""
    async with PowerHarness() as h:
        h.put_node("vm1", {"nodeType": "CloudVM", "instanceType": "small"})
        await h.start()
        await h.round()
        assert _valid(h, "vm1") is None, h.status("vm1")  # held: the list may come
        h.ctrl.list_failed(h.clock())
        took = await h.run_until(lambda: _valid(h, "vm1") is not None, within=19, what="Valid")
        assert took <= 2.0, took
