"""PowerIntent (`pi`): one requested power transition of one WorkerNode, and its Safety Record.

The spec is immutable once created (a CEL rule enforces it); the status carries the
transition's progress and the full Safety Record of the decision.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from nodewarden.api.base import (
    DNS_SUBDOMAIN_PATTERN,
    FENCE_RULE,
    MAX_CONDITIONS,
    MAX_GENERATION,
    MAX_REASONS,
    MAX_STATUS_DOCUMENT_KEYS,
    ApiModel,
    Condition,
    FenceTokens,
    ReasonCode,
    StatusModel,
    fence_field,
)

PowerAction = Literal["Shutdown", "Wake", "Drain", "Restart"]
IntentPhase = Literal[
    "Pending",
    "Deferred",
    "InProgress",
    "Succeeded",
    "Blocked",
    "Aborted",
    "Superseded",
    "Failed",
    "Shadow",
]
"""Pending: seen, waiting for the gates (or behind another intent for the node).
Deferred: the gates say wait (time or fresh evidence); recheckAt says when.
InProgress: the transition runs (drain, request, confirmation).
Succeeded: the requested state was observed (Off; On and ready).
Blocked: a person must act (reasons say why); nothing more is tried.
Aborted: a gate stopped passing before the irreversible step (e.g. demand arrived).
Superseded: a newer intent for the node replaced this one before it finished.
Failed: the intent cannot be carried out (its node does not exist, the spec is invalid).
Shadow: the policy is in Shadow mode: decided and recorded, never acted on."""
TERMINAL_INTENT_PHASES: frozenset[str] = frozenset(
    {"Succeeded", "Blocked", "Aborted", "Superseded", "Failed", "Shadow"}
)


class IntentOverride(ApiModel):
    """A pre-authorised, audited override of one safety gate (manual intents only)."""

    inhibitors: bool = Field(
        default=False,
        description="Pass an active shutdown inhibitor (needs PowerPolicy inhibitorOverride.permitted).",
    )
    force_off: bool = Field(
        default=False,
        description="Allow ForceOff if GracefulShutdown fails (needs inhibitorOverride.permitForceOff).",
    )
    recorded_identity: bool = Field(
        default=False,
        description=(
            "Shutdown only: when the host's DMI product UUID cannot be read now, rely on the "
            "BMC/host UUID match recorded at enrolment (its age is in the Safety Record)."
        ),
    )
    justification: str = Field(
        min_length=10,
        max_length=2048,
        description="Why the override is needed; recorded in the Safety Record.",
    )


class PowerIntentSpec(ApiModel):
    """The requested transition. Immutable once created."""

    cel_rules: ClassVar[list[dict[str, str]]] = [
        {
            "rule": "self == oldSelf",
            "message": "PowerIntent spec is immutable; create a new PowerIntent",
        },
        {
            "rule": "!has(self.override) || self.source == 'Manual'",
            "message": "only Manual intents may carry an override",
            "fieldPath": ".override",
        },
    ]

    node_name: str = Field(
        description="Name of the WorkerNode (same namespace).",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    action: PowerAction = Field(description="Shutdown, Wake, Drain or Restart.")
    source: Literal["Policy", "Manual"] = Field(
        default="Manual",
        description="Policy (created by nodewarden) or Manual (created by a person).",
    )
    requested_by: str = Field(
        default="",
        max_length=256,
        description=(
            "Who asked: your user name exactly as the API server authenticates you (the "
            "chart's admission policy refuses any other; ServiceAccounts: "
            "system:serviceaccount:<namespace>:<name>). The operator writes its own."
        ),
    )
    reason: str = Field(
        default="", max_length=2048, description="Free-text reason given by the requester."
    )
    override: IntentOverride | None = Field(
        default=None, description="Audited override of a safety gate (Manual only)."
    )


class PowerIntentStatus(StatusModel):
    """Progress of the transition and its Safety Record."""

    cel_rules: ClassVar[list[dict[str, str]]] = [FENCE_RULE]

    fence: FenceTokens | None = fence_field()

    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="metadata.generation last processed by the operator.",
    )
    phase: IntentPhase | None = Field(
        default=None,
        description=(
            "Pending, Deferred, InProgress, Succeeded, Blocked, Aborted, Superseded, Failed or "
            "Shadow (docs/state-machine.md, 'PowerIntent phases')."
        ),
    )
    decision: str | None = Field(
        default=None,
        max_length=32,
        description="Last decision: SHUTDOWN, START, DRAIN, DEFER, BLOCK or NONE.",
    )
    reasons: list[ReasonCode] = Field(
        default_factory=list, max_length=MAX_REASONS, description="Reason codes of the decision."
    )
    transition_id: str | None = Field(
        default=None, max_length=253, description="Identifier of the transition attempt."
    )
    message: str | None = Field(
        default=None, max_length=32768, description="Human-readable state of the intent."
    )
    recheck_at: datetime | None = Field(
        default=None, description="When a deferred decision will be re-evaluated."
    )
    deadline: datetime | None = Field(default=None, description="Deadline of the step in progress.")
    retries: int = Field(default=0, ge=0, le=1_000_000, description="Retries used so far.")
    started_at: datetime | None = Field(
        default=None, description="When the transition for this intent began."
    )
    finished_at: datetime | None = Field(
        default=None, description="When the intent reached a terminal phase."
    )
    safety_record: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The Safety Record of the latest decision: every piece of evidence with its "
            "source and time (format: docs/safety-record.md)."
        ),
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    request_record: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The Safety Record of the decision that sent the latest power request: every "
            "gate with the evidence it passed on at that moment (safetyRecord moves on to "
            "the confirmation)."
        ),
        max_length=MAX_STATUS_DOCUMENT_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, description="Standard conditions."
    )
