"""Wake path, in process: qualified demand wakes an Off node (Redfish On or a Wake-on-LAN
packet), WAKING until the BMC says On, admission opens only after a passing ready probe
(boot grace), and the wake gates (demand, min-off, capability) hold it off."""

from __future__ import annotations

from datetime import timedelta

from harness import POLICY, PowerHarness


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


async def off_node(h: PowerHarness, **host: object) -> None:
    h.side_node("n1", power="Off", **host)  # type: ignore[arg-type]
    await h.start()
    await h.run_until(lambda: h.state("n1") == "Off", within=60, what="n1 seen Off")


async def test_demand_wakes_an_off_node_and_admission_opens_only_when_ready() -> None:
    async with PowerHarness() as h:
        await off_node(h, ready_delay=20.0)
        assert not h.control.requests
        h.queue("gpu-job", gpus=1, wake="n1")
        opened_early: list[str] = []

        def open_() -> bool:
            if h.status("n1").get("admission") == "Open" and not h.hosts["n1"].is_ready(h.clock()):
                opened_early.append(str(h.clock()))
            return h.status("n1").get("admission") == "Open"

        await h.run_until(open_, within=200, what="admission Open")
        assert not opened_early
        (sent,) = h.control.requests
        assert sent.action == "On" and sent.persisted == "WAKING"
        assert "READY_CONFIRMED" in seen(h, "n1"), h.history("n1")
        assert "READY_PROBE_PENDING" in seen(h, "n1")  # booted, not ready yet: no work
        assert h.state("n1") in ("Idle", "Active")
        (intent,) = [i for i in h.intents("n1") if i["spec"]["action"] == "Wake"]
        status = intent["status"]
        assert status["phase"] == "Succeeded"
        assert status["requestRecord"]["decision"] == "START"
        assert status["requestRecord"]["demand"]["queued"] == 1
        record = status["safetyRecord"]
        assert record["readyProbe"]["passed"] is True
        assert record["observed"]["power"] == "On"


async def test_a_wake_on_lan_node_gets_a_magic_packet() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", method="WakeOnLan", bmc=True, power="Off", allowable=("WakeOnLan",))
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=60)
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=200)
        assert [r.action for r in h.control.requests] == ["WakeOnLan"]
        wake = [i for i in h.intents("n1") if i["spec"]["action"] == "Wake"]
        assert wake[0]["status"]["requestRecord"]["control"]["chosenAction"] == "WakeOnLan"


async def test_an_off_node_without_demand_stays_off() -> None:
    async with PowerHarness() as h:
        await off_node(h)
        h.queue("cpu-job", vcpus=1)  # fits elsewhere; the plan waits on no node
        await h.run_for(200, tick=2.0)
        assert not h.control.requests
        assert h.state("n1") == "Off"


async def test_min_off_holds_the_wake_until_it_is_over() -> None:
    async with PowerHarness(policy={**POLICY, "minOff": "2m"}) as h:
        await off_node(h)
        seen_off = h.clock()
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_for(30)
        assert not h.control.requests
        assert "MIN_OFF_NOT_MET" in seen(h, "n1"), h.history("n1")
        await h.run_until(lambda: bool(h.control.requests), within=200)
        assert h.control.requests[0].action == "On"
        assert h.control.requests[0].at - seen_off >= timedelta(seconds=100)


async def test_a_wake_the_node_cannot_do_is_blocked_not_attempted() -> None:
    async with PowerHarness() as h:
        await off_node(h, allowable=("GracefulShutdown",))
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_for(120, tick=2.0)
        assert not h.control.requests
        assert h.decision("n1") == "BLOCK"
        assert {"ACTION_NOT_ALLOWED", "POWER_CONTROL_UNAVAILABLE"} & seen(h, "n1")


async def test_boot_grace_a_node_waking_is_not_ready_until_its_probe_passes() -> None:
    async with PowerHarness() as h:
        await off_node(h, ready_delay=40.0)
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_until(lambda: h.hosts["n1"].power == "On", within=100)
        on_at = h.clock()
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=200)
        assert h.clock() - on_at >= timedelta(seconds=30)
        assert h.status("n1")["readiness"] == "Ready"
