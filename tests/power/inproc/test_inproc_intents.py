"""Manual PowerIntents, in process: a person's Shutdown / Wake passes the same gates as the
policy's, its phase tells where it is (Pending behind another, InProgress, Blocked,
Succeeded, Aborted), an override needs a verified requester and a policy that permits
it, and is audited; policy edits and Shadow mode show in the records."""

from __future__ import annotations

from harness import POLICY, PowerHarness


def seen(h: PowerHarness, node: str) -> set[str]:
    return {code for _, codes in h.history(node) for code in codes}


def phase(h: PowerHarness, name: str) -> str | None:
    return h.intent_status(name).get("phase")


SLOW = {**POLICY, "idleThreshold": "1h"}
"""A policy that would not switch the nodes off by itself within a test."""

OVERRIDE = {"override": {"inhibitors": True, "justification": "rack maintenance, ticket 4711"}}


async def test_a_manual_shutdown_succeeds_and_a_second_intent_waits_pending() -> None:
    async with PowerHarness(policy=SLOW) as h:
        h.side_node("n1", apply_delay=20.0)
        await h.start()
        await h.run_for(5)
        h.intent("off-1", "n1", "Shutdown")
        await h.run_until(lambda: bool(h.control.requests), within=120)
        h.intent("wake-1", "n1", "Wake")
        await h.run_for(4)
        assert phase(h, "off-1") == "InProgress"
        assert phase(h, "wake-1") == "Pending"
        await h.run_until(lambda: phase(h, "off-1") == "Succeeded", within=200)
        status = h.intent_status("off-1")
        assert status["safetyRecord"]["powerIntent"] == "off-1"
        assert status["safetyRecord"]["confirmation"]["confirmed"]
        await h.run_until(lambda: phase(h, "wake-1") == "Succeeded", within=300)
        assert [r.action for r in h.control.requests] == ["GracefulShutdown", "On"]


async def test_a_manual_shutdown_passes_the_same_gates_an_inhibitor_blocks_it() -> None:
    async with PowerHarness(policy=SLOW) as h:
        h.side_node("n1", inhibitors=("backup-agent",))
        await h.start()
        h.intent("off-1", "n1", "Shutdown")
        await h.run_until(lambda: phase(h, "off-1") == "Blocked", within=120)
        assert "INHIBITOR_ACTIVE" in h.intent_status("off-1")["reasons"]
        assert not h.control.requests


async def test_an_override_with_an_unverified_requester_is_never_honoured() -> None:
    policy = {**SLOW, "inhibitorOverride": {"permitted": True}}
    async with PowerHarness(policy=policy) as h:
        h.side_node("n1", inhibitors=("backup-agent",))
        await h.start()
        h.intent("off-1", "n1", "Shutdown", requester="mallory", **OVERRIDE)
        await h.run_for(60, tick=2.0)
        assert not h.control.requests
        assert "REQUESTER_UNVERIFIED" in seen(h, "n1"), h.history("n1")


async def test_an_override_where_the_policy_forbids_it_is_refused() -> None:
    async with PowerHarness(policy=SLOW) as h:
        h.side_node("n1", inhibitors=("backup-agent",))
        h.verify_requesters()
        await h.start()
        h.intent("off-1", "n1", "Shutdown", requester="alice", **OVERRIDE)
        await h.run_until(lambda: phase(h, "off-1") == "Blocked", within=120)
        assert "OVERRIDE_NOT_PERMITTED" in h.intent_status("off-1")["reasons"]
        assert not h.control.requests


async def test_a_permitted_override_by_a_verified_requester_is_applied_and_audited() -> None:
    policy = {**SLOW, "inhibitorOverride": {"permitted": True, "allowedRequesters": ["alice"]}}
    async with PowerHarness(policy=policy) as h:
        h.side_node("n1", inhibitors=("backup-agent",))
        h.verify_requesters()
        await h.start()
        h.intent("off-1", "n1", "Shutdown", requester="alice", **OVERRIDE)
        await h.run_until(lambda: phase(h, "off-1") == "Succeeded", within=300)
        record = h.intent_status("off-1")["requestRecord"]
        assert "OVERRIDE_APPLIED" in record["reasons"] or "OVERRIDE_APPLIED" in seen(h, "n1")
        text = str(record)
        assert "alice" in text and "ticket 4711" in text
        assert [r.action for r in h.control.requests] == ["GracefulShutdown"]


async def test_a_manual_shutdown_aborted_by_demand_while_draining() -> None:
    async with PowerHarness(policy=SLOW, probe_interval=30.0) as h:
        h.answer_probe_requests = False
        h.side_node("n1")
        await h.start()
        await h.run_for(5)
        h.intent("off-1", "n1", "Shutdown")
        await h.run_until(lambda: h.state("n1") == "Draining", within=120)
        h.queue("gpu-job", gpus=1)
        h.answer_probe_requests = True
        await h.run_until(lambda: phase(h, "off-1") in ("Aborted", "Blocked"), within=200)
        assert phase(h, "off-1") == "Aborted", h.intent_status("off-1")
        assert not h.control.requests


async def test_a_policy_edit_mid_transition_shows_the_new_version_in_later_records() -> None:
    async with PowerHarness() as h:
        h.side_node("n1", apply_delay=20.0)
        await h.start()
        await h.run_until(lambda: bool(h.control.requests), within=200)
        (intent,) = h.intents("n1")
        asked = h.intent_status(intent["metadata"]["name"])["requestRecord"]["policy"]
        h.set_policy("default", **{**POLICY, "idleThreshold": "90s"})
        await h.run_until(lambda: h.state("n1") == "Off", within=200)
        done = h.intent_status(intent["metadata"]["name"])["safetyRecord"]["policy"]
        assert asked["generation"] == 1 and done["generation"] == 2
        assert asked["contentHash"] != done["contentHash"]


async def test_shadow_mode_records_a_shadow_intent_and_acts_on_nothing() -> None:
    async with PowerHarness(policy={**POLICY, "mode": "Shadow"}) as h:
        h.side_node("n1")
        await h.start()
        await h.run_for(200, tick=2.0)
        assert not h.control.requests
        shadows = [i for i in h.intents("n1") if i["status"].get("phase") == "Shadow"]
        assert shadows, [i["status"].get("phase") for i in h.intents("n1")]
        assert "SHADOW_MODE" in shadows[0]["status"]["reasons"]
        assert h.status("n1")["admission"] == "Open"
