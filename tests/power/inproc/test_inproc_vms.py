"""Cloud VMs, in process (the node-manager matrix): an idle VM is drained and destroyed
when the billing window is open, an unpaired one after its boot grace, a broken or
stopped one at once; a busy one never; the instance leaving the cloud list is the
observed Off."""

from __future__ import annotations

from datetime import timedelta

from harness import POLICY, PowerHarness
from powerfakes import T0


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


async def test_an_idle_vm_is_drained_destroyed_and_off_only_once_it_left_the_list() -> None:
    async with PowerHarness() as h:
        h.cloud_vm("vm1")
        await h.start()
        early: list[str] = []

        def off() -> bool:
            if h.state("vm1") == "Off" and "vm1" in h.vms:
                early.append(str(h.clock()))
            return h.state("vm1") == "Off"

        await h.run_until(off, within=400, what="vm1 Off")
        assert not early
        (sent,) = h.control.sent("vm1")
        assert sent.persisted == "SHUTTING_DOWN"
        assert "IDLE_EXCEEDED" in seen(h, "vm1"), h.history("vm1")
        assert "POWER_OFF_CONFIRMED" in seen(h, "vm1")
        (intent,) = h.intents("vm1")
        record = intent["status"]["safetyRecord"]
        assert intent["status"]["phase"] == "Succeeded"
        assert "no longer listed" in record["observed"]["source"]


async def test_a_busy_vm_is_never_destroyed() -> None:
    async with PowerHarness() as h:
        h.cloud_vm("vm1")
        h.hosts["vm1"].runners = 2
        await h.start()
        await h.run_for(300, tick=3.0)
        assert not h.control.requests
        assert h.state("vm1") != "Off"


async def test_an_unpaired_vm_is_destroyed_only_after_its_boot_grace() -> None:
    async with PowerHarness() as h:
        h.cloud_vm("vm1")
        h.hosts["vm1"].probe_fails = True  # never paired
        await h.start()
        await h.run_for(60)
        assert not h.control.requests  # boot grace (120 s) not over
        await h.run_until(lambda: bool(h.control.requests), within=200)
        assert "BOOT_GRACE_EXCEEDED" in seen(h, "vm1"), h.history("vm1")
        assert h.control.requests[0].at - T0 >= timedelta(seconds=120)


async def test_a_vm_found_after_a_restart_gets_a_fresh_boot_grace() -> None:
    """A VM launched an hour ago that this process found at start-up and has not yet
    paired (its first probes fail, e.g. the SSH connection it kept died with the old
    leader) is not destroyed before its boot grace has passed since it was found."""
    async with PowerHarness() as h:
        h.cloud_vm("vm1")
        h.hosts["vm1"].probe_fails = True
        h.worker("vm1", booted_at=h.clock() - timedelta(hours=1), found_at=h.clock())
        await h.start()
        await h.run_for(60)
        assert not h.control.requests, h.history("vm1")  # launched 1 h ago, found 60 s ago
        await h.run_until(lambda: bool(h.control.requests), within=200)
        assert "BOOT_GRACE_EXCEEDED" in seen(h, "vm1"), h.history("vm1")
        assert h.control.requests[0].at - T0 >= timedelta(seconds=120)


async def test_a_broken_vm_is_shut_down_at_once() -> None:
    async with PowerHarness(policy={**POLICY, "idleThreshold": "1h"}) as h:
        h.cloud_vm("vm1")
        await h.start()
        await h.run_for(10)
        h.worker("vm1", broken=True)
        await h.run_until(lambda: bool(h.control.requests), within=60)
        assert {"NODE_BROKEN", "WORKER_DOWN"} & seen(h, "vm1"), h.history("vm1")


async def test_a_stopped_vm_is_destroyed() -> None:
    async with PowerHarness(policy={**POLICY, "idleThreshold": "1h"}) as h:
        h.cloud_vm("vm1")
        await h.start()
        await h.run_for(10)
        h.vms["vm1"] = h.vms["vm1"].model_copy(update={"state": "Stopped"})
        h.worker("vm1", instance_stopped=True)
        h.hosts["vm1"].power = "Stopped"
        await h.run_until(lambda: bool(h.control.requests), within=120)
        assert h.state("vm1") in ("Off", "ShuttingDown")


async def test_a_closed_billing_window_keeps_an_idle_vm() -> None:
    billing = {"period": "1h", "windowStart": "50m", "windowEnd": "55m"}
    async with PowerHarness(policy={**POLICY, "billing": billing}) as h:
        h.cloud_vm("vm1")
        await h.start()
        await h.run_for(300, tick=3.0)
        assert not h.control.requests
        assert "BILLING_WINDOW_CLOSED" in seen(h, "vm1"), h.history("vm1")


async def test_a_vm_destroyed_by_someone_else_is_recorded_off_without_a_request() -> None:
    async with PowerHarness(policy={**POLICY, "idleThreshold": "1h"}) as h:
        h.cloud_vm("vm1")
        await h.start()
        await h.run_for(10)
        await h.vm_gone("vm1")
        await h.round()
        assert h.state("vm1") == "Off"
        assert not h.control.requests
