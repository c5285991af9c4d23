"""Consolidation by drain in the live power controller, in process with a fake clock: a
lightly used dear node whose work fits elsewhere stops admitting (DRAIN, a Drain
PowerIntent with its Safety Record), within its own budget and not the transition
budget; the do-not-consolidate annotation on a node or a container keeps it; Shadow
records and does not drain; Off does nothing (`rules.consolidation`,
`power.consolidating`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness import POLICY, PowerHarness
from powerfakes import NS, container_uuid

from nodewarden.api.kinds import POWER_POLICY
from nodewarden.power.runtime import ControllerSettings, EnergyBook

CPU = {"vcpus": 16, "ram": "64Gi"}
DEAR, CHEAP = 4.0, 1.0


def _policy(mode: str, **consolidation: Any) -> dict[str, Any]:
    return {
        **POLICY,
        "consolidation": {
            "mode": mode,
            "consolidateAfter": "2m",
            "recheckAfter": "3m",
            "maxConcurrent": 1,
            **consolidation,
        },
    }


def _fleet(h: PowerHarness, dear: list[str], cheap: list[str], **meta: Any) -> None:
    """Dear nodes each run one 2-vCPU container (1/8 used), cheap ones five (5/8: not
    lightly used)."""
    for name in dear:
        h.side_node(name, spec={"capacity": CPU, "costPerHour": DEAR}, runners=1)
        h.queue(f"{name}-c0", vcpus=2, ram="2Gi")
        h.place(f"{name}-c0", name)
    for name in cheap:
        h.side_node(name, spec={"capacity": CPU, "costPerHour": CHEAP}, runners=5)
        for i in range(5):
            h.queue(f"{name}-c{i}", vcpus=2, ram="2Gi")
            h.place(f"{name}-c{i}", name)


def _drains(h: PowerHarness, phase: str | None = None) -> list[dict[str, Any]]:
    return [
        i
        for i in h.intents()
        if i["spec"]["action"] == "Drain"
        and i["spec"]["source"] == "Policy"
        and (phase is None or (i.get("status") or {}).get("phase") == phase)
    ]


def _admission(h: PowerHarness, name: str) -> str:
    return h.ctrl.nodes[name].state.admission.value


async def test_a_lightly_used_dear_node_is_drained_within_its_own_budget_then_goes_idle() -> None:
    policy = {**_policy("On"), "disruptionBudget": {"maxConcurrentTransitions": 1}}
    async with PowerHarness(policy=policy) as h:
        _fleet(h, ["dear-0", "dear-1"], ["cheap-0", "cheap-1"])
        h.side_node("spare", power="Off", spec={"capacity": CPU, "costPerHour": CHEAP})
        await h.start()
        await h.run_until(lambda: bool(_drains(h)), within=600, tick=5, what="a drain")
        (intent,) = _drains(h)
        node = intent["spec"]["nodeName"]
        other = ({"dear-0", "dear-1"} - {node}).pop()
        assert node in ("dear-0", "dear-1")
        status = intent["status"]
        assert status["phase"] == "InProgress"
        record = status["safetyRecord"]
        assert record["decision"] == "DRAIN" and record["reasons"] == ["CONSOLIDATION_DRAIN"]
        evidence = record["consolidation"]
        assert evidence["utilisation"] == 0.125 and evidence["hourlyPrice"] == DEAR
        assert evidence["pricePerUsed"] == 32.0
        assert set(evidence["targets"].values()) <= {"cheap-0", "cheap-1", other}
        assert evidence["targets"] and "1 of maxConcurrent 1" in evidence["budget"]
        assert _admission(h, node) in ("Closing", "Closed")
        assert h.decision(node) in ("DRAIN", "NONE")  # busy: it finishes what it runs
        # the budget holds the other dear node; the drain holds no transition: a wake
        # for demand goes ahead under maxConcurrentTransitions 1
        h.queue("burst", vcpus=16, ram="32Gi", wake="spare")
        await h.run_until(
            lambda: any(r.action == "On" and r.node == "spare" for r in h.control.requests),
            within=300,
            tick=5,
            what="the wake",
        )
        await h.run_until(lambda: h.state("spare") == "Idle", within=300, tick=5, what="up")
        h.place("burst", "spare")
        await h.run_for(600, tick=10)
        assert len(_drains(h)) == 1 and _admission(h, other) == "Open"
        assert _admission(h, node) == "Closed" and h.state(node) == "Active"
        # the policy in force shows the consolidation budget in use, apart from the
        # transition budget (issue 27)
        shown = h.kube.status(POWER_POLICY, NS, "default").get("inForce") or {}
        assert shown.get("consolidationBudget") == {"max": 1, "inUse": 1, "left": 0}, shown
        # its work ends: the drain Succeeded, the usual idle path switches it off, and the
        # budget lets the other dear node go next
        h.finish(f"{node}-c0")
        h.hosts[node].runners = 0
        await h.run_until(lambda: h.state(node) == "Off", within=600, tick=5, what="off")
        assert _drains(h, "Succeeded")[0]["spec"]["nodeName"] == node
        await h.run_until(lambda: len(_drains(h)) == 2, within=900, tick=10, what="2nd drain")
        assert _drains(h)[-1]["spec"]["nodeName"] == other


async def test_do_not_consolidate_on_a_node_or_a_container_keeps_it_open() -> None:
    async with PowerHarness(policy=_policy("On")) as h:
        _fleet(h, ["dear-0", "dear-1"], ["cheap-0", "cheap-1"])
        body = h.kube.objects[("WorkerNode", NS, "dear-0")]
        h.put_node("dear-0", body["spec"], annotations={"nodewarden.io/do-not-consolidate": "true"})
        uuid = container_uuid("dear-1-c0")
        h.containers[uuid] = replace(h.containers[uuid], do_not_consolidate=True)
        h.plan()
        await h.start()
        await h.run_for(900, tick=10)
        assert h.ctrl.consolidation.assessed >= 2  # they were looked at, and kept
        assert _drains(h) == []
        assert _admission(h, "dear-0") == "Open" and _admission(h, "dear-1") == "Open"
        # the annotation taken off the container: that node is drained
        h.containers[uuid] = replace(h.containers[uuid], do_not_consolidate=False, priority=501)
        await h.run_until(lambda: bool(_drains(h)), within=600, tick=10, what="a drain")
        assert [i["spec"]["nodeName"] for i in _drains(h)] == ["dear-1"]
        await h.run_until(lambda: _admission(h, "dear-1") == "Closed", within=120, tick=5)
        # the annotation put on the draining node: consolidation lets it go, admission
        # reopens (after a fresh verification) and its Drain intent is Aborted
        body = h.kube.objects[("WorkerNode", NS, "dear-1")]
        h.put_node("dear-1", body["spec"], annotations={"nodewarden.io/do-not-consolidate": "true"})
        await h.run_until(
            lambda: _admission(h, "dear-1") == "Open", within=300, tick=5, what="reopened"
        )
        assert h.ctrl.nodes["dear-1"].facts.consolidation is None
        await h.run_until(lambda: bool(_drains(h, "Aborted")), within=60, tick=5, what="aborted")


async def test_shadow_records_the_drain_and_does_not_drain_and_off_does_nothing() -> None:
    async with PowerHarness(policy=_policy("Shadow")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: bool(_drains(h)), within=600, tick=5, what="a record")
        await h.run_for(600, tick=10)
        (shadow,) = _drains(h)
        status = shadow["status"]
        assert status["phase"] == "Shadow"
        record = status["safetyRecord"]
        assert record["decision"] == "DRAIN"
        assert status["reasons"] == ["CONSOLIDATION_DRAIN", "SHADOW_MODE"]
        assert record["consolidation"]["utilisation"] == 0.125
        assert _admission(h, "dear-0") == "Open" and h.state("dear-0") == "Active"
        assert h.ctrl.nodes["dear-0"].facts.consolidation is None
    async with PowerHarness(policy=_policy("Off")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_for(900, tick=10)
        assert h.ctrl.consolidation.assessed == 0 and _drains(h) == []
        assert _admission(h, "dear-0") == "Open"


async def test_at_rest_nothing_is_assessed_and_a_change_assesses_only_its_node() -> None:
    """Counted, not timed: candidates are due times from the ledger's changes, never a
    scan per round."""
    policy = {**_policy("On"), "idleThreshold": "2h"}
    settings = ControllerSettings(
        power_poll_interval=15.0,
        power_poll_interval_at_rest=15.0,
        energy=EnergyBook(status_interval=3600.0),
    )
    async with PowerHarness(policy=policy, settings=settings) as h:
        h.plan_changes = True
        cheap = [f"cheap-{i}" for i in range(12)]
        _fleet(h, ["dear-0"], cheap)  # the cheap ones are 5/8 used: not candidates
        body = h.kube.objects[("WorkerNode", NS, "dear-0")]  # kept (a drain polls its node)
        h.put_node("dear-0", body["spec"], annotations={"nodewarden.io/do-not-consolidate": "true"})
        await h.start()
        await h.run_for(300, tick=5)  # every node's first due time (2 m) has come
        first = h.ctrl.consolidation.assessed
        assert first >= len(cheap) + 1  # each looked at once its work settled
        steps, writes = h.ctrl.steps, h.kube.writes
        await h.run_for(600, tick=10)
        assert h.ctrl.consolidation.assessed == first  # nothing due: nothing looked at
        assert h.ctrl.steps - steps == 0 and h.kube.writes - writes == 0
        assert _drains(h) == []
        # one container ends on cheap-3: that node alone is due again
        before = h.ctrl.consolidation.assessed
        h.finish("cheap-3-c0")
        h.hosts["cheap-3"].runners = 4
        await h.run_for(170, tick=10)
        assert 1 <= h.ctrl.consolidation.assessed - before <= 2


async def _restarted(h: PowerHarness, policy: dict[str, Any] | None = None) -> PowerHarness:
    """A second controller on `h`'s API objects, hosts and clock (the operator restarted:
    nothing of `h`'s memory), with the dispatcher's containers as they were."""
    await h.ctrl.stop()
    await h.settle()
    h.clock.advance(30)  # away for half a minute
    again = PowerHarness(policy=policy, kube=h.kube, hosts=h.hosts, clock=h.clock)
    again.containers.update(h.containers)
    if policy is not None:
        again.set_policy("default", **policy)
    return again


async def test_a_restart_keeps_a_consolidation_drain_closed_and_ends_its_intent() -> None:
    """A restarted operator resumes the drain it decided: the node stays closed to new
    work (never reopened, not even for a round), its Drain intent stays InProgress, and
    is Succeeded once its work ends and the usual idle path takes over."""
    async with PowerHarness(policy=_policy("On")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: _admission(h, "dear-0") == "Closed", within=600, tick=5)
        (intent,) = _drains(h, "InProgress")
        b = await _restarted(h)
    async with b:
        seen: set[str] = set()

        def watch() -> bool:
            seen.add(_admission(b, "dear-0"))
            seen.add(str(b.status("dear-0").get("admission")))
            return False

        b.recovering = True  # the dispatcher has not planned yet: no node's work is known
        await b.start()
        await b.run_until(lambda: watch() or b.ctrl.nodes["dear-0"].facts.ready is not None)
        await b.run_for(60, tick=5)
        assert len(_drains(b, "InProgress")) == 1  # not taken for drained meanwhile
        b.recovering = False
        await b.run_for(600, tick=10)
        watch()
        assert "Open" not in seen, seen
        assert b.board.admission_open("dear-0") is False
        assert b.ctrl.nodes["dear-0"].facts.consolidation is not None
        assert [i["metadata"]["name"] for i in _drains(b, "InProgress")] == [
            intent["metadata"]["name"]
        ], [(i["metadata"]["name"], i.get("status", {}).get("phase")) for i in _drains(b)]
        shown = b.kube.status(POWER_POLICY, NS, "default").get("inForce") or {}
        assert shown.get("consolidationBudget", {}).get("inUse") == 1, shown
        # its work ends: the intent Succeeded, the usual idle path switches it off
        b.finish("dear-0-c0")
        b.hosts["dear-0"].runners = 0
        await b.run_until(lambda: b.state("dear-0") == "Off", within=600, tick=5, what="off")
        (done,) = _drains(b)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert "work ended" in done["status"]["message"]


async def test_a_restart_with_the_lever_switched_off_reopens_and_aborts_the_drain() -> None:
    async with PowerHarness(policy=_policy("On")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: _admission(h, "dear-0") == "Closed", within=600, tick=5)
        b = await _restarted(h, policy=_policy("Off"))
    async with b:
        await b.start()
        await b.run_until(lambda: bool(_drains(b, "Aborted")), within=120, tick=5, what="aborted")
        (done,) = _drains(b)
        assert "consolidation.mode is Off" in done["status"]["message"], done["status"]
        await b.run_until(lambda: _admission(b, "dear-0") == "Open", within=300, tick=5)
        assert b.ctrl.nodes["dear-0"].facts.consolidation is None


async def test_restarts_in_shadow_do_not_record_the_same_would_be_drain_again() -> None:
    """A Shadow record's node, its work unchanged, is back in the Shadow budget after a
    restart and not recorded again (copies would push its other records out of the
    finished intents kept per node); once its work is new, it is recorded afresh."""
    async with PowerHarness(policy=_policy("Shadow")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: bool(_drains(h)), within=600, tick=5, what="a record")
        b = await _restarted(h)
    for _ in range(3):
        async with b:
            await b.start()
            await b.run_for(600, tick=10)
            assert len(_drains(b)) == 1, [i["metadata"]["name"] for i in _drains(b)]
            assert b.ctrl.consolidation.in_use() == {"default": 1}
            c = await _restarted(b)
        b = c
    async with b:
        await b.start()
        b.finish("dear-0-c0")  # new work on it: a new would-be drain
        b.queue("dear-0-c1", vcpus=2, ram="2Gi")
        b.place("dear-0-c1", "dear-0")
        await b.run_until(lambda: len(_drains(b)) == 2, within=900, tick=10, what="2nd")


async def test_queued_work_only_the_drained_node_can_run_lets_it_go() -> None:
    """The drain no longer holds once queued work that only this node could ever run
    waits (kept closed, the node would make it wait until its own work ends, or for ever
    once it is idle and that demand keeps it on); work that fits elsewhere does not undo
    it."""
    async with PowerHarness(policy=_policy("On")) as h:
        big = {"capacity": {"vcpus": 32, "ram": "128Gi"}, "costPerHour": 8.0}
        h.side_node("dear-0", spec=big, runners=1)
        h.queue("dear-0-c0", vcpus=2, ram="2Gi")
        h.place("dear-0-c0", "dear-0")
        _fleet(h, [], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: _admission(h, "dear-0") == "Closed", within=600, tick=5)
        # 12 vCPUs: no room now, but a cheap node's shape holds it -- the drain holds
        h.queue("mid", vcpus=12, ram="32Gi")
        await h.run_for(300, tick=10)
        assert _admission(h, "dear-0") == "Closed"
        assert _drains(h, "InProgress")
        # 24 vCPUs: only dear-0 could ever run it
        h.queue("huge", vcpus=24, ram="64Gi")
        await h.run_until(lambda: bool(_drains(h, "Aborted")), within=60, tick=5, what="let go")
        message = _drains(h)[0]["status"]["message"]
        assert "1 queued container(s) only this node can run wait" in message, message
        await h.run_until(lambda: _admission(h, "dear-0") == "Open", within=120, tick=5)
        assert "consolidation" not in h.power_state("dear-0")


async def test_a_restart_keeps_the_node_closed_before_its_drain_intent_is_read() -> None:
    """PowerIntents come on their own watch, possibly after the nodes and the first
    rounds: the node's stored state (`powerState.consolidation`) keeps it closed from the
    first step; the intent, once read, gives its evidence and is driven to its end."""
    async with PowerHarness(policy=_policy("On")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: _admission(h, "dear-0") == "Closed", within=600, tick=5)
        (intent,) = _drains(h, "InProgress")
        assert h.power_state("dear-0").get("consolidation") == intent["metadata"]["name"]
        b = await _restarted(h)
    async with b:
        real = b.ctrl.observe_intent
        b.ctrl.observe_intent = lambda body, deleted=False: None  # type: ignore[method-assign]
        await b.start()
        shown: set[str] = set()
        for _ in range(12):
            await b.run_for(5, tick=5)
            shown |= {_admission(b, "dear-0"), str(b.status("dear-0").get("admission"))}
        assert shown == {"Closed"}, shown
        b.ctrl.observe_intent = real  # type: ignore[method-assign]
        b.forget_seen("PowerIntent")
        await b.run_for(60, tick=5)
        reading = b.ctrl.nodes["dear-0"].facts.consolidation
        assert reading is not None and reading.utilisation == 0.125  # the record's evidence
        assert len(_drains(b, "InProgress")) == 1
        b.finish("dear-0-c0")
        b.hosts["dear-0"].runners = 0
        await b.run_until(lambda: b.state("dear-0") == "Off", within=600, tick=5, what="off")
        assert _drains(b)[0]["status"]["phase"] == "Succeeded"
        assert "consolidation" not in b.power_state("dear-0")


async def test_deleting_the_drain_intent_lets_the_node_go() -> None:
    async with PowerHarness(policy=_policy("On")) as h:
        _fleet(h, ["dear-0"], ["cheap-0", "cheap-1"])
        await h.start()
        await h.run_until(lambda: _admission(h, "dear-0") == "Closed", within=600, tick=5)
        (intent,) = _drains(h, "InProgress")
        body = h.kube.objects.pop(("PowerIntent", NS, intent["metadata"]["name"]))
        h.ctrl.observe_intent(body, deleted=True)  # a person deleted it: the watch says so
        await h.run_until(lambda: _admission(h, "dear-0") == "Open", within=300, tick=5)
        assert h.ctrl.nodes["dear-0"].facts.consolidation is None
        assert "consolidation" not in h.power_state("dear-0")
