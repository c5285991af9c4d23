"""Building the Safety Record (`record.SafetyRecord`) of a step or of a bare evaluation.

    build_record(before=, after=, facts=, event=, now=, policy=, ...) -> SafetyRecord
    record_for_evaluation(evaluation, facts, now, policy, state) -> SafetyRecord
    same_decision(previous, ...) / reevaluated(previous, now)

`build_record` is called by the state machine at every step; `record_for_evaluation`
makes a record from a bare gate evaluation (explain, periodic checks).

Incremental records: both take the node's previous record (`previous`, a fact like any
other). When the decision is the same -- decision, reasons, state before and after,
admission, transition and its request, race flag, manual override, policy version,
chosen action, every gate's verdict and the set of stale or missing readings
(`same_decision`) -- and the step opened, closed
or requested nothing, the result is the previous record with `evaluatedAt` set to the new
evaluation time (`reevaluated`); only a changed decision costs a full record. A full
record never carries `evaluatedAt`, so its content is exactly what it always was.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from nodewarden.api.powerpolicy import ResetAction
from nodewarden.api.workernode import ControlMethod, ObservedPower, Readiness
from nodewarden.policy.base import trusted
from nodewarden.policy.evaluation import Evaluation, Evidence, GateResult
from nodewarden.policy.facts import (
    CapabilityReading,
    DemandReading,
    ManualIntent,
    NodeFacts,
    PowerReading,
    ReadyReading,
    WorkReading,
)
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.record import (
    SCHEMA,
    ControlEvidence,
    DrainEvidence,
    OverrideEvidence,
    Proof,
    RequestEvidence,
    SafetyRecord,
    StateConfirmation,
    TelemetryFreshness,
)
from nodewarden.policy.state import (
    AdmissionState,
    NodePowerState,
    PowerRequest,
    Transition,
    TransitionKind,
)
from nodewarden.policy.timing import timing_measures
from nodewarden.policy.view import PolicyView

_DECISIVE = ("demand", "work", "power", "inhibitors")


def _telemetry(
    now: datetime,
    policy: PolicyView,
    oldest: datetime | None,
    stale: tuple[str, ...],
    missing: tuple[str, ...],
) -> TelemetryFreshness:
    return trusted(
        TelemetryFreshness,
        {
            "oldest_observed_at": oldest,
            "oldest_age_seconds": None if oldest is None else (now - oldest).total_seconds(),
            "max_age_seconds": policy.seconds.telemetry_max_age,
            "stale": stale,
            "missing": missing,
        },
    )


def _decisive_freshness(
    facts: NodeFacts, now: datetime, max_age: float
) -> tuple[datetime | None, tuple[str, ...], tuple[str, ...]]:
    """The oldest decisive reading's time, the stale and the missing ones (a step
    without a gate evaluation)."""
    oldest: datetime | None = None
    stale: list[str] = []
    missing: list[str] = []
    for name in _DECISIVE:
        reading = getattr(facts, name)
        if reading is None:
            missing.append(name)
            continue
        at = reading.observed_at
        if oldest is None or at < oldest:
            oldest = at
        if (now - at).total_seconds() > max_age:
            stale.append(name)
    return oldest, tuple(stale), tuple(missing)


def _request_evidence(
    transition: Transition, req: PowerRequest, policy: PolicyView
) -> RequestEvidence:
    """The transition's latest request (`req`) with its deadline, retries and back-off."""
    backoff = None
    if transition.next_attempt_at is not None and req.result_at is not None:
        backoff = (transition.next_attempt_at - req.result_at).total_seconds()
    return trusted(
        RequestEvidence,
        {
            "action": req.action,
            "attempt": req.attempt,
            "requested_at": req.requested_at,
            "result": req.status,
            "result_at": req.result_at,
            "result_source": req.source,
            "detail": req.detail,
            "deadline": transition.deadline,
            "retries_used": transition.retries_used,
            "retry_budget": policy.retry_budget,
            "next_attempt_at": transition.next_attempt_at,
            "backoff_seconds": backoff,
        },
    )


def _override(
    intent: ManualIntent, policy: PolicyView, applied: tuple[str, ...]
) -> OverrideEvidence:
    """The override a manual intent carries (`intent.override` is not None)."""
    ov = intent.override
    assert ov is not None
    requester_ok = (
        not policy.override_requesters or intent.requested_by in policy.override_requesters
    )
    permitted = requester_ok and (
        (not ov.inhibitors or policy.override_permitted)
        and (not ov.force_off or policy.permit_force_off)
    )
    return trusted(
        OverrideEvidence,
        {
            "intent": intent.name,
            "requested_by": intent.requested_by,
            "requester_verified": intent.requester_verified,
            "justification": ov.justification,
            "inhibitors": ov.inhibitors,
            "force_off": ov.force_off,
            "recorded_identity": ov.recorded_identity,
            "permitted_by_policy": permitted,
            "applied": applied,
        },
    )


_CLOSED = AdmissionState.CLOSED  # bound once: Enum class attribute reads are slow on 3.11
_REQUESTED_POWER: dict[TransitionKind, Literal["On", "Off"]] = {
    TransitionKind.SHUTDOWN: "Off",
    TransitionKind.WAKE: "On",
}


def build_record(
    *,
    before: NodePowerState,
    after: NodePowerState,
    facts: NodeFacts,
    event: str,
    now: datetime,
    policy: PolicyView,
    evaluation: Evaluation | None,
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    actions: tuple[str, ...],
    overrides_applied: tuple[str, ...] = (),
    recheck_at: datetime | None = None,
) -> SafetyRecord:
    """The Safety Record of one step (or one evaluation when before is after).

    `recheck_at` defaults to the recheck time of `after`."""
    # Each model field is read once, from the model's __dict__: a pydantic attribute read
    # costs ~4x a dict subscript on 3.11 (BaseModel.__getattr__ turns off the attribute
    # cache), and a record reads ~25.
    f = facts.__dict__
    a = after.__dict__
    after_transition: Transition | None = a["transition"]
    transition = after_transition or before.transition
    cap: CapabilityReading | None = f["capability"]
    power: PowerReading | None = f["power"]
    ready: ReadyReading | None = f["ready"]
    demand: DemandReading | None = f["demand"]
    work: WorkReading | None = f["work"]
    intent: ManualIntent | None = f["intent"]
    admission: AdmissionState = a["admission"]
    admission_since: datetime | None = a["admission_since"]
    closed_since = admission_since if admission is _CLOSED else None
    demand_reread = (
        demand is not None and closed_since is not None and demand.observed_at >= closed_since
    )
    drain_complete = (
        work is not None
        and closed_since is not None
        and work.observed_at >= closed_since
        and work.active_jobs == 0
    )

    # what trusted sources observed (the actual state)
    observed: ObservedPower | None = None
    power_source: str | None = None
    power_seen: datetime | None = None
    actual: tuple[Evidence, ...] = ()
    if power is not None:
        p = power.__dict__
        observed, power_source, power_seen = p["power"], p["source"], p["observed_at"]
        actual = (Evidence("power", observed, power_source, power_seen),)
    readiness: Readiness = "Unknown"
    if ready is not None:
        r = ready.__dict__
        ready_passed: bool = r["passed"]
        actual = (
            *actual,
            Evidence("ready", "Pass" if ready_passed else "Fail", r["source"], r["observed_at"]),
        )
        # Ready only with a passing ready probe and observed power On
        if not ready_passed:
            readiness = "NotReady"
        elif observed == "On":
            readiness = "Ready"

    # the transition in progress: what it asked for, whether power confirms it
    power_intent: str | None = None
    transition_id: str | None = None
    transition_kind: TransitionKind | None = None
    requested: Literal["On", "Off"] | None = None
    confirmed = False
    request_ev: RequestEvidence | None = None
    proof_request: tuple[Evidence, ...] = ()
    chosen = evaluation.action if evaluation is not None else None
    if transition is not None:
        power_intent = transition.intent or transition.id
        transition_id = transition.id
        transition_kind = transition.kind
        requested = _REQUESTED_POWER.get(transition_kind)
        if requested is not None and power_seen is not None:
            since = transition.first_requested_at
            confirmed = observed == requested and since is not None and power_seen >= since
        request = transition.request
        if request is not None:
            request_ev = _request_evidence(transition, request, policy)
            proof_request = (
                Evidence("requested", request_ev.action, "nodewarden", request_ev.requested_at),
                Evidence(
                    "result",
                    request_ev.result.value,
                    request_ev.result_source or "-",
                    request_ev.result_at,
                ),
            )
            chosen = request.action

    # how the node's power is controlled (discovered capability)
    method: ControlMethod | None = None
    allowable: tuple[ResetAction, ...] | None = None
    cap_source: str | None = None
    cap_seen: datetime | None = None
    if cap is not None:
        k = cap.__dict__
        method, allowable, cap_source, cap_seen = (
            k["control_method"],
            k["allowable"],
            k["source"],
            k["observed_at"],
        )

    if evaluation is not None:
        telemetry = _telemetry(
            now, policy, evaluation.oldest_observed_at, evaluation.stale, evaluation.missing
        )
        timing = evaluation.timing
        gates = evaluation.gates
    else:
        max_age = policy.seconds.telemetry_max_age
        telemetry = _telemetry(now, policy, *_decisive_freshness(facts, now, max_age))
        timing = timing_measures(facts, now, policy, after)
        gates = ()
    return trusted(
        SafetyRecord,
        {
            "schema_version": SCHEMA,
            "node": f["node"],
            "node_type": f["node_type"],
            "power_intent": power_intent,
            "transition_id": transition_id,
            "transition_kind": transition_kind,
            "decided_at": now,
            "event": event,
            "state_before": before.state,
            "state_after": a["state"],
            "decision": decision,
            "reasons": reasons,
            "desired": f["desired"],
            "observed": power,
            "readiness": readiness,
            "ready_probe": ready,
            "control": trusted(
                ControlEvidence,
                {
                    "method": method,
                    "allowable": allowable,
                    "policy_allowed": policy.allowed_sorted,
                    "chosen_action": chosen,
                    "source": cap_source,
                    "observed_at": cap_seen,
                },
            ),
            "demand": demand,
            "demand_reread": demand_reread,
            "active_jobs": work,
            "drain": trusted(
                DrainEvidence,
                {
                    "admission": admission,
                    "admission_since": admission_since,
                    "drain_complete": drain_complete,
                },
            ),
            "telemetry": telemetry,
            "timing": timing,
            "inhibitors": f["inhibitors"],
            "request": request_ev,
            "confirmation": trusted(
                StateConfirmation,
                {
                    "requested": requested,
                    "observed": observed,
                    "source": power_source,
                    "observed_at": power_seen,
                    "confirmed": confirmed,
                },
            ),
            "race": a["race"],
            "manual_override": None
            if intent is None or intent.override is None
            else _override(intent, policy, overrides_applied),
            "policy": policy.version,
            "gates": gates,
            "proof": trusted(Proof, {"request": proof_request, "actual_state": actual}),
            "actions": actions,
            "recheck_at": recheck_at if recheck_at is not None else a["recheck_at"],
            "deadline": after_transition.deadline if after_transition is not None else None,
            "evaluated_at": None,
            "energy": None,
            "consolidation": facts.consolidation,
        },
    )


def same_decision(
    previous: SafetyRecord,
    *,
    before: NodePowerState,
    after: NodePowerState,
    facts: NodeFacts,
    now: datetime,
    policy: PolicyView,
    evaluation: Evaluation | None,
    decision: Decision,
    reasons: tuple[ReasonCode, ...],
    overrides_applied: tuple[str, ...] = (),
) -> bool:
    """Whether a step with these outcomes reaches the decision `previous` records, on the
    same gate verdicts (see the module docstring). Cheap: no record is built."""
    d = previous.__dict__  # one dict, read by key (pydantic attribute reads are slower)
    if (
        d["decision"] is not decision
        or d["state_after"] is not after.state
        or d["state_before"] is not before.state
        or d["reasons"] != reasons
        or d["race"] != after.race
        or d["node"] != facts.node
        or d["drain"].admission is not after.admission
        or d["consolidation"] is not facts.consolidation
    ):
        return False
    version = policy.version
    if d["policy"] is not version and d["policy"] != version:
        return False
    transition = after.transition or before.transition
    chosen = evaluation.action if evaluation is not None else None
    prev_request: RequestEvidence | None = d["request"]
    if transition is None:
        if d["transition_id"] is not None or prev_request is not None:
            return False
    else:
        request = transition.request
        if request is not None:
            chosen = request.action
            if (
                prev_request is None
                or prev_request.attempt != request.attempt
                or prev_request.result is not request.status
                or prev_request.retries_used != transition.retries_used
            ):
                return False
        elif prev_request is not None:
            return False
        deadline = after.transition.deadline if after.transition is not None else None
        if d["transition_id"] != transition.id or d["deadline"] != deadline:
            return False
    if d["control"].chosen_action != chosen:
        return False
    override: OverrideEvidence | None = d["manual_override"]
    intent = facts.intent
    if override is None:
        if intent is not None and intent.override is not None:
            return False
    elif intent is None or override.intent != intent.name or override.applied != overrides_applied:
        return False
    telemetry: TelemetryFreshness = d["telemetry"]
    stale: tuple[str, ...]
    missing: tuple[str, ...]
    if evaluation is not None:
        stale, missing = evaluation.stale, evaluation.missing
    else:
        _, stale, missing = _decisive_freshness(facts, now, policy.seconds.telemetry_max_age)
    if telemetry.stale != stale or telemetry.missing != missing:
        return False  # the same verdicts on other readings: time made another one stale
    gates = evaluation.gates if evaluation is not None else ()
    prev_gates: tuple[GateResult, ...] = d["gates"]
    if len(gates) != len(prev_gates):
        return False
    for new, old in zip(gates, prev_gates, strict=True):
        if new.verdict is not old.verdict or new.gate is not old.gate:
            return False
    return True


def reevaluated(previous: SafetyRecord, now: datetime) -> SafetyRecord:
    """`previous` with `evaluated_at` = `now` (the same decision, evaluated again)."""
    return trusted(SafetyRecord, {**previous.__dict__, "evaluated_at": now})


_EVALUATION_EVENT = {"shutdown": "evaluate-shutdown", "wake": "evaluate-wake"}


def record_for_evaluation(
    evaluation: Evaluation,
    facts: NodeFacts,
    now: datetime,
    policy: PolicyView,
    state: NodePowerState,
    previous: SafetyRecord | None = None,
) -> SafetyRecord:
    """A record of a bare evaluation (no transition made): state before == after.
    With the node's `previous` record and the same decision: `previous` re-evaluated."""
    if previous is not None and same_decision(
        previous,
        before=state,
        after=state,
        facts=facts,
        now=now,
        policy=policy,
        evaluation=evaluation,
        decision=evaluation.decision,
        reasons=evaluation.reasons,
        overrides_applied=evaluation.overrides_applied,
    ):
        return reevaluated(previous, now)
    return build_record(
        before=state,
        after=state,
        facts=facts,
        event=_EVALUATION_EVENT[evaluation.kind],
        now=now,
        policy=policy,
        evaluation=evaluation,
        decision=evaluation.decision,
        reasons=evaluation.reasons,
        actions=(),
        overrides_applied=evaluation.overrides_applied,
        recheck_at=evaluation.recheck_at,
    )
