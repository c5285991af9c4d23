"""Shutdown path, in process: idle -> drain -> power off only on observed Off, and every
shutdown gate holding the node on (with its reason code, and nothing sent)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from harness import POLICY, PowerHarness
from powerfakes import T0

QUIET = 240.0
"""Fake seconds a gate must hold the node on (four idle thresholds)."""


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


async def test_an_idle_node_is_drained_then_switched_off_only_on_observed_off() -> None:
    async with PowerHarness() as h:
        host = h.side_node("n1")
        await h.start()
        early: list[str] = []

        def off() -> bool:
            if h.state("n1") == "Off" and host.power != "Off":
                early.append(str(h.clock()))
            return h.state("n1") == "Off"

        await h.run_until(off, within=400, what="n1 Off")
        assert not early, f"recorded Off before the BMC said so: {early}"
        decisions = [d for d, _ in h.history("n1")]
        assert decisions.index("DRAIN") < decisions.index("SHUTDOWN")
        assert ("SHUTDOWN", ("GATES_PASSED",)) in h.history("n1")
        assert ("NONE", ("POWER_OFF_CONFIRMED",)) in h.history("n1")
        (sent,) = h.control.requests
        assert sent.action == "GracefulShutdown"
        assert sent.persisted == "SHUTTING_DOWN"  # persisted before the request left
        assert sent.at - T0 >= timedelta(seconds=60)  # not before the idle threshold
        (intent,) = h.intents("n1")
        status = intent["status"]
        assert status["phase"] == "Succeeded"
        asked = status["requestRecord"]
        assert asked["decision"] == "SHUTDOWN" and asked["demandReread"] is True
        assert asked["drain"]["admission"] == "Closed" and asked["drain"]["drainComplete"]
        gates = {g["gate"]: g for g in asked["gates"]}
        for gate in ("demand", "work", "telemetry", "timing", "inhibitors", "capability"):
            assert gates[gate]["verdict"] == "PASS", (gate, list(gates))
        done = status["safetyRecord"]
        assert done["confirmation"]["confirmed"] and done["observed"]["power"] == "Off"
        assert done["proof"]["request"][0]["value"] == "GracefulShutdown"
        assert done["proof"]["actualState"][0]["source"].endswith("#PowerState")
        assert h.status("n1")["admission"] == "Closed"


def _demand(h: PowerHarness) -> None:
    h.queue("c-fits", vcpus=2, gpus=1)


def _work(h: PowerHarness) -> None:
    h.hosts["n1"].runners = 1


def _inhibitor(h: PowerHarness) -> None:
    h.hosts["n1"].inhibitors = ("backup-agent",)


def _no_graceful(h: PowerHarness) -> None:
    h.set_policy("default", **{**POLICY, "allowedActions": ["On"]})


def _unknown_capability(h: PowerHarness) -> None:
    h.hosts["n1"].allowable = None


def _identity(h: PowerHarness) -> None:
    h.hosts["n1"].host_uuid = "4c4c4544-0000-1000-8000-0000deadbeef"


def _min_on(h: PowerHarness) -> None:
    h.hosts["n1"].booted_at = T0 - timedelta(minutes=22)
    h.set_policy("default", **{**POLICY, "idleThreshold": "20s", "minOn": "30m"})


def _idle_threshold(h: PowerHarness) -> None:
    h.set_policy("default", **{**POLICY, "idleThreshold": "20m"})


def _desired_on(h: PowerHarness) -> None:
    h.edit_node("n1", power="On")


def _hold(h: PowerHarness) -> None:
    h.edit_node("n1", idleBehavior="hold")


def _min_warm(h: PowerHarness) -> None:
    h.set_policy("default", **{**POLICY, "minWarmNodes": 1})


def _paused(h: PowerHarness) -> None:
    h.set_policy("default", **{**POLICY, "paused": True})


GATES: dict[str, tuple[Callable[[PowerHarness], None], str, str | None]] = {
    # case: (set-up, reason code recorded, decision of the last record)
    "demand": (_demand, "DEMAND_PRESENT", None),
    "work": (_work, "ACTIVE_WORK", None),
    "inhibitor": (_inhibitor, "INHIBITOR_ACTIVE", "BLOCK"),
    "action-not-allowed": (_no_graceful, "ACTION_NOT_ALLOWED", "BLOCK"),
    "capability-unknown": (_unknown_capability, "POWER_CONTROL_UNAVAILABLE", "BLOCK"),
    "identity": (_identity, "IDENTITY_MISMATCH", "BLOCK"),
    "min-on": (_min_on, "MIN_ON_NOT_MET", "DEFER"),
    "idle-threshold": (_idle_threshold, "IDLE_WINDOW_NOT_MET", "DEFER"),
    "desired-on": (_desired_on, "DESIRED_ON", None),
    "hold": (_hold, "IDLE_BEHAVIOR_HOLD", None),
    "min-warm": (_min_warm, "MIN_WARM_NODES", None),
    "paused": (_paused, "POLICY_PAUSED", None),
}


@pytest.mark.parametrize("case", list(GATES))
async def test_each_shutdown_gate_keeps_an_idle_node_on(case: str) -> None:
    setup, code, decision = GATES[case]
    async with PowerHarness() as h:
        h.side_node("n1")
        setup(h)
        await h.start()
        await h.run_for(QUIET, tick=2.0)
        assert not h.control.sent("n1"), h.dump()
        assert h.state("n1") != "Off"
        assert code in seen(h, "n1"), (code, h.history("n1"))
        assert code in h.reasons("n1"), h.record("n1")
        if decision is not None:
            assert h.decision("n1") == decision, h.record("n1")


async def test_stale_telemetry_defers_and_never_counts_as_all_fine() -> None:
    async with PowerHarness() as h:
        host = h.side_node("n1")
        await h.start()
        await h.run_for(10)
        host.probe_fails = True  # seen once, then SSH stops answering
        await h.run_for(QUIET, tick=2.0)
        assert not h.control.sent("n1")
        assert "TELEMETRY_STALE" in h.reasons("n1") and h.decision("n1") == "DEFER"


async def test_an_inhibitor_block_is_a_blocked_policy_intent_with_its_record() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", inhibitors=("backup-agent",))
        await h.start()
        await h.run_for(QUIET, tick=2.0)
        blocked = [i for i in h.intents("n1") if i["status"].get("phase") == "Blocked"]
        assert len(blocked) == 1, [i["status"].get("phase") for i in h.intents("n1")]
        record: dict[str, Any] = blocked[0]["status"]["safetyRecord"]
        assert record["decision"] == "BLOCK" and "INHIBITOR_ACTIVE" in record["reasons"]
        assert record["inhibitors"]["inhibitors"][0]["who"] == "backup-agent"
        assert any(e["reason"] for e in h.events("n1") if "INHIBITOR_ACTIVE" in e["message"])


async def test_the_disruption_budget_holds_a_second_node_until_the_first_is_off() -> None:
    policy = {**POLICY, "disruptionBudget": {"maxConcurrentTransitions": 1}}
    async with PowerHarness(policy=policy) as h:
        h.side_node("n1", apply_delay=30.0)
        h.side_node("n2", apply_delay=30.0, runners=1)
        await h.start()
        await h.run_until(lambda: h.state("n1") == "ShuttingDown", within=200)
        h.hosts["n2"].runners = 0  # n2 falls idle while n1's transition is under way
        await h.run_until(lambda: h.state("n1") == "Off", within=200)
        assert not h.control.sent("n2")
        assert "DISRUPTION_BUDGET_EXHAUSTED" in seen(h, "n2"), h.history("n2")
        await h.run_until(lambda: h.state("n2") == "Off", within=300)


async def test_two_nodes_idle_in_the_same_round_stay_within_the_disruption_budget() -> None:
    policy = {**POLICY, "disruptionBudget": {"maxConcurrentTransitions": 1}}
    async with PowerHarness(policy=policy) as h:
        for name in ("n1", "n2"):
            h.side_node(name, apply_delay=30.0)
        await h.start()
        await h.run_until(lambda: len(h.control.requests) >= 1, within=200)
        first = h.control.requests[0]
        await h.run_for(20)
        assert [r.node for r in h.control.requests] == [first.node]


async def test_a_wake_on_lan_node_is_switched_off_over_ssh_learned_at_its_first_login() -> None:
    async with PowerHarness() as h:
        # the NIC allows only WakeOnLan; SshPoweroff is known once SSH logs in, not only
        # at the next capability rediscovery (ten minutes later)
        h.side_node("n1", method="WakeOnLan", bmc=True, allowable=("WakeOnLan",))
        await h.start()
        await h.run_until(lambda: h.state("n1") == "Off", within=300)
        assert [r.action for r in h.control.requests] == ["SshPoweroff"]
