"""Races, in process: work arriving while a node drains or is switched off, stale facts,
and a second actor (a replica taking over mid-transition, someone else switching the
machine, another install's node)."""

from __future__ import annotations

from harness import PowerHarness
from powerfakes import BMC_SPEC, DISPATCHER

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.ownership import DISPATCHER_LABEL


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


async def test_demand_during_draining_aborts_the_shutdown_before_its_irreversible_step() -> None:
    async with PowerHarness(probe_interval=30.0) as h:
        h.answer_probe_requests = False  # the drain waits for the pool's next probe
        h.side_node("n1")
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Draining", within=200, what="Draining")
        assert h.status("n1")["admission"] == "Closed"
        h.queue("gpu-job", gpus=1)
        h.answer_probe_requests = True
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=200)
        assert not h.control.sent("n1", "GracefulShutdown"), h.dump()
        (intent,) = [i for i in h.intents("n1") if i["spec"]["action"] == "Shutdown"]
        status = intent["status"]
        assert status["phase"] == "Aborted", status.get("phase")
        assert status["safetyRecord"]["race"] is True
        assert "RACE_DEMAND_ARRIVED" in status["safetyRecord"]["reasons"]
        # admission reopened only after On and a passing ready probe were verified
        assert h.status("n1")["readiness"] == "Ready"
        assert h.state("n1") != "Off"


async def test_a_node_is_not_drained_while_the_dispatcher_holds_work_on_it() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        await h.start()
        h.queue("gpu-job", gpus=1)
        h.place("gpu-job", "n1")  # chosen for n1: its runner is not listed yet
        await h.run_for(200, tick=2.0)
        assert not h.control.requests
        assert h.state("n1") not in ("Draining", "ShuttingDown", "Off")
        assert "ACTIVE_WORK" in seen(h, "n1")
        h.finish("gpu-job")
        await h.run_until(lambda: h.state("n1") == "Off", within=300)


async def test_demand_after_the_request_finishes_the_shutdown_then_wakes() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", apply_delay=20.0)
        await h.start()
        await h.run_until(lambda: bool(h.control.requests), within=200)
        assert h.state("n1") == "ShuttingDown"
        h.queue("gpu-job", gpus=1, wake="n1")
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=300)
        assert [r.action for r in h.control.requests] == ["GracefulShutdown", "On"]
        shutdown, wake = sorted(h.intents("n1"), key=lambda i: i["spec"]["action"] != "Shutdown")
        assert shutdown["status"]["phase"] == "Succeeded"  # the irreversible step was taken
        assert wake["status"]["phase"] == "Succeeded"


async def test_a_bmc_that_stops_answering_leaves_stale_power_and_no_decision_to_act() -> None:
    async with PowerHarness() as h:
        host = h.side_node("n1")
        h.hosts["n1"].runners = 1
        await h.start()
        await h.run_for(10)
        host.bmc_answers = False
        host.runners = 0
        await h.run_for(200, tick=2.0)
        assert not h.control.requests
        assert "TELEMETRY_STALE" in seen(h, "n1"), h.history("n1")
        source = [c for c in h.status("n1")["conditions"] if c["type"] == "PowerSource"]
        assert source and source[0]["status"] == "False"
        assert any(e["reason"] == "PowerSourceError" for e in h.events("n1"))


async def test_a_replica_taking_over_mid_shutdown_never_sends_a_second_request() -> None:
    a = PowerHarness()
    a.side_node("n1", apply_delay=40.0)
    await a.start()
    await a.run_until(lambda: bool(a.control.requests), within=200)
    await a.ctrl.stop()  # replica A is gone while the BMC applies the reset
    await a.settle()
    async with PowerHarness(kube=a.kube, hosts=a.hosts, clock=a.clock) as b:
        await b.start()
        await b.run_until(lambda: b.state("n1") == "Off", within=200, what="B confirms Off")
        assert not b.control.requests, b.control.requests
        (intent,) = b.intents("n1")
        assert intent["status"]["phase"] == "Succeeded"
        assert intent["status"]["safetyRecord"]["confirmation"]["confirmed"]


async def test_a_replica_taking_over_mid_wake_never_sends_a_second_request() -> None:
    a = PowerHarness()
    a.side_node("n1", power="Off", apply_delay=40.0)
    await a.start()
    await a.run_until(lambda: a.state("n1") == "Off", within=60)
    a.queue("gpu-job", gpus=1, wake="n1")
    await a.run_until(lambda: bool(a.control.requests), within=100)
    await a.ctrl.stop()
    await a.settle()
    async with PowerHarness(kube=a.kube, hosts=a.hosts, clock=a.clock) as b:
        b.queue("gpu-job", gpus=1, wake="n1")
        await b.start()
        await b.run_until(lambda: b.status("n1").get("admission") == "Open", within=200)
        assert not b.control.requests, b.control.requests


async def test_someone_else_switching_the_machine_off_is_recorded_not_mistaken() -> None:
    async with PowerHarness() as h:
        host = h.side_node("n1", runners=1)
        await h.start()
        await h.run_for(10)
        host.power = "Off"  # a person at the BMC, not us
        await h.run_until(lambda: h.state("n1") == "Off", within=100)
        assert not h.control.requests
        assert "UNEXPECTED_POWER_CHANGE" in seen(h, "n1"), h.history("n1")


async def test_another_installs_node_is_never_acted_on() -> None:
    async with PowerHarness() as h:
        h.side_node("mine")
        h.hosts["theirs"] = h.hosts["mine"].__class__("theirs")
        h.put_node(
            "theirs",
            h.kube.objects[("WorkerNode", "ns", "mine")]["spec"],
            labels={DISPATCHER_LABEL: "other-" + DISPATCHER},
        )
        await h.start()
        await h.run_until(lambda: h.state("mine") == "Off", within=300)
        assert not h.control.sent("theirs")
        assert not h.intents("theirs")
        assert h.state("theirs") is None


async def test_a_second_node_on_a_claimed_bmc_is_refused_and_the_holder_served() -> None:
    async with PowerHarness() as h:
        h.side_node("holder")
        h.clock.advance(1)  # the newcomer is younger
        h.side_node("newcomer", spec={"bmc": {**BMC_SPEC, "systemId": "holder"}})
        await h.start()
        await h.run_until(lambda: h.state("holder") == "Off", within=300)
        valid = h.kube.condition(WORKER_NODE, "ns", "newcomer", "Valid")
        assert valid["status"] == "False" and "'holder'" in valid["message"], valid
        held = h.kube.condition(WORKER_NODE, "ns", "holder", "Valid")
        assert "newcomer" not in held.get("message", "")  # the holder is not refused
        assert not h.control.sent("newcomer")


async def test_a_node_created_a_moment_ago_exists_before_its_watch_event() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        await h.start()
        h.kube.put(WORKER_NODE, "ns", {"metadata": {"name": "fresh"}, "spec": {}})
        assert await h.ctrl.node_exists("fresh")  # a live GET, not the cache
        assert not await h.ctrl.node_exists("ghost")


async def test_demand_after_a_rejected_request_aborts_instead_of_resending() -> None:
    async with PowerHarness() as h:
        h.side_node("n1")
        h.control.answers["GracefulShutdown"] = ["rejected"]  # not applied: recoverable
        await h.start()
        await h.run_until(lambda: bool(h.control.requests), within=200)
        h.queue("gpu-job", gpus=1)
        (intent,) = [i for i in h.intents("n1") if i["spec"]["action"] == "Shutdown"]
        name = intent["metadata"]["name"]
        # cancelled at once (the host is recoverable), not at the re-send after the back-off
        await h.run_until(lambda: h.intent_status(name).get("phase") == "Aborted", within=3)
        await h.run_until(lambda: h.status("n1").get("admission") == "Open", within=200)
        assert len(h.control.sent("n1", "GracefulShutdown")) == 1, h.control.requests
        intent = next(i for i in h.intents("n1") if i["metadata"]["name"] == name)
        assert intent["status"]["safetyRecord"]["race"] is True


async def test_work_released_by_the_ledger_after_the_runner_was_seen_gone_is_stepped_at_once() -> (
    None
):
    # a streaming node reports its runner gone while the dispatcher still holds the
    # container (work = max(runners, ledger): still active); when the next plan lets go of
    # it, the node is idle from its last runner list, not at its next probe or heartbeat
    # (a list older than the hold does not count: the cycle in test_parity_live.py)
    async with PowerHarness(probe_interval=600.0) as h:
        h.answer_probe_requests = False  # no probe but the ones this test makes
        host = h.side_node("n1")
        host.runners = 1
        await h.start()
        h.queue("job", gpus=1)
        h.place("job", "n1")
        await h.run_until(lambda: h.state("n1") == "Active", within=30, what="Active")
        h.clock.advance(1.0)
        host.runners = 0
        h.probe("n1")  # the stream's line: no runner (the ledger still holds "job")
        await h.run_for(3)
        assert h.state("n1") == "Active", h.history("n1")
        h.finish("job")  # the dispatcher's plan: "job" is complete
        waited = await h.run_until(lambda: h.state("n1") == "Idle", within=5, what="Idle")
        assert waited <= 1.0, waited
