"""The Safety Record's fast construction equals a straightforward, fully validated one.

`build_record` assembles records from already-validated readings without re-running
pydantic validation (`nodewarden.policy.base.trusted`) and reads each input only once,
for speed. `reference_record` below rebuilds the same record with plain pydantic
constructors (validation on), written from docs/safety-record.md independently of
record.py. Over random walks through the state machine (every state, requests, retries,
overrides, races, cloud VMs, fleet readings) every step's record, and the record of a
bare shutdown and wake evaluation of every visited state, must equal the reference:
same values, same JSON, same one-line summary. The other fast paths of the gate code
(shared constant gate results, the positional Evaluation constructor, precomputed
policy values) are pinned here too.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_builders import (
    NOW,
    block_lock,
    capability,
    desired,
    idle_facts,
    intent,
    off_facts,
    off_state,
    on_state,
    policy,
)
from pydantic import BaseModel, ValidationError

from nodewarden.policy.actions import describe
from nodewarden.policy.base import require_aware, trusted
from nodewarden.policy.evaluation import Evaluation, Evidence, GateName, GateResult, Verdict
from nodewarden.policy.evaluation import new_evaluation as _evaluation
from nodewarden.policy.events import (
    AdmissionClosed,
    DeadlineReached,
    DemandReread,
    Evaluate,
    Event,
    ManualOverride,
    NewDemand,
    PolicyChanged,
    PowerObserved,
    ReadyProbeResult,
    RequestAccepted,
    RequestErrored,
    RequestRejected,
)
from nodewarden.policy.facts import (
    DemandReading,
    FleetReading,
    InhibitorReading,
    NodeFacts,
    PowerReading,
    ReadyReading,
    UptimeReading,
    WorkReading,
)
from nodewarden.policy.gateblocks import _DEFAULT_DESIRED_PASS, _FLEET_NOT_SUPPLIED
from nodewarden.policy.gates import evaluate_shutdown, evaluate_wake
from nodewarden.policy.machine import Step, step
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.record import (
    ControlEvidence,
    DrainEvidence,
    OverrideEvidence,
    Proof,
    RequestEvidence,
    SafetyRecord,
    StateConfirmation,
    TelemetryFreshness,
)
from nodewarden.policy.record_build import build_record, record_for_evaluation
from nodewarden.policy.state import AdmissionState, NodePowerState, Transition, TransitionKind
from nodewarden.policy.timing import timing_measures
from nodewarden.policy.view import PolicyView

POLICIES = [
    policy(),
    policy(
        idleThreshold="5m",
        minOn="10m",
        minOff="2m",
        cooldown="1m",
        telemetryMaxAge="30s",
        retry={"budget": 2, "initialBackoff": "5s", "maxBackoff": "1m"},
        allowedActions=["On", "GracefulShutdown", "ForceOff", "WakeOnLan", "SshPoweroff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True},
        billing={"period": "1h", "windowStart": "40m", "windowEnd": "55m"},
        disruptionBudget={"maxConcurrentTransitions": 2},
        minWarmNodes=1,
    ),
    policy(
        retry={"budget": 0},
        allowedActions=["On", "GracefulShutdown", "ForceOff"],
        inhibitorOverride={"permitted": True, "permitForceOff": True, "allowedRequesters": ["bob"]},
    ),
    policy(paused=True),
]


# -- the reference: plain, validated construction ----------------------------------------


def reference_record(
    *,
    before: NodePowerState,
    after: NodePowerState,
    facts: NodeFacts,
    event: str,
    now: datetime,
    pol: PolicyView,
    evaluation: Evaluation | None,
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    actions: tuple[str, ...],
    overrides_applied: tuple[str, ...],
    recheck_at: datetime | None,
) -> SafetyRecord:
    t = after.transition or before.transition
    req = t.request if t is not None else None
    power, ready, cap, demand, work = (
        facts.power,
        facts.ready,
        facts.capability,
        facts.demand,
        facts.work,
    )
    closed_since = after.admission_since if after.admission is AdmissionState.CLOSED else None

    requested: Literal["On", "Off"] | None = None
    if t is not None and t.kind is TransitionKind.SHUTDOWN:
        requested = "Off"
    elif t is not None and t.kind is TransitionKind.WAKE:
        requested = "On"

    if ready is None:
        readiness: Literal["Ready", "NotReady", "Unknown"] = "Unknown"
    elif not ready.passed:
        readiness = "NotReady"
    else:
        readiness = "Ready" if power is not None and power.power == "On" else "Unknown"

    if evaluation is not None:
        oldest, stale, missing = (
            evaluation.oldest_observed_at,
            evaluation.stale,
            evaluation.missing,
        )
    else:
        oldest, stale_l, missing_l = None, [], []
        for name in ("demand", "work", "power", "inhibitors"):
            reading = getattr(facts, name)
            if reading is None:
                missing_l.append(name)
            else:
                if oldest is None or reading.observed_at < oldest:
                    oldest = reading.observed_at
                if (now - reading.observed_at).total_seconds() > (
                    pol.telemetry_max_age.total_seconds()
                ):
                    stale_l.append(name)
        stale, missing = tuple(stale_l), tuple(missing_l)

    override = None
    it = facts.intent
    if it is not None and it.override is not None:
        ov = it.override
        override = OverrideEvidence(
            intent=it.name,
            requested_by=it.requested_by,
            requester_verified=it.requester_verified,
            justification=ov.justification,
            inhibitors=ov.inhibitors,
            force_off=ov.force_off,
            recorded_identity=ov.recorded_identity,
            permitted_by_policy=(
                (not pol.override_requesters or it.requested_by in pol.override_requesters)
                and (not ov.inhibitors or pol.override_permitted)
                and (not ov.force_off or pol.permit_force_off)
            ),
            applied=overrides_applied,
        )

    actual = []
    if power is not None:
        actual.append(Evidence("power", power.power, power.source, power.observed_at))
    if ready is not None:
        actual.append(
            Evidence("ready", "Pass" if ready.passed else "Fail", ready.source, ready.observed_at)
        )

    return SafetyRecord(
        node=facts.node,
        node_type=facts.node_type,
        power_intent=(t.intent or t.id) if t is not None else None,
        transition_id=t.id if t is not None else None,
        transition_kind=t.kind if t is not None else None,
        decided_at=now,
        event=event,
        state_before=before.state,
        state_after=after.state,
        decision=decision,
        reasons=reasons,
        desired=facts.desired,
        observed=power,
        readiness=readiness,
        ready_probe=ready,
        control=ControlEvidence(
            method=cap.control_method if cap is not None else None,
            allowable=cap.allowable if cap is not None else None,
            policy_allowed=tuple(sorted(pol.allowed_actions)),
            chosen_action=(
                req.action
                if req is not None
                else (evaluation.action if evaluation is not None else None)
            ),
            source=cap.source if cap is not None else None,
            observed_at=cap.observed_at if cap is not None else None,
        ),
        demand=demand,
        demand_reread=(
            demand is not None and closed_since is not None and demand.observed_at >= closed_since
        ),
        active_jobs=work,
        drain=DrainEvidence(
            admission=after.admission,
            admission_since=after.admission_since,
            drain_complete=(
                work is not None
                and closed_since is not None
                and work.observed_at >= closed_since
                and work.active_jobs == 0
            ),
        ),
        telemetry=TelemetryFreshness(
            oldest_observed_at=oldest,
            oldest_age_seconds=None if oldest is None else (now - oldest).total_seconds(),
            max_age_seconds=pol.telemetry_max_age.total_seconds(),
            stale=stale,
            missing=missing,
        ),
        timing=(
            evaluation.timing if evaluation is not None else timing_measures(facts, now, pol, after)
        ),
        inhibitors=facts.inhibitors,
        request=(
            RequestEvidence(
                action=req.action,
                attempt=req.attempt,
                requested_at=req.requested_at,
                result=req.status,
                result_at=req.result_at,
                result_source=req.source,
                detail=req.detail,
                deadline=t.deadline,
                retries_used=t.retries_used,
                retry_budget=pol.retry_budget,
                next_attempt_at=t.next_attempt_at,
                backoff_seconds=(
                    (t.next_attempt_at - req.result_at).total_seconds()
                    if t.next_attempt_at is not None and req.result_at is not None
                    else None
                ),
            )
            if t is not None and req is not None
            else None
        ),
        confirmation=StateConfirmation(
            requested=requested,
            observed=power.power if power is not None else None,
            source=power.source if power is not None else None,
            observed_at=power.observed_at if power is not None else None,
            confirmed=(
                requested is not None
                and t is not None
                and power is not None
                and power.power == requested
                and t.first_requested_at is not None
                and power.observed_at >= t.first_requested_at
            ),
        ),
        race=after.race,
        manual_override=override,
        policy=pol.version,
        gates=evaluation.gates if evaluation is not None else (),
        proof=Proof(
            request=(
                (
                    Evidence("requested", req.action, "nodewarden", req.requested_at),
                    Evidence("result", req.status.value, req.source or "-", req.result_at),
                )
                if req is not None
                else ()
            ),
            actual_state=tuple(actual),
        ),
        actions=actions,
        recheck_at=recheck_at if recheck_at is not None else after.recheck_at,
        deadline=after.deadline,
    )


def assert_same_record(fast: SafetyRecord, reference: SafetyRecord) -> None:
    assert fast == reference
    assert fast.to_status() == reference.to_status()
    assert list(fast.to_status()) == list(reference.to_status())  # key order too
    assert fast.summary() == reference.summary()
    assert_complete(fast)


RECORD_PARTS = (
    ControlEvidence,
    DrainEvidence,
    TelemetryFreshness,
    RequestEvidence,
    StateConfirmation,
    OverrideEvidence,
    Proof,
)


def assert_complete(model: BaseModel) -> None:
    """Built like pydantic builds it: every field in __dict__ (declaration order), no
    extras, no private attributes; the record's nested models too."""
    fields = list(type(model).model_fields)
    assert list(model.__dict__) == fields, type(model).__name__
    assert model.__pydantic_extra__ is None and model.__pydantic_private__ is None
    for name in fields:
        value = getattr(model, name)
        if isinstance(value, RECORD_PARTS):
            assert_complete(value)


def check_step(
    prev: NodePowerState, event: Event, result: Step, now: datetime, pol: PolicyView
) -> None:
    assert result.record is not None
    reference = reference_record(
        before=prev,
        after=result.next,
        facts=result.facts,
        event=event.type,
        now=now,
        pol=pol,
        evaluation=result.evaluation,
        decision=result.decision,
        reasons=result.reasons,
        actions=tuple(describe(a) for a in result.actions),
        overrides_applied=result.overrides_applied,
        recheck_at=None,
    )
    assert_same_record(result.record, reference)


def check_evaluations(
    state: NodePowerState, facts: NodeFacts, now: datetime, pol: PolicyView
) -> None:
    for evaluate in (evaluate_shutdown, evaluate_wake):
        ev = evaluate(facts, now, pol, state)
        assert ev == evaluate(facts, now, pol, state)  # same facts -> same evaluation
        reference = reference_record(
            before=state,
            after=state,
            facts=facts,
            event=f"evaluate-{ev.kind}",
            now=now,
            pol=pol,
            evaluation=ev,
            decision=ev.decision,
            reasons=ev.reasons,
            actions=(),
            overrides_applied=ev.overrides_applied,
            recheck_at=ev.recheck_at,
        )
        assert_same_record(record_for_evaluation(ev, facts, now, pol, state), reference)


# -- random walks ---------------------------------------------------------------------------


def _event(rng: random.Random, state: NodePowerState, now: datetime) -> Event:
    def ago(seconds: int) -> datetime:
        return now - timedelta(seconds=seconds)

    t = state.transition
    kind = rng.choice(
        ["evaluate"] * 4
        + ["closed", "reread", "new-demand", "power", "ready", "outcome", "outcome"]
        + ["deadline", "intent", "policy"]
    )
    if kind == "closed":
        return AdmissionClosed(at=ago(rng.choice([0, 1, 30])))
    if kind in ("reread", "new-demand"):
        reading = DemandReading(
            source="queue", observed_at=ago(rng.choice([0, 5, 300])), queued=rng.choice([0, 0, 2])
        )
        return DemandReread(reading=reading) if kind == "reread" else NewDemand(reading=reading)
    if kind == "power":
        value = rng.choice(["On", "Off", "Off", "PoweringOff", "Unknown"])
        return PowerObserved(
            reading=PowerReading(source="redfish", observed_at=ago(rng.choice([0, 3])), power=value)
        )
    if kind == "ready":
        reading = ReadyReading(source="probe", observed_at=now, passed=rng.random() < 0.7)
        return ReadyProbeResult(reading=reading)
    if kind == "outcome" and t is not None and t.request is not None:
        fields: dict[str, Any] = {
            "transition_id": t.id,
            "attempt": t.request.attempt,
            "action": t.request.action,
            "at": now,
            "source": "bmc",
            "detail": "HTTP 204",
        }
        cls = rng.choice([RequestAccepted, RequestAccepted, RequestRejected, RequestErrored])
        return cls(**fields)
    if kind == "deadline":
        return DeadlineReached()
    if kind == "intent":
        return ManualOverride(
            intent=rng.choice(
                [
                    None,
                    intent("Shutdown"),
                    intent("Shutdown", override_inhibitors=True),
                    intent("Shutdown", override_inhibitors=True, force_off=True),
                    intent("Shutdown", force_off=True, requested_by="bob"),
                    intent("Wake"),
                ]
            )
        )
    if kind == "policy":
        return PolicyChanged()
    return Evaluate()


def _healthy(rng: random.Random, facts: NodeFacts, now: datetime) -> NodeFacts:
    """Every decisive reading re-read now with benign values (sometimes a blocking lock)."""
    power_value = facts.power.power if facts.power is not None else "On"
    return facts.model_copy(
        update={
            "demand": DemandReading(source="queue", observed_at=now, queued=0),
            "work": WorkReading(
                source="probe",
                observed_at=now,
                active_jobs=0,
                idle_since=now - timedelta(seconds=rng.choice([60, 3600])),
            ),
            "inhibitors": InhibitorReading(
                source="logind",
                observed_at=now,
                inhibitors=(block_lock(),) if rng.random() < 0.2 else (),
            ),
            "power": PowerReading(source="redfish", observed_at=now, power=power_value),
            "uptime": UptimeReading(
                source="probe", observed_at=now, on_since=now - timedelta(hours=3)
            ),
        }
    )


def _refresh(rng: random.Random, facts: NodeFacts, now: datetime) -> NodeFacts:
    """Change some readings without an event (as the shell's adapters do)."""
    if rng.random() < 0.5:
        facts = _healthy(rng, facts, now)
    update: dict[str, Any] = {}
    if rng.random() < 0.1:
        update["work"] = WorkReading(source="probe", observed_at=now, active_jobs=1)
    if rng.random() < 0.1:
        update["capability"] = rng.choice(
            [
                capability(),
                capability("Redfish", ("On", "GracefulShutdown")),
                capability("Redfish", None),
                capability("WakeOnLan", ("WakeOnLan", "SshPoweroff")),
                None,
            ]
        )
    if rng.random() < 0.1:
        update["desired"] = rng.choice(
            [None, desired(), desired("On"), desired("Off"), desired("Auto", "hold")]
        )
    if rng.random() < 0.1:
        update["fleet"] = rng.choice(
            [
                None,
                FleetReading(
                    source="fleet",
                    observed_at=now,
                    transitions_in_progress=rng.choice([0, 3]),
                    warm_idle_nodes=rng.choice([0, 2]),
                ),
            ]
        )
    if rng.random() < 0.05:
        update["node_type"] = rng.choice(["SideNode", "CloudVM"])
    for name in ("demand", "ready", "uptime"):
        if rng.random() < 0.03:
            update[name] = None
    return facts.model_copy(update=update) if update else facts


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), start=st.sampled_from(["on", "off"]))
def test_every_record_equals_the_validated_reference_on_random_walks(seed: int, start: str) -> None:
    rng = random.Random(seed)
    pol = rng.choice(POLICIES)
    if start == "on":
        state, facts = on_state(), idle_facts()
    else:
        state, facts = off_state(), off_facts()
    now = NOW
    for _ in range(20):
        now += timedelta(seconds=rng.choice([1, 5, 61, 301, 1801]))
        facts = _refresh(rng, facts, now)
        if rng.random() < 0.3:
            # the usual way to a shutdown request: evaluate (drain), admission closed,
            # demand re-read; then maybe new demand (a race) or an outcome
            plan: list[Event] = [Evaluate(), AdmissionClosed(at=now + timedelta(seconds=1))]
            facts = _healthy(rng, facts, now)
        else:
            plan = [_event(rng, state, now)]
        for event in plan:
            if isinstance(event, PolicyChanged):
                pol = rng.choice(POLICIES)
            check_evaluations(state, facts, now, pol)
            result = step(state, facts, event, now, pol)
            check_step(state, event, result, now, pol)
            state, facts = result.next, result.facts
            now += timedelta(seconds=1)
        if len(plan) > 1:
            facts = _healthy(rng, facts, now)
            queued = rng.choice([0, 0, 0, 3])
            reading = DemandReading(source="queue", observed_at=now, queued=queued)
            for event in (DemandReread(reading=reading), _event(rng, state, now)):
                check_evaluations(state, facts, now, pol)
                result = step(state, facts, event, now, pol)
                check_step(state, event, result, now, pol)
                state, facts = result.next, result.facts
                now += timedelta(seconds=1)
    # nothing wrote to the gate results shared by all evaluations
    assert (
        GateResult(
            GateName.FLEET, Verdict.SKIPPED, (), (Evidence("fleet", "not supplied", "-", None),)
        )
        == _FLEET_NOT_SUPPLIED
    )
    assert (
        GateResult(
            GateName.DESIRED,
            Verdict.PASS,
            (),
            (Evidence("spec.power/idleBehavior", "Auto/run", "default (not supplied)"),),
        )
        == _DEFAULT_DESIRED_PASS
    )


def test_build_record_with_a_request_override_and_race_equals_the_reference() -> None:
    """A hand-made state with every optional part set (request with result and back-off,
    manual override, race flag, closed admission), recorded as a step."""
    pol = POLICIES[1]
    facts = idle_facts(intent=intent("Shutdown", override_inhibitors=True, force_off=True))
    drained = on_state(admission=AdmissionState.CLOSED, admission_since=NOW)
    first = step(on_state(), facts, Evaluate(), NOW, pol)
    assert first.next.transition is not None
    t = Transition.model_validate(
        {
            **first.next.transition.model_dump(),
            "request": {
                "action": "GracefulShutdown",
                "attempt": 2,
                "requested_at": NOW,
                "status": "Rejected",
                "result_at": NOW + timedelta(seconds=3),
                "source": "bmc",
                "detail": "HTTP 409",
            },
            "first_requested_at": NOW,
            "retries_used": 1,
            "next_attempt_at": NOW + timedelta(seconds=20),
        }
    )
    after = NodePowerState.model_validate(
        {**drained.model_dump(), "transition": t, "race": True, "state": "SHUTTING_DOWN"}
    )
    now = NOW + timedelta(seconds=5)
    kwargs: dict[str, Any] = {
        "before": drained,
        "after": after,
        "facts": facts,
        "event": "RequestRejected",
        "now": now,
        "evaluation": None,
        "decision": Decision.DEFER,
        "reasons": (ReasonCode.REQUEST_REJECTED, ReasonCode.BACKOFF),
        "actions": ("PollObservedPower",),
        "overrides_applied": ("inhibitors",),
        "recheck_at": None,
    }
    fast = build_record(policy=pol, **kwargs)
    assert fast.request is not None and fast.request.backoff_seconds == 17.0
    assert fast.manual_override is not None and fast.race
    assert_same_record(fast, reference_record(pol=pol, **kwargs))


# -- trusted() and the other fast paths ----------------------------------------------------


def test_trusted_builds_the_model_validation_builds() -> None:
    values = {"admission": AdmissionState.CLOSED, "admission_since": NOW, "drain_complete": True}
    fast = trusted(DrainEvidence, dict(values))
    validated = DrainEvidence(**values)
    assert fast == validated and fast.model_dump() == validated.model_dump()
    assert_complete(fast)
    with pytest.raises(ValidationError, match="frozen"):
        fast.drain_complete = False  # type: ignore[misc]  # frozen like any CoreModel


def test_trusted_rejects_missing_and_unknown_fields() -> None:
    with pytest.raises(TypeError, match=r"missing fields \['drain_complete'\]"):
        trusted(DrainEvidence, {"admission": AdmissionState.OPEN, "admission_since": None})
    with pytest.raises(TypeError, match=r"unknown fields \['extra'\]"):
        trusted(
            DrainEvidence,
            {
                "admission": AdmissionState.OPEN,
                "admission_since": None,
                "drain_complete": False,
                "extra": 1,
            },
        )


def test_positional_evaluation_constructor_maps_every_field() -> None:
    """_evaluation passes its keywords to Evaluation positionally: distinct values per
    field catch any two fields swapped."""
    values: dict[str, Any] = {
        "kind": "wake",
        "decision": Decision.DEFER,
        "reasons": (ReasonCode.COOLDOWN,),
        "gates": (_FLEET_NOT_SUPPLIED,),
        "action": "On",
        "recheck_at": NOW + timedelta(seconds=1),
        "overrides_applied": ("inhibitors",),
        "timing": (),
        "stale": ("demand",),
        "missing": ("work",),
        "oldest_observed_at": NOW - timedelta(seconds=2),
        "refresh": ("power",),
        "forced": True,
    }
    assert [f.name for f in dataclasses.fields(Evaluation)] == list(values)
    assert _evaluation(**values) == Evaluation(**values)


def test_policy_view_derived_values_follow_replace() -> None:
    view = POLICIES[1]
    evaluate_shutdown(idle_facts(), NOW, view, on_state())  # fills the memo
    assert view.memo
    assert view.seconds.cooldown == view.cooldown.total_seconds() == 60.0
    changed = dataclasses.replace(view, cooldown=timedelta(minutes=7), paused=True)
    assert changed.seconds.cooldown == 420.0 and changed.seconds.min_on == 600.0
    assert changed.memo == {}
    ev = evaluate_shutdown(idle_facts(), NOW, changed, on_state())
    assert ReasonCode.POLICY_PAUSED in ev.reasons
    assert ReasonCode.POLICY_PAUSED not in evaluate_shutdown(idle_facts(), NOW, view).reasons


def test_require_aware_accepts_any_timezone_and_rejects_naive_times() -> None:
    plus_two = NOW.astimezone(timezone(timedelta(hours=2)))
    assert require_aware(plus_two) is plus_two
    assert require_aware(NOW) is NOW
    with pytest.raises(ValueError, match="timezone-aware"):
        require_aware(NOW.replace(tzinfo=None))
    # the same instant in another zone gives the same evaluation
    assert evaluate_shutdown(idle_facts(), plus_two, POLICIES[0], on_state()) == (
        evaluate_shutdown(idle_facts(), NOW, POLICIES[0], on_state())
    )
