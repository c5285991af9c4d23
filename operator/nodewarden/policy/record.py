"""The Safety Record: the evidence behind one power decision, with provenance.

`SafetyRecord` (a frozen pydantic model) carries every field SPEC.md lists: node,
power intent and transition ids; desired / observed power and readiness; control
method and allowable actions; queued demand; active jobs; drain and admission state;
telemetry freshness (timestamp, age, max age); idle / min-on / min-off / cooldown
values and measurements; inhibitors; request time, deadline, retry count, back-off;
request result; state confirmation; ready probe result; race flag; manual override;
final decision and reason codes; the policy version; and provenance: every reading
carries `source` and `observedAt`, and `proof` separates the evidence that proves the
*request* (what the controller accepted) from the evidence that proves the *actual
state* (what a trusted source observed).

    record.to_status()  -> dict   JSON (camelCase) for PowerIntent status.safetyRecord
    record.summary()    -> str    one line for Events and WorkerNode
                                  status.lastSafetyRecord.summary
    event_summary(record) -> EventSummary   reason / type / decision / codes for an Event

Built by `nodewarden.policy.record_build` (`build_record(...)` at every state-machine
step, `record_for_evaluation(...)` from a bare gate evaluation); this module is the
model and its rendering. The format is documented field by field in
docs/safety-record.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime

from nodewarden.api.workernode import NodeType, ObservedPower, Readiness
from nodewarden.policy.base import CoreModel
from nodewarden.policy.evaluation import Evidence, GateResult, TimingMeasure
from nodewarden.policy.facts import (
    ConsolidationReading,
    DemandReading,
    DesiredReading,
    InhibitorReading,
    PowerReading,
    ReadyReading,
    WorkReading,
)
from nodewarden.policy.reasons import Decision, ReasonCode
from nodewarden.policy.state import (
    AdmissionState,
    PowerState,
    RequestStatus,
    TransitionKind,
)
from nodewarden.policy.view import PolicyVersion

SCHEMA: Literal["nodewarden.io/v1alpha1/SafetyRecord"] = "nodewarden.io/v1alpha1/SafetyRecord"


class TelemetryFreshness(CoreModel):
    """Freshness of the decisive readings: the oldest one, its age, the limit."""

    oldest_observed_at: AwareDatetime | None = None
    oldest_age_seconds: float | None = None
    max_age_seconds: float
    stale: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


class DrainEvidence(CoreModel):
    """Admission and drain progress."""

    admission: AdmissionState
    admission_since: AwareDatetime | None = None
    drain_complete: bool


class ControlEvidence(CoreModel):
    """Control method, what the node allows (discovered), what the policy allows."""

    method: str | None = None
    allowable: tuple[str, ...] | None = None
    policy_allowed: tuple[str, ...]
    chosen_action: str | None = None
    source: str | None = None
    observed_at: AwareDatetime | None = None


class RequestEvidence(CoreModel):
    """The latest power request: when, what, its result, deadline, retries and back-off."""

    action: str
    attempt: int
    requested_at: AwareDatetime
    result: RequestStatus
    result_at: AwareDatetime | None = None
    result_source: str | None = None
    detail: str
    deadline: AwareDatetime | None = None
    retries_used: int
    retry_budget: int
    next_attempt_at: AwareDatetime | None = None
    backoff_seconds: float | None = None


class StateConfirmation(CoreModel):
    """Whether a trusted observation confirms the requested power state."""

    requested: Literal["On", "Off"] | None = None
    observed: ObservedPower | None = None
    source: str | None = None
    observed_at: AwareDatetime | None = None
    confirmed: bool


class OverrideEvidence(CoreModel):
    """The manual intent's override, whether the policy permits it, and what it passed."""

    intent: str
    requested_by: str
    requester_verified: bool = False
    """requested_by is the user the API server authenticated (the requester admission
    policy, which also checked the powerintents/override permission, was in force)."""
    justification: str
    inhibitors: bool
    force_off: bool
    recorded_identity: bool = False
    permitted_by_policy: bool
    applied: tuple[str, ...]


class EnergyEvidence(CoreModel):
    """Not a gate: what a side node's off period is expected to save (the record of the
    decision to shut it down) or saved (the record of the transition that ended it),
    against never switching it off (docs/energy.md)."""

    kind: Literal["Expected", "Measured"]
    off_seconds: float
    off_seconds_basis: str
    idle_watts: float
    idle_basis: Literal["Measured", "Configured"]
    off_watts: float
    off_basis: Literal["Measured", "Configured"]
    cycle_joules: float
    saved_kwh: float
    money_saved: float
    currency: str | None = None


class Proof(CoreModel):
    """Evidence that proves the request vs evidence that proves the actual state."""

    request: tuple[Evidence, ...]
    actual_state: tuple[Evidence, ...]


class SafetyRecord(CoreModel):
    """Evidence for one power decision. See docs/safety-record.md."""

    schema_version: Literal["nodewarden.io/v1alpha1/SafetyRecord"] = SCHEMA
    node: str
    node_type: NodeType
    power_intent: str | None = None
    transition_id: str | None = None
    transition_kind: TransitionKind | None = None
    decided_at: AwareDatetime
    event: str
    state_before: PowerState
    state_after: PowerState
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    desired: DesiredReading | None = None
    observed: PowerReading | None = None
    readiness: Readiness
    ready_probe: ReadyReading | None = None
    control: ControlEvidence
    demand: DemandReading | None = None
    demand_reread: bool
    active_jobs: WorkReading | None = None
    drain: DrainEvidence
    telemetry: TelemetryFreshness
    timing: tuple[TimingMeasure, ...]
    inhibitors: InhibitorReading | None = None
    request: RequestEvidence | None = None
    confirmation: StateConfirmation
    race: bool
    manual_override: OverrideEvidence | None = None
    policy: PolicyVersion
    gates: tuple[GateResult, ...]
    proof: Proof
    actions: tuple[str, ...]
    recheck_at: AwareDatetime | None = None
    deadline: AwareDatetime | None = None
    evaluated_at: AwareDatetime | None = None
    """The latest evaluation that reached this same decision (absent on the record of
    the step that made it); the evidence above is as of `decided_at`."""
    energy: EnergyEvidence | None = None
    """The saving an off period is expected to bring or brought (side nodes; set by the
    shell from the node's energy meter, never read by a gate)."""
    consolidation: ConsolidationReading | None = None
    """Consolidation by drain chose this node: utilisation, price, price per used share,
    where its work could go (`rules.consolidation`)."""

    def to_status(self) -> dict[str, Any]:
        """JSON-ready dict (camelCase, no nulls) for PowerIntent status.safetyRecord."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return data

    def summary(self) -> str:
        """One line: decision, reasons, state change, request proof, actual-state proof."""
        parts = [
            f"{self.node} {self.decision.value} [{','.join(r.value for r in self.reasons)}]",
            f"{self.state_before.value}->{self.state_after.value}",
        ]
        req = self.request
        if req is not None:
            parts.append(f"request: {req.action} #{req.attempt} {req.result.value}")
        else:
            parts.append("request: none")
        actual = ", ".join(
            f"{e.name} {e.value} ({e.source}, {_age(self.decided_at, e.at)})"
            for e in self.proof.actual_state
        )
        parts.append(f"actual: {actual or 'no observation'}")
        parts.append(f"admission {self.drain.admission.value}")
        if self.race:
            parts.append("RACE")
        if self.manual_override is not None and self.manual_override.applied:
            parts.append(
                f"override {'+'.join(self.manual_override.applied)} by {self.manual_override.requested_by or '?'}"
            )
        parts.append(f"policy {self.policy.label()}")
        return " | ".join(parts)


def _age(now: datetime, at: datetime | None) -> str:
    if at is None:
        return "age ?"
    seconds = (now - at).total_seconds()
    return f"{seconds:g}s old"


@dataclass(frozen=True, slots=True)
class EventSummary:
    """What to put in a Kubernetes Event for a record."""

    reason: str
    type: Literal["Normal", "Warning"]
    decision: Decision
    reasons: tuple[ReasonCode, ...]
    message: str


_EVENT_REASON = {
    Decision.SHUTDOWN: "PowerShutdown",
    Decision.START: "PowerStart",
    Decision.DRAIN: "PowerDrain",
    Decision.DEFER: "PowerDeferred",
    Decision.BLOCK: "PowerBlocked",
    Decision.NONE: "PowerNoAction",
}


def event_summary(record: SafetyRecord) -> EventSummary:
    """Stable CamelCase Event reason per decision; Warning for BLOCK and races."""
    warning = record.decision is Decision.BLOCK or record.race
    message = record.summary()
    if len(message) > 1024:
        message = message[:1021] + "..."
    return EventSummary(
        reason=_EVENT_REASON[record.decision],
        type="Warning" if warning else "Normal",
        decision=record.decision,
        reasons=record.reasons,
        message=message,
    )
