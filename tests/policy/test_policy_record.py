"""The Safety Record: every spec field, provenance, JSON for the status, the one-line summary."""

from __future__ import annotations

import json

from policy_builders import (
    NOW,
    accepted,
    at,
    block_lock,
    drive_to_shutting_down,
    idle_facts,
    inhibitors,
    intent,
    observed,
    on_state,
    policy,
)

from nodewarden.policy.gates import evaluate_shutdown
from nodewarden.policy.machine import step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.record import SafetyRecord, event_summary
from nodewarden.policy.record_build import record_for_evaluation

DEFAULT = policy()

# SPEC.md "Safety Record (minimum content)" -> the record field(s) that carry it.
SPEC_FIELDS = {
    "node id": ["node"],
    "power intent id": ["powerIntent"],
    "transition id": ["transitionId"],
    "desired / observed / readiness": ["desired", "observed", "readiness"],
    "control method and allowable actions": ["control"],
    "queued demand": ["demand"],
    "active job count": ["activeJobs"],
    "drain and admission state": ["drain"],
    "telemetry freshness": ["telemetry"],
    "idle / min-on / min-off / cooldown values and measurements": ["timing"],
    "inhibitors": ["inhibitors"],
    "request time, deadline, retry count, backoff": ["request"],
    "request result": ["request"],
    "state confirmation": ["confirmation"],
    "ready probe result": ["readyProbe"],
    "race flag": ["race"],
    "manual override": ["manualOverride"],
    "final decision": ["decision"],
    "reason codes": ["reasons"],
    "power policy version": ["policy"],
    "provenance": ["proof", "gates"],
}


def shutdown_record() -> SafetyRecord:
    pol = policy(inhibitorOverride={"permitted": True})
    facts = idle_facts(
        inhibitors=inhibitors(block_lock()), intent=intent("Shutdown", override_inhibitors=True)
    )
    *_, sent = drive_to_shutting_down(
        pol, **{"inhibitors": facts.inhibitors, "intent": facts.intent}
    )
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), pol)
    assert ack.record is not None
    return ack.record


def test_record_has_every_field_the_spec_lists() -> None:
    status = shutdown_record().to_status()
    for item, keys in SPEC_FIELDS.items():
        for key in keys:
            assert key in status, f"{item}: {key} missing from {sorted(status)}"
    request = status["request"]
    for key in ("requestedAt", "deadline", "retriesUsed", "retryBudget", "result", "resultAt"):
        assert key in request, key
    telemetry = status["telemetry"]
    assert {"oldestObservedAt", "oldestAgeSeconds", "maxAgeSeconds"} <= set(telemetry)
    timing = {m["name"] for m in status["timing"]}
    assert timing == {"idleThreshold", "minOn", "cooldown"}
    expected = policy(inhibitorOverride={"permitted": True}).version
    assert status["policy"] == {
        "name": "test-policy",
        "generation": 1,
        "contentHash": expected.content_hash,
    }
    assert expected.content_hash != DEFAULT.version.content_hash


def test_every_reading_carries_source_and_time() -> None:
    status = shutdown_record().to_status()
    for key in ("desired", "observed", "readyProbe", "demand", "activeJobs", "inhibitors"):
        assert status[key]["source"] and status[key]["observedAt"], key
    for gate in status["gates"]:
        for evidence in gate["evidence"]:
            assert evidence["source"], gate


def test_record_separates_request_proof_from_actual_state_proof() -> None:
    record = shutdown_record()
    request = {e.name: e for e in record.proof.request}
    assert request["requested"].value == "GracefulShutdown"
    assert request["result"].value == "Accepted" and request["result"].source == "redfish"
    actual = {e.name: e for e in record.proof.actual_state}
    assert actual["power"].value == "On" and actual["power"].source == "redfish"
    assert record.confirmation.requested == "Off" and record.confirmation.confirmed is False
    summary = record.summary()
    assert "request: GracefulShutdown #1 Accepted" in summary
    assert "actual: power On (redfish" in summary
    assert "\n" not in summary


def test_confirmed_off_record_shows_confirmation_from_trusted_source() -> None:
    pol = DEFAULT
    *_, sent = drive_to_shutting_down(pol)
    ack = step(sent.next, sent.facts, accepted(sent, 5), at(5), pol)
    off = step(ack.next, ack.facts, observed("Off", 40), at(40), pol)
    assert off.record is not None
    assert off.record.confirmation.confirmed and off.record.confirmation.observed == "Off"
    assert off.record.state_after.value == "OFF"
    assert "actual: power Off (redfish" in off.record.summary()


def test_override_is_recorded_with_requester_and_justification() -> None:
    record = shutdown_record()
    assert record.manual_override is not None
    assert record.manual_override.requested_by == "alice"
    assert record.manual_override.permitted_by_policy
    assert "INC-1234" in record.manual_override.justification


def test_override_applied_is_listed_on_the_request_step() -> None:
    pol = policy(inhibitorOverride={"permitted": True})
    *_, sent = drive_to_shutting_down(
        pol,
        inhibitors=inhibitors(block_lock()),
        intent=intent("Shutdown", override_inhibitors=True),
    )
    assert sent.record is not None and sent.record.manual_override is not None
    assert sent.record.manual_override.applied == ("inhibitors",)
    assert ReasonCode.OVERRIDE_APPLIED in sent.record.reasons
    assert "override inhibitors by alice" in sent.record.summary()


def test_to_status_is_json_and_round_trips() -> None:
    record = shutdown_record()
    status = record.to_status()
    text = json.dumps(status)
    assert "null" not in text
    again = SafetyRecord.model_validate(json.loads(text))
    assert again.to_status() == status
    assert again.summary() == record.summary()


def test_record_for_evaluation_and_event_summary() -> None:
    ev = evaluate_shutdown(
        idle_facts(inhibitors=inhibitors(block_lock())), NOW, DEFAULT, on_state()
    )
    record = record_for_evaluation(
        ev, idle_facts(inhibitors=inhibitors(block_lock())), NOW, DEFAULT, on_state()
    )
    assert record.decision is Decision.BLOCK and ReasonCode.INHIBITOR_ACTIVE in record.reasons
    assert len(record.gates) == len(ev.gates)
    summary = event_summary(record)
    assert summary.reason == "PowerBlocked" and summary.type == "Warning"
    assert summary.decision is Decision.BLOCK and ReasonCode.INHIBITOR_ACTIVE in summary.reasons
    assert summary.message == record.summary() and len(summary.message) <= 1024
    ok = event_summary(shutdown_record())
    assert ok.type == "Normal" and ok.reason == "PowerDeferred"


def test_record_contains_no_secret_like_material() -> None:
    """Records carry evidence, never credentials: nothing in the inputs is secret, and the
    record only copies readings, so a marker placed in a reading's detail shows where it goes."""
    status = json.dumps(shutdown_record().to_status())
    for word in ("password", "private_key", "token", "secret"):
        assert word not in status.lower()
